"""Jobs for the device-pool tests (tests/test_search_devices.py, tests/ray_pool_cases.py): light
stand-ins for the evaluator's Startup and JudgeCandidate that need no torch, so a pool of
several "devices" starts in a fraction of a second. The worker unpickles them by this module's
name, so the workers' environment puts tests/ on PYTHONPATH."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class FakeStartup:
    """Reports a device as the real Startup does: backend, name, capability (from the environment,
    so a test can give its "devices" different GPU models)."""

    def run(self, ctx) -> dict:
        return {"backend": os.environ.get("FAKE_BACKEND", ctx.backend), "name": os.environ.get("FAKE_GPU", "cpu"),
                "capability": os.environ.get("FAKE_CAPABILITY", ""), "pid": os.getpid()}


@dataclass(frozen=True)
class FakeJudge:
    """Holds its device for ``sleep_s`` (a timed run) and says where and when it ran."""

    cand_hash: str
    sleep_s: float

    def run(self, ctx) -> dict:
        t0 = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
        time.sleep(self.sleep_s)
        return {"hash": self.cand_hash, "device": os.environ.get("FAKE_DEVICE", ""), "pid": os.getpid(),
                "t0": t0, "t1": time.monotonic()}


@dataclass(frozen=True)
class ReadArtifact:
    """Reads the file its ``artifact`` names, as a judge job loads a built kernel."""

    artifact: str

    def run(self, ctx) -> bytes:
        with open(self.artifact, "rb") as f:
            return f.read()
