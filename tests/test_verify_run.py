"""verify.verify and its guarded buffers, in process: a fake module whose bound call runs Python
(an honest softmax, or one that cheats in one known way), so every guard of a verification run is
seen to decide the verdict, with its exact reason and detail.

Fast on purpose: these are the tests `make mutation` runs against forge_pack/evaluate/verify.py (the
evaluator tests reach the same code through worker processes and compiled kernels)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from forge_pack.targets import ops, registry
from forge_pack.evaluate import verify
from forge_pack.evaluate import verdict_rules as rules
from forge_pack.core.candidate import Candidate, KernelLaunch, LaunchSpec, Workspace
from forge_pack.evaluate.launch import LaunchError
from forge_pack.targets.sigparse import parse_signature
from forge_pack.core.signature import TensorSpec
from forge_pack.core.verdict import Check, Verdict

SIG = ops.with_output(parse_signature("softmax", "x: f32[4,16], dim=-1"))


def cand(workspaces=(), requires=(), args=("x", "out")) -> Candidate:
    return Candidate(op="softmax", backend="cpu", source="// fake",
                     spec=LaunchSpec(kernels=(KernelLaunch("k", tuple(args)),), workspaces=tuple(workspaces),
                                     requires=tuple(requires)))


class FakeRun:
    def __init__(self, behave, tensors):
        self.t, self.n, self.behave, self.outs = dict(tensors), 0, behave, []

    def retarget(self, name, tensor):
        self.t[name] = tensor

    def __call__(self):
        self.n += 1
        self.outs.append(self.t["out"])
        self.behave(self.t, self.n)


class FakeModule:
    def __init__(self, behave):
        self.behave, self.runs = behave, []

    def bind(self, p, tensors):
        r = FakeRun(self.behave, tensors)
        self.runs.append(r)
        return r


def honest(t, n):
    t["out"].copy_(torch.softmax(t["x"], -1))


def fresh_set(i: int = 0):
    s = verify.fresh_sets(SIG, "cpu", 3, "hash", final=False, count=i + 1)[i]
    return s


def whole_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the storage a guarded tensor lives in (payload and canaries)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


# ---------------------------------------------------------------- verdicts of verify()


def test_an_honest_kernel_passes_every_set_with_its_errors_recorded():
    sets = verify.fresh_sets(SIG, "cpu", 3, "hash", final=False, count=2)
    m = FakeModule(honest)
    v = verify.verify(m, cand(), sets, "cpu")
    assert (v.ok, v.reason, v.detail) == (True, "ok", "2 input sets verified")
    assert [c.input_kind for c in v.checks] == ["fresh[0]", "fresh[1]"]
    assert v.max_abs_err == max(c.max_abs_err for c in v.checks)
    assert v.max_rel_err == max(c.max_rel_err for c in v.checks)
    assert all(c.passed for c in v.checks)
    assert [r.n for r in m.runs] == [2, 2]  # two calls per set


def test_the_first_call_sees_the_sentinel_and_the_second_a_fresh_allocation():
    seen = []

    def look(t, n):
        seen.append((n, rules.count_sentinel(t["out"])[0], t["out"].data_ptr()))
        honest(t, n)

    m = FakeModule(look)
    verify.verify(m, cand(), [fresh_set()], "cpu")
    (first_n, first_sentinel, first_ptr), (second_n, _, second_ptr) = seen
    assert (first_n, first_sentinel, second_n) == (1, 64, 2)
    assert first_ptr != second_ptr
    assert m.runs[0].outs[1].shape == (4, 16) and m.runs[0].outs[1].stride() == (16, 1)


def test_a_write_into_the_input_on_the_first_call_is_input_mutated_and_undone():
    s = fresh_set()
    original = s.tensors["x"].clone()

    def cheat(t, n):
        honest(t, n)
        t["x"][1, 2] = 99.0

    v = verify.verify(FakeModule(cheat), cand(), [s], "cpu")
    assert (v.ok, v.reason) == (False, "input_mutated")
    assert v.detail.startswith("fresh[0]: input `x` changed during the first call (1 elements, first at (1, 2): 99 vs")
    assert v.checks == () and v.max_abs_err is None and v.max_rel_err is None
    assert torch.equal(s.tensors["x"], original)  # the cached set is restored for the next candidate


def test_a_write_into_the_input_on_the_second_call_keeps_the_first_check():
    s = fresh_set()
    original = s.tensors["x"].clone()

    def cheat(t, n):
        honest(t, n)
        if n == 2:
            t["x"][0, 0] = -5.0

    v = verify.verify(FakeModule(cheat), cand(), [s], "cpu")
    assert (v.ok, v.reason) == (False, "input_mutated")
    assert v.detail.startswith("fresh[0]: input `x` changed during the second call (1 elements, first at (0, 0)")
    assert [c.input_kind for c in v.checks] == ["fresh[0]"] and v.checks[0].passed
    assert torch.equal(s.tensors["x"], original)


def test_a_write_past_the_end_of_out_is_caught_by_the_canaries():
    def cheat(t, n):
        honest(t, n)
        if n == 1:
            whole_bytes(t["out"])[-1] = 0

    v = verify.verify(FakeModule(cheat), cand(), [fresh_set()], "cpu")
    assert (v.ok, v.reason, v.detail) == (
        False, "mismatch", "fresh[0]: out-of-bounds write past the end of out or a workspace (the first call)")


def test_a_write_before_the_start_of_out_is_caught_by_the_canaries():
    def cheat(t, n):
        honest(t, n)
        whole_bytes(t["out"])[0] = 0

    v = verify.verify(FakeModule(cheat), cand(), [fresh_set()], "cpu")
    assert (v.reason, v.detail) == ("mismatch", "fresh[0]: out-of-bounds write past the end of out or a workspace "
                                                "(the first call)")


WS = Workspace("ws", "64", False)
WSZ = Workspace("wz", "32", True)


def test_a_workspace_overrun_on_the_second_call_is_caught():
    def cheat(t, n):
        honest(t, n)
        if n == 2:
            whole_bytes(t["wz"])[-1] = 1

    v = verify.verify(FakeModule(cheat), cand(workspaces=(WS, WSZ)), [fresh_set()], "cpu")
    assert (v.reason, v.detail) == ("mismatch", "fresh[0]: out-of-bounds write past the end of out or a workspace "
                                                "(the second call)")
    assert len(v.checks) == 1


def test_an_overrun_of_the_first_workspace_is_caught_too():
    def cheat(t, n):
        honest(t, n)
        whole_bytes(t["ws"])[0] = 1

    v = verify.verify(FakeModule(cheat), cand(workspaces=(WS, WSZ)), [fresh_set()], "cpu")
    assert (v.reason, v.detail) == ("mismatch", "fresh[0]: out-of-bounds write past the end of out or a workspace "
                                                "(the first call)")


def test_workspaces_are_guarded_garbled_anew_and_zeroed_when_asked():
    seen = []

    def look(t, n):
        ws, wz = t["ws"], t["wz"]
        wb = whole_bytes(ws)
        seen.append((ws.numel(), wz.numel(), ws.clone(), bool((wz == 0).all()),
                     bool((wb[:512] == 0xA5).all()), bool((wb[-512:] == 0xA5).all()),
                     bool((whole_bytes(wz)[-512:] == 0xA5).all())))
        wz.fill_(7)  # left dirty: the judge zeroes it again before the next call
        honest(t, n)

    v = verify.verify(FakeModule(look), cand(workspaces=(WS, WSZ)), [fresh_set()], "cpu")
    assert v.ok, v
    (n1, z1, g1, zero1, c1a, c1b, c1z), (n2, z2, g2, zero2, c2a, c2b, c2z) = seen
    assert (n1, z1, n2, z2) == (64, 32, 64, 32)
    assert zero1 and zero2 and c1a and c1b and c1z and c2a and c2b and c2z
    assert not torch.equal(g1, g2)  # new garbage for the second call
    assert int(g1.to(torch.int64).max()) > 128  # random bytes over the whole 0..255 range


def test_an_element_never_written_on_the_first_call_is_unwritten_output():
    def lazy(t, n):
        honest(t, n)
        if n == 1:
            rules.fill_sentinel(t["out"][2, 5:6])

    v = verify.verify(FakeModule(lazy), cand(), [fresh_set()], "cpu")
    assert (v.ok, v.reason, v.detail) == (False, "unwritten_output",
                                          "fresh[0]: 1 of 64 output elements never written (first at index (2, 5))")
    assert len(v.checks) == 1 and not v.checks[0].passed


def test_the_sentinel_left_by_the_second_run_is_unwritten_output():
    def lazy(t, n):
        honest(t, n)
        if n == 2:
            rules.fill_sentinel(t["out"][3])

    v = verify.verify(FakeModule(lazy), cand(), [fresh_set()], "cpu")
    assert (v.ok, v.reason, v.detail) == (
        False, "unwritten_output", "fresh[0]: 16 of 64 output elements not written by the second run "
                                   "(first at index (3, 0))")
    assert len(v.checks) == 1 and v.checks[0].passed


def test_a_wrong_first_output_is_mismatch_with_its_check():
    def wrong(t, n):
        honest(t, n)
        t["out"][0, 0] += 0.5

    v = verify.verify(FakeModule(wrong), cand(), [fresh_set()], "cpu")
    assert (v.ok, v.reason) == (False, "mismatch")
    assert v.detail.startswith("fresh[0]: 1 of 64 elements out of tolerance")
    assert v.checks[0].mismatches == 1 and v.max_abs_err == pytest.approx(0.5, abs=1e-6)


def test_a_tiny_difference_between_the_two_runs_is_nondeterministic():
    def racy(t, n):
        honest(t, n)
        if n == 2:
            t["out"][1, 1] = torch.nextafter(t["out"][1, 1], torch.tensor(2.0))

    v = verify.verify(FakeModule(racy), cand(), [fresh_set()], "cpu")
    assert (v.ok, v.reason) == (False, "nondeterministic")
    assert v.detail.startswith("fresh[0]: two runs on the same input differ bitwise (1 elements, first at (1, 1)")
    assert len(v.checks) == 1 and v.checks[0].passed


def test_a_kernel_wrong_only_without_the_sentinel_is_mismatch_with_the_second_check():
    def sentinel_only(t, n):
        honest(t, n)
        if n == 2:
            t["out"][2, 3] = 5.0

    v = verify.verify(FakeModule(sentinel_only), cand(), [fresh_set()], "cpu")
    assert (v.ok, v.reason) == (False, "mismatch")
    assert v.detail.startswith("fresh[0]: the second run, into an output not pre-filled with the sentinel, is wrong "
                               "(1 of 64 elements, ")
    assert v.detail.endswith("): the kernel behaves differently when it does not see the sentinel")
    assert len(v.checks) == 1 and not v.checks[0].passed and v.checks[0].mismatches == 1


def test_the_first_failing_set_decides_and_earlier_checks_are_kept():
    sets = verify.fresh_sets(SIG, "cpu", 3, "hash", final=False, count=3)
    calls = []

    def second_set_wrong(t, n):
        calls.append(n)
        honest(t, n)
        if len(calls) > 2:
            t["out"].zero_()

    v = verify.verify(FakeModule(second_set_wrong), cand(), sets, "cpu")
    assert (v.reason, v.detail.split(":")[0]) == ("mismatch", "fresh[1]")
    assert [c.input_kind for c in v.checks] == ["fresh[0]", "fresh[1]"]
    assert len(calls) == 3  # the third set never ran


def test_a_requires_rule_that_excludes_every_set_is_inapplicable():
    v = verify.verify(FakeModule(honest), cand(requires=("rows > 4",)), [fresh_set()], "cpu")
    assert v == Verdict(False, "inapplicable", "no input set was applicable (requires excludes them all)")


def test_a_requires_rule_skips_only_the_sets_it_excludes():
    small = verify.fresh_sets(ops.with_output(parse_signature("softmax", "x: f32[2,16], dim=-1")), "cpu", 3, "h",
                              final=False)[0]
    v = verify.verify(FakeModule(honest), cand(requires=("rows > 2",)), [small, fresh_set()], "cpu")
    assert (v.ok, v.detail, [c.input_kind for c in v.checks]) == (True, "1 input sets verified", ["fresh[0]"])
    assert v.checks[0].input_kind == "fresh[0]"


def test_a_launch_spec_that_cannot_be_planned_is_a_static_check():
    v = verify.verify(FakeModule(honest), cand(workspaces=(Workspace("out", "8"),)), [fresh_set()], "cpu")
    assert v == Verdict(False, "static_check",
                        "fresh[0]: launch spec: workspace name 'out' shadows a tensor or size variable", checks=())


def test_a_bad_requires_expression_is_a_static_check():
    v = verify.verify(FakeModule(honest), cand(requires=("nosuchname > 1",)), [fresh_set()], "cpu")
    assert (v.ok, v.reason) == (False, "static_check")
    assert v.detail.startswith("fresh[0]: launch spec: ")


def test_an_input_sharing_memory_with_out_is_aliasing(monkeypatch):
    monkeypatch.setattr(verify, "_ranges_overlap", lambda a, b: True)
    v = verify.verify(FakeModule(honest), cand(), [fresh_set()], "cpu")
    assert v == Verdict(False, "aliasing", "fresh[0]: out or a workspace shares memory with input x", checks=())


def test_aliasing_is_checked_against_out_and_every_workspace(monkeypatch):
    seen = []
    monkeypatch.setattr(verify, "_ranges_overlap", lambda a, b: seen.append(b.numel()) or False)
    s = fresh_set()
    s.tensors["skip"] = None  # an absent optional input is never compared
    v = verify.verify(FakeModule(honest), cand(workspaces=(WS, WSZ)), [s], "cpu")
    assert v.ok
    assert seen == [64 * 4 + 1024, 64 + 1024, 32 + 1024]


def test_ranges_overlap_is_exact_at_the_boundary():
    buf = bytearray(32)
    a = torch.frombuffer(memoryview(buf)[0:8], dtype=torch.uint8)
    b = torch.frombuffer(memoryview(buf)[8:16], dtype=torch.uint8)
    c = torch.frombuffer(memoryview(buf)[7:16], dtype=torch.uint8)
    assert not verify._ranges_overlap(a, b) and not verify._ranges_overlap(b, a)
    assert verify._ranges_overlap(a, c) and verify._ranges_overlap(c, a)
    assert verify._ranges_overlap(b, c)
    assert not verify._ranges_overlap(torch.empty(0), a) and not verify._ranges_overlap(a, torch.empty(0))


def test_verdict_errors_leave_out_infinite_checks():
    checks = [Check("a", float("inf"), float("inf"), 1, 0.0, 0.0), Check("b", 0.25, 0.5, 0, 0.0, 0.0),
              Check("c", 0.125, 0.75, 0, 0.0, 0.0)]
    v = verify._with_errors(Verdict(True, "ok", "d"), checks)
    assert (v.max_abs_err, v.max_rel_err, v.checks) == (0.25, 0.75, tuple(checks))
    v = verify._with_errors(Verdict(False, "nan", "d"), checks[:1])
    assert (v.ok, v.reason, v.detail, v.max_abs_err, v.max_rel_err) == (False, "nan", "d", None, None)


# ---------------------------------------------------------------- guarded buffers and helpers


def test_guarded_empty_puts_the_payload_between_two_512_byte_zones():
    payload, whole = verify.guarded_empty(10, "cpu")
    assert payload.numel() == 10 and whole.numel() == 10 + 1024 and whole.dtype == torch.uint8
    assert payload.data_ptr() == whole.data_ptr() + 512


def test_guarded_like_spans_exactly_the_strided_tensor():
    spec = TensorSpec("float32", (4, 3), (1, 4))
    t, whole = verify.guarded_like(spec, "cpu")
    assert t.shape == (4, 3) and t.stride() == (1, 4) and t.dtype == torch.float32
    assert whole.numel() == (1 + 3 * 1 + 2 * 4) * 4 + 1024
    assert t.data_ptr() == whole.data_ptr() + 512
    e, whole_e = verify.guarded_like(TensorSpec("bfloat16", (0, 3), (3, 1)), "cpu")
    assert e.numel() == 0 and whole_e.numel() == 1024


def test_canaries_are_checked_on_both_sides_and_nowhere_else():
    payload, whole = verify.guarded_empty(16, "cpu")
    verify.set_canaries(whole)
    assert bool((whole[:512] == 0xA5).all()) and bool((whole[-512:] == 0xA5).all())
    payload.fill_(0)
    assert verify.canaries_intact(whole)
    for i in (0, 511, 512 + 16, whole.numel() - 1):
        verify.set_canaries(whole)
        whole[i] = 0
        assert not verify.canaries_intact(whole), i


def test_prefill_writes_the_sentinel_or_seeded_finite_garbage():
    out = torch.zeros(8, 8)
    verify.prefill(out, "sentinel", torch.Generator().manual_seed(1))
    assert rules.count_sentinel(out)[0] == 64
    verify.prefill(out, "stale", torch.Generator().manual_seed(1))
    assert rules.count_sentinel(out)[0] == 0 and bool(torch.isfinite(out).all())
    assert torch.equal(out, torch.empty(8, 8).normal_(generator=torch.Generator().manual_seed(1)))


def test_garble_fills_a_workspace_with_seeded_random_bytes():
    a, b = torch.zeros(4096, dtype=torch.uint8), torch.zeros(4096, dtype=torch.uint8)
    verify.garble(a, torch.Generator().manual_seed(5))
    verify.garble(b, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and int(a.max()) == 255 and int((a == 0).sum()) < 64
    verify.garble(torch.zeros(0, dtype=torch.uint8), torch.Generator())  # nothing to write, no error


def test_fresh_output_is_a_new_tensor_with_the_spec_layout():
    o = verify.fresh_output(TensorSpec("float16", (3, 5), (1, 3)))
    assert (o.dtype, tuple(o.shape), o.stride(), o.device.type) == (torch.float16, (3, 5), (1, 3), "cpu")


def test_sync_waits_for_the_device_only_on_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(a))
    verify.sync("cpu")
    assert calls == []
    verify.sync("cuda")
    assert calls == [()]


def test_launch_error_verdict_says_where_and_truncates():
    assert verify.launch_error_verdict(LaunchError("boom"), "loading") == Verdict(False, "launch_error",
                                                                                  "loading: boom")
    assert verify.launch_error_verdict(RuntimeError("boom")) == Verdict(False, "launch_error", "boom")
    assert verify.launch_error_verdict(RuntimeError("y" * 3000)).detail == "y" * 2000


# ---------------------------------------------------------------- the input sets


def test_make_set_holds_the_reference_the_allowance_and_a_fingerprint():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    s = verify.make_set("k", SIG, {"x": x}, "cpu")
    assert (s.kind, s.sig) == ("k", SIG) and s.tensors["x"] is x
    assert torch.equal(s.ref, torch.softmax(x.double(), -1))
    want = rules.allowance(torch.softmax(x, -1), s.ref, "float32", registry.get("softmax"))
    assert torch.equal(torch.as_tensor(s.atol_floor), torch.as_tensor(want))
    assert s.fingerprint == verify.fingerprint(s) and len(s.fingerprint) == 2


def test_make_set_drops_a_set_where_eager_breaks_parity(monkeypatch):
    monkeypatch.setattr(rules, "allowance", lambda *a: None)
    assert verify.make_set("k", SIG, {"x": torch.zeros(4, 16)}, "cpu") is None


def test_static_sets_are_the_captured_adversarial_and_odd_sets_seeded_by_mode(monkeypatch, tmp_path):
    from forge_pack.profile import capture

    loaded = []

    def fake_load(path, sig, device):
        loaded.append((Path(path), device))
        return {"x": torch.full((4, 16), float(len(loaded)))}, None

    monkeypatch.setattr(capture, "load_capture", fake_load)
    sets, skipped = verify.static_sets(SIG, ["c/a.safetensors", "c/b.safetensors"], str(tmp_path), "cpu", 9,
                                       final=False)
    assert loaded == [(tmp_path / "c/a.safetensors", "cpu"), (tmp_path / "c/b.safetensors", "cpu")]
    kinds = [s.kind for s in sets]
    odd = [ops.with_output(o) for o in ops.odd_signatures(SIG)]
    assert kinds == (["captured[0]", "captured[1]"] + [f"adversarial:{k}" for k in ops.adversarial_kinds(SIG)]
                     + [f"odd:{'x'.join(map(str, o.x.shape))}" for o in odd])
    assert skipped == []
    assert float(sets[1].tensors["x"][0, 0]) == 2.0
    op = ops.get_op("softmax")
    k0 = ops.adversarial_kinds(SIG)[0]
    gen = torch.Generator().manual_seed(verify.seed_for(9, "search", "adversarial", k0, SIG.key()))
    assert torch.equal(sets[2].tensors["x"], op.make_inputs(SIG, k0, gen, "cpu")["x"])
    gen = torch.Generator().manual_seed(verify.seed_for(9, "search", "odd", odd[0].key()))
    last_odd = sets[2 + len(ops.adversarial_kinds(SIG))]
    assert last_odd.sig == odd[0]
    assert torch.equal(last_odd.tensors["x"], op.make_inputs(odd[0], "fresh", gen, "cpu")["x"])
    final, _ = verify.static_sets(SIG, [], None, "cpu", 9, final=True)
    gen = torch.Generator().manual_seed(verify.seed_for(9, "final", "odd", odd[0].key()))
    assert torch.equal(final[len(ops.adversarial_kinds(SIG))].tensors["x"],
                       op.make_inputs(odd[0], "fresh", gen, "cpu")["x"])


def test_static_sets_skip_a_set_where_eager_breaks_parity_and_say_why(monkeypatch):
    real = verify.make_set
    monkeypatch.setattr(verify, "make_set", lambda kind, *a: None if kind == "adversarial:large" else real(kind, *a))
    sets, skipped = verify.static_sets(SIG, [], None, "cpu", 0, final=False)
    assert "adversarial:large" not in [s.kind for s in sets]
    assert skipped == ["adversarial:large: eager PyTorch itself differs from float64 in NaN/Inf positions"]


def test_derived_sets_are_one_per_transform_seeded_by_candidate_and_mode():
    sources = verify.fresh_sets(SIG, "cpu", 3, "hash", final=False, count=3)
    out = verify.derived_sets(SIG, "cpu", 3, "hash", False, sources)
    assert [s.kind for s in out] == [f"derived:{k}" for k in ops.DERIVED_KINDS]
    for s, kind in zip(out, ops.DERIVED_KINDS):
        gen = torch.Generator().manual_seed(verify.seed_for(3, "search", "hash", "derived", kind, SIG.key()))
        src = sources[rules.derived_source(3, gen)]
        assert torch.equal(s.tensors["x"], ops.derive_inputs(SIG, kind, src.tensors, gen)["x"]), kind
    final = verify.derived_sets(SIG, "cpu", 3, "hash", True, sources)
    assert not torch.equal(final[0].tensors["x"], out[0].tensors["x"])


def test_derived_sets_leave_out_a_set_where_eager_breaks_parity(monkeypatch):
    sources = [fresh_set()]
    monkeypatch.setattr(verify, "make_set", lambda kind, *a: None)
    assert verify.derived_sets(SIG, "cpu", 3, "hash", False, sources) == []


# ---------------------------------------------------------------- exact inputs of each judgement


def test_the_module_is_bound_with_the_planned_launch_and_every_buffer():
    from forge_pack.evaluate.launch import Plan

    bound = []

    class Recording(FakeModule):
        def bind(self, p, tensors):
            bound.append((p, sorted(tensors)))
            return super().bind(p, tensors)

    assert verify.verify(Recording(honest), cand(workspaces=(WS, WSZ)), [fresh_set()], "cpu").ok
    (p, names), = bound
    assert isinstance(p, Plan) and [k.name for k in p.launches] == ["k"]
    assert p.workspaces == (("ws", 64, False), ("wz", 32, True)) and names == ["out", "ws", "wz", "x"]


def test_workspace_garbage_is_seeded_by_the_set_kind_and_drawn_in_call_order():
    seen = []

    def look(t, n):
        seen.append(t["ws"].clone())
        honest(t, n)

    verify.verify(FakeModule(look), cand(workspaces=(WS, WSZ)), [fresh_set()], "cpu")
    g = torch.Generator().manual_seed(verify.seed_for("garbage", "fresh[0]"))
    first = torch.empty(64, dtype=torch.uint8).random_(0, 256, generator=g)
    torch.empty(32, dtype=torch.uint8).random_(0, 256, generator=g)  # the zeroed workspace, garbled then zeroed
    second = torch.empty(64, dtype=torch.uint8).random_(0, 256, generator=g)
    assert torch.equal(seen[0], first) and torch.equal(seen[1], second)


def _tiny_probability_set():
    """A row whose first probability is ~1e-8: a generic float32 atol (1e-5) would forgive any value
    there, softmax's own row (atol 1e-8) does not."""
    x = torch.zeros(4, 16)
    x[0, 0] = -15.0
    s = verify.make_set("tiny", SIG, {"x": x}, "cpu")
    assert float(s.ref[0, 0]) < 1e-7
    return s


def test_the_first_output_is_judged_by_the_ops_own_tolerance_row():
    def off(t, n):
        honest(t, n)
        t["out"][0, 0] += 5e-6

    v = verify.verify(FakeModule(off), cand(), [_tiny_probability_set()], "cpu")
    assert (v.reason, v.detail.split(":")[0]) == ("mismatch", "tiny")
    assert (v.checks[0].atol, v.checks[0].rtol) == (1e-8, 1e-4)


def test_the_second_output_is_judged_by_the_ops_own_tolerance_row():
    def off_second(t, n):
        honest(t, n)
        if n == 2:
            t["out"][0, 0] += 5e-6

    v = verify.verify(FakeModule(off_second), cand(), [_tiny_probability_set()], "cpu")
    assert v.reason == "mismatch" and "not pre-filled with the sentinel" in v.detail
    assert (v.checks[0].input_kind, v.checks[0].atol, v.checks[0].rtol) == ("tiny", 1e-8, 1e-4)


def test_the_second_output_keeps_the_sets_eager_allowance():
    s = fresh_set()
    s.atol_floor = 1.0  # an allowance larger than the change below

    def off_second(t, n):
        honest(t, n)
        if n == 2:
            t["out"][1, 1] += 0.5

    v = verify.verify(FakeModule(off_second), cand(), [s], "cpu")
    assert (v.ok, v.reason) == (False, "nondeterministic")  # within tolerance, but not bitwise equal


def test_a_launch_spec_error_on_a_later_set_keeps_the_earlier_checks():
    big = verify.fresh_sets(ops.with_output(parse_signature("softmax", "x: f32[8,16], dim=-1")), "cpu", 3, "h",
                            final=False)[0]
    v = verify.verify(FakeModule(honest), cand(requires=("rows < 8 or 64 // (rows - 8) > 0",)),
                      [fresh_set(), big], "cpu")
    assert (v.ok, v.reason) == (False, "static_check")
    assert v.detail.startswith("fresh[0]: launch spec: expression ") and "divides by zero" in v.detail
    assert len(v.checks) == 1 and v.checks[0].passed


def test_ranges_of_one_byte_still_overlap():
    buf = bytearray(16)
    one = torch.frombuffer(memoryview(buf)[3:4], dtype=torch.uint8)
    span = torch.frombuffer(memoryview(buf)[0:8], dtype=torch.uint8)
    assert verify._ranges_overlap(one, span) and verify._ranges_overlap(span, one)


def test_guarded_like_sizes_by_the_element_size_of_the_dtype():
    t, whole = verify.guarded_like(TensorSpec("bfloat16", (2, 3), (3, 1)), "cpu")
    assert t.dtype == torch.bfloat16 and whole.numel() == 6 * 2 + 1024
    e, whole_e = verify.guarded_like(TensorSpec("float32", (0, 5), (1, 1)), "cpu")
    assert e.numel() == 0 and whole_e.numel() == 1024  # no element: no payload, whatever the strides say


def test_fingerprint_reads_one_and_two_byte_tensors():
    a = torch.tensor([1, 2, 3], dtype=torch.uint8)
    b = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    s = verify.InputSet("k", SIG, {"a": a, "b": b}, torch.zeros(1, dtype=torch.float64))
    fp = verify.fingerprint(s)
    assert fp[0] == 6 and fp[1] == int(b.view(torch.int16).sum()) and fp[2] == 0


def test_garble_can_write_every_byte_value_including_zero():
    a = torch.full((4096,), 7, dtype=torch.uint8)
    verify.garble(a, torch.Generator().manual_seed(5))
    assert int((a == 0).sum()) > 0 and int(a.max()) == 255


def test_a_fresh_set_kept_without_slack_holds_its_signature(monkeypatch):
    monkeypatch.setattr(verify, "make_set", lambda *a, **k: None)
    (s,) = verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False)
    assert s.sig == SIG and s.kind == "fresh[0]"


def test_make_set_works_for_a_signature_without_an_output_spec():
    import dataclasses

    sig = dataclasses.replace(SIG, output=None)
    s = verify.make_set("k", sig, {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(0))}, "cpu")
    assert s is not None and s.sig is sig


def test_derived_sets_of_the_final_check_are_seeded_with_the_final_mode():
    sources = verify.fresh_sets(SIG, "cpu", 3, "hash", final=False, count=2)
    out = verify.derived_sets(SIG, "cpu", 3, "hash", True, sources)
    kind = ops.DERIVED_KINDS[0]
    gen = torch.Generator().manual_seed(verify.seed_for(3, "final", "hash", "derived", kind, SIG.key()))
    src = sources[rules.derived_source(2, gen)]
    assert torch.equal(out[0].tensors["x"], ops.derive_inputs(SIG, kind, src.tensors, gen)["x"])


def test_static_sets_read_captures_relative_to_the_working_folder_without_a_run_dir(monkeypatch):
    from forge_pack.profile import capture

    loaded = []

    def fake_load(path, sig, device):
        loaded.append((path, sig))
        return {"x": torch.zeros(4, 16)}, None

    monkeypatch.setattr(capture, "load_capture", fake_load)
    verify.static_sets(SIG, ["c/a.safetensors"], None, "cpu", 0, final=False)
    assert loaded == [(Path("c/a.safetensors"), SIG)]


def test_static_sets_report_skipped_captured_and_odd_sets(monkeypatch):
    from forge_pack.profile import capture

    monkeypatch.setattr(capture, "load_capture", lambda path, sig, device: ({"x": torch.zeros(4, 16)}, None))
    monkeypatch.setattr(verify, "make_set", lambda *a: None)
    sets, skipped = verify.static_sets(SIG, ["c/a.safetensors"], None, "cpu", 0, final=False)
    odd = [ops.with_output(o) for o in ops.odd_signatures(SIG)]
    assert sets == []
    assert skipped == [f"{k}: eager PyTorch itself differs from float64 in NaN/Inf positions" for k in
                       ["captured[0]"] + [f"adversarial:{a}" for a in ops.adversarial_kinds(SIG)]
                       + [f"odd:{'x'.join(map(str, o.x.shape))}" for o in odd]]


# ---------------------------------------------------------------- the allowance's magnitude


POOL = ops.with_output(parse_signature("adaptive_avg_pool2d", "x: f32[2,3,8,8], output_size=[1,1]"))


def test_make_set_keeps_the_kinds_magnitude_and_looks_the_allowance_up_by_it():
    # a pooled mean of large values of both signs: |result| is far below the mean |x| its error scales with
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 8, 8, generator=g) * 1000 + torch.randn(2, 3, 1, 1, generator=g)
    s = verify.make_set("k", POOL, {"x": x}, "cpu")
    spec = registry.get("adaptive_avg_pool2d")
    mag = torch.nn.functional.adaptive_avg_pool2d(x.double().abs(), 1)
    assert torch.equal(s.magnitude, mag)
    eager = torch.nn.functional.adaptive_avg_pool2d(x, (1, 1))
    want = rules.allowance(eager, s.ref, "float32", spec, mag)
    by_ref = rules.allowance(eager, s.ref, "float32", spec, None)
    assert not torch.equal(want, by_ref)  # the magnitude decides the allowance here
    assert torch.equal(s.atol_floor, want)


def test_make_set_of_a_kind_without_a_magnitude_has_none():
    assert verify.make_set("k", SIG, {"x": torch.randn(4, 16)}, "cpu").magnitude is None


def _allowance_at_large_magnitudes_only(s):
    """The set judged by a table that allows 1.0 from magnitude 2^10 up and nothing below, and a
    magnitude of 1024 everywhere: an error of 0.5 passes by the magnitude, fails by |ref| (< 1)."""
    table = torch.zeros(2048, dtype=torch.float64)
    table[(torch.tensor(1024.0, dtype=torch.float64).view(torch.int64) >> 52).item():] = 1.0
    s.atol_floor = table
    s.magnitude = torch.full((4, 16), 1024.0, dtype=torch.float64)
    return s


def test_the_first_output_is_judged_with_the_sets_magnitude():
    def off(t, n):
        honest(t, n)
        t["out"][0, 0] += 0.5

    v = verify.verify(FakeModule(off), cand(), [_allowance_at_large_magnitudes_only(fresh_set())], "cpu")
    assert (v.ok, v.reason, v.detail) == (True, "ok", "1 input sets verified")
    v = verify.verify(FakeModule(off), cand(), [fresh_set()], "cpu")
    assert (v.ok, v.reason) == (False, "mismatch")


def test_a_second_output_within_the_magnitudes_allowance_is_nondeterministic_not_mismatch():
    def off_second(t, n):
        honest(t, n)
        if n == 2:
            t["out"][1, 1] += 0.5

    v = verify.verify(FakeModule(off_second), cand(), [_allowance_at_large_magnitudes_only(fresh_set())], "cpu")
    assert (v.ok, v.reason) == (False, "nondeterministic")
    assert len(v.checks) == 1 and v.checks[0].passed


# ---------------------------------------------------------------- the CUDA path of a verification run, on CPU tensors


@pytest.fixture
def on_cuda(monkeypatch):
    """verify with device "cuda" on CPU tensors: every buffer and generator it asks for on a device is
    recorded and made on the CPU; the output preparations and device-wide synchronisations are recorded."""
    asked = {"devices": [], "prefill": [], "syncs": 0}
    real_like, real_empty, real_prefill, real_gen = verify.guarded_like, verify.guarded_empty, verify.prefill, torch.Generator

    def on(what, device):
        asked["devices"].append((what, device))
        return "cpu"

    def sync(*a):
        asked["syncs"] += 1

    monkeypatch.setattr(verify, "guarded_like", lambda spec, device: real_like(spec, on("out", device)))
    monkeypatch.setattr(verify, "guarded_empty", lambda n, device: real_empty(n, on("workspace", device)))
    monkeypatch.setattr(verify, "prefill", lambda out, mode, gen: asked["prefill"].append((mode, gen)) or
                        real_prefill(out, mode, gen))
    monkeypatch.setattr(torch, "Generator", lambda device=None: real_gen(device=on("generator", device)))
    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    asked["real_gen"] = real_gen
    return asked


def test_on_cuda_both_calls_write_one_guarded_output_sentinel_first_then_seeded_garbage(on_cuda):
    """No fresh allocation per call on CUDA (the package's output is reused memory): the second call
    writes the same guarded output, prepared as finite garbage from the set's seed, and each call is
    followed by a device-wide synchronisation."""
    s = fresh_set()
    seen = []

    def look(t, n):
        seen.append(t["out"].clone())
        honest(t, n)

    on_cuda["devices"].clear()
    m = FakeModule(look)
    v = verify.verify(m, cand(workspaces=(WS,)), [s], "cuda")
    assert (v.ok, v.reason, v.detail) == (True, "ok", "1 input sets verified")
    (run,) = m.runs
    assert run.n == 2 and run.outs[0] is run.outs[1]  # never retargeted
    assert [mode for mode, _ in on_cuda["prefill"]] == ["sentinel", "stale"] and on_cuda["syncs"] == 2
    assert [d for d in on_cuda["devices"] if d != ("workspace", "cpu")] == [
        ("out", "cuda"), ("workspace", "cuda"), ("generator", "cuda")]
    assert rules.count_sentinel(seen[0])[0] == 64
    g = on_cuda["real_gen"]().manual_seed(verify.seed_for("garbage", "fresh[0]"))
    torch.empty(64, dtype=torch.uint8).random_(0, 256, generator=g)  # the workspace's garbage for the first call
    assert torch.equal(seen[1], torch.empty(4, 16).normal_(generator=g))


def test_on_cuda_a_second_run_one_ulp_off_is_nondeterministic(on_cuda):
    """The first output is copied before the second call overwrites it in place."""
    def racy(t, n):
        honest(t, n)
        if n == 2:
            t["out"][1, 1] = torch.nextafter(t["out"][1, 1], torch.tensor(2.0))

    v = verify.verify(FakeModule(racy), cand(), [fresh_set()], "cuda")
    assert (v.ok, v.reason) == (False, "nondeterministic")
    assert v.detail.startswith("fresh[0]: two runs on the same input differ bitwise (1 elements, first at (1, 1)")


def test_the_second_run_of_a_held_set_is_judged_against_its_reference_without_remaking_it(monkeypatch):
    """A cached set keeps its float64 reference: only a streamed set (whose reference was dropped after
    the first run) makes it again, once, when the second run differs from the first."""
    held, streamed = fresh_set(), fresh_set()
    streamed.streamed = True
    made = []
    real = verify.memory_plan.reference64
    monkeypatch.setattr(verify.memory_plan, "reference64", lambda sig, t: made.append(sig) or real(sig, t))

    def off_second(t, n):
        honest(t, n)
        if n == 2:
            t["out"][2, 3] = 5.0

    v = verify.verify(FakeModule(off_second), cand(), [held], "cpu")
    assert (v.reason, v.checks[0].mismatches) == ("mismatch", 1) and made == []
    s = streamed
    v = verify.verify(FakeModule(off_second), cand(), [s], "cpu")
    assert (v.reason, v.checks[0].mismatches) == ("mismatch", 1) and made == [SIG] and s.ref is None


def test_a_cpu_kernel_writing_into_the_first_calls_output_on_the_second_call_is_rejected():
    """On the CPU the second call gets a new output and the first output stays where the caller left
    it: a kernel that writes into it later (a stale pointer) changes what the second run is compared to."""
    kept = []

    def stale(t, n):
        honest(t, n)
        if n == 1:
            kept.append(t["out"])
        else:
            kept[0][0, 0] += 1.0

    v = verify.verify(FakeModule(stale), cand(), [fresh_set()], "cpu")
    assert (v.ok, v.reason) == (False, "nondeterministic")
    assert v.detail.startswith("fresh[0]: two runs on the same input differ bitwise (1 elements, first at (0, 0)")


# ---------------------------------------------------------------- a kind's second key (verdict_rules.rejudge)


def _second_key(monkeypatch, key, eager_error: float):
    """Softmax with a second allowance key (as a region rounded in 16-bit floats has): ``key(tensors)``, and an
    eager whose own error at [0, 0] is ``eager_error`` (so the allowance rebuilt under that key is about it)."""
    import dataclasses

    spec = dataclasses.replace(registry.get("softmax"), sensitivity=key)
    monkeypatch.setattr(verify.registry, "spec_for", lambda sig: spec)
    calls = []

    def eager(sig):
        def run(t):
            calls.append(sig)
            out = torch.softmax(t["x"], -1)
            out[0, 0] += eager_error
            return out
        return run

    monkeypatch.setattr(verify.ops, "eager", eager)
    return calls


def _off_by_half(t, n):
    honest(t, n)
    t["out"][0, 0] += 0.5


def test_a_mismatch_within_eagers_error_under_the_second_key_passes_and_the_set_keeps_that_key(monkeypatch):
    s = fresh_set()
    first_floor = s.atol_floor
    key = torch.ones(4, 16, dtype=torch.float64)
    calls = _second_key(monkeypatch, lambda t: key if t is s.tensors else None, 0.4)  # the set's own tensors
    v = verify.verify(FakeModule(_off_by_half), cand(), [s], "cpu")
    assert (v.ok, v.reason) == (True, "ok") and calls == [s.sig] and v.checks[0].input_kind == "fresh[0]"
    assert s.magnitude is key and s.atol_floor is not first_floor
    assert float(s.atol_floor.max()) == pytest.approx(0.8, rel=1e-6)  # 2 x eager's 0.4, in key 1's bucket


def test_a_mismatch_beyond_eagers_error_under_the_second_key_stays_the_first_judgement(monkeypatch):
    s = fresh_set()
    first_floor = s.atol_floor
    _second_key(monkeypatch, lambda t: torch.ones(4, 16, dtype=torch.float64), 0.1)
    v = verify.verify(FakeModule(_off_by_half), cand(), [s], "cpu")
    assert (v.ok, v.reason) == (False, "mismatch")
    assert v.detail.startswith("fresh[0]: 1 of 64 elements out of tolerance")
    assert s.atol_floor is first_floor and s.magnitude is None


def test_without_a_second_key_a_mismatch_is_not_judged_again(monkeypatch):
    s = fresh_set()
    calls = _second_key(monkeypatch, lambda t: None, 0.4)
    v = verify.verify(FakeModule(_off_by_half), cand(), [s], "cpu")
    assert (v.ok, v.reason) == (False, "mismatch") and calls == []


def test_only_a_mismatch_is_judged_again(monkeypatch):
    keys, sets = [], [fresh_set(), fresh_set()]
    _second_key(monkeypatch, lambda t: keys.append(t) or torch.ones(4, 16, dtype=torch.float64), 0.4)

    def unwritten(t, n):
        honest(t, n)
        t["out"][0, 0] = float("nan")  # not the sentinel's payload: a NaN where the reference has none

    v = verify.verify(FakeModule(unwritten), cand(), [sets[0]], "cpu")
    assert (v.ok, v.reason) == (False, "nan") and keys == []
    v = verify.verify(FakeModule(honest), cand(), [sets[1]], "cpu")
    assert v.ok and keys == []
