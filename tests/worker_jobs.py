"""Jobs for tests/test_worker_jobs.py: the worker unpickles them by this module's name, so its
environment puts tests/ on PYTHONPATH."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Started:
    def run(self, ctx) -> dict:
        return {"pid": os.getpid(), "backend": ctx.backend}


@dataclass(frozen=True)
class Counted:
    value: int
    jobs_so_far: int


@dataclass(frozen=True)
class Echo:
    value: int

    def run(self, ctx) -> Counted:
        ctx.state["jobs"] = ctx.state.get("jobs", 0) + 1  # kept between jobs
        return Counted(self.value, ctx.state["jobs"])


@dataclass(frozen=True)
class Crash:
    def run(self, ctx) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)


@dataclass(frozen=True)
class Hang:
    def run(self, ctx) -> None:
        time.sleep(60)


@dataclass(frozen=True)
class Raise:
    message: str

    def run(self, ctx) -> None:
        raise ValueError(self.message)


@dataclass(frozen=True)
class RaiseInUnusableProcess:
    def run(self, ctx) -> None:
        raise RuntimeError("a sticky device error")

    def usable_after_error(self, ctx) -> bool:
        return False
