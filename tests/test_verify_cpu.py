"""The CPU evaluator end to end: every cheating fixture rejected with its reason, references pass.

One Evaluator (worker processes) is shared by the module; a crash or a timeout replaces its
worker and the next candidate is judged normally.
"""

import pytest

from forge_pack.evaluate.evaluator import Evaluator
from forge_pack.search.families import reference_candidate
from forge_pack.evaluate.timing import TimingConfig

from eval_helpers import (CPU_SIGNATURE, expected_reasons, fixture_files, fixture_modes, fixture_signature, hotspot,
                          load_fixture, one_thread_cpu_evaluator)

FAST = TimingConfig(warmup=1, reps=5, flush=False, compile_baseline=False)


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    with one_thread_cpu_evaluator(tmp_path_factory, 8, FAST) as ev:
        yield ev


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
    assert {"fresh", "derived", "adversarial"} <= kinds
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

    from forge_pack.profile.capture import save_capture

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


def test_a_stray_write_through_a_kept_pointer_is_input_mutated(evaluator):
    """The kernel keeps the address of an input it was given and writes there on a later call. In
    the CPU sandbox that address is a slot of the runner's arena, reused for the next set, so the
    write lands in the inputs of the call being made and the per-call input comparison sees it."""
    from eval_helpers import KERNELS

    h = hotspot("softmax", CPU_SIGNATURE)
    e = evaluator.evaluate(load_fixture(KERNELS / "cpu_stray_write_cached_set.cpp"), h)
    assert e.verdict.reason == "input_mutated", (e.verdict.reason, e.verdict.detail)
    _reference_ok(evaluator, h)  # the next candidate is judged on clean inputs


def test_a_cached_set_changed_during_an_evaluation_is_caught_by_the_fingerprint(monkeypatch):
    """Guard alone: the worker-side judge compares every cached set's content fingerprint after the
    evaluation. A CPU kernel no longer reaches the judge's cached buffers (the sandbox hands it arena
    copies; a CUDA kernel keeping a device pointer still could), so the write is simulated here,
    after verification's own per-call checks, where only the fingerprint can see it."""
    from forge_pack.evaluate import verify as verify_mod
    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.judge import JudgeCandidate, LoadInputs, Session, judge
    from forge_pack.targets.ops import with_output

    monkeypatch.setenv("FORGE_PACK_THREADS", "1")
    sig = with_output(hotspot("softmax", CPU_SIGNATURE).signature)
    cand = reference_candidate(sig, "cpu")
    build = compile_candidate(cand)
    assert build.ok, build.log
    inputs = LoadInputs("k", sig)
    job = JudgeCandidate(inputs, cand, build.path, FAST)
    session = Session("cpu")
    session.load(inputs)
    static = session.sets["k"][0]
    real_verify = verify_mod.verify

    def verify_then_stray_write(module, c, sets, device):
        verdict = real_verify(module, c, sets, device)
        static[-1].tensors["x"].view(-1)[0] += 1.0  # after that set's own checks
        return verdict

    monkeypatch.setattr(verify_mod, "verify", verify_then_stray_write)
    judged = judge(session, job)
    assert judged.verdict.reason == "input_mutated", judged.verdict
    assert "fingerprint" in judged.verdict.detail
    assert judged.sets_dropped is True and "k" not in session.sets  # reloaded for the next candidate
    monkeypatch.setattr(verify_mod, "verify", real_verify)
    session.load(inputs)
    assert judge(session, job).verdict.ok is True


def test_fresh_and_derived_sets_are_seeded_by_the_candidates_own_hash():
    import torch

    from forge_pack.targets.ops import with_output
    from forge_pack.targets.sigparse import parse_signature
    from forge_pack.evaluate.verify import derived_sets, fresh_sets

    sig = with_output(parse_signature("softmax", "x: f32[16,100], dim=-1"))

    def draw(h, final=False):
        fresh = fresh_sets(sig, "cpu", 0, h, final)
        return [fresh[0].tensors["x"]] + [s.tensors["x"] for s in derived_sets(sig, "cpu", 0, h, final, fresh)]

    a, a2, b, fin = draw("hash-a"), draw("hash-a"), draw("hash-b"), draw("hash-a", final=True)
    assert len(a) == 6
    assert all(torch.equal(x, y) for x, y in zip(a, a2))  # reproducible for one candidate
    assert not any(torch.equal(x, y) for x, y in zip(a, b))  # another candidate sees other inputs
    assert not any(torch.equal(x, y) for x, y in zip(a, fin))  # and the final check other ones again


def test_two_candidates_are_verified_on_different_fresh_inputs(evaluator):
    from forge_pack.core.candidate import Candidate

    h = hotspot("softmax", CPU_SIGNATURE)
    ref = reference_candidate(h.signature, "cpu")
    other = Candidate(ref.op, ref.backend, ref.source + "\n// the same kernel, another hash\n", ref.spec)
    errs = []
    for cand in (ref, other):
        e = evaluator.evaluate(cand, h)
        assert e.verdict.ok, e.verdict.detail
        errs.append({c.input_kind: c.max_abs_err for c in e.verdict.checks})
    assert errs[0]["fresh[0]"] != errs[1]["fresh[0]"]
    assert errs[0]["derived:mixed"] != errs[1]["derived:mixed"]


@pytest.mark.parametrize("op,text", [
    ("softmax", "x: f32[6,50], dim=-1"),
    ("log_softmax", "x: bf16[4,3,40], dim=1"),
    ("layer_norm", "x: f32[5,8,12], normalized_shape=(8,12), weight: f32[8,12], bias: f32[8,12], eps=1e-5"),
    ("rms_norm", "x: f32[5,16], normalized_shape=(16,), weight: f32[16], eps=1e-6"),
    ("group_norm", "x: f32[2,8,3,3], num_groups=4, weight: f32[8], bias: f32[8]"),
    ("batch_norm", "x: f32[3,4,2,2], running_mean: f32[4], running_var: f32[4], weight: f32[4], bias: f32[4]"),
    ("adaptive_avg_pool2d", "x: f16[2,6,5,5], output_size=(1,1)"),
])
def test_derived_inputs_transform_without_touching_their_source(op, text):
    import torch

    from forge_pack.targets import ops
    from forge_pack.targets.sigparse import parse_signature
    from forge_pack.evaluate.verify import make_set

    sig = ops.with_output(parse_signature(op, text))
    src = ops.make_inputs(sig, "fresh", torch.Generator().manual_seed(1), "cpu")
    keep = {n: t.clone() for n, t in src.items() if t is not None}
    for kind in ops.DERIVED_KINDS:
        t = ops.derive_inputs(sig, kind, src, torch.Generator().manual_seed(2))
        assert all(torch.equal(src[n], keep[n]) for n in keep)
        x0, x = src["x"].double(), t["x"].double()
        assert t["x"].stride() == src["x"].stride() and t["x"].dtype == src["x"].dtype
        if kind == "permute":  # the same values, reordered; parameters travel with their channels
            assert torch.equal(x.reshape(-1).sort().values, x0.reshape(-1).sort().values)
            for n in keep:
                assert torch.equal(t[n].double().reshape(-1).sort().values, keep[n].double().reshape(-1).sort().values)
        else:
            assert not torch.equal(x, x0)
        if kind == "scale":
            ratio = float(x.abs().max() / x0.abs().max())
            assert ratio >= 10 ** 0.49 or ratio <= 10 ** -0.49
        assert make_set(f"derived:{kind}", sig, t, "cpu") is not None  # eager keeps NaN/Inf parity on it


def test_derived_permutation_keeps_group_norm_semantics():
    """Channels move with their weight and bias, inside their group: each output channel is the
    original output of some channel, not a different normalisation."""
    import torch

    from forge_pack.targets import ops
    from forge_pack.targets.sigparse import parse_signature

    sig = ops.with_output(parse_signature("group_norm", "x: f32[1,8,4,4], num_groups=2, weight: f32[8], bias: f32[8]"))
    src = ops.make_inputs(sig, "fresh", torch.Generator().manual_seed(3), "cpu")
    t = ops.derive_inputs(sig, "permute", src, torch.Generator().manual_seed(4))
    before = ops.reference64(sig, src)[0].reshape(8, -1).sort(dim=1).values
    after = ops.reference64(sig, t)[0].reshape(8, -1).sort(dim=1).values
    for c in range(8):  # every permuted channel's output values match one original channel's
        assert min(float((after[c] - before[d]).abs().max()) for d in range(8)) < 1e-9


class _FakeCpuModule:
    """A Python stand-in for a bound CPU kernel (the sandbox's bind / retarget / stage / elapsed_s
    interface, forge_pack.evaluate.sandbox): softmax into out,
    with ``misbehave(call_number, tensors)`` deciding what goes wrong on which call."""

    def __init__(self, misbehave):
        self.misbehave = misbehave
        self.calls = 0  # over every bound copy, as a kernel's static state would count

    def bind(self, plan, tensors):
        import torch

        t = dict(tensors)
        # the runner's output slot, copied back into the judge's tensor after every call as the sandbox
        # does: a skipped call leaves what the slot held (zeros: new memfd pages; later its last output),
        # never the judge's uninitialised tensor, whose memory can be a freed tensor that held an answer
        # for the same seeded inputs (a clean CI run on 2026-12-06 saw a skipped call 2 pass once)
        arena = torch.zeros_like(t["out"])

        def run():
            self.calls += 1
            if self.misbehave(self.calls, t) != "skip":
                arena.copy_(torch.softmax(t["x"], -1))
            t["out"].copy_(arena)

        run.retarget = lambda name, tensor, fresh=False: t.__setitem__(name, tensor)
        run.stage = lambda: None  # the real runner copies the judge's tensors into its arena here
        run.elapsed_s = lambda: 1e-5
        return run


def _time_fake(misbehave, reps=6):
    import torch

    from forge_pack.evaluate.judge import time_candidate
    from forge_pack.targets.ops import with_output
    from forge_pack.targets.sigparse import parse_signature
    from forge_pack.evaluate.verify import fresh_sets

    sig = with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    cand = reference_candidate(sig, "cpu")
    base = fresh_sets(sig, "cpu", 0, cand.content_hash, False)[0]
    torch.manual_seed(0)
    return time_candidate(_FakeCpuModule(misbehave), cand, sig, base,
                          TimingConfig(warmup=2, reps=reps, flush=False, compile_baseline=False), "cpu")


def test_time_candidate_passes_an_honest_kernel_and_times_every_call():
    timing, verdict = _time_fake(lambda n, t: None)
    assert verdict is None and timing.n == 6


@pytest.mark.parametrize("bad_call", [1, 2, 3, 5, 8])
def test_every_warm_up_and_timed_call_is_checked(bad_call):
    """Four copies, two warm-up calls then six timed ones: a single skipped call anywhere (not
    only the last call per copy) is caught, and the verdict names it."""
    timing, verdict = _time_fake(lambda n, t: "skip" if n == bad_call else None)
    assert verdict is not None and verdict.reason in ("mismatch", "unwritten_output"), verdict
    assert verdict.detail.startswith(f"call {bad_call} of the timing loop")
    assert (timing is None) == (bad_call <= 2)


def test_a_timed_call_that_writes_into_its_input_is_input_mutated_with_the_first_index():
    def shift_row_0(n, t):  # softmax-invariant: an output check alone cannot see it
        if n == 4:
            t["x"][0] -= t["x"][0].max()

    _, verdict = _time_fake(shift_row_0)
    assert verdict.reason == "input_mutated", verdict
    assert verdict.detail.startswith("call 4 of the timing loop (timed, copy 1): input `x` changed")
    assert "first at (0, " in verdict.detail
