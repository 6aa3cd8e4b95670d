"""The CPU evaluator end to end: every cheating fixture rejected with its reason, references pass.

One Evaluator (worker processes) is shared by the module; a crash or a timeout replaces its
worker and the next candidate is judged normally.
"""

import os

import pytest

from forge_pack.evaluate import Evaluator
from forge_pack.reference_kernels import reference_candidate
from forge_pack.timing import TimingConfig

from eval_helpers import (CPU_SIGNATURE, expected_reasons, fixture_files, fixture_modes, fixture_signature, hotspot,
                          load_fixture)

FAST = TimingConfig(warmup=1, reps=5, flush=False, compile_baseline=False)


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    old = os.environ.get("FORGE_PACK_CPU_THREADS")
    os.environ["FORGE_PACK_CPU_THREADS"] = "1"  # timings on a shared 2-core CI box are steadier
    ev = Evaluator("cpu", workers=1, timeout_s=8, timing=FAST, log_dir=tmp_path_factory.mktemp("workers"))
    yield ev
    ev.close()
    if old is None:
        os.environ.pop("FORGE_PACK_CPU_THREADS", None)
    else:
        os.environ["FORGE_PACK_CPU_THREADS"] = old


def _reference_ok(evaluator, h):
    e = evaluator.evaluate(reference_candidate(h.signature, "cpu"), h, bounds=True)  # guard pages too
    assert e.verdict.ok, e.verdict.detail
    return e


CHEATS = [p for p in fixture_files("cpu_") if not expected_reasons(p) & {"crash", "timeout"}]


@pytest.mark.parametrize("path", CHEATS, ids=lambda p: p.stem)
def test_verify_rejects_cpu_cheating_kernel(evaluator, path):
    h = hotspot("softmax", fixture_signature(path, CPU_SIGNATURE))
    e = evaluator.evaluate(load_fixture(path), h, bounds="bounds" in fixture_modes(path))
    assert not e.verdict.ok
    assert e.verdict.reason in expected_reasons(path), (e.verdict.reason, e.verdict.detail)
    assert e.verdict.detail
    if e.verdict.reason == "compile_error":
        assert "error" in e.compile_log and e.compile_cmd.startswith("g++")


@pytest.mark.parametrize("path", [p for p in fixture_files("cpu_") if expected_reasons(p) & {"crash", "timeout"}],
                         ids=lambda p: p.stem)
def test_crash_and_hang_become_verdicts_and_the_next_candidate_is_judged(evaluator, path):
    h = hotspot("softmax", CPU_SIGNATURE)
    e = evaluator.evaluate(load_fixture(path), h)
    assert e.verdict.reason in expected_reasons(path), (e.verdict.reason, e.verdict.detail)
    if e.verdict.reason == "crash":
        assert "SIG" in e.verdict.detail  # killed by SIGSEGV / SIGILL
    _reference_ok(evaluator, h)


@pytest.mark.parametrize("text", ["x: f32[3,333], dim=-1",  # 3996 bytes: 4 bytes short of a 16-byte multiple
                                  "x: f32[4,256], dim=-1"])  # 4096 bytes: the last byte touches the guard page
def test_honest_kernel_whose_last_row_ends_at_the_guard_page_passes(evaluator, text):
    h = hotspot("softmax", text)
    e = evaluator.evaluate(reference_candidate(h.signature, "cpu"), h, bounds=True)
    assert e.verdict.ok, e.verdict.detail


@pytest.mark.parametrize("op,text", [
    ("softmax", "x: f32[64,1000], dim=-1"),
    ("softmax", "x: bf16[33,257], dim=-1, dtype=float32"),
    ("softmax", "x: f16[16,128], dim=1"),
    ("log_softmax", "x: f32[40,300], dim=-1"),
    ("log_softmax", "x: bf16[8,64], dim=1"),
    ("group_norm", "x: f32[2,64,16,16], num_groups=8, weight: f32[64], bias: f32[64]"),
    ("group_norm", "x: bf16[1,32,9,9], num_groups=4, weight: bf16[32], bias: bf16[32], eps=1e-6"),
    ("group_norm", "x: f32[2,16,5,5], num_groups=4"),
    ("adaptive_avg_pool2d", "x: f32[4,64,7,7], output_size=(1,1)"),
    ("adaptive_avg_pool2d", "x: bf16[4,64,7,7]{channels_last}, output_size=(1,1)"),
])
def test_reference_kernels_pass_verification(evaluator, op, text):
    h = hotspot(op, text)
    e = _reference_ok(evaluator, h)
    kinds = {c.input_kind.split("[")[0].split(":")[0] for c in e.verdict.checks}
    assert {"fresh", "adversarial"} <= kinds
    assert e.timing is not None and e.timing.n == 5 and e.timing.clock == "monotonic"
    assert e.verdict.max_abs_err is not None


def test_baseline_and_speedups(evaluator):
    h = hotspot("softmax", "x: f32[128,512], dim=-1")
    base = evaluator.baseline(h)
    assert base.eager.median_us > 0 and base.compiled is None and base.copy_bandwidth_gbs > 0
    assert base.floor_us == pytest.approx(128 * 512 * 8 / (base.copy_bandwidth_gbs * 1e3))
    e = evaluator.evaluate(reference_candidate(h.signature, "cpu"), h)
    assert e.verdict.ok
    assert e.speedup_vs_eager == pytest.approx(base.eager.median_us / e.timing.median_us)
    assert e.bandwidth_fraction == pytest.approx(base.floor_us / e.timing.median_us, rel=0.05)


def test_final_mode_uses_other_inputs_than_search(evaluator):
    h = hotspot("softmax", CPU_SIGNATURE)
    cand = reference_candidate(h.signature, "cpu")
    a = evaluator.evaluate(cand, h)
    b = evaluator.evaluate(cand, h, final=True)
    assert a.verdict.ok and b.verdict.ok
    fa = {c.input_kind: c.max_abs_err for c in a.verdict.checks}
    fb = {c.input_kind: c.max_abs_err for c in b.verdict.checks}
    assert fa["fresh[0]"] != fb["fresh[0]"]


def test_captured_inputs_are_checked(evaluator, tmp_path):
    import torch

    from forge_pack.capture import save_capture

    h0 = hotspot("softmax", "x: f32[16,100], dim=-1")
    x = torch.randn(16, 100) * 3
    save_capture(tmp_path / "inputs" / "a.safetensors", h0.signature, {"x": x}, torch.softmax(x, -1))
    h = hotspot("softmax", "x: f32[16,100], dim=-1", captures=("inputs/a.safetensors",))
    ev = Evaluator("cpu", workers=1, timeout_s=20, timing=FAST, run_dir=tmp_path)
    try:
        e = ev.evaluate(reference_candidate(h.signature, "cpu"), h)
    finally:
        ev.close()
    assert e.verdict.ok, e.verdict.detail
    assert "captured[0]" in {c.input_kind for c in e.verdict.checks}


def test_inapplicable_and_static_verdicts_need_no_worker(evaluator):
    h = hotspot("softmax", "x: f32[8,100], dim=0")  # not the last dim: not targeted
    e = evaluator.evaluate(reference_candidate(hotspot("softmax", "x: f32[8,100], dim=-1").signature, "cpu"), h)
    assert e.verdict.reason == "inapplicable"
