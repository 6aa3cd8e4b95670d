"""Central skips for the markers: gpu (needs CUDA), browser (needs Chromium + Playwright).

`slow` and `llm` tests run everywhere (the LLM tests talk to a scripted server on 127.0.0.1).
"""

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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


def pytest_collection_modifyitems(config, items):
    has_cuda = _cuda()
    browser_missing = _browser()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "browser" in item.keywords and browser_missing:
            item.add_marker(pytest.mark.skip(reason=browser_missing))


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
