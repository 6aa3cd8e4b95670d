"""Out-of-bounds accesses on CUDA: the guarded buffers fault where they must and nowhere else, and
the evaluator's final confirmation turns such a fault into `out_of_bounds`.

Every probe that may fault runs in its own process (tests/bounds_probe.py): an illegal address
poisons the CUDA context of the process for good. Needs a CUDA GPU (marker `gpu`). A machine
whose driver cannot make guarded buffers fails these tests, with the driver's reason: a silently
skipped bounds check would look like a passing one.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forge_pack.evaluate.evaluator import Evaluator
from forge_pack.search.families import reference_candidate
from forge_pack.evaluate.timing import TimingConfig

from eval_helpers import KERNELS, expected_reasons, hotspot, load_fixture

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "bounds_probe.py"
CFG = TimingConfig(warmup=3, reps=10, compile_baseline=False)
ILLEGAL_ADDRESS = 700  # CUDA_ERROR_ILLEGAL_ADDRESS


def probe(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, f"probe {args} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["guard_problem"] == "", f"guarded buffers do not work on this machine: {report['guard_problem']}"
    return report


# ---------------------------------------------------------------- the guarded buffer itself


@pytest.mark.parametrize("nbytes", [16000, 2 << 20])
def test_guarded_buffer_faults_one_byte_past_the_end(nbytes):
    r = probe("access", "--guard", "end", "--nbytes", str(nbytes), "--at", str(nbytes))
    assert r["payload_ends_at_mapping_end"] and r["slack"] == 0, r
    assert r["code"] == ILLEGAL_ADDRESS, r


@pytest.mark.parametrize("nbytes", [16000, 2 << 20])
def test_guarded_buffer_faults_one_byte_before_the_start(nbytes):
    r = probe("access", "--guard", "start", "--nbytes", str(nbytes), "--at", "-1")
    assert r["payload_starts_at_mapping_start"] and r["slack"] == 0, r
    assert r["code"] == ILLEGAL_ADDRESS, r


def test_guarded_buffer_faults_on_a_write_one_byte_past_the_end():
    r = probe("access", "--guard", "end", "--nbytes", "16000", "--at", "16000", "--write")
    assert r["code"] == ILLEGAL_ADDRESS, r


@pytest.mark.parametrize("guard,at", [("end", 15999), ("start", 0)])
def test_guarded_buffer_reads_its_edge_bytes_without_a_fault(guard, at):
    r = probe("access", "--guard", guard, "--nbytes", "16000", "--at", str(at))
    assert r["code"] == 0, r
    assert r["value"] == 0xA7, r  # the byte the probe wrote there: the read reached the payload
    assert r["granularity"] >= 4096 and r["mapped"] % r["granularity"] == 0, r


def test_guarded_run_launches_on_flush_copies_and_copies_results_back():
    r = probe("roundtrip")
    assert r["supports_guard"] is True
    for guard in ("end", "start"):
        assert r[guard] == {"out_is_2x": True, "x_unchanged": True, "kernel_saw_guarded_x": True,
                            "kernel_saw_guarded_out": True, "x_flush": True, "out_flush": True, "slack": [0, 0],
                            "second_call_same": True, "input_write_copied_back": True}, (guard, r[guard])


# ---------------------------------------------------------------- through the evaluator


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    ev = Evaluator("cuda", workers=1, timeout_s=60, timing=CFG, log_dir=tmp_path_factory.mktemp("workers"))
    yield ev
    ev.close()


OOB = sorted(p for p in KERNELS.glob("cuda_oob_*.cu") if "out_of_bounds" in expected_reasons(p))


def test_the_three_out_of_bounds_fixtures_exist():
    assert [p.stem for p in OOB] == ["cuda_oob_read_before_start", "cuda_oob_read_past_end",
                                     "cuda_oob_write_past_end"]


@pytest.mark.parametrize("text", ["x: f32[500,2048], dim=-1", "x: f32[3,1000], dim=-1"])
@pytest.mark.parametrize("path", OOB, ids=lambda p: p.stem)
def test_final_check_rejects_out_of_bounds_access_as_out_of_bounds(evaluator, path, text):
    """Tensors that end inside a granule, and a tiny one (test_verify_gpu.py runs each fixture at its
    own signature, 512x2048 f32 = 4 MiB, two whole granules)."""
    e = evaluator.evaluate(load_fixture(path), hotspot("softmax", text, device="cuda"), final=True)
    # launch_error only for the read before the start, where the allocator put x at the start of a
    # mapping of its own and the plain verification run faulted first (see the fixture)
    assert e.verdict.reason in expected_reasons(path), (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("text", ["x: f32[512,2048], dim=-1", "x: f32[500,2048], dim=-1", "x: f32[3,1000], dim=-1"])
def test_final_check_passes_the_honest_kernel_that_ends_at_the_boundary(evaluator, text):
    # also shows that the worker poisoned by the faults above was replaced
    e = evaluator.evaluate(load_fixture(KERNELS / "cuda_oob_honest_flush.cu"), hotspot("softmax", text, device="cuda"),
                           final=True)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("op,text", [
    ("softmax", "x: f32[512,2048], dim=-1"),
    ("softmax", "x: bf16[4096,256], dim=-1, dtype=float32"),
    ("log_softmax", "x: bf16[64,1000], dim=-1"),
    ("group_norm", "x: f32[1,512,32,32], num_groups=32, weight: f32[512], bias: f32[512]"),
    ("adaptive_avg_pool2d", "x: bf16[32,2048,7,7]{channels_last}, output_size=(1,1)"),
])
def test_reference_kernels_pass_the_final_bounds_check(evaluator, op, text):
    h = hotspot(op, text, device="cuda")
    e = evaluator.evaluate(reference_candidate(h.signature, "cuda"), h, final=True)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)
