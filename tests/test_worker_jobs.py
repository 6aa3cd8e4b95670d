"""The worker as a generic runner of typed jobs: results come back as the job's own types, and a
crash, a timeout, a raising job or a failed start come back as typed results, never as
exceptions in the parent. Also: the worker imports nothing of forge-pack, and the evaluator's
parent side (evaluate) and its worker side (judge) do not import each other."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forge_pack.evaluate.worker import JobError, WorkerLost, WorkerProcess

from worker_jobs import Counted, Crash, Echo, Hang, Raise, RaiseInUnusableProcess, Started

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH")) if p)}


@pytest.fixture
def worker(tmp_path):
    w = WorkerProcess("cpu", 0, ENV, Started(), str(tmp_path))
    yield w
    w.close()


def test_a_job_returns_its_own_type_and_the_worker_keeps_state_between_jobs(worker):
    assert worker.ready() == {"pid": worker.proc.pid, "backend": "cpu"}
    assert worker.run(Echo(7), 30) == Counted(7, 1)
    assert worker.run(Echo(8), 30) == Counted(8, 2)


def test_a_crash_is_worker_lost_naming_the_signal(worker):
    lost = worker.run(Crash(), 30)
    assert isinstance(lost, WorkerLost)
    assert (lost.kind, lost.detail) == ("crash", "worker killed by SIGSEGV")
    assert not worker.alive


def test_a_timeout_kills_the_worker_and_is_worker_lost(worker):
    worker.ready()
    lost = worker.run(Hang(), 1.0)
    assert lost == WorkerLost("timeout", "no answer within 1 s")
    assert worker.proc.returncode is not None and not worker.alive


def test_a_raising_job_is_a_job_error_and_the_worker_serves_the_next_job(worker):
    err = worker.run(Raise("boom"), 30)
    assert isinstance(err, JobError) and err.retire is False
    assert err.traceback.rstrip().endswith("ValueError: boom")
    assert worker.alive and worker.run(Echo(1), 30) == Counted(1, 1)


def test_a_job_that_finds_its_process_unusable_retires_the_worker(worker):
    err = worker.run(RaiseInUnusableProcess(), 30)
    assert isinstance(err, JobError) and err.retire is True
    assert not worker.alive and worker.proc.returncode == 3  # exited right after answering


def test_a_failing_startup_job_is_worker_lost_at_start(tmp_path):
    w = WorkerProcess("cpu", 0, ENV, Raise("no device"), str(tmp_path))
    try:
        lost = w.run(Echo(1), 30)
        assert isinstance(lost, WorkerLost) and lost.kind == "start"
        assert "ValueError: no device" in lost.detail
    finally:
        w.close()


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (function-level imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_evaluate_and_the_worker_do_not_import_each_other():
    worker = _imports(ROOT / "forge_pack" / "evaluate" / "worker.py")
    assert {n for n in worker if n.startswith("forge_pack") and not n.startswith("forge_pack.evaluate.worker")} == set()
    judge = _imports(ROOT / "forge_pack" / "evaluate" / "judge.py")
    assert not {n for n in judge if n.startswith(("forge_pack.evaluate.evaluator", "forge_pack.evaluate.worker"))}
    # and at run time: importing the worker module loads no other forge_pack module
    code = "import sys, forge_pack.evaluate.worker; print(sorted(m for m in sys.modules if m.startswith('forge_pack')))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **ENV}, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['forge_pack', 'forge_pack.evaluate', 'forge_pack.evaluate.worker']"
