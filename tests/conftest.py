"""Central skips for the markers: gpu (needs CUDA), browser (needs Chromium + Playwright).

`slow` and `llm` tests run everywhere (the LLM tests talk to a scripted server on 127.0.0.1).

FORGE_PACK_REQUIRE_GPU=1 (set by `make test-gpu` / bench/test_gpu.sh) is for a GPU machine: no CUDA
device is a usage error, a `gpu` test that skips is reported as failed (a skipped anti-cheat fixture
must never read as green), and the CUDA cheating-kernel fixtures run before every other test.
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _beside(name: str):
    """tests/<name>.py by its path: this file is also loaded by path from elsewhere (tests/test_gpu_gate.py)."""
    spec = importlib.util.spec_from_file_location(f"forge_tests_{name}", Path(__file__).resolve().parent / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# `make test`'s -n --dist loadscope: long modules first, and a crashed worker costs its test, not the run
_SCHEDULE = _beside("xdist_schedule")
pytest_xdist_make_scheduler = _SCHEDULE.pytest_xdist_make_scheduler

MODELS = ROOT / "tests" / "models"


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _browser() -> str:
    if not (shutil.which("chromium") or os.path.exists("/usr/bin/chromium")):
        return "Debian's chromium is not installed (.ci/run installs it)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (.ci/run installs it)"
    return ""


def require_gpu() -> bool:
    return os.environ.get("FORGE_PACK_REQUIRE_GPU", "") not in ("", "0")


def _fixture_first(item) -> int:
    """0 for a parametrisation of tests/test_verify_gpu.py over a tests/kernels/ fixture, else 1."""
    callspec = getattr(item, "callspec", None)
    path = callspec.params.get("path") if callspec is not None else None
    return 0 if item.path.name == "test_verify_gpu.py" and isinstance(path, Path) else 1


def pytest_collection_modifyitems(config, items):
    has_cuda = _cuda()
    browser_missing = _browser()
    if require_gpu():
        if not has_cuda:
            raise pytest.UsageError("FORGE_PACK_REQUIRE_GPU=1 but torch sees no CUDA device: "
                                    "run the GPU suite on a GPU machine")
        items.sort(key=_fixture_first)  # stable: the anti-cheat fixtures first, the rest as collected
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "browser" in item.keywords and browser_missing:
            item.add_marker(pytest.mark.skip(reason=browser_missing))
    if hasattr(config, "workerinput") and not require_gpu():  # an xdist worker (`make test`)
        _SCHEDULE.longest_first(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and require_gpu() and "gpu" in item.keywords and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"a gpu test skipped on a GPU machine (FORGE_PACK_REQUIRE_GPU=1): {reason}"


@pytest.fixture
def cli_env():
    """Environment for running the forge-pack CLI in a subprocess from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("FORGE_DEBUG", None)
    return env


@pytest.fixture
def forge_cmd():
    return [sys.executable, "-m", "forge_pack"]


@pytest.fixture(scope="module")
def cpu_evaluator(tmp_path_factory):
    """One CPU evaluator per test module for the region tests: a single worker on one thread
    (FORGE_PACK_CPU_THREADS=1 while the module runs), a short timing protocol (no L2 flush, no
    torch.compile baseline: these tests judge verdicts, not speed)."""
    from eval_helpers import one_thread_cpu_evaluator
    from forge_pack.evaluate.timing import TimingConfig

    with one_thread_cpu_evaluator(tmp_path_factory, 30, TimingConfig(warmup=1, reps=3, flush=False,
                                                                     compile_baseline=False)) as ev:
        yield ev
