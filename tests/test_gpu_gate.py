"""FORGE_PACK_REQUIRE_GPU=1 (make test-gpu): a skipped gpu test fails, fixtures run first, no GPU is an error.

Runs pytest in a subprocess on a small generated suite whose conftest is tests/conftest.py with the
CUDA probe replaced, so the GPU-machine behaviour is checked on a machine without a GPU.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

SUITE = {
    "test_verify_gpu.py": '''
import pytest
from pathlib import Path
pytestmark = pytest.mark.gpu
ORDER = []
def test_reference_first_in_file():
    print("RAN reference")
@pytest.mark.parametrize("path", [Path("kernels/cuda_a.cu"), Path("kernels/cuda_b.cu")], ids=lambda p: p.stem)
def test_fixture(path):
    print("RAN", path.stem)
''',
    "test_other.py": '''
import pytest
def test_cpu_only():
    print("RAN cpu")
@pytest.mark.gpu
def test_gpu_that_skips_inside():
    pytest.skip("no nvcc here")
@pytest.mark.gpu
@pytest.mark.skipif(True, reason="decided at import")
def test_gpu_skipif():
    pass
def test_cpu_skip_is_still_a_skip():
    pytest.skip("not a gpu test")
''',
}


def _run(tmp_path: Path, cuda: bool, require: bool) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('forge_conftest', {str(CONFTEST)!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        f"mod._cuda = lambda: {cuda}\n"
        "pytest_collection_modifyitems = mod.pytest_collection_modifyitems\n"
        "pytest_runtest_makereport = mod.pytest_runtest_makereport\n")
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs CUDA\n")
    env = {k: v for k, v in os.environ.items() if k != "FORGE_PACK_REQUIRE_GPU"}
    if require:
        env["FORGE_PACK_REQUIRE_GPU"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-s",
                           "-rA", "test_other.py", "test_verify_gpu.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _summary(out: str) -> str:
    return out.strip().splitlines()[-1]


def test_gpu_skips_fail_and_fixtures_run_first_when_a_gpu_is_required(tmp_path):
    r = _run(tmp_path, cuda=True, require=True)
    assert r.returncode == 1, r.stdout
    # a skip decided in setup (skipif) is reported as an error, one in the body as a failure
    assert " 1 failed, 4 passed, 1 skipped, 1 error in " in _summary(r.stdout), r.stdout
    ran = [line.split("RAN ", 1)[1] for line in r.stdout.splitlines() if "RAN " in line]
    assert ran == ["cuda_a", "cuda_b", "cpu", "reference"]
    assert "a gpu test skipped on a GPU machine (FORGE_PACK_REQUIRE_GPU=1): Skipped: no nvcc here" in r.stdout
    assert "a gpu test skipped on a GPU machine (FORGE_PACK_REQUIRE_GPU=1): Skipped: decided at import" in r.stdout
    assert "FAILED test_other.py::test_gpu_that_skips_inside" in r.stdout
    assert "ERROR test_other.py::test_gpu_skipif" in r.stdout
    assert "SKIPPED [1] test_other.py:13: not a gpu test" in r.stdout


def test_without_the_switch_gpu_tests_skip_and_keep_file_order(tmp_path):
    r = _run(tmp_path, cuda=False, require=False)
    assert r.returncode == 0, r.stdout
    assert " 1 passed, 6 skipped in " in _summary(r.stdout), r.stdout
    assert "SKIPPED [2] test_verify_gpu.py:8: needs a CUDA GPU" in r.stdout


def test_requiring_a_gpu_on_a_machine_without_one_is_a_usage_error(tmp_path):
    r = _run(tmp_path, cuda=False, require=True)
    assert r.returncode == pytest.ExitCode.USAGE_ERROR
    assert "FORGE_PACK_REQUIRE_GPU=1 but torch sees no CUDA device" in r.stderr
