"""The evaluation in process: judge.py's plausibility gate, the timing loop's per-call checks and its
jobs (JudgeCandidate, MeasureBaseline: a stand-in session and a fake module whose calls run Python),
and evaluator.py's parent-side Evaluator (a stand-in worker pool and build), each with the exact
verdict it decides.

Fast on purpose: these are the tests `make mutation` runs against forge_pack/evaluate/evaluator.py and
forge_pack/evaluate/judge.py (the evaluator tests in test_evaluate_cpu.py run the same code through
real workers and compiled kernels)."""

from __future__ import annotations

import random
import re
from pathlib import Path
from collections import OrderedDict
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from forge_pack.targets import abi, ops
from forge_pack.evaluate import memory_plan
from forge_pack.evaluate import evaluator as evaluate
from forge_pack.evaluate import judge
from forge_pack.evaluate import timing as timing_mod
from forge_pack.evaluate import verify
from forge_pack.evaluate import verdict_rules as rules
from forge_pack.core.candidate import Candidate, KernelLaunch, LaunchSpec, Workspace
from forge_pack.core.hotspot import Hotspot
from forge_pack.evaluate.launch import LaunchError
from forge_pack.targets.sigparse import parse_signature
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.core.verdict import Baseline, Timing, Verdict
from forge_pack.evaluate.worker import JobError, WorkerLost

SIG = ops.with_output(parse_signature("softmax", "x: f32[4,16], dim=-1"))
MOVED = abi.bytes_moved(SIG)  # 512 bytes


def cand(workspaces=(), backend="cpu") -> Candidate:
    return Candidate(op="softmax", backend=backend, source="// fake " + str(len(workspaces)),
                     spec=LaunchSpec(kernels=(KernelLaunch("k", ("x", "out")),), workspaces=tuple(workspaces)))


# ---------------------------------------------------------------- implausible


def T(median, clock="monotonic"):
    return Timing(median_us=median, iqr_us=0.0, n=5, clock=clock)


def test_implausible_after_a_flush_explains_the_floor_it_beats():
    cfg = TimingConfig()
    why = judge.implausible(T(1.0), 10.0, 51.2, SIG, cfg, cold=True, cache=1 << 20)
    assert why == (f"median 1.00 us is below 0.8x the bandwidth floor 10.00 us ({MOVED} bytes at 51 GB/s, after a "
                   f"cache flush): no kernel moves its bytes faster than a copy (work done outside the timed calls?)")


def test_implausible_is_exact_at_the_margin_for_the_monotonic_clock():
    cfg = TimingConfig()
    assert judge.implausible(T(8.0), 10.0, 1.0, SIG, cfg, True, 1) is None
    assert judge.implausible(T(7.99), 10.0, 1.0, SIG, cfg, True, 1) is not None


def test_implausible_forgives_cuda_events_half_a_microsecond():
    cfg = TimingConfig()
    assert judge.implausible(T(7.5, "cuda_events"), 10.0, 1.0, SIG, cfg, True, 1) is None
    assert judge.implausible(T(7.49, "cuda_events"), 10.0, 1.0, SIG, cfg, True, 1) is not None


def test_implausible_follows_the_configured_margin():
    cfg = TimingConfig(implausible_margin=0.5)
    assert judge.implausible(T(6.0), 10.0, 1.0, SIG, cfg, True, 1) is None
    why = judge.implausible(T(4.0), 10.0, 1.0, SIG, cfg, True, 1)
    assert why.startswith("median 4.00 us is below 0.5x the bandwidth floor 10.00 us")


def test_implausible_without_a_flush_judges_only_working_sets_far_beyond_the_cache():
    cfg = TimingConfig(implausible_uncached_factor=8.0)
    assert judge.implausible(T(1.0), 10.0, 1.0, SIG, cfg, cold=False, cache=MOVED // 8 + 1) is None
    why = judge.implausible(T(1.0), 10.0, 1.0, SIG, cfg, cold=False, cache=MOVED // 8)
    assert why == (f"median 1.00 us is below 0.8x the bandwidth floor 10.00 us ({MOVED} bytes at 1 GB/s, a working "
                   f"set of 8x the cache): no kernel moves its bytes faster than a copy (work done outside the "
                   f"timed calls?)")
    cfg4 = TimingConfig(implausible_uncached_factor=4.0)
    assert judge.implausible(T(1.0), 10.0, 1.0, SIG, cfg4, cold=False, cache=MOVED // 4) is not None
    assert judge.implausible(T(1.0), 10.0, 1.0, SIG, cfg4, cold=False, cache=MOVED // 4 + 1) is None


# ---------------------------------------------------------------- small helpers


def test_tail_keeps_short_texts_and_cuts_long_ones_at_the_end():
    assert evaluate._tail("abcdef", 6) == "abcdef"
    assert evaluate._tail("abcdefg", 6) == "...\nbcdefg"


def test_launch_verdict_takes_the_errors_own_reason():
    made = []

    def make(err, where=None):
        made.append(where)
        return verify.launch_error_verdict(err, where or "")

    v = judge._launch_verdict(LaunchError("boom", reason="out_of_bounds"), make, "loading")
    assert v == Verdict(False, "out_of_bounds", "loading: boom") and made == ["loading"]
    v = judge._launch_verdict(LaunchError("boom"), make)
    assert v == Verdict(False, "launch_error", "boom") and made[-1] is None
    assert judge._launch_verdict(RuntimeError("x"), make) == Verdict(False, "launch_error", "x")


# ---------------------------------------------------------------- fake module (CPU runner shape)


class FakeRun:
    """A bound CPU call: stage, retarget (fresh output per call), elapsed_s, like the sandbox's."""

    def __init__(self, module, tensors, guard=None):
        self.m, self.t, self.guard = module, dict(tensors), guard
        self.staged = 0

    def retarget(self, name, tensor, fresh=False):
        self.t[name] = tensor
        self.m.log.append(("retarget", name, fresh))

    def stage(self):
        self.staged += 1

    def elapsed_s(self):
        return 2e-6

    def __call__(self):
        self.m.calls += 1
        self.m.behave(self.t, self.m.calls, self)


class FakeModule:
    def __init__(self, behave=None, guard=False):
        self.behave = behave or honest
        self.calls, self.log, self.runs, self.closed = 0, [], [], 0
        self.supports_guard = guard
        self.settled = 0

    def bind(self, p, tensors, guard=None):
        r = FakeRun(self, tensors, guard)
        self.runs.append(r)
        return r

    def close(self):
        self.closed += 1

    def settle(self):
        self.settled += 1


def honest(t, n, run):
    t["out"].copy_(torch.softmax(t["x"], -1))


def base_set():
    return verify.fresh_sets(SIG, "cpu", 3, "hash", final=False)[0]


FAST = TimingConfig(warmup=2, reps=3, flush=False, rotate=2, compile_baseline=False)


# ---------------------------------------------------------------- time_candidate / _check_batch


def test_an_honest_kernel_is_timed_with_every_call_checked():
    m = FakeModule()
    timing, verdict = judge.time_candidate(m, cand(), SIG, base_set(), FAST, "cpu")
    assert verdict is None and timing.n == 3 and timing.clock == "monotonic"
    assert timing.min_us >= 2.0  # the runner's own clock plus the zeroing
    assert m.calls == 2 + 3 and len(m.runs) == 2  # two copies (rotate=2)
    assert all(e == ("retarget", "out", True) for e in m.log) and len(m.log) == 5


def test_the_copies_are_bounded_by_rotate():
    m = FakeModule()
    judge.time_candidate(m, cand(), SIG, base_set(), TimingConfig(warmup=1, reps=1, flush=False, rotate=3), "cpu")
    assert len(m.runs) == 3
    m = FakeModule()
    cfg = TimingConfig(warmup=1, reps=1, flush=False, rotate=3, rotate_max_bytes=MOVED + 64)
    judge.time_candidate(m, cand((Workspace("ws", "64"),)), SIG, base_set(), cfg, "cpu")
    assert len(m.runs) == 1  # the workspace bytes count too


def test_every_call_sees_one_element_of_x_changed_by_the_judge():
    seen = []

    def look(t, n, run):
        seen.append(t["x"].clone())
        honest(t, n, run)

    base = base_set()
    m = FakeModule(look)
    timing, verdict = judge.time_candidate(m, cand(), SIG, base, TimingConfig(warmup=1, reps=2, flush=False,
                                                                                rotate=1), "cpu")
    assert verdict is None
    rng = random.Random(verify.seed_for("timing", cand().content_hash, SIG.key()))
    x = base.tensors["x"].clone()
    sign = 1.0
    for got in seen:
        idx = tuple(rng.randrange(n) for n in x.shape)
        sign = -sign
        x[idx] = sign * (4.0 + 2.0 * rng.random())
        assert torch.equal(got, x)
    assert torch.equal(base.tensors["x"], base_set().tensors["x"])  # the verified set itself is untouched


def _spy_references(monkeypatch):
    """Every timed call's reference as the judge got it, beside the whole reference of the inputs that call had."""
    got = []
    real = judge._timed_reference

    def spy(sig, slot, changed, running):
        ref = real(sig, slot, changed, running)
        got.append((running, list(changed), ref.clone(), memory_plan.reference64(sig, slot["tensors"])))
        return ref

    monkeypatch.setattr(judge, "_timed_reference", spy)
    return got


def test_one_large_row_wise_copy_keeps_its_reference_and_recomputes_only_the_changed_rows(monkeypatch):
    """One copy of a row-wise signature whose reference is larger than a slice: the first check makes the
    reference whole, each later one recomputes the row the judge changed before the call; every
    reference the checks get is the whole reference of that call's inputs."""
    monkeypatch.setattr(memory_plan, "SLICE_BYTES", 64)  # SIG's reference (512 bytes) is "large"
    assert memory_plan.running_reference(SIG)
    base = base_set()
    whole, rows = [], []
    real_whole, real_rows = memory_plan.reference64, memory_plan.reference64_rows
    monkeypatch.setattr(memory_plan, "reference64", lambda sig, t, *a: whole.append(1) or real_whole(sig, t, *a))
    monkeypatch.setattr(memory_plan, "reference64_rows",
                        lambda sig, t, ref, r: rows.append(list(r)) or real_rows(sig, t, ref, r))
    got = _spy_references(monkeypatch)
    cfg = TimingConfig(warmup=2, reps=4, flush=False, rotate=1, compile_baseline=False)
    timing, verdict = judge.time_candidate(FakeModule(), cand(), SIG, base, cfg, "cpu")
    assert verdict is None and timing.n == 4 and len(got) == 6
    assert len(rows) == 5 and all(len(r) == 1 for r in rows)  # one changed row per later call
    assert len(whole) == 1 + 6  # the first check's, and the spy's own per call
    for running, changed, ref, want in got:
        assert running and len(changed) == 1
        torch.testing.assert_close(ref, want, rtol=1e-13, atol=1e-15)


def test_a_cached_result_is_caught_with_the_running_reference(monkeypatch):
    monkeypatch.setattr(memory_plan, "SLICE_BYTES", 64)
    first = {}

    def cached(t, n, run):
        if "out" not in first:
            first["out"] = torch.softmax(t["x"], -1)
        t["out"].copy_(first["out"])

    cfg = TimingConfig(warmup=2, reps=4, flush=False, rotate=1, compile_baseline=False)
    _, v = judge.time_candidate(FakeModule(cached), cand(), SIG, base_set(), cfg, "cpu")
    assert v.reason == "mismatch" and v.detail.startswith("call 2 of the timing loop (warm-up, copy 0)")


@pytest.mark.parametrize("rotate, slice_bytes", [(2, 64), (1, 1 << 26)])
def test_several_copies_or_a_small_reference_get_a_whole_reference_per_call(monkeypatch, rotate, slice_bytes):
    monkeypatch.setattr(memory_plan, "SLICE_BYTES", slice_bytes)
    got = _spy_references(monkeypatch)
    cfg = TimingConfig(warmup=1, reps=3, flush=False, rotate=rotate, compile_baseline=False)
    _, verdict = judge.time_candidate(FakeModule(), cand(), SIG, base_set(), cfg, "cpu")
    assert verdict is None and got and not any(running for running, *_ in got)
    for _, _, ref, want in got:
        assert torch.equal(ref, want)


def test_a_running_reference_is_only_for_row_wise_ops_larger_than_a_slice(monkeypatch):
    big = ops.with_output(parse_signature("softmax", "x: f32[4096,4096], dim=-1"))  # 128 MiB of float64
    assert memory_plan.running_reference(big)
    assert not memory_plan.running_reference(ops.with_output(parse_signature("softmax", "x: f32[4096,4096], dim=0")))
    assert not memory_plan.running_reference(SIG)  # 512 bytes: the whole reference is one slice
    monkeypatch.setattr(memory_plan, "SLICE_BYTES", 512)
    assert not memory_plan.running_reference(SIG)
    monkeypatch.setattr(memory_plan, "SLICE_BYTES", 511)
    assert memory_plan.running_reference(SIG)


def test_a_kernel_writing_its_input_while_timed_is_input_mutated():
    def writes(t, n, run):
        honest(t, n, run)
        if n == 2:
            t["x"][0, 0] = 123.0

    timing, v = judge.time_candidate(FakeModule(writes), cand(), SIG, base_set(), FAST, "cpu")
    assert v.reason == "input_mutated" and timing is None
    assert v.detail.startswith("call 2 of the timing loop (warm-up, copy 1): input `x` changed during the call "
                               "(1 elements, first at (0, 0): 123 vs")


def test_a_kernel_misbehaving_in_a_timed_batch_is_caught_with_the_calls_so_far():
    def late(t, n, run):
        honest(t, n, run)
        if n == 4:
            t["out"][1, 1] += 0.5

    timing, v = judge.time_candidate(FakeModule(late), cand(), SIG, base_set(), FAST, "cpu")
    assert (v.ok, v.reason) == (False, "mismatch") and timing.n == 2
    assert v.detail.startswith("call 4 of the timing loop (timed, copy 1): the output is wrong for its inputs (1 of "
                               "64 elements, ")
    assert v.detail.endswith("): the kernel behaves differently when timed (cached or skipped work?)")
    assert len(v.checks) == 1 and v.checks[0].input_kind == "timed[1]" and v.checks[0].mismatches == 1


def test_a_kernel_returning_a_cached_result_is_caught():
    first = {}

    def cached(t, n, run):
        if "out" not in first:
            first["out"] = torch.softmax(t["x"], -1)
        t["out"].copy_(first["out"])

    _, v = judge.time_candidate(FakeModule(cached), cand(), SIG, base_set(), FAST, "cpu")
    # copy 0's first call was computed from its own changed input; copy 1 gets copy 0's answer
    assert v.reason == "mismatch" and v.detail.startswith("call 2 of the timing loop (warm-up, copy 1)")


def test_a_timed_output_is_judged_with_the_sets_eager_allowance():
    base = base_set()
    base.atol_floor = 1.0

    def off(t, n, run):
        honest(t, n, run)
        t["out"][0, 0] += 0.5

    _, v = judge.time_candidate(FakeModule(off), cand(), SIG, base, FAST, "cpu")
    assert v is None


def test_a_timed_output_is_judged_by_the_ops_own_tolerance_row():
    x = torch.zeros(4, 16)
    x[0, 0] = -30.0  # a probability ~1e-13 there: softmax's row (atol 1e-8) does not forgive 5e-6
    base = verify.make_set("tiny", SIG, {"x": x}, "cpu")

    def off(t, n, run):
        honest(t, n, run)
        t["out"][0, 0] += 5e-6

    _, v = judge.time_candidate(FakeModule(off), cand(), SIG, base, FAST, "cpu")
    assert v is not None and v.reason == "mismatch"


def test_a_sentinel_left_in_a_timed_output_is_unwritten_output():
    def lazy(t, n, run):
        honest(t, n, run)
        if n == 3:
            rules.fill_sentinel(t["out"][2, 3:5])

    _, v = judge.time_candidate(FakeModule(lazy), cand(), SIG, base_set(), FAST, "cpu")
    assert (v.reason, v.detail) == ("unwritten_output", "call 3 of the timing loop (timed, copy 0): 2 of 64 output "
                                                        "elements not written (first at index (2, 3))")


WS = Workspace("ws", "64", False)
WZ = Workspace("wz", "32", True)


def whole_bytes(t):
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def test_a_workspace_overrun_while_timed_is_caught_and_canaries_reset():
    def overrun(t, n, run):
        honest(t, n, run)
        if n == 5:
            whole_bytes(t["wz"])[-1] = 0

    timing, v = judge.time_candidate(FakeModule(overrun), cand((WS, WZ)), SIG, base_set(), FAST, "cpu")
    assert (v.reason, v.detail) == ("mismatch", "call 5 of the timing loop (timed, copy 0): out-of-bounds write past "
                                                "the end of out or a workspace")


def test_a_canary_hit_once_is_reported_at_that_call_only():
    def once(t, n, run):
        honest(t, n, run)
        if n == 1:
            whole_bytes(t["ws"])[0] = 0

    _, v = judge.time_candidate(FakeModule(once), cand((WS, WZ)), SIG, base_set(), FAST, "cpu")
    assert v.detail.startswith("call 1 of the timing loop (warm-up, copy 0): out-of-bounds")


def test_timed_workspaces_are_zeroed_or_garbled_before_every_call():
    seen = []

    def look(t, n, run):
        seen.append((bool((t["wz"] == 0).all()), t["ws"].clone(), t["ws"].numel(), t["wz"].numel()))
        t["wz"].fill_(3)
        honest(t, n, run)

    timing, v = judge.time_candidate(FakeModule(look), cand((WS, WZ)), SIG, base_set(), FAST, "cpu")
    assert v is None
    assert all(z for z, _, _, _ in seen) and {(a, b) for _, _, a, b in seen} == {(64, 32)}
    assert not torch.equal(seen[0][1], seen[2][1])  # copy 0 gets new garbage between its calls
    gen = torch.Generator().manual_seed(verify.seed_for("timing-garbage", cand((WS, WZ)).content_hash, SIG.key()))
    assert torch.equal(seen[0][1], torch.empty(64, dtype=torch.uint8).random_(0, 256, generator=gen))


def test_zero_workspace_time_is_added_to_the_runners_clock(monkeypatch):
    ticks = iter([0.0, 0.25] * 100)
    monkeypatch.setattr(evaluate.time, "perf_counter", lambda: next(ticks))
    timing, v = judge.time_candidate(FakeModule(), cand((WS, WZ)), SIG, base_set(),
                                        TimingConfig(warmup=0, reps=2, flush=False, rotate=1), "cpu")
    assert v is None and timing.median_us == pytest.approx(0.25e6 + 2.0)


def test_a_timed_output_slot_is_a_fresh_allocation_per_call():
    ptrs = []

    def look(t, n, run):
        ptrs.append(t["out"])
        honest(t, n, run)

    judge.time_candidate(FakeModule(look), cand(), SIG, base_set(), FAST, "cpu")
    assert len({id(p) for p in ptrs}) == len(ptrs) == 5
    assert all(p.shape == (4, 16) and p.stride() == (16, 1) and p.dtype == torch.float32 for p in ptrs)


def test_allocating_stages_once_per_call_and_only_when_not_staged():
    m = FakeModule()
    run = m.bind(None, {"x": torch.randn(4, 16), "out": torch.empty(4, 16)})
    slot = {"called": False}
    call = judge._allocating(run, [], slot, SIG.output)
    call()  # not staged by the timer: stages itself
    assert run.staged == 1 and slot["called"] is True
    call.stage()
    call()
    assert run.staged == 2  # staged ahead by the timer: not again
    call()
    assert run.staged == 3
    assert slot["out"] is run.t["out"]


def test_marking_and_zeroing_wrappers_of_the_cuda_path():
    log = []
    z = torch.ones(4)
    slot = {"called": False}
    call = judge._marking(judge._with_zeroing(lambda: log.append(float(z.sum())), [z]), slot)
    call()
    assert log == [0.0] and slot["called"] is True
    plain = lambda: None  # noqa: E731
    assert judge._with_zeroing(plain, []) is plain


def test_before_timed_call_prefills_out_with_the_sentinel_in_even_batches_and_garbage_in_odd():
    x = torch.zeros(4, 16)
    out = torch.zeros(4, 16)
    g = torch.zeros(8, dtype=torch.uint8)
    slot = {"tensors": {"x": x}, "pending": []}
    state = {"batch": 0}
    before = judge._before_timed_call(slot, out, [g], random.Random(1), torch.Generator().manual_seed(2), state)
    before()
    assert rules.count_sentinel(out)[0] == 64 and int(g.to(torch.int64).sum()) > 0
    state["batch"] = 1
    before()
    assert rules.count_sentinel(out)[0] == 0 and bool(torch.isfinite(out).all())
    (i1, v1), (i2, v2) = slot["pending"]
    assert v1 < 0 < v2 and 4.0 <= abs(v1) <= 6.0 and 4.0 <= abs(v2) <= 6.0
    assert float(x[i2]) == pytest.approx(v2, rel=1e-6)


def test_the_judges_change_to_x_fills_the_elements_view_and_never_assigns_a_python_number(monkeypatch):
    """A Python number assigned to one element of a CUDA tensor is copied from the host and synchronises
    the stream: ahead of every timed call that drained the queue lead's spin. The change is a fill_ of
    the element's view (a kernel with the value as its argument); no __setitem__ on x or its shadow."""
    def refuse(self, key, value):
        raise AssertionError(f"x[{key}] = {value}: a host-to-device copy and a stream sync on CUDA")

    monkeypatch.setattr(torch.Tensor, "__setitem__", refuse)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    shadow = x.clone()
    out = torch.softmax(x, -1)
    slot = {"index": 0, "called": False, "tensors": {"x": x}, "shadow": {"x": shadow}, "pending": [], "out": out,
            "wholes": []}
    before = judge._before_timed_call(slot, None, [], random.Random(1), torch.Generator().manual_seed(2),
                                      {"batch": 0})
    before()
    (idx, value), = slot["pending"]
    assert float(x[idx]) == pytest.approx(value, rel=1e-6) and not torch.equal(x, shadow)
    out.copy_(torch.softmax(x, -1))
    slot["called"] = True
    assert judge._check_batch([slot], SIG, SimpleNamespace(atol_floor=0.0), "timed", {"calls": 0}) is None
    assert torch.equal(slot["shadow"]["x"], x)  # the shadow took the same change, by fill_ too


def test_check_batch_applies_the_judges_changes_to_the_shadow_and_skips_uncalled_slots():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    out = torch.softmax(x, -1)
    slot = {"index": 0, "called": True, "tensors": {"x": x}, "shadow": {"x": x.clone()}, "pending": [],
            "out": out, "wholes": []}
    idle = {"index": 1, "called": False}
    x[1, 1] = 5.0
    slot["pending"].append(((1, 1), 5.0))
    out.copy_(torch.softmax(x, -1))
    state = {"calls": 0}
    base = SimpleNamespace(atol_floor=0.0)
    assert judge._check_batch([slot, idle], SIG, base, "timed", state) is None
    assert state["calls"] == 1 and slot["called"] is False and slot["pending"] == []
    assert float(slot["shadow"]["x"][1, 1]) == 5.0
    assert "ref" not in slot  # no running flag: a whole reference for the call, none kept in the slot


def test_check_batch_ignores_an_absent_optional_input():
    x = torch.randn(4, 16)
    slot = {"index": 0, "called": True, "tensors": {"x": x, "weight": None},
            "shadow": {"x": x.clone(), "weight": None}, "pending": [], "out": torch.softmax(x, -1), "wholes": []}
    assert judge._check_batch([slot], SIG, SimpleNamespace(atol_floor=0.0), "timed", {"calls": 0}) is None


def _slot_off_by(delta: float, index: int = 0):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    out = torch.softmax(x, -1)
    out[0, 0] += delta
    return {"index": index, "called": True, "tensors": {"x": x}, "shadow": {"x": x.clone()}, "pending": [],
            "out": out, "wholes": []}


def _with_second_key(monkeypatch, key, eager_error: float):
    """Softmax given a second allowance key, and an eager whose own error at [0, 0] is ``eager_error``."""
    import dataclasses

    from forge_pack.evaluate import tolerance
    from forge_pack.targets import registry

    spec = dataclasses.replace(registry.get("softmax"), sensitivity=key)
    monkeypatch.setattr(tolerance, "spec_for", lambda op: spec if op is SIG else None)

    def eager(sig):
        assert sig is SIG

        def run(t):
            out = torch.softmax(t["x"], -1)
            out[0, 0] += eager_error
            return out
        return run

    monkeypatch.setattr(ops, "eager", eager)


def test_a_timed_output_failing_the_kinds_key_is_judged_again_under_the_second_key(monkeypatch):
    seen = []
    _with_second_key(monkeypatch, lambda t: seen.append(t["x"]) or torch.ones(4, 16, dtype=torch.float64), 0.4)
    state = {"calls": 0}
    slots = [_slot_off_by(0.5), _slot_off_by(0.5, 1)]
    assert judge._check_batch(slots, SIG, SimpleNamespace(atol_floor=0.0), "timed", state) is None
    # each call's own tensors (the judge changes one element of them per call)
    assert state["calls"] == 2 and len(seen) == 2 and all(a is s["tensors"]["x"] for a, s in zip(seen, slots))


@pytest.mark.parametrize("key,eager_error", [(None, 0.4), (1.0, 0.1)], ids=["no second key", "beyond eager"])
def test_a_timed_output_failing_both_keys_is_a_mismatch(monkeypatch, key, eager_error):
    _with_second_key(monkeypatch, lambda t: None if key is None else torch.full((4, 16), key, dtype=torch.float64),
                     eager_error)
    v = judge._check_batch([_slot_off_by(0.5)], SIG, SimpleNamespace(atol_floor=0.0), "timed", {"calls": 0})
    assert v is not None and v.reason == "mismatch" and "behaves differently when timed" in v.detail


# ---------------------------------------------------------------- check_bounds


def test_check_bounds_runs_once_flush_at_the_end_and_once_at_the_start():
    m = FakeModule()
    base = base_set()
    judge.check_bounds(m, cand((WS, Workspace("none", "0"))), base, "cpu")
    assert [r.guard for r in m.runs] == ["end", "start"] and m.calls == 2
    for r in m.runs:
        assert r.t["x"] is not base.tensors["x"] and torch.equal(r.t["x"], base.tensors["x"])
        assert r.t["out"].shape == (4, 16) and r.t["out"].stride() == (16, 1)
        assert r.t["ws"].numel() == 64 and bool((r.t["ws"] == 0).all()) and r.t["none"].numel() == 0


def test_check_bounds_lets_a_fault_escape_as_out_of_bounds():
    def faults(t, n, run):
        if run.guard == "start":
            raise LaunchError("SIGSEGV at the guard page", reason="out_of_bounds")

    with pytest.raises(LaunchError) as e:
        judge.check_bounds(FakeModule(faults), cand(), base_set(), "cpu")
    assert e.value.reason == "out_of_bounds"


def test_check_bounds_synchronises_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(a))
    monkeypatch.setattr(ops, "empty_like_spec", lambda spec, device: torch.empty(4, 16))
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: real_zeros(*a, dtype=k.get("dtype")))
    judge.check_bounds(FakeModule(), cand((WS,)), base_set(), "cuda")
    assert len(calls) == 2


# ---------------------------------------------------------------- judge (the JudgeCandidate job)


class FakeSession:
    def __init__(self, static=(), bw=10.0, healthy=True):
        self.device = "cpu"
        self.sets = OrderedDict()
        self.static = list(static)
        self.bw, self._healthy = bw, healthy
        self.loaded = []

    def load(self, inputs):
        self.loaded.append(inputs.key)
        self.sets.setdefault(inputs.key, (self.static, []))

    def healthy(self):
        return self._healthy

    def bandwidth(self, cfg):
        return self.bw


def request(c: Candidate, cfg=FAST, seed=3, final=False, bounds=False) -> judge.JudgeCandidate:
    """The job the parent sends for one candidate (inputs under key "k")."""
    inputs = judge.LoadInputs("k", SIG, seed=seed, final=final)
    return judge.JudgeCandidate(inputs, c, "/nowhere/k.so", cfg, bounds=bounds)


@pytest.fixture
def loaded(monkeypatch):
    """launch.load_module replaced: returns the module set in loaded['module'] and records the call."""
    from forge_pack.evaluate import launch

    box = {"module": FakeModule(), "calls": []}

    def load_module(backend, artifact, names, **kw):
        box["calls"].append((backend, artifact, tuple(names), kw))
        if isinstance(box["module"], Exception):
            raise box["module"]
        return box["module"]

    monkeypatch.setattr(launch, "load_module", load_module)
    monkeypatch.setattr(timing_mod, "cold_cache", lambda device, cfg: False)
    return box


def test_judge_verifies_times_and_reports_the_floor(loaded):
    from forge_pack.evaluate.sandbox import default_memory_cap

    s = FakeSession(bw=25.0)
    reply = judge.judge(s, request(cand()))
    v = reply.verdict
    assert (v.ok, v.reason) == (True, "ok") and v.detail.endswith("input sets verified")
    assert reply.floor_us == abi.floor_us(SIG, 25.0) and reply.copy_bandwidth_gbs == 25.0
    assert reply.timing.n == 3
    assert loaded["calls"] == [("cpu", "/nowhere/k.so", ("k",), {"memory_cap": default_memory_cap(MOVED)})]
    m = loaded["module"]
    assert m.closed == 1 and m.settled == 1 and reply.retire is False and reply.sets_dropped is False
    assert s.loaded == ["k"] and reply.attributes == {}


def test_judge_uses_the_configured_memory_cap(loaded):
    judge.judge(FakeSession(), request(cand(), TimingConfig(**{**FAST.to_json(), "cpu_memory_cap": 4096})))
    assert loaded["calls"][0][3] == {"memory_cap": 4096}


def test_judge_loads_a_cuda_module_without_a_cap(loaded):
    loaded["module"] = LaunchError("no device")
    reply = judge.judge(FakeSession(), request(cand(backend="cuda")))
    assert loaded["calls"][0][3] == {}
    assert reply.verdict == Verdict(False, "launch_error", "loading the module: no device")


def test_judge_verifies_sets_cheap_and_likely_failures_first(loaded, monkeypatch):
    kinds = []
    real = verify.verify

    def spy(module, c, sets, device):
        kinds.extend(s.kind.split("[")[0].split(":")[0] for s in sets)
        return real(module, c, sets, device)

    monkeypatch.setattr(verify, "verify", spy)
    static, _ = verify.static_sets(SIG, [], None, "cpu", 3, final=False)
    cap = verify.fresh_sets(SIG, "cpu", 9, "c", final=False)[0]
    cap.kind = "captured[0]"
    s = FakeSession(static=[cap] + static)
    judge.judge(s, request(cand()))
    order = ["fresh", "derived", "odd", "adversarial", "captured"]
    assert kinds == sorted(kinds, key=order.index) and set(kinds) == set(order)


def test_judge_derives_from_the_captured_sets(loaded, monkeypatch):
    got = []
    real = verify.derived_sets
    monkeypatch.setattr(verify, "derived_sets", lambda sig, dev, seed, h, final, sources: got.append(
        [x.kind for x in sources]) or real(sig, dev, seed, h, final, sources))
    cap = verify.fresh_sets(SIG, "cpu", 9, "c", final=False)[0]
    cap.kind = "captured[0]"
    odd = verify.fresh_sets(SIG, "cpu", 8, "c", final=False)[0]
    odd.kind = "odd:4x16"
    judge.judge(FakeSession(static=[odd, cap]), request(cand()))
    judge.judge(FakeSession(static=[odd]), request(cand()))
    assert got == [["captured[0]"], ["fresh[0]"]]


def test_judge_seeds_fresh_inputs_by_seed_hash_and_mode(loaded, monkeypatch):
    got = []
    real = verify.fresh_sets
    monkeypatch.setattr(verify, "fresh_sets", lambda *a, **k: got.append(a) or real(*a, **k))
    c = cand()
    judge.judge(FakeSession(), request(c, seed=11, final=True))
    judge.judge(FakeSession(), judge.JudgeCandidate(judge.LoadInputs("k", SIG), c, "/nowhere/k.so", FAST))
    assert got == [(SIG, "cpu", 11, c.content_hash, True), (SIG, "cpu", 0, c.content_hash, False)]


def test_judge_returns_the_verification_failure_untimed(loaded):
    def wrong(t, n, run):
        honest(t, n, run)
        t["out"][0, 0] = 3.0

    loaded["module"] = FakeModule(wrong)
    reply = judge.judge(FakeSession(), request(cand()))
    assert reply.verdict.reason == "mismatch"
    assert reply.timing is None and reply.floor_us is None and loaded["module"].closed == 1


def test_judge_reports_a_timing_failure_with_every_check(loaded):
    calls = []

    def late(t, n, run):
        calls.append(n)
        honest(t, n, run)
        if run.staged:  # only the timing loop stages its calls
            t["out"][0, 0] += 1.0

    loaded["module"] = FakeModule(late)
    reply = judge.judge(FakeSession(), request(cand()))
    v = reply.verdict
    assert (v.ok, v.reason) == (False, "mismatch") and "of the timing loop" in v.detail
    assert v.checks[-1].input_kind.startswith("timed[") and len(v.checks) > 1
    assert v.max_abs_err is not None and v.max_abs_err < 1e-3  # verification's errors, not the timed one


def test_judge_rejects_an_implausibly_fast_kernel(loaded, monkeypatch):
    monkeypatch.setattr(timing_mod, "cold_cache", lambda device, cfg: True)
    reply = judge.judge(FakeSession(bw=1e-9), request(cand()))
    v = reply.verdict
    assert (v.ok, v.reason) == (False, "implausible_speedup")
    assert v.detail.startswith("median ") and "after a cache flush" in v.detail
    assert v.checks and v.max_abs_err is not None and reply.timing is not None


def test_judge_judges_plausibility_with_the_machines_cache(loaded, monkeypatch):
    seen = []
    monkeypatch.setattr(timing_mod, "cold_cache", lambda device, cfg: seen.append(("cold", device, cfg)) or False)
    monkeypatch.setattr(timing_mod, "cache_bytes", lambda device: seen.append(("cache", device)) or 1)
    reply = judge.judge(FakeSession(bw=1e-9), request(cand()))
    assert reply.verdict.reason == "implausible_speedup"
    assert seen == [("cold", "cpu", FAST), ("cache", "cpu")]
    assert "a working set of 512x the cache" in reply.verdict.detail


def test_judge_runs_the_guard_page_check_when_final_or_asked(loaded):
    for kw, want in (({"final": True}, ["end", "start"]), ({"bounds": True}, ["end", "start"]), ({}, [])):
        loaded["module"] = FakeModule(guard=True)
        judge.judge(FakeSession(), request(cand(), **kw))
        assert [r.guard for r in loaded["module"].runs if r.guard] == want, kw
    loaded["module"] = FakeModule(guard=False)
    judge.judge(FakeSession(), request(cand(), final=True))
    assert [r.guard for r in loaded["module"].runs if r.guard] == []


def test_judge_turns_a_guard_page_fault_into_out_of_bounds(loaded):
    def faults(t, n, run):
        if run.guard:
            raise LaunchError("SIGSEGV", reason="out_of_bounds")
        honest(t, n, run)

    loaded["module"] = FakeModule(faults, guard=True)
    reply = judge.judge(FakeSession(), request(cand(), bounds=True))
    assert reply.verdict == Verdict(False, "out_of_bounds", "SIGSEGV")
    assert reply.retire is False and loaded["module"].closed == 1 and reply.timing is None


def test_a_sticky_launch_error_poisons_the_worker_and_leaves_the_module_open(loaded):
    def crashes(t, n, run):
        raise LaunchError("illegal address", sticky=True, reason="crash")

    loaded["module"] = FakeModule(crashes)
    reply = judge.judge(FakeSession(), request(cand()))
    assert reply.verdict == Verdict(False, "crash", "illegal address")
    assert reply.retire is True and loaded["module"].closed == 0


def test_a_launch_error_in_an_unhealthy_worker_poisons_it(loaded):
    loaded["module"] = FakeModule(lambda t, n, run: (_ for _ in ()).throw(LaunchError("bad launch")))
    reply = judge.judge(FakeSession(healthy=False), request(cand()))
    assert reply.retire is True and reply.verdict.reason == "launch_error"
    loaded["module"] = FakeModule(lambda t, n, run: (_ for _ in ()).throw(LaunchError("bad launch")))
    reply = judge.judge(FakeSession(healthy=True), request(cand()))
    assert reply.retire is False and loaded["module"].closed == 1


def test_a_sticky_load_error_poisons_only_an_unhealthy_worker(loaded):
    loaded["module"] = LaunchError("context lost", sticky=True)
    assert judge.judge(FakeSession(healthy=False), request(cand())).retire is True
    assert judge.judge(FakeSession(healthy=True), request(cand())).retire is False
    loaded["module"] = LaunchError("bad object", sticky=False)
    assert judge.judge(FakeSession(healthy=False), request(cand())).retire is False


def test_a_runtime_error_of_a_cpu_candidate_is_forge_packs_own(loaded):
    loaded["module"] = FakeModule(lambda t, n, run: (_ for _ in ()).throw(RuntimeError("CUDA error: none here")))
    with pytest.raises(RuntimeError):
        judge.judge(FakeSession(), request(cand()))
    assert loaded["module"].closed == 1


def test_an_asynchronous_cuda_fault_is_a_launch_error(loaded):
    loaded["module"] = FakeModule(lambda t, n, run: (_ for _ in ()).throw(RuntimeError("CUDA error: illegal address")))
    reply = judge.judge(FakeSession(healthy=False), request(cand(backend="cuda")))
    assert reply.verdict == Verdict(False, "launch_error", "CUDA error: illegal address")
    assert reply.retire is True and loaded["module"].closed == 0
    loaded["module"] = FakeModule(lambda t, n, run: (_ for _ in ()).throw(RuntimeError("CUDA error: x")))
    reply = judge.judge(FakeSession(healthy=True), request(cand(backend="cuda")))
    assert reply.retire is False and loaded["module"].closed == 1


def test_a_cuda_runtime_error_without_cuda_in_it_is_raised_from_a_healthy_worker(loaded):
    loaded["module"] = FakeModule(lambda t, n, run: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError):
        judge.judge(FakeSession(healthy=True), request(cand(backend="cuda")))
    loaded["module"] = FakeModule(lambda t, n, run: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    reply = judge.judge(FakeSession(healthy=False), request(cand(backend="cuda")))
    assert reply.verdict.reason == "launch_error"


def test_judge_reports_cuda_attributes(loaded):
    m = FakeModule()
    m.attributes = lambda: {"k": {"registers": 32}}
    loaded["module"] = m
    reply = judge.judge(FakeSession(), request(cand(backend="cuda")))
    assert reply.attributes == {"k": {"registers": 32}}


def test_a_write_into_a_cached_set_outside_the_calls_is_input_mutated(loaded):
    static, _ = verify.static_sets(SIG, [], None, "cpu", 3, final=False)
    m = FakeModule()
    m.settle = lambda: static[0].tensors["x"].view(-1).__setitem__(0, 77.0)
    loaded["module"] = m
    s = FakeSession(static=static)
    reply = judge.judge(s, request(cand()))
    v = reply.verdict
    assert (v.ok, v.reason, v.detail) == (False, "input_mutated", "a cached input set changed during the evaluation "
                                                                  "(its content fingerprint differs afterwards)")
    assert reply.sets_dropped is True and "k" not in s.sets and v.checks and v.max_abs_err is not None


def test_a_stray_write_after_a_failed_verdict_keeps_the_verdict_and_drops_the_sets(loaded):
    static, _ = verify.static_sets(SIG, [], None, "cpu", 3, final=False)

    def wrong(t, n, run):
        t["out"].zero_()

    m = FakeModule(wrong)
    m.settle = lambda: static[0].tensors["x"].view(-1).__setitem__(0, 77.0)
    loaded["module"] = m
    reply = judge.judge(FakeSession(static=static), request(cand()))
    assert reply.verdict.reason == "mismatch" and reply.sets_dropped is True


# ---------------------------------------------------------------- measure_baseline (the MeasureBaseline job)


def test_measure_baseline_times_eager_and_reports_the_floor(monkeypatch):
    s = FakeSession(bw=40.0)
    s.torch = torch
    b = judge.measure_baseline(s, judge.MeasureBaseline(SIG, FAST, seed=1))
    assert b.eager.n == 3 and b.compiled is None and b.compile_error == ""
    assert (b.floor_us, b.copy_bandwidth_gbs) == (abi.floor_us(SIG, 40.0), 40.0)


def test_measure_baseline_times_eager_over_rotating_copies_of_seeded_inputs(monkeypatch):
    got = []

    def fake_time_calls(calls, device, cfg, flusher=None):
        got.append((len(calls), device, cfg, type(flusher).__name__, [c() for c in calls]))
        return Timing(5.0, 0.0, 3)

    monkeypatch.setattr(timing_mod, "time_calls", fake_time_calls)
    s = FakeSession()
    s.torch = torch
    cfg = TimingConfig(**{**FAST.to_json(), "rotate": 3})
    judge.measure_baseline(s, judge.MeasureBaseline(SIG, cfg, seed=4))
    (n, device, got_cfg, flusher, outs), = got
    assert (n, device, got_cfg, flusher) == (3, "cpu", cfg, "Flusher")
    gen = torch.Generator().manual_seed(verify.seed_for(4, "baseline", SIG.key()))
    x = ops.make_inputs(SIG, "fresh", gen, "cpu")["x"]
    assert all(torch.equal(o, torch.softmax(x, -1)) for o in outs)


def test_measure_baseline_times_torch_compile_and_records_its_failure(monkeypatch):
    s = FakeSession()
    s.torch = torch
    modes = []

    def fake_compile(fn, mode=None, dynamic=None):
        modes.append((mode, dynamic))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = TimingConfig(**{**FAST.to_json(), "compile_baseline": True})
    b = judge.measure_baseline(s, judge.MeasureBaseline(SIG, cfg))
    assert b.compiled is not None and b.compiled.n == 3 and modes == [("max-autotune-no-cudagraphs", False)]

    def broken(fn, mode=None, dynamic=None):
        def call(t):
            raise RuntimeError("inductor: " + "e" * 3000)
        return call

    monkeypatch.setattr(torch, "compile", broken)
    b = judge.measure_baseline(s, judge.MeasureBaseline(SIG, cfg))
    assert b.compiled is None and b.compile_error == "RuntimeError: " + ("inductor: " + "e" * 3000)[:2000]


def test_measure_baseline_keeps_the_parents_compile_error():
    s = FakeSession()
    s.torch = torch
    b = judge.measure_baseline(s, judge.MeasureBaseline(SIG, FAST, compile_error="torch.compile: hung"))
    assert b.compile_error == "torch.compile: hung"


# ---------------------------------------------------------------- the parent-side Evaluator


class FakeWorker:
    """One worker of the pool: records each job with its timeout and answers the next result."""

    def __init__(self, pool):
        self.pool, self.memo = pool, {}
        self.backend, self.index, self.generation = pool.backend, 0, 3

    @property
    def loaded(self) -> OrderedDict:
        """The parent's mirror of the hotspot sets this worker holds (the evaluator keeps it in memo)."""
        return self.memo.setdefault("loaded", OrderedDict())

    def run(self, job, timeout):
        self.pool.requests.append((job, timeout))
        return self.pool.replies.pop(0)


class FakePool:
    def __init__(self, backend, workers, startup, log_dir):
        assert isinstance(startup, judge.Startup)
        self.backend, self.workers, self.log_dir = backend, workers, log_dir
        self.requests, self.replies, self.closed = [], [], 0
        self.worker = FakeWorker(self)
        self.info_calls = 0

    @contextmanager
    def acquire(self):
        yield self.worker

    def info(self):
        self.info_calls += 1
        return {"arch": "sm_90", "name": "fake"}

    def close(self):
        self.closed += 1


class FakeBuild:
    def __init__(self, ok=True, log="built", resources=None):
        self.ok, self.log, self.cmd, self.compile_s = ok, log, "g++ -O3", 1.5
        self.cached, self.path, self.resources = False, "/tmp/k.so", resources or {}


HOT = Hotspot(signature=parse_signature("softmax", "x: f32[4,16], dim=-1"), call_paths=("F.softmax",),
              calls_per_forward=1.0, total_us=1.0, per_call_us=1.0, time_share=1.0, captures=("c/0.safetensors",))
HID = HOT.id


@pytest.fixture
def ev(monkeypatch):
    from forge_pack.evaluate import object_check, static_check

    monkeypatch.setattr(evaluate, "WorkerPool", FakePool)
    box = {"build": FakeBuild(), "compiled": []}

    def compile_candidate(c, arch=None, cache_dir=None):
        box["compiled"].append((arch, cache_dir))
        return box["build"]

    monkeypatch.setattr(evaluate, "compile_candidate", compile_candidate)
    monkeypatch.setattr(object_check, "check_build", lambda build: None)
    monkeypatch.setattr(static_check, "check", lambda c, sig: None)
    e = evaluate.Evaluator("cpu", seed=7, run_dir="/runs/r1", timing=FAST, cache_dir="/cache", timeout_s=12.0,
                           load_timeout_s=34.0, baseline_timeout_s=56.0)
    e.box = box
    return e


LOADED = judge.Loaded(())


def ok_reply(median=2.0, floor_us=1.0, **kw):
    return judge.Judged(Verdict(True, "ok", "3 input sets verified"), Timing(median, 0.0, 3), floor_us, 9.0, **kw)


def test_evaluator_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        evaluate.Evaluator("tpu")


def test_evaluator_logs_workers_under_the_run_dir(ev):
    assert ev.pool.log_dir == "/runs/r1/workers" and ev.pool.backend == "cpu" and ev.pool.workers == 1
    assert ev.run_dir == "/runs/r1"


def test_evaluator_without_a_run_dir_keeps_no_worker_logs(monkeypatch):
    monkeypatch.setattr(evaluate, "WorkerPool", FakePool)
    e = evaluate.Evaluator("cpu", workers=3)
    assert e.pool.log_dir is None and e.run_dir is None and e.pool.workers == 3
    e2 = evaluate.Evaluator("cpu", log_dir="/logs")
    assert e2.pool.log_dir == "/logs"
    with e2 as same:
        assert same is e2
    assert e2.pool.closed == 1


def test_evaluate_loads_the_inputs_once_then_evaluates_with_the_full_request(ev):
    ev.pool.replies = [judge.Loaded((), ("odd:3x5: why",)), ok_reply(), ok_reply()]
    c = cand()
    e1 = ev.evaluate(c, HOT, final=True, bounds=True)
    e2 = ev.evaluate(c, HOT, final=True)
    (load, t_load), (req, t_req), (req2, _) = ev.pool.requests
    key = f"{HID}|final|c/0.safetensors|/runs/r1"
    assert load == judge.LoadInputs(key, ev.signature(HOT), ("c/0.safetensors",), "/runs/r1", 7, True)
    assert t_load == 34.0 and t_req == pytest.approx(12.0)  # a 512-byte signature adds nothing to see
    assert req == judge.JudgeCandidate(load, c, "/tmp/k.so", FAST, True)
    assert req2 == judge.JudgeCandidate(load, c, "/tmp/k.so", FAST, False)
    assert e1.extra["skipped_sets"] == ["odd:3x5: why"] and "skipped_sets" not in e2.extra
    assert e1.extra["worker"] == "cpu-0.3" and e1.extra["cached_build"] is False
    assert (e1.compile_s, e1.compile_log, e1.compile_cmd) == (1.5, "built", "g++ -O3")
    assert ev.box["compiled"] == [(None, "/cache"), (None, "/cache")]


def test_evaluate_search_key_and_mode(ev):
    ev.pool.replies = [LOADED, ok_reply()]
    ev.evaluate(cand(), HOT)
    assert ev.pool.requests[0][0].key == f"{HID}|search|c/0.safetensors|/runs/r1"
    assert ev.pool.requests[0][0].final is False


def test_evaluate_reports_a_failed_load_as_an_internal_error(ev):
    ev.pool.replies = [JobError("Traceback: boom")]
    e = ev.evaluate(cand(), HOT)
    assert e.verdict.reason == "internal_error"
    assert e.verdict.detail.startswith("RuntimeError: loading the inputs of softmax(") and "boom" in e.verdict.detail
    ev.pool.replies = [WorkerLost("timeout", "slow")]
    e = ev.evaluate(cand(), HOT)
    assert e.verdict.reason == "internal_error" and "failed: slow" in e.verdict.detail


def test_evaluate_computes_speedups_and_the_bandwidth_fraction(ev):
    ev.pool.replies = [LOADED, ok_reply(median=2.0), ok_reply(median=4.0)]
    base = Baseline(Timing(10.0, 0.0, 3), Timing(5.0, 0.0, 3))
    e = ev.evaluate(cand(), HOT, baseline=base)
    assert (e.speedup_vs_eager, e.speedup_vs_compile, e.bandwidth_fraction) == (5.0, 2.5, 0.5)
    assert e.timing == Timing(2.0, 0.0, 3) and e.verdict.ok
    assert e.extra["floor_us"] == 1.0 and e.extra["copy_bandwidth_gbs"] == 9.0 and e.extra["attributes"] == {}
    ev._baselines[HID] = Baseline(Timing(8.0, 0.0, 3), None)
    e = ev.evaluate(cand(), HOT)  # the cached baseline, no compiled time
    assert (e.speedup_vs_eager, e.speedup_vs_compile, e.bandwidth_fraction) == (2.0, None, 0.25)


def test_evaluate_without_timing_or_floor_has_no_figures(ev):
    ev.pool.replies = [LOADED, judge.Judged(Verdict(False, "mismatch", "bad")),
                       ok_reply(floor_us=None)]
    base = Baseline(Timing(10.0, 0.0, 3), None)
    e = ev.evaluate(cand(), HOT, baseline=base)
    assert e.timing is None and e.speedup_vs_eager is None and e.bandwidth_fraction is None
    assert e.verdict == Verdict(False, "mismatch", "bad")
    e = ev.evaluate(cand(), HOT, baseline=base)
    assert e.bandwidth_fraction is None and e.speedup_vs_eager == 5.0


def test_evaluate_reports_a_timeout_and_a_crash(ev):
    ev.pool.replies = [LOADED, WorkerLost("timeout", "t"), WorkerLost("crash", "worker killed by SIGSEGV", "log line\n" * 400)]
    e = ev.evaluate(cand(), HOT)
    assert e.verdict == Verdict(False, "timeout", "no verdict within 12 s (endless loop or far too slow); the worker "
                                                  "was killed and replaced")
    assert e.extra["worker"] == "cpu-0.3" and e.compile_cmd == "g++ -O3"
    e = ev.evaluate(cand(), HOT)
    assert e.verdict.reason == "crash"
    assert e.verdict.detail.startswith("worker killed by SIGSEGV while running the candidate\n...\n")
    assert len(e.verdict.detail) == len("worker killed by SIGSEGV while running the candidate\n...\n") + 2000


def test_the_judge_limit_grows_with_the_signatures_data(ev):
    """A GB-scale signature gets 10 s per GB of its inputs and output on top of --timeout: verifying a
    12.8 GB softmax honestly takes longer than 60 s (every evaluation of it timed out on an H100)."""
    big = Hotspot(signature=parse_signature("softmax", "x: f32[4096,393216], dim=1"), call_paths=("F.softmax",),
                  calls_per_forward=1.0, total_us=1.0, per_call_us=1.0, time_share=1.0, captures=())
    data = abi.bytes_moved(ev.signature(big))
    assert data == 2 * 4096 * 393216 * 4
    ev.pool.replies = [LOADED, ok_reply(), LOADED, WorkerLost("timeout", "t")]
    ev.evaluate(cand(), HOT)
    e = ev.evaluate(cand(), big)
    limits = [t for job, t in ev.pool.requests if isinstance(job, judge.JudgeCandidate)]
    assert limits[0] == pytest.approx(12.0 + 10.0 * MOVED / 1e9)  # 512 bytes: the limit is --timeout's
    assert limits[1] == pytest.approx(12.0 + 10.0 * data / 1e9) and 140 < limits[1] < 141
    assert e.verdict.reason == "timeout"
    assert e.verdict.detail.startswith("no verdict within 141 s (12 s + 10 s per GB of the signature's data) "
                                       "(endless loop or far too slow)")
    assert [t for job, t in ev.pool.requests if isinstance(job, judge.LoadInputs)] == [34.0, 34.0]


def test_the_judge_limit_is_exactly_the_base_plus_its_per_gb_share_and_says_so_from_half_a_second():
    from forge_pack.evaluate import evaluator

    sig = ops.with_output(parse_signature("softmax", "x: f32[4096,393216], dim=1"))
    data = abi.bytes_moved(sig)
    assert evaluator.judge_timeout_s(12.0, sig) == 12.0 + evaluator.JUDGE_S_PER_GB * data / 1e9
    assert evaluator._limit_text(12.0, 12.4) == "12 s"  # under half a second added: the base alone
    for limit in (12.5, 13.0):
        assert evaluator._limit_text(12.0, limit) == f"{limit:.0f} s (12 s + 10 s per GB of the signature's data)"


def test_evaluate_reports_a_worker_error_as_launch_or_internal_error(ev):
    ev.pool.replies = [LOADED, JobError("x" * 5000, retire=True), JobError("oops")]
    e = ev.evaluate(cand(), HOT)
    assert e.verdict.reason == "launch_error" and e.verdict.detail == "...\n" + "x" * 4000
    e = ev.evaluate(cand(), HOT)
    assert e.verdict == Verdict(False, "internal_error", "oops") and e.extra["worker"] == "cpu-0.3"


def test_evaluate_forgets_loaded_sets_the_worker_dropped_and_keeps_the_rest_fresh(ev):
    ev.pool.replies = [LOADED, ok_reply(sets_dropped=True), LOADED, ok_reply()]
    ev.evaluate(cand(), HOT)
    assert ev.pool.worker.loaded == OrderedDict()
    ev.pool.worker.loaded["other"] = True
    ev.evaluate(cand(), HOT)
    assert [type(r[0]).__name__ for r in ev.pool.requests] == ["LoadInputs", "JudgeCandidate", "LoadInputs",
                                                              "JudgeCandidate"]
    assert list(ev.pool.worker.loaded) == ["other", f"{HID}|search|c/0.safetensors|/runs/r1"]
    ev.pool.worker.loaded.move_to_end(f"{HID}|search|c/0.safetensors|/runs/r1", last=False)
    ev.pool.replies = [ok_reply()]
    ev.evaluate(cand(), HOT)
    assert list(ev.pool.worker.loaded)[-1] == f"{HID}|search|c/0.safetensors|/runs/r1"  # most recently used last


def test_evaluate_takes_resources_from_the_attributes_when_the_log_has_none(ev):
    attrs = {"k": {"registers": 40, "static_smem_bytes": 1024, "local_bytes": 8}}
    ev.pool.replies = [LOADED, ok_reply(attributes=attrs, retire=True), ok_reply(attributes={"k": {}})]
    e = ev.evaluate(cand(), HOT)
    assert e.extra["resources"] == {"k": {"registers": 40, "smem_bytes": 1024, "stack_bytes": 8,
                                          "source": "cuFuncGetAttribute"}}
    assert e.extra["worker_replaced"] is True
    e = ev.evaluate(cand(), HOT)
    assert e.extra["resources"] == {"k": {"registers": 0, "smem_bytes": 0, "stack_bytes": 0,
                                          "source": "cuFuncGetAttribute"}}
    assert "worker_replaced" not in e.extra
    ev.box["build"] = FakeBuild(resources={"k": {"registers": 12}})
    ev.pool.replies = [ok_reply(attributes=attrs)]
    assert ev.evaluate(cand(), HOT).extra["resources"] == {"k": {"registers": 12}}


def test_evaluate_stops_at_the_static_check_compile_error_or_object_check(ev, monkeypatch):
    from forge_pack.evaluate import object_check, static_check

    monkeypatch.setattr(static_check, "check", lambda c, sig: Verdict(False, "static_check", "bad spec"))
    e = ev.evaluate(cand(), HOT)
    assert e.verdict == Verdict(False, "static_check", "bad spec") and ev.box["compiled"] == []
    monkeypatch.setattr(static_check, "check", lambda c, sig: None)
    ev.box["build"] = FakeBuild(ok=False, log="e" * 5000)
    e = ev.evaluate(cand(), HOT)
    assert e.verdict == Verdict(False, "compile_error", "...\n" + "e" * 4000)
    assert e.extra == {"cached_build": False} and e.compile_log == "e" * 5000
    ev.box["build"] = FakeBuild()
    monkeypatch.setattr(object_check, "check_build", lambda b: Verdict(False, "static_check", "calls system"))
    e = ev.evaluate(cand(), HOT)
    assert e.verdict == Verdict(False, "static_check", "calls system") and e.extra == {"cached_build": False}
    assert ev.pool.requests == []


def test_evaluate_records_its_own_faults_as_internal_errors(ev, monkeypatch):
    from forge_pack.evaluate import static_check

    monkeypatch.setattr(static_check, "check", lambda c, sig: 1 / 0)
    e = ev.evaluate(cand(), HOT)
    assert e.verdict.reason == "internal_error" and e.verdict.detail.startswith("ZeroDivisionError: division by zero\n")
    assert "Traceback" in e.verdict.detail and e.eval_s >= 0.0


def test_evaluate_passes_the_cuda_arch_to_the_compiler(monkeypatch):
    monkeypatch.setattr(evaluate, "WorkerPool", FakePool)
    e = evaluate.Evaluator("cuda")
    assert e.arch == "sm_90" and evaluate.Evaluator("cpu").arch == ""


def test_device_info_is_asked_once_and_carries_the_copy_bandwidth(ev):
    assert ev.device_info() == {"arch": "sm_90", "name": "fake"}
    ev._baselines[HID] = Baseline(Timing(1.0, 0.0, 3), None, copy_bandwidth_gbs=321.0)
    assert ev.device_info() == {"arch": "sm_90", "name": "fake", "copy_bandwidth_gbs": 321.0}
    assert ev.pool.info_calls == 1


def test_signature_is_filled_and_cached(ev):
    s = ev.signature(HOT)
    assert s.output is not None and s.output.shape == (4, 16) and ev.signature(HOT) is s


def test_baseline_is_requested_once_per_hotspot(ev):
    b = Baseline(Timing(3.0, 0.0, 3), None, floor_us=1.0)
    ev.pool.replies = [b]
    assert ev.baseline(HOT) == b and ev.baseline(HOT) == b
    (req, timeout), = ev.pool.requests
    assert req == judge.MeasureBaseline(ev.signature(HOT), FAST, 7)
    assert timeout == 56.0


def test_baseline_falls_back_to_eager_alone_when_torch_compile_hangs(monkeypatch):
    monkeypatch.setattr(evaluate, "WorkerPool", FakePool)
    cfg = TimingConfig(compile_baseline=True)
    e = evaluate.Evaluator("cpu", timing=cfg)
    b = Baseline(Timing(3.0, 0.0, 3), None)
    e.pool.replies = [WorkerLost("timeout", "no reply in 1800 s"), b]
    assert e.baseline(HOT) == b
    (first, _), (second, _) = e.pool.requests
    assert first == judge.MeasureBaseline(e.signature(HOT), cfg, 0)
    assert second == judge.MeasureBaseline(e.signature(HOT), TimingConfig(compile_baseline=False), 0,
                                           "torch.compile: no reply in 1800 s")


def test_baseline_gives_up_after_the_second_failure_or_without_compile(monkeypatch):
    monkeypatch.setattr(evaluate, "WorkerPool", FakePool)
    e = evaluate.Evaluator("cpu", timing=TimingConfig(compile_baseline=True))
    e.pool.replies = [WorkerLost("crash", "died"), WorkerLost("crash", "died again")]
    with pytest.raises(RuntimeError, match=r"baseline of softmax\(.*\) failed: died again"):
        e.baseline(HOT)
    e = evaluate.Evaluator("cpu", timing=TimingConfig(compile_baseline=False))
    e.pool.replies = [WorkerLost("timeout", "slow")]
    with pytest.raises(RuntimeError, match="failed: slow"):
        e.baseline(HOT)
    assert len(e.pool.requests) == 1


def test_baseline_error_reply_is_raised_with_the_workers_text(ev):
    ev.pool.replies = [JobError("Traceback: eager failed")]
    with pytest.raises(RuntimeError, match="failed in the worker:\nTraceback: eager failed"):
        ev.baseline(HOT)


# ---------------------------------------------------------------- exact inputs and figures


class Clock:
    """perf_counter for evaluate: t0 = 100.0, every later reading 100.25."""

    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1
        return 100.0 if self.n == 1 else 100.25


def test_every_evaluation_records_its_own_duration(ev, monkeypatch):
    from forge_pack.evaluate import object_check, static_check

    def run(replies, **patch):
        ev.pool.replies = list(replies)
        monkeypatch.setattr(evaluate.time, "perf_counter", Clock())
        return ev.evaluate(cand(), HOT)

    assert run([LOADED, ok_reply()]).eval_s == 0.25
    assert run([WorkerLost("timeout", "t")]).eval_s == 0.25
    e = run([WorkerLost("crash", "gone", "tail")])
    assert (e.eval_s, e.verdict.ok, e.compile_cmd) == (0.25, False, "g++ -O3") and e.extra["worker"] == "cpu-0.3"
    e = run([JobError("bad")])
    assert (e.eval_s, e.compile_cmd) == (0.25, "g++ -O3")
    monkeypatch.setattr(object_check, "check_build", lambda b: Verdict(False, "static_check", "x"))
    e = run([])
    assert (e.eval_s, e.compile_cmd) == (0.25, "g++ -O3")
    ev.box["build"] = FakeBuild(ok=False)
    assert run([]).eval_s == 0.25
    monkeypatch.setattr(static_check, "check", lambda c, sig: Verdict(False, "static_check", "y"))
    assert run([]).eval_s == 0.25
    monkeypatch.setattr(static_check, "check", lambda c, sig: 1 / 0)
    e = run([])
    assert e.eval_s == 0.25 and e.verdict.ok is False


def test_evaluate_checks_and_builds_this_candidate_for_the_workers_arch(monkeypatch):
    from forge_pack.evaluate import object_check, static_check

    monkeypatch.setattr(evaluate, "WorkerPool", FakePool)
    seen = []
    monkeypatch.setattr(static_check, "check", lambda c, sig: seen.append(("static", c, sig.output is not None)))
    build = FakeBuild(ok=False)
    monkeypatch.setattr(evaluate, "compile_candidate", lambda c, arch=None, cache_dir=None: seen.append(
        ("compile", c, arch)) or build)
    monkeypatch.setattr(object_check, "check_build", lambda b: seen.append(("object", b)))
    c = cand(backend="cuda")
    e = evaluate.Evaluator("cuda")
    e.evaluate(c, HOT)
    assert seen == [("static", c, True), ("compile", c, "sm_90")]
    build.ok = True
    e.pool.replies = [LOADED, ok_reply()]
    e.evaluate(c, HOT)
    assert seen[-1] == ("object", build)


def test_evaluator_defaults():
    pool = evaluate.WorkerPool
    try:
        evaluate.WorkerPool = FakePool
        e = evaluate.Evaluator("cpu")
    finally:
        evaluate.WorkerPool = pool
    assert (e.timeout_s, e.seed, e.load_timeout_s, e.baseline_timeout_s) == (60.0, 0, 900.0, 1800.0)


def test_the_set_key_joins_every_capture(ev):
    import dataclasses

    hot = dataclasses.replace(HOT, captures=("c/0.safetensors", "c/1.safetensors"))
    ev.pool.replies = [LOADED, ok_reply()]
    e = ev.evaluate(cand(), hot)
    assert ev.pool.requests[0][0].key == f"{HID}|search|c/0.safetensors/c/1.safetensors|/runs/r1"
    assert e.extra["skipped_sets"] == []


def test_signatures_are_cached_per_hotspot(ev):
    import dataclasses

    other = dataclasses.replace(HOT, signature=parse_signature("softmax", "x: f32[8,16], dim=-1"))
    assert ev.signature(HOT).x.shape == (4, 16) and ev.signature(other).x.shape == (8, 16)


def test_an_internal_error_keeps_the_last_3000_characters_of_the_traceback(ev, monkeypatch):
    from forge_pack.evaluate import static_check

    def fails(c, sig):
        raise ValueError("v" * 5000)

    monkeypatch.setattr(static_check, "check", fails)
    d = ev.evaluate(cand(), HOT).verdict.detail
    head = "ValueError: " + "v" * 5000 + "\n"
    assert d.startswith(head) and len(d) == len(head) + 3000


LNS = ops.with_output(parse_signature("layer_norm", "x: f32[4,16], weight: f32[16], normalized_shape=[16], eps=1e-5"))


def ln_set():
    s = verify.fresh_sets(LNS, "cpu", 3, "h", final=False)[0]
    assert "bias" in s.tensors and s.tensors["bias"] is None
    return s


def ln_honest(t, n, run):
    t["out"].copy_(torch.nn.functional.layer_norm(t["x"], (16,), t["weight"], t["bias"], 1e-5))


def ln_cand():
    return Candidate(op="layer_norm", backend="cpu", source="// ln", spec=LaunchSpec(
        kernels=(KernelLaunch("k", ("x", "weight", "bias", "out")),)))


def test_an_absent_optional_input_stays_absent_in_timing_and_bounds():
    m = FakeModule(ln_honest)
    timing, v = judge.time_candidate(m, ln_cand(), LNS, ln_set(), FAST, "cpu")
    assert v is None and all(r.t["bias"] is None for r in m.runs)
    m = FakeModule(ln_honest)
    judge.check_bounds(m, ln_cand(), ln_set(), "cpu")
    assert all(r.t["bias"] is None for r in m.runs)


def test_the_baseline_of_an_op_with_an_absent_input_and_the_default_seed(monkeypatch):
    s = FakeSession()
    s.torch = torch
    got = []
    monkeypatch.setattr(timing_mod, "time_calls", lambda calls, device, cfg, flusher=None: got.append(
        [c() for c in calls]) or Timing(1.0, 0.0, 1))
    judge.measure_baseline(s, judge.MeasureBaseline(LNS, FAST))
    gen = torch.Generator().manual_seed(verify.seed_for(0, "baseline", LNS.key()))
    x = ops.make_inputs(LNS, "fresh", gen, "cpu")
    want = torch.nn.functional.layer_norm(x["x"], (16,), x["weight"], None, 1e-5)
    assert torch.equal(got[0][0], want)


def test_the_compiled_baseline_is_timed_like_eager_with_one_copy(monkeypatch):
    s = FakeSession()
    s.torch = torch
    cfgs = []
    s.bandwidth = lambda cfg: cfgs.append(cfg) or 10.0
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, dynamic=None: fn)
    seen = []
    real = timing_mod.time_calls

    def spy(calls, device, cfg, flusher=None):
        seen.append((device, type(flusher).__name__, [c() is not None for c in calls]))
        return real(calls, device, cfg, flusher)

    monkeypatch.setattr(timing_mod, "time_calls", spy)
    cfg = TimingConfig(**{**FAST.to_json(), "compile_baseline": True, "rotate": 1})
    b = judge.measure_baseline(s, judge.MeasureBaseline(SIG, cfg))
    assert b.compiled is not None and b.compile_error == ""
    assert seen == [("cpu", "Flusher", [True]), ("cpu", "Flusher", [True])]
    assert cfgs == [cfg]


def test_judge_loads_a_cuda_module_by_backend_artifact_and_names(loaded):
    loaded["module"].attributes = lambda: {}
    judge.judge(FakeSession(), request(cand(backend="cuda")))
    assert loaded["calls"][0][:3] == ("cuda", "/nowhere/k.so", ("k",))


def test_judge_derives_with_its_seed_hash_and_mode(loaded, monkeypatch):
    got = []
    real = verify.derived_sets
    monkeypatch.setattr(verify, "derived_sets", lambda *a: got.append(a[:5]) or real(*a))
    c = cand()
    judge.judge(FakeSession(), request(c, seed=5, final=True))
    assert got == [(SIG, "cpu", 5, c.content_hash, True)]


def test_a_module_without_guard_support_or_settle_is_still_judged(loaded):
    class Plain:
        def __init__(self):
            self.inner = FakeModule()

        def bind(self, p, tensors, guard=None):
            assert guard is None
            return self.inner.bind(p, tensors)

        def close(self):
            pass

    loaded["module"] = Plain()
    reply = judge.judge(FakeSession(), request(cand(), final=True))
    assert reply.verdict.ok


def test_judge_with_cached_sets_passes_an_honest_kernel(loaded):
    static, _ = verify.static_sets(SIG, [], None, "cpu", 3, final=False)
    reply = judge.judge(FakeSession(static=static), request(cand()))
    assert reply.verdict.ok and reply.sets_dropped is False


def test_judge_asks_the_session_for_bandwidth_with_the_config(loaded):
    s = FakeSession()
    cfgs = []
    s.bandwidth = lambda cfg: cfgs.append(cfg) or 10.0
    judge.judge(s, request(cand()))
    assert cfgs == [FAST]


def test_failed_verdicts_keep_both_error_figures(loaded, monkeypatch):
    def late(t, n, run):
        honest(t, n, run)
        if run.staged:
            t["out"][0, 0] += 1.0

    loaded["module"] = FakeModule(late)
    v = judge.judge(FakeSession(), request(cand())).verdict
    assert v.max_rel_err is not None and v.max_abs_err is not None
    monkeypatch.setattr(timing_mod, "cold_cache", lambda device, cfg: True)
    loaded["module"] = FakeModule(late)
    v = judge.judge(FakeSession(bw=1e-9), request(cand())).verdict
    assert v.reason == "mismatch"  # a timing failure is not re-judged as implausible
    loaded["module"] = FakeModule()
    v = judge.judge(FakeSession(bw=1e-9), request(cand())).verdict
    assert v.reason == "implausible_speedup" and v.max_rel_err is not None
    static, _ = verify.static_sets(SIG, [], None, "cpu", 3, final=False)
    m = FakeModule()
    m.settle = lambda: static[0].tensors["x"].view(-1).__setitem__(0, 77.0)
    loaded["module"] = m
    monkeypatch.setattr(timing_mod, "cold_cache", lambda device, cfg: False)
    v = judge.judge(FakeSession(static=static), request(cand())).verdict
    assert v.reason == "input_mutated" and v.max_rel_err is not None


def test_failed_batch_checks_are_not_ok():
    def writes(t, n, run):
        honest(t, n, run)
        t["x"][0, 0] = 9.0

    _, v = judge.time_candidate(FakeModule(writes), cand(), SIG, base_set(), FAST, "cpu")
    assert v.ok is False

    def overrun(t, n, run):
        honest(t, n, run)
        whole_bytes(t["ws"])[0] = 0

    _, v = judge.time_candidate(FakeModule(overrun), cand((WS,)), SIG, base_set(), FAST, "cpu")
    assert v.ok is False

    def lazy(t, n, run):
        honest(t, n, run)
        rules.fill_sentinel(t["out"][0, :1])

    _, v = judge.time_candidate(FakeModule(lazy), cand(), SIG, base_set(), FAST, "cpu")
    assert v.ok is False


def test_check_batch_goes_on_past_a_slot_that_was_not_called():
    x = torch.randn(4, 16)
    bad = {"index": 1, "called": True, "tensors": {"x": x}, "shadow": {"x": x + 1}, "pending": [],
           "out": torch.softmax(x, -1), "wholes": []}
    v = judge._check_batch([{"index": 0, "called": False}, bad], SIG, SimpleNamespace(atol_floor=0.0), "timed",
                              {"calls": 0})
    assert v is not None and v.reason == "input_mutated"


def test_a_copy_not_yet_called_is_not_checked():
    m = FakeModule()
    timing, v = judge.time_candidate(m, cand(), SIG, base_set(), TimingConfig(warmup=1, reps=1, flush=False,
                                                                                  rotate=2), "cpu")
    assert v is None and timing.n == 1


def test_the_workspace_bytes_count_toward_the_copies():
    m = FakeModule()
    cfg = TimingConfig(warmup=1, reps=1, flush=False, rotate=3, rotate_max_bytes=2 * (MOVED + 64) - 1)
    judge.time_candidate(m, cand((Workspace("ws", "64"),)), SIG, base_set(), cfg, "cpu")
    assert len(m.runs) == 1


def test_a_zero_byte_workspace_gets_one_guarded_byte():
    seen = []

    def look(t, n, run):
        seen.append(t["none"].numel())
        honest(t, n, run)

    judge.time_candidate(FakeModule(look), cand((Workspace("none", "0"),)), SIG, base_set(), FAST, "cpu")
    assert set(seen) == {1}


def test_timed_module_is_bound_with_the_plan():
    from forge_pack.evaluate.launch import Plan

    plans = []

    class Recording(FakeModule):
        def bind(self, p, tensors, guard=None):
            plans.append(p)
            return super().bind(p, tensors, guard)

    judge.time_candidate(Recording(), cand(), SIG, base_set(), FAST, "cpu")
    judge.check_bounds(Recording(), cand(), base_set(), "cpu")
    assert plans and all(isinstance(p, Plan) and p.launches[0].name == "k" for p in plans)


def test_bounds_workspaces_are_bytes():
    m = FakeModule()
    judge.check_bounds(m, cand((WS,)), base_set(), "cpu")
    assert all(r.t["ws"].dtype == torch.uint8 for r in m.runs)


def test_cpu_timing_garbage_stream_is_only_workspace_bytes():
    seen = []

    def look(t, n, run):
        seen.append(t["ws"].clone())
        honest(t, n, run)

    c = cand((WS,))
    judge.time_candidate(FakeModule(look), c, SIG, base_set(), FAST, "cpu")
    gen = torch.Generator().manual_seed(verify.seed_for("timing-garbage", c.content_hash, SIG.key()))
    draws = [torch.empty(64, dtype=torch.uint8).random_(0, 256, generator=gen) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(seen[:3], draws))


def test_before_timed_call_alternates_prefill_by_batch_parity_with_seeded_garbage():
    out = torch.zeros(4, 16)
    slot = {"tensors": {"x": torch.zeros(4, 16)}, "pending": []}
    state = {"batch": 1}
    g = torch.zeros(8, dtype=torch.uint8)
    before = judge._before_timed_call(slot, out, [g], random.Random(1), torch.Generator().manual_seed(2), state)
    before()
    want = torch.empty(4, 16).normal_(generator=torch.Generator().manual_seed(2))
    assert torch.equal(out, want)
    state["batch"] = 2
    before()
    assert rules.count_sentinel(out)[0] == 64


def test_allocating_makes_outputs_in_the_specs_dtype():
    spec = ops.with_output(parse_signature("softmax", "x: bf16[4,16], dim=-1")).output
    m = FakeModule()
    run = m.bind(None, {"x": torch.randn(4, 16), "out": torch.empty(4, 16)})
    slot = {"called": False}
    call = judge._allocating(run, [], slot, spec)
    call.stage()
    assert slot["out"].dtype == torch.bfloat16 and slot["out"].shape == (4, 16)


# ---------------------------------------------------------------- the worker's Session and the jobs' entry points


def test_a_cpu_session_starts_empty_and_takes_its_threads_from_the_environment(monkeypatch):
    monkeypatch.setenv("FORGE_PACK_THREADS", "1")
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    s = judge.Session("cpu")
    assert (s.torch, s.backend, s.device, s.copy_bw) == (torch, "cpu", "cpu", None)
    assert s.sets == OrderedDict() and isinstance(s.sets, OrderedDict) and calls == [1]
    monkeypatch.delenv("FORGE_PACK_THREADS")
    judge.Session("cpu")
    assert calls == [1]
    c = judge.Session("cuda")
    assert (c.backend, c.device) == ("cuda", "cuda") and calls == [1]


def test_a_cpu_session_says_hello_with_its_backend_pid_torch_and_threads():
    import os

    assert judge.Session("cpu").hello() == {"backend": "cpu", "pid": os.getpid(), "torch": torch.__version__,
                                            "name": "cpu", "threads": torch.get_num_threads()}


def test_the_sessions_bandwidth_is_measured_once_with_the_config(monkeypatch):
    got = []
    monkeypatch.setattr(timing_mod, "copy_bandwidth_gbs", lambda device, cfg: got.append((device, cfg)) or 12.5)
    s = judge.Session("cpu")
    assert s.bandwidth(FAST) == 12.5 and s.bandwidth(FAST) == 12.5
    assert got == [("cpu", FAST)] and s.copy_bw == 12.5


def test_the_session_loads_each_key_once_and_keeps_the_two_most_recent(monkeypatch):
    calls = []

    def static_sets(sig, captures, run_dir, device, seed, final):
        calls.append((sig, captures, run_dir, device, seed, final))
        return [SimpleNamespace(kind=f"captured[{len(calls)}]")], [f"odd: skipped {len(calls)}"]

    monkeypatch.setattr(verify, "static_sets", static_sets)
    s = judge.Session("cpu")
    a = judge.LoadInputs("a", SIG, ("c/0.safetensors",), "/runs/r", 5, True)
    assert s.load(a) == judge.Loaded(("captured[1]",), ("odd: skipped 1",))
    assert calls == [(SIG, ["c/0.safetensors"], "/runs/r", "cpu", 5, True)]
    assert s.load(a) == judge.Loaded(("captured[1]",), ("odd: skipped 1",)) and len(calls) == 1
    s.load(judge.LoadInputs("b", SIG))
    s.load(a)  # touched: "b" is now the oldest
    s.load(judge.LoadInputs("c", SIG))
    assert list(s.sets) == ["a", "c"] and judge.Session.MAX_CACHED == 2


def test_a_cpu_session_is_always_healthy_and_a_cuda_one_only_if_it_still_computes(monkeypatch):
    assert judge.Session("cpu").healthy() is True
    s = judge.Session("cuda")
    fake = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None),
                           ones=lambda n, device=None: torch.ones(n))
    s.torch = fake
    assert s.healthy() is True
    fake.ones = lambda n, device=None: torch.zeros(n)  # 0 + 1 != 2: the context computes garbage
    assert s.healthy() is False

    def lost():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    fake.cuda.synchronize = lost
    assert s.healthy() is False


def test_the_jobs_share_one_session_per_worker_created_on_first_use(monkeypatch):
    from forge_pack.evaluate.worker import Context

    ctx = Context("cpu")
    hello = judge.Startup().run(ctx)
    s = ctx.state["session"]
    assert isinstance(s, judge.Session) and s.backend == "cpu" and hello == s.hello()
    seen = []
    monkeypatch.setattr(judge.Session, "load", lambda self, inputs: seen.append(("load", self, inputs)) or "L")
    monkeypatch.setattr(judge.Session, "healthy", lambda self: seen.append(("healthy", self)) or False)
    monkeypatch.setattr(judge, "judge", lambda session, job: seen.append(("judge", session, job)) or "J")
    monkeypatch.setattr(judge, "measure_baseline", lambda session, job: seen.append(("base", session, job)) or "B")
    inputs = judge.LoadInputs("k", SIG)
    job = judge.JudgeCandidate(inputs, cand(), "/a.so", FAST)
    base = judge.MeasureBaseline(SIG, FAST)
    assert inputs.run(ctx) == "L" and job.run(ctx) == "J" and base.run(ctx) == "B"
    assert job.usable_after_error(ctx) is False
    assert seen == [("load", s, inputs), ("judge", s, job), ("base", s, base), ("healthy", s)]
    assert ctx.state["session"] is s


def test_a_job_before_startup_creates_the_session_for_the_workers_backend(monkeypatch):
    from forge_pack.evaluate.worker import Context

    ctx = Context("cuda")
    monkeypatch.setattr(judge, "measure_baseline", lambda session, job: session)
    s = judge.MeasureBaseline(SIG, FAST).run(ctx)
    assert isinstance(s, judge.Session) and s.backend == "cuda" and ctx.state == {"session": s}


# ---------------------------------------------------------------- the timed calls' allowance magnitude


POOL = ops.with_output(parse_signature("adaptive_avg_pool2d", "x: f32[2,3,8,8], output_size=[1,1]"))


def test_a_timed_pool_output_is_judged_by_the_kinds_magnitude_not_its_reference():
    """Means of +-4 (|result| near 0, mean |x| = 4) and a table that allows 1.0 only from magnitude 2
    up: an error of 0.5 passes when looked up by mean |x| and would fail by |result|."""
    base = verify.fresh_sets(POOL, "cpu", 3, "hash", final=False)[0]
    x = torch.full((2, 3, 8, 8), 4.0)
    x.view(-1)[1::2] = -4.0
    base.tensors["x"].copy_(x)
    table = torch.zeros(2048, dtype=torch.float64)
    table[(torch.tensor(2.0, dtype=torch.float64).view(torch.int64) >> 52).item():] = 1.0
    base.atol_floor = table
    c = Candidate(op="adaptive_avg_pool2d", backend="cpu", source="// pool",
                  spec=LaunchSpec(kernels=(KernelLaunch("k", ("x", "out")),)))

    def off(t, n, run):
        t["out"].copy_(torch.nn.functional.adaptive_avg_pool2d(t["x"], (1, 1)) + 0.5)

    timing, verdict = judge.time_candidate(FakeModule(off), c, POOL, base, FAST, "cpu")
    assert verdict is None and timing.n == 3

    def way_off(t, n, run):
        t["out"].copy_(torch.nn.functional.adaptive_avg_pool2d(t["x"], (1, 1)) + 1.5)

    _, verdict = judge.time_candidate(FakeModule(way_off), c, POOL, base, FAST, "cpu")
    assert (verdict.ok, verdict.reason) == (False, "mismatch")


# ---------------------------------------------------------------- what the worker reports and keeps (exact values)


class FakeDriver:
    """launch.Driver's two calls hello makes, recorded."""

    def __init__(self, asked):
        self.asked = asked

    def ensure_context(self):
        self.asked.append("context")

    def device_attribute(self, attr):
        from forge_pack.evaluate.launch import DEV_SMEM_OPTIN

        self.asked.append(("attribute", attr))
        return {DEV_SMEM_OPTIN: 232448}[attr]


def cuda_session(monkeypatch, props, asked):
    from forge_pack.evaluate import launch

    monkeypatch.setattr(launch.Driver, "get", classmethod(lambda cls: FakeDriver(asked)))
    s = judge.Session("cuda")

    def get_device_properties(index):
        asked.append(("properties", index))
        return props

    s.torch = SimpleNamespace(__version__="2.99.0", version=SimpleNamespace(cuda="12.8"),
                              cuda=SimpleNamespace(get_device_properties=get_device_properties))
    return s


def test_a_cuda_session_says_hello_with_device_zeros_properties(monkeypatch):
    import os

    from forge_pack.evaluate.launch import DEV_SMEM_OPTIN

    asked = []
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                            total_memory=150_000_000_000, L2_cache_size=62_914_560)
    s = cuda_session(monkeypatch, props, asked)
    assert s.hello() == {"backend": "cuda", "pid": os.getpid(), "torch": "2.99.0", "name": "NVIDIA H200",
                         "capability": "9.0", "arch": "sm_90", "sm_count": 132, "memory_bytes": 150_000_000_000,
                         "l2_bytes": 62_914_560, "smem_optin_bytes": 232448, "cuda": "12.8"}
    assert asked == [("properties", 0), "context", ("attribute", DEV_SMEM_OPTIN)]


def test_a_cuda_session_reports_no_l2_as_zero_bytes(monkeypatch):
    props = SimpleNamespace(name="old", major=7, minor=5, multi_processor_count=40, total_memory=1)
    assert cuda_session(monkeypatch, props, []).hello()["l2_bytes"] == 0  # torch without the field
    props.L2_cache_size = None
    assert cuda_session(monkeypatch, props, []).hello()["l2_bytes"] == 0
    props.L2_cache_size = 0
    assert cuda_session(monkeypatch, props, []).hello()["l2_bytes"] == 0


def test_a_cuda_sessions_health_probe_computes_on_the_gpu():
    s = judge.Session("cuda")
    devices = []

    def ones(n, device=None):
        devices.append(device)
        return torch.ones(n)

    s.torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None), ones=ones)
    assert s.healthy() is True and devices == ["cuda"]  # a CPU tensor would say nothing about the context


def test_the_session_streams_the_sets_of_a_hotspot_too_large_to_cache(monkeypatch):
    from forge_pack.evaluate import memory_plan

    asked, made = [], []

    class Stream:
        def __init__(self, *args):
            made.append(args)
            self.skipped = ["odd:1x1: too small"]

    monkeypatch.setattr(memory_plan, "cache_static", lambda sig, n: asked.append((sig, n)) or False)
    monkeypatch.setattr(verify, "StaticStream", Stream)
    s = judge.Session("cpu")
    got = s.load(judge.LoadInputs("big", SIG, ("c/0.safetensors", "c/1.safetensors"), "/runs/r", 5, True))
    # two captures and softmax's three adversarial kinds: five static sets asked about
    assert asked == [(SIG, 2 + len(ops.get_op("softmax").adversarial_kinds(SIG)))] and asked[0][1] == 5
    assert made == [(SIG, ["c/0.safetensors", "c/1.safetensors"], "/runs/r", "cpu", 5, True)]
    stream, skipped = s.sets["big"]
    assert isinstance(stream, Stream) and skipped is stream.skipped
    assert got == judge.Loaded((), ("odd:1x1: too small",))  # a stream holds no sets to name


def test_the_baseline_rotates_copies_against_the_devices_cache_and_flushes_that_device(monkeypatch):
    caches, flushed, counted = [], [], []

    class Flusher:
        def __init__(self, device, cfg):
            flushed.append((device, cfg))

        def __call__(self):
            pass

    monkeypatch.setattr(timing_mod, "rotation_cache", lambda device: caches.append(device) or 1)
    real_count = timing_mod.rotation_count
    monkeypatch.setattr(timing_mod, "rotation_count",
                        lambda b, cfg, cache=0: counted.append((b, cache)) or real_count(b, cfg, cache))
    monkeypatch.setattr(timing_mod, "Flusher", Flusher)
    monkeypatch.setattr(timing_mod, "time_calls", lambda calls, device, cfg, flusher=None: Timing(len(calls), 0.0, 3))
    real_make = ops.make_inputs
    monkeypatch.setattr(ops, "make_inputs", lambda sig, kind, gen, device: caches.append(("inputs", device)) or
                        real_make(sig, kind, gen, device))
    s = FakeSession()
    s.torch = torch
    cfg = TimingConfig(**{**FAST.to_json(), "rotate": 3})
    b = judge.measure_baseline(s, judge.MeasureBaseline(SIG, cfg, seed=4))
    # a copy of 512 bytes is far beyond a 1-byte cache: one copy, where 3 would be timed otherwise
    assert caches == [("inputs", "cpu"), "cpu"] and counted == [(MOVED, 1)] and b.eager.median_us == 1
    assert flushed == [("cpu", cfg)]


def test_device_info_names_a_worker_that_did_not_start_with_its_logs_tail(ev):
    tail = "a" * 100 + "b" * 2000
    ev.pool.info = lambda: WorkerLost("start", "exit code 1", tail)
    with pytest.raises(RuntimeError) as e:
        ev.device_info()
    assert str(e.value) == "the cpu worker did not start: exit code 1\n...\n" + "b" * 2000


def test_a_failed_load_reports_the_workers_traceback_or_what_it_answered(ev):
    ev.pool.replies = [JobError("Traceback (most recent call last): boom")]
    e = ev.evaluate(cand(), HOT)
    assert "failed:\nTraceback (most recent call last): boom\n" in e.verdict.detail
    ev.pool.replies = ["an answer of the wrong type"]
    e = ev.evaluate(cand(), HOT)
    assert e.verdict.reason == "internal_error"
    assert e.verdict.detail.startswith(f"RuntimeError: loading the inputs of {ev.signature(HOT).pretty()} failed:\n"
                                       "an answer of the wrong type\n")


def test_an_evaluation_records_the_device_of_a_labelled_worker(ev):
    ev.pool.worker.device = "cuda:3"
    ev.pool.replies = [LOADED, ok_reply()]
    assert ev.evaluate(cand(), HOT).extra["device"] == "cuda:3"
    ev.pool.worker.device = ""
    ev.pool.replies = [ok_reply()]
    assert "device" not in ev.evaluate(cand(), HOT).extra


def test_touch_keeps_the_most_recently_loaded_hotspots_and_evicts_the_oldest():
    loaded = OrderedDict()
    for key in ("a", "b", "c"):
        evaluate._touch(loaded, key)
    assert list(loaded) == ["b", "c"]
    evaluate._touch(loaded, "b")
    evaluate._touch(loaded, "d")
    assert list(loaded) == ["b", "d"]


def test_an_evaluator_uses_the_pool_it_is_given(monkeypatch):
    monkeypatch.setattr(evaluate, "WorkerPool", FakePool)
    given = FakePool("cpu", 1, judge.Startup(), None)
    assert evaluate.Evaluator("cpu", pool=given).pool is given


def test_an_evaluation_names_the_devices_its_job_was_lost_with(ev):
    from forge_pack.evaluate.device_pool import DeviceLost

    w = ev.pool.worker
    w.device = "cuda:1"
    real_run = w.run

    def run(job, timeout):
        reply = real_run(job, timeout)
        if isinstance(reply, Exception):
            raise reply
        return reply

    w.run = run
    ev.pool.replies = [LOADED, DeviceLost("the GPU fell off the bus"), ok_reply()]
    e = ev.evaluate(cand(), HOT)
    assert (e.verdict.ok, e.extra["requeued_from"], e.extra["device"]) == (True, ["cuda:1"], "cuda:1")


def test_the_workspace_bytes_of_a_spec_that_cannot_be_planned_are_zero():
    assert judge._workspace_bytes(cand((WS, WZ)), SIG) == 64 + 32
    negative = Workspace("ws", "-8")  # plan() refuses it: verification will say why
    assert judge._workspace_bytes(cand((negative,)), SIG) == 0


def test_check_bounds_allocates_the_workspaces_and_out_on_the_evaluations_device(monkeypatch):
    devices = []
    base = base_set()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(ops, "empty_like_spec", lambda spec, device: devices.append(("out", spec, device))
                        or torch.empty(4, 16))
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: devices.append(("ws", k.get("device"))) or
                        real_zeros(*a, dtype=k.get("dtype")))
    judge.check_bounds(FakeModule(), cand((WS,)), base, "cuda")
    assert devices == [("ws", "cuda"), ("out", SIG.output, "cuda")] * 2


def test_judge_refuses_a_candidate_that_cannot_fit_before_allocating(loaded, monkeypatch):
    from forge_pack.evaluate import memory_plan

    asked = []
    monkeypatch.setattr(memory_plan, "free_bytes", lambda device: asked.append(("free", device)) or 1000)
    monkeypatch.setattr(memory_plan, "fits", lambda sig, free, ws: asked.append(("fits", sig, free, ws)) or
                        "needs 2 GB, 1000 bytes free")
    monkeypatch.setattr(verify, "fresh_sets", lambda *a, **k: pytest.fail("inputs drawn for a refused candidate"))
    reply = judge.judge(FakeSession(), request(cand((WS, WZ))))
    assert reply == judge.Judged(Verdict(False, "out_of_memory", "needs 2 GB, 1000 bytes free"))
    assert asked == [("free", "cpu"), ("fits", SIG, 1000, 64 + 32)] and loaded["module"].closed == 1


class Stream:
    """A hotspot's static sets as judge sees them when too large to cache (verify.StaticStream)."""

    def __init__(self, sets=(), captures=()):
        self.sets, self.captures, self.skipped = list(sets), list(captures), []

    def capture(self, i):
        return verify.fresh_sets(SIG, "cpu", 11, f"capture{i}", final=False)[0].tensors

    def source(self, i):  # verify.StaticStream.source: the capture's tensors, from host memory where kept
        return self.capture(i)

    def __iter__(self):
        return iter(self.sets)


def test_judge_streams_a_large_hotspots_sets_and_draws_the_timed_input_again(loaded, monkeypatch):
    odd = verify.fresh_sets(SIG, "cpu", 9, "odd", final=False)[0]
    odd.kind = "odd:4x8"
    derived_asked, drawn, verified = [], [], []
    real_derived, real_fresh = verify.iter_derived_sets, verify.fresh_inputs

    def iter_derived_sets(sig, device, seed, h, final, count, source):
        derived_asked.append((sig, device, seed, h, final, count))
        return real_derived(sig, device, seed, h, final, count, source)

    def fresh_inputs(sig, device, seed, h, final, i=None):
        if i is None:  # judge's own draw (fresh_sets passes the set's index)
            drawn.append((sig, device, seed, h, final))
        return real_fresh(sig, device, seed, h, final, i or 0)

    def spy(module, c, sets, device):
        for s in sets:
            verified.append((s.kind, getattr(s, "streamed", False)))
        return Verdict(True, "ok", f"{len(verified)} input sets verified")

    monkeypatch.setattr(verify, "iter_derived_sets", iter_derived_sets)
    monkeypatch.setattr(verify, "fresh_inputs", fresh_inputs)
    monkeypatch.setattr(verify, "verify", spy)
    s = FakeSession()
    s.sets["k"] = (Stream([odd]), [])
    c = cand()
    reply = judge.judge(s, request(c, seed=3))
    assert (reply.verdict.ok, reply.timing.n) == (True, 3)
    # the timed set first, then the sets derived from it, then the stream's own (each made when asked for)
    assert verified == [("fresh[0]", True)] + [(f"derived:{k}", True) for k in ops.DERIVED_KINDS] + [("odd:4x8", False)]
    # derived from the fresh set alone (no captures), with the evaluation's seed, hash and mode
    assert derived_asked == [(SIG, "cpu", 3, c.content_hash, False, 1)]
    # the timed input was dropped while the other sets were verified, and is drawn again the same way
    assert drawn == [(SIG, "cpu", 3, c.content_hash, False)]
    assert s.sets["k"][0].sets == [odd] and not reply.sets_dropped  # a stream has no fingerprints to check


def test_an_allocation_failure_while_judging_is_out_of_memory_and_the_worker_goes_on(loaded, monkeypatch):
    from forge_pack.evaluate import memory_plan

    released = []
    monkeypatch.setattr(memory_plan, "release", lambda device: released.append(device))
    err = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 TB. " + "x" * 600
    loaded["module"] = FakeModule(lambda t, n, run: (_ for _ in ()).throw(RuntimeError(err)))
    s = FakeSession(bw=25.0)
    reply = judge.judge(s, request(cand()))
    detail = reply.verdict.detail
    assert reply == judge.Judged(Verdict(False, "out_of_memory", detail), None, None, None, {}, False, False)
    # the message cut at 500 characters, then where in forge_pack the call that failed was made
    assert detail.startswith(f"an allocation failed while evaluating {SIG.pretty()}: {err[:500]} [in verify.py:")
    # innermost first, the judge outermost (under mutmut the judge's frame is its trampoline's original)
    assert re.search(r" <- judge\.py:\d+ (x_)?judge(__mutmut_orig)?\]$", detail), detail
    assert released == ["cpu"] and loaded["module"].closed == 1
    s._healthy = False  # and a worker that can no longer compute is retired
    assert judge.judge(s, request(cand())).retire is True


def test_judge_hands_the_sessions_device_to_every_stage(loaded, monkeypatch):
    seen = []
    real_verify = verify.verify

    def spy_verify(module, c, sets, device):
        seen.append(("verify", device))
        return real_verify(module, c, sets, device)

    monkeypatch.setattr(verify, "verify", spy_verify)
    monkeypatch.setattr(judge, "check_bounds", lambda module, c, base, device: seen.append(("bounds", device)))
    monkeypatch.setattr(judge, "time_candidate", lambda module, c, sig, base, cfg, device, own_base=False:
                        seen.append(("time", device, own_base)) or (Timing(3.0, 0.0, 3), None))
    loaded["module"] = FakeModule(guard=True)
    reply = judge.judge(FakeSession(), request(cand(), bounds=True))
    assert reply.verdict.ok and seen == [("verify", "cpu"), ("bounds", "cpu"), ("time", "cpu", False)]


def test_judge_runs_the_guard_page_check_only_for_a_module_that_supports_it(loaded, monkeypatch):
    ran = []
    monkeypatch.setattr(judge, "check_bounds", lambda *a: ran.append(a))
    loaded["module"] = FakeModule(guard=False)
    assert judge.judge(FakeSession(), request(cand(), final=True)).verdict.ok and ran == []
    loaded["module"] = FakeModule(guard=True)
    assert judge.judge(FakeSession(), request(cand(), final=True)).verdict.ok and len(ran) == 1


def test_judge_times_a_parked_timed_input_copied_back_from_the_host(loaded, monkeypatch):
    from forge_pack.evaluate import memory_plan

    drawn, timed = [], []
    monkeypatch.setattr(memory_plan, "park_on_host", lambda device: True)
    real_fresh = verify.fresh_inputs
    monkeypatch.setattr(verify, "fresh_inputs", lambda *a: real_fresh(*a) if len(a) == 6 else drawn.append(a))
    monkeypatch.setattr(verify, "verify", lambda module, c, sets, device: [None for _ in sets] and
                        Verdict(True, "ok", "verified"))
    monkeypatch.setattr(judge, "time_candidate", lambda module, c, sig, base, cfg, device, own_base=False:
                        timed.append((dict(base.tensors), own_base)) or (Timing(3.0, 0.0, 3), None))
    s = FakeSession()
    s.sets["k"] = (Stream(), [])
    c = cand()
    assert judge.judge(s, request(c, seed=3)).verdict.ok
    want = verify.fresh_sets(SIG, "cpu", 3, c.content_hash, final=False)[0].tensors
    (tensors, own_base), = timed
    assert own_base is True and drawn == [] and list(tensors) == list(want)
    assert all(torch.equal(tensors[n], want[n]) for n in want)


# ---------------------------------------------------------------- the timing loop's CUDA wiring, on CPU tensors


@pytest.fixture
def as_cuda(monkeypatch):
    """time_candidate with device "cuda" on CPU tensors: what it asks for which device is recorded,
    and time_calls is a plain loop (one untimed-prepared call per copy per batch, then the checks)."""
    asked = {"devices": [], "modes": [], "phases": ["warm-up", "timed", "timed"]}
    real_like, real_empty, real_prefill, real_gen = verify.guarded_like, verify.guarded_empty, verify.prefill, torch.Generator

    def on(what, device):
        asked["devices"].append((what, device))
        return "cpu"

    monkeypatch.setattr(verify, "guarded_like", lambda spec, device: real_like(spec, on("out", device)))
    monkeypatch.setattr(verify, "guarded_empty", lambda n, device: real_empty(n, on("workspace", device)))
    monkeypatch.setattr(verify, "prefill", lambda out, mode, gen: asked["modes"].append(mode) or
                        real_prefill(out, mode, gen))
    monkeypatch.setattr(torch, "Generator", lambda device=None: real_gen(device=on("generator", device)))
    monkeypatch.setattr(timing_mod, "rotation_cache", lambda device: on("cache", device) and 0)

    def time_calls(calls, device, cfg, before=None, after=None):
        on("timer", device)
        for n, phase in enumerate(asked["phases"]):
            for b, c in zip(before, calls):
                b()
                c()
            if after(phase):
                return Timing(1.0, 0.0, n, clock="cuda_events") if n else None
        return Timing(1.0, 0.0, len(asked["phases"]) - 1, clock="cuda_events")

    monkeypatch.setattr(timing_mod, "time_calls", time_calls)
    return asked


def test_the_cuda_timing_loop_prepares_out_and_zeroes_workspaces_before_every_call(as_cuda):
    seen = []

    def kernel(t, n, run):
        seen.append((int(t["wz"].to(torch.int64).sum()), t["out"] is run.t["out"]))
        honest(t, n, run)
        t["wz"].fill_(7)  # a zeroed workspace is zeroed again before the next call

    m = FakeModule(kernel)
    base = base_set()
    as_cuda["devices"].clear()
    timing, verdict = judge.time_candidate(m, cand((WS, WZ)), SIG, base, FAST, "cuda")
    assert verdict is None and timing.n == 2
    # the sentinel in even batches, finite garbage in odd ones, for each of the two copies
    assert as_cuda["modes"] == ["sentinel", "sentinel", "stale", "stale", "sentinel", "sentinel"]
    assert seen == [(0, True)] * 6 and len(m.runs) == 2 and m.log == []  # bound once: no per-call output
    assert all("out" in r.t for r in m.runs)
    # (guarded_like makes its buffer through guarded_empty: the CPU here, after the fixture's redirect)
    devices = [d for d in as_cuda["devices"] if d != ("workspace", "cpu")]
    assert devices == ([("cache", "cuda"), ("generator", "cuda")] + [("out", "cuda")] + [("workspace", "cuda")] * 2
                       + [("out", "cuda")] + [("workspace", "cuda")] * 2 + [("timer", "cuda")])


def test_the_cuda_timing_loop_checks_the_canaries_after_out(as_cuda):
    def overrun(t, n, run):
        honest(t, n, run)
        if n == 3:
            torch.as_strided(t["out"], (65,), (1,))[64] = 1.0  # one element past out: its canary zone

    _, v = judge.time_candidate(FakeModule(overrun), cand(), SIG, base_set(), FAST, "cuda")
    assert (v.reason, v.detail) == ("mismatch", "call 3 of the timing loop (timed, copy 0): out-of-bounds write "
                                                "past the end of out or a workspace")


def test_the_cuda_timing_loop_finds_a_sentinel_left_in_out(as_cuda):
    def skips(t, n, run):
        if n != 5:
            honest(t, n, run)  # call 5 (a sentinel batch) writes nothing

    _, v = judge.time_candidate(FakeModule(skips), cand(), SIG, base_set(), FAST, "cuda")
    assert v.reason == "unwritten_output" and v.detail.startswith("call 5 of the timing loop (timed, copy 0): "
                                                                 "64 of 64 output elements not written")


def test_time_candidate_asks_the_devices_cache_and_timer_on_the_cpu(monkeypatch):
    asked = []
    monkeypatch.setattr(timing_mod, "rotation_cache", lambda device: asked.append(("cache", device)) or 1)
    real_calls = timing_mod.time_calls
    monkeypatch.setattr(timing_mod, "time_calls", lambda calls, device, cfg, **kw: asked.append(("timer", device))
                        or real_calls(calls, device, cfg, **kw))
    m = FakeModule()
    timing, verdict = judge.time_candidate(m, cand(), SIG, base_set(), TimingConfig(**{**FAST.to_json(), "rotate": 3}),
                                           "cpu")
    # 512 bytes a copy against a 1-byte cache: one copy, where rotate would give three
    assert verdict is None and asked == [("cache", "cpu"), ("timer", "cpu")] and len(m.runs) == 1


def test_time_candidate_times_the_sets_own_tensors_as_the_first_copy_only_when_told(monkeypatch):
    base = base_set()
    m = FakeModule()
    judge.time_candidate(m, cand(), SIG, base, FAST, "cpu", own_base=True)
    assert m.runs[0].t["x"] is base.tensors["x"] and m.runs[1].t["x"] is not base.tensors["x"]
    m = FakeModule()
    judge.time_candidate(m, cand(), SIG, base, FAST, "cpu")
    assert all(r.t["x"] is not base.tensors["x"] for r in m.runs)


def test_the_timing_loop_perturbs_x_or_a_regions_largest_floating_input():
    f, i8 = torch.zeros(4), torch.zeros(64, dtype=torch.int8)
    assert judge.main_input({"w": torch.zeros(64), "x": f}) == "x"
    assert judge.main_input({"in0": f, "in1": torch.zeros(8), "in2": i8, "in3": None}) == "in1"
    assert judge.main_input({"in0": torch.zeros(8), "in1": torch.zeros(8)}) == "in0"  # a tie: the first
    assert judge.main_input({"in0": i8, "in1": None}) == "in0"  # nothing floating: the first input


def test_same_layout_copies_dtype_strides_and_values():
    t = torch.arange(24, dtype=torch.int16).reshape(4, 6)[:, 1:5]
    c = judge.same_layout(t)
    assert (c.dtype, c.stride(), c.device) == (torch.int16, (6, 1), t.device) and torch.equal(c, t)
    assert c.data_ptr() != t.data_ptr()


def test_a_timing_failure_is_not_relabelled_implausible(loaded, monkeypatch):
    monkeypatch.setattr(judge, "time_candidate", lambda *a, **k: (T(1e-6), Verdict(False, "mismatch", "call 3")))
    monkeypatch.setattr(judge, "implausible", lambda *a: "faster than a copy")
    reply = judge.judge(FakeSession(), request(cand()))
    assert (reply.verdict.reason, reply.verdict.detail) == ("mismatch", "call 3")


def test_same_layout_keeps_the_tensors_device():
    t = torch.empty(4, 6, device="meta")[:, 1:5]
    c = judge.same_layout(t)
    assert (c.device.type, c.stride(), c.dtype) == ("meta", (6, 1), torch.float32)


def test_judge_derives_a_streamed_hotspots_sets_from_its_captures(loaded, monkeypatch):
    asked = []
    real_derived = verify.iter_derived_sets

    def iter_derived_sets(sig, device, seed, h, final, count, source):
        asked.append((sig, device, seed, h, final, count, source))
        return real_derived(sig, device, seed, h, final, count, source)

    monkeypatch.setattr(verify, "iter_derived_sets", iter_derived_sets)
    s = FakeSession()
    stream = Stream(captures=["c/0.safetensors", "c/1.safetensors"])
    s.sets["k"] = (stream, [])
    c = cand()
    assert judge.judge(s, request(c, seed=3, final=True)).verdict.ok
    assert asked == [(SIG, "cpu", 3, c.content_hash, True, 2, stream.source)]


def parked_judge(monkeypatch, sig, c, module, tensors_seen):
    """judge on a streamed hotspot whose fresh set is parked in host memory (as on a GPU)."""
    from forge_pack.evaluate import memory_plan

    asked = []
    real_derived = verify.iter_derived_sets
    monkeypatch.setattr(memory_plan, "park_on_host", lambda device: asked.append(("park", device)) or True)

    def iter_derived_sets(sig, device, seed, h, final, count, source):
        asked.append((sig, device, seed, h, final, count))
        return real_derived(sig, device, seed, h, final, count, source)

    monkeypatch.setattr(verify, "iter_derived_sets", iter_derived_sets)
    monkeypatch.setattr(judge, "time_candidate", lambda module, c, sig, base, cfg, device, own_base=False:
                        tensors_seen.append(dict(base.tensors)) or (Timing(3.0, 0.0, 3), None))
    s = FakeSession()
    s.sets["k"] = (Stream(), [])
    inputs = judge.LoadInputs("k", sig, seed=3)
    reply = judge.judge(s, judge.JudgeCandidate(inputs, c, "/nowhere/k.so", FAST))
    return reply, asked


def test_a_parked_fresh_set_derives_once_with_the_evaluations_seeds(loaded, monkeypatch):
    c = cand()
    reply, asked = parked_judge(monkeypatch, SIG, c, loaded["module"], [])
    assert reply.verdict.ok and asked == [("park", "cpu"), (SIG, "cpu", 3, c.content_hash, False, 1)]


def test_a_parked_set_keeps_an_absent_optional_input_absent(loaded, monkeypatch):
    loaded["module"] = FakeModule(ln_honest)
    seen = []
    reply, _ = parked_judge(monkeypatch, LNS, ln_cand(), loaded["module"], seen)
    assert reply.verdict.ok, reply.verdict
    (tensors,) = seen
    assert tensors["bias"] is None and tensors["x"].shape == (4, 16)


def test_an_allocation_failure_after_timing_keeps_the_floor_and_bandwidth(loaded):
    err = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB")

    class LateFailure(FakeModule):
        def settle(self):
            raise err

    loaded["module"] = LateFailure()
    reply = judge.judge(FakeSession(bw=25.0), request(cand()))
    where = f"judge.py:{_line_of('settle()')} judge"
    if "__mutmut_orig]" in reply.verdict.detail:  # under mutmut: the trampoline's original, in the mutated file
        where = re.search(r"judge\.py:\d+ x_judge__mutmut_orig", reply.verdict.detail).group(0)
    assert reply == judge.Judged(Verdict(False, "out_of_memory", f"an allocation failed while evaluating "
                                         f"{SIG.pretty()}: {err} [in {where}]"),
                                 None, abi.floor_us(SIG, 25.0), 25.0, {}, False, False)


def _line_of(code: str) -> int:
    """The line of judge.py whose code (stripped, before any comment) is ``code``."""
    lines = Path(judge.__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.split("#")[0].strip() == code)


def test_a_parked_set_moves_by_copy_to_a_named_device_every_time(loaded, monkeypatch):
    """On a GPU the parked fresh set goes to the host and comes back for each derived set and for timing;
    on the CPU the host is the device, so the moves judge asks for are what can be checked: each names
    its destination and copies (an alias would let one set's changes reach the next)."""
    moves = []
    real_host, real_back = memory_plan.to_host, memory_plan.from_host

    def to_host(t):
        h = real_host(t)
        moves.append(("host", h.data_ptr() != t.data_ptr() and torch.equal(h, t)))
        return h

    def from_host(t, device):
        d = real_back(t, device)
        moves.append((device, d.data_ptr() != t.data_ptr() and torch.equal(d, t)))
        return d

    monkeypatch.setattr(memory_plan, "to_host", to_host)
    monkeypatch.setattr(memory_plan, "from_host", from_host)
    reply, _ = parked_judge(monkeypatch, SIG, cand(), loaded["module"], [])
    assert reply.verdict.ok
    # parked once, copied back for each derived set, and once more for timing
    assert moves == [("host", True)] + [("cpu", True)] * (len(ops.DERIVED_KINDS) + 1)


@pytest.mark.parametrize("op, text", [
    ("group_norm", "x: f32[5,4,6], weight: f32[4], bias: f32[4], num_groups=2"),
    ("layer_norm", "x: f32[5,3,8], weight: f32[8], bias: f32[8], normalized_shape=[8]"),
    ("log_softmax", "x: f32[5,7], dim=1"),
])
def test_reference64_rows_recomputes_exactly_the_changed_samples(op, text):
    sig = ops.with_output(parse_signature(op, text))
    g = torch.Generator().manual_seed(4)
    t = {n: torch.randn(s.shape, generator=g) for n, s in sig.inputs if s is not None}
    ref = memory_plan.reference64(sig, t)
    before = ref.clone()
    t["x"][3].add_(1.5)
    t["x"][1, 0] = 9.0
    memory_plan.reference64_rows(sig, t, ref, [3, 1, 3])
    torch.testing.assert_close(ref, memory_plan.reference64(sig, t), rtol=1e-13, atol=1e-15)
    assert torch.equal(ref[[0, 2, 4]], before[[0, 2, 4]])  # the other samples untouched
