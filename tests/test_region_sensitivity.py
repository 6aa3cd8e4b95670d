"""The eager allowance's key for regions rounded in 16-bit floats (forge_pack/targets/region_sensitivity.py): how far
roundings inside the region can move each element, so that an element whose intermediates were large and cancelled
is measured against eager's error on elements like it, not on the few elements of its small |reference|."""

from __future__ import annotations

import torch
import torch.nn as nn

from forge_pack.evaluate import verdict_rules as rules
from forge_pack.graph.capture import capture
from forge_pack.graph.regions import find_regions
from forge_pack.targets import region_sensitivity
from forge_pack.targets.region_target import signature, spec_for

U_BF16 = 2.0 ** -8


class _GroupNormByHand(nn.Module):
    """A group norm written inline, then an affine epilogue that cancels: out = norm * 2 + 1 (near 0 where the
    norm is near -0.5, computed from a product rounded near 1). ``shift_var``: the variance one bf16 step up in
    every other row, what an honest kernel gives when its fp32 sum rounds the other way."""

    def __init__(self, shift_var: bool = False):
        super().__init__()
        self.shift_var = shift_var

    def forward(self, x):
        b, c, h, w = x.shape
        y = x.view(b, 4, -1)
        m = y.mean(-1, keepdim=True)
        v = y.var(-1, keepdim=True, unbiased=False)
        if self.shift_var:
            up = torch.nextafter(v, torch.full_like(v, float("inf")))
            v = torch.where(torch.arange(v.numel()).view(v.shape) % 2 == 0, up, v)
        return ((y - m) * torch.rsqrt(v + 1e-6)).view(b, c, h, w) * 2 + 1


class _Twice(nn.Module):
    def forward(self, x):
        return x * 2


class _MaskedSoftmax(nn.Module):
    def forward(self, x, mask):
        return torch.softmax(x * 0.125 + mask, dim=-1)


def _region(model, *inputs):
    (region,) = find_regions(capture(model, inputs, profile=False))
    sig = signature(region)
    return sig, spec_for(sig)


def _judged(spec, sig, t: dict, out, key) -> rules.Comparison:
    """``out`` judged as verify judges a set: eager's allowance and the comparison, both looked up by ``key``."""
    ref = spec.reference64(sig.params, t)
    eager = spec.eager(sig.params, sig.output.dtype, None)(t)
    allow = rules.allowance(eager, ref, "bfloat16", spec, key)
    return rules.compare(out, ref, "bfloat16", spec, atol_floor=allow, magnitude=key)


def test_the_units_are_the_roundings_eager_makes_and_views_round_nothing():
    sig, spec = _region(_GroupNormByHand().bfloat16(), torch.randn(2, 8, 3, 5).bfloat16())
    key = spec.sensitivity({"in0": torch.randn(2, 8, 3, 5).bfloat16()})
    assert key is not None and key.dtype == torch.float32 and key.shape == (2, 8, 3, 5)
    units, out_unit = spec._units[0]
    ops = [o["op"].split(".")[1] for o in sig.param("form")["ops"]]
    assert out_unit == U_BF16
    for op, unit in zip(ops, units):
        assert unit == (None if op in ("view", "_unsafe_view") else U_BF16), (op, unit)


def test_a_region_computed_in_float32_keeps_the_reference_as_its_key():
    sig, spec = _region(_GroupNormByHand(), torch.randn(2, 8, 3, 5))
    assert spec.sensitivity({"in0": torch.randn(2, 8, 3, 5)}) is None
    t = {"in0": torch.randn(2, 8, 3, 5)}
    ref = spec.reference64(sig.params, t)
    assert rules.rejudge(ref.float() + 1, ref, "float32", spec, "fresh", t, lambda: ref.float()) is None


def test_a_region_is_judged_by_its_reference_first_and_a_kind_without_a_second_key_is_not_judged_again():
    sig, spec = _region(_Twice().bfloat16(), torch.randn(4, 8).bfloat16())
    assert spec.magnitude is None and spec.sensitivity is not None
    assert rules.rejudge(torch.zeros(3), torch.ones(3, dtype=torch.float64), "float32", None, "fresh", {},
                         lambda: torch.ones(3)) is None


def test_an_element_rounded_once_has_a_key_of_its_own_size():
    x = torch.randn(4, 33).bfloat16()
    sig, spec = _region(_Twice().bfloat16(), x)
    ref = spec.reference64(sig.params, {"in0": x})
    key = spec.sensitivity({"in0": x}).double()
    # one rounding op, moved one step (2u relative): |ref| x 2u / u
    assert torch.allclose(key, 2 * ref.abs(), rtol=1e-6, atol=0)


def test_cancelled_elements_are_keyed_by_their_intermediates():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 7).bfloat16()
    sig, spec = _region(_GroupNormByHand().bfloat16(), x)
    ref = spec.reference64(sig.params, {"in0": x})
    key = spec.sensitivity({"in0": x}).double()
    small = ref.abs() < 0.1
    assert small.sum() > 5
    # norm * 2 is about -1 there: each of its roundings moves the element by ~2^-8, the key is at least ~1
    assert (key[small] > 1.0).all(), key[small].min()
    assert (key >= ref.abs()).all()


def test_an_honest_kernel_one_rounding_step_away_from_eager_passes_where_the_reference_key_failed_it():
    """The variance one bf16 step away in every other row: every output of the row moves by a step of the product,
    ~2^-8 at magnitude 1, wherever the epilogue's + 1 cancels it; keyed by |reference| that failed some seeds."""
    x0 = torch.randn(2, 8, 6, 7).bfloat16()
    sig, spec = _region(_GroupNormByHand().bfloat16(), x0)
    honest = _GroupNormByHand(shift_var=True)
    old_failures = 0
    for seed in range(24):
        x = torch.randn(2, 8, 6, 7, generator=torch.Generator().manual_seed(seed)).bfloat16()
        t = {"in0": x}
        assert _judged(spec, sig, t, honest(x), spec.sensitivity(t)).passed, seed
        first = _judged(spec, sig, t, honest(x), None)
        old_failures += not first.passed
        if not first.passed:  # what verify does then: judged again under the second key, and it passes
            ref = spec.reference64(sig.params, t)
            eager = spec.eager(sig.params, sig.output.dtype, None)
            cmp, reason, detail, allow, key = rules.rejudge(honest(x), ref, "bfloat16", spec, "fresh", t,
                                                            lambda: eager(t))
            assert reason is None and cmp.passed and key.shape == ref.shape and allow.shape == (2048,)
    assert old_failures >= 1  # the case this key is for occurs in these seeds


def test_a_wrong_statistic_is_still_caught():
    """rstd 3% too large in every row: far more than any rounding inside the region moves an element."""

    class Wrong(_GroupNormByHand):
        def forward(self, x):
            b, c, h, w = x.shape
            y = x.view(b, 4, -1)
            v = y.var(-1, keepdim=True, unbiased=False)
            return ((y - y.mean(-1, keepdim=True)) * (torch.rsqrt(v + 1e-6) * 1.03)).view(b, c, h, w) * 2 + 1

    x = torch.randn(2, 8, 6, 7, generator=torch.Generator().manual_seed(1)).bfloat16()
    sig, spec = _region(_GroupNormByHand().bfloat16(), x)
    t = {"in0": x}
    assert not _judged(spec, sig, t, Wrong()(x), spec.sensitivity(t)).passed
    ref = spec.reference64(sig.params, t)
    eager = spec.eager(sig.params, sig.output.dtype, None)
    assert rules.rejudge(Wrong()(x), ref, "bfloat16", spec, "fresh", t, lambda: eager(t))[1] == "mismatch"


def test_small_softmax_probabilities_keep_small_keys_and_zeroing_them_is_caught():
    """A probability's sensitivity is proportional to it: the small ones stay in small buckets, where eager's error
    is small, so a kernel that flushes them to 0 still fails (what keying by one global figure once let through;
    below bf16's atol of 1e-3 no key matters)."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 256, generator=g) * 40).bfloat16()
    mask = torch.zeros(4, 256).bfloat16()
    sig, spec = _region(_MaskedSoftmax().bfloat16(), x, mask)
    t = {"in0": x, "in1": mask} if spec.main == "in0" else {"in0": mask, "in1": x}
    ref = spec.reference64(sig.params, t)
    key = spec.sensitivity(t).double()
    tiny = (ref > 0) & (ref < 1e-4)
    assert tiny.sum() > 10
    assert (key[tiny] < 1e-2).all()
    eager = spec.eager(sig.params, sig.output.dtype, None)(t)
    flushed = torch.where(eager.double() < 4e-3, torch.zeros_like(eager), eager)
    assert ((ref > 2e-3) & (ref < 4e-3)).any()
    assert _judged(spec, sig, t, eager, spec.sensitivity(t)).passed
    assert not _judged(spec, sig, t, flushed, spec.sensitivity(t)).passed


def test_non_finite_references_and_moves_are_left_out_of_the_key():
    """A fully masked softmax row is NaN in float64: its key is not a number the table could use, and the finite
    rows' keys are unaffected by it."""
    x = torch.randn(3, 16).bfloat16()
    mask = torch.zeros(3, 16).bfloat16()
    mask[1] = float("-inf")
    sig, spec = _region(_MaskedSoftmax().bfloat16(), x, mask)
    t = {"in0": x, "in1": mask} if spec.main == "in0" else {"in0": mask, "in1": x}
    key = spec.sensitivity(t)
    ref = spec.reference64(sig.params, t)
    assert torch.isnan(ref[1]).all() and not torch.isfinite(key[1]).any()
    assert torch.isfinite(key[0]).all() and torch.isfinite(key[2]).all()


def test_an_op_without_a_meta_kernel_gives_no_key(monkeypatch):
    sig, spec = _region(_Twice().bfloat16(), torch.randn(4, 8).bfloat16())

    def no_meta(*a, **k):
        raise NotImplementedError("no meta kernel")

    monkeypatch.setattr(torch.fx.Interpreter, "run", no_meta)
    assert region_sensitivity.rounding_units(None, sig.param("form")["inputs"]) is None


def test_a_perturbed_result_moves_every_element_one_step_up_or_down_at_random():
    v = torch.randn(4096, dtype=torch.float64) + 3
    moved = region_sensitivity._perturbed(v, U_BF16, torch.Generator().manual_seed(1))
    rel = (moved - v) / v
    assert torch.allclose(rel.abs(), torch.full_like(rel, 2 * U_BF16), rtol=1e-9, atol=0)
    up = (rel > 0).double().mean().item()
    assert 0.45 < up < 0.55, up
    assert torch.equal(moved, region_sensitivity._perturbed(v, U_BF16, torch.Generator().manual_seed(1)))
    assert not torch.equal(moved, region_sensitivity._perturbed(v, U_BF16, torch.Generator().manual_seed(2)))


def test_a_perturbed_tuple_moves_each_result_by_its_own_unit_and_leaves_exact_ones():
    a, b = torch.ones(512, dtype=torch.float64), torch.ones(512, dtype=torch.float64)
    idx = torch.arange(512)
    for kind in (tuple, list):
        out = region_sensitivity._perturbed(kind([a, b, idx]), (U_BF16, None, None), torch.Generator().manual_seed(0))
        assert type(out) is kind and len(out) == 3
        assert torch.allclose((out[0] - 1).abs(), torch.full_like(a, 2 * U_BF16), rtol=1e-12, atol=0)
        assert out[1] is b and out[2] is idx
    assert region_sensitivity._perturbed(idx, U_BF16, torch.Generator()) is idx  # an integer result is exact
    assert region_sensitivity._perturbed(2.5, U_BF16, torch.Generator()) == 2.5  # so is a Python number


def test_the_units_of_an_ops_results_follow_their_dtypes_nested_as_the_results_are():
    u = region_sensitivity._units_of((torch.zeros(1).bfloat16(), [torch.zeros(1).half(), torch.zeros(1)],
                                      torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.bool), 3.0))
    assert u == (U_BF16, (2.0 ** -11, 2.0 ** -24), None, None, None)
    assert region_sensitivity._units_of(torch.zeros(1, dtype=torch.float64)) == 2.0 ** -53


def test_the_key_sums_each_rounding_ops_move_in_units_of_the_output_and_clamps_to_float32():
    """Two rounding ops in a row (x * 2, then + 1) on float64 stand-ins: each moves an element by 2u of its own
    result, so the key is (2u |2x| + 2u |2x + 1|) / out_unit where that exceeds |ref|; a huge element's key is
    clamped to float32's largest value, not infinity."""
    class Two(torch.nn.Module):
        def forward(self, x):
            return x * 2 + 1

    graph = torch.fx.symbolic_trace(Two())
    x = torch.tensor([0.25, -0.5, 3.0, 1e300], dtype=torch.float64)
    ref = graph(x)
    key = region_sensitivity.sensitivity_key(graph, [U_BF16, U_BF16], U_BF16, [x], ref).double()
    want = torch.maximum(ref.abs(), 2 * (2 * x).abs() + 2 * (2 * x + 1).abs())
    assert torch.allclose(key[:3], want[:3], rtol=1e-6, atol=0), (key, want)
    assert key[3].item() == torch.finfo(torch.float32).max
    # an op whose unit is None is not moved: only the + 1 counts, keyed in a coarser output unit
    key = region_sensitivity.sensitivity_key(graph, [None, U_BF16], 2 * U_BF16, [x], ref).double()
    assert torch.allclose(key[:3], torch.maximum(ref.abs(), (2 * x + 1).abs())[:3], rtol=1e-6, atol=0)


def test_the_rounding_units_are_found_once_per_spec_and_only_for_16_bit_regions(monkeypatch):
    sig, spec = _region(_Twice().bfloat16(), torch.randn(4, 8).bfloat16())
    calls = []
    real = region_sensitivity.rounding_units
    monkeypatch.setattr(region_sensitivity, "rounding_units", lambda *a: calls.append(a) or real(*a))
    object.__setattr__(spec, "_units", [])
    t = {"in0": torch.randn(4, 8).bfloat16()}
    first = spec.sensitivity(t)
    assert torch.equal(spec.sensitivity(t), first) and len(calls) == 1
    assert spec._units[0] == ([U_BF16], U_BF16)
    # the meta run saw the form's own input: its dtype, shape and strides
    assert calls[0][1] == sig.param("form")["inputs"]
    # a float32 region has no units: None, found once too
    sig32, spec32 = _region(_Twice(), torch.randn(4, 8))
    assert spec32.sensitivity({"in0": torch.randn(4, 8)}) is None and spec32._units == [None]


class _CausalByIndex(nn.Module):
    """A softmax whose mask the graph builds from an arange: a tensor the graph creates, so the rebuilt graphs
    (the meta one the units come from, the float64 one the key comes from) must place it on their own device."""

    def forward(self, x):
        pos = torch.arange(x.shape[-1], device=x.device)
        return torch.softmax(x * 0.5 + (pos[None, :] > pos[:, None]).to(x.dtype) * -1e4, -1)


class _KeepWhere(nn.Module):
    def forward(self, x, keep):
        return torch.softmax(torch.where(keep, x * 0.5, -1e4), -1)


def test_a_graph_that_makes_its_own_tensors_and_one_with_a_boolean_input_get_keys():
    x = torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(3)).bfloat16()
    sig, spec = _region(_CausalByIndex().bfloat16(), x)
    key = spec.sensitivity({"in0": x})
    assert key is not None and spec._units[0] is not None and torch.isfinite(key).all()
    keep = torch.rand(2, 16, 16, generator=torch.Generator().manual_seed(4)) > 0.3
    sig, spec = _region(_KeepWhere().bfloat16(), x, keep)
    assert spec.roles == ["data", "bool"]
    t = {"in0": x, "in1": keep}
    key = spec.sensitivity(t)  # the boolean input stays boolean in the float64 run (where needs a condition)
    ref = spec.reference64(sig.params, t)
    assert key is not None and key.shape == ref.shape and (key.double() >= ref.abs().float().double() * 0.999).all()


def test_the_key_is_the_same_whatever_the_global_random_state():
    """The build and the package's verify must key a set alike: every move comes from the key's own seeded
    generators, never from torch's global one."""
    x = torch.randn(2, 8, 6, 7, generator=torch.Generator().manual_seed(5)).bfloat16()
    sig, spec = _region(_GroupNormByHand().bfloat16(), x)
    torch.manual_seed(1)
    first = spec.sensitivity({"in0": x})
    torch.manual_seed(2)
    torch.rand(100)
    assert torch.equal(spec.sensitivity({"in0": x}), first)
    v = (torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64))
    torch.manual_seed(1)
    a = region_sensitivity._perturbed(v, (U_BF16, U_BF16), torch.Generator().manual_seed(9))
    torch.manual_seed(2)
    b = region_sensitivity._perturbed(v, (U_BF16, U_BF16), torch.Generator().manual_seed(9))
    assert all(torch.equal(p, q) for p, q in zip(a, b))
