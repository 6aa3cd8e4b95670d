"""Unit tests of forge_pack/evaluate/verdict_rules.py's per-call checks, input makers and reference: each
asserts the exact verdict reason, detail text or value, so a changed rule shows up here (these
are also the tests `bench/mutation.sh verdict_rules` mutates the module against)."""

import torch

from forge_pack.evaluate import verdict_rules as vr


def test_sentinel_fill_is_counted_exactly_and_the_first_unwritten_index_named():
    out = torch.zeros(2, 3)
    vr.fill_sentinel(out)
    out[0, 0] = 1.0
    out[1, 2] = 2.0
    assert vr.count_sentinel(out) == (4, "first at index (0, 1)")
    out.fill_(0.0)
    assert vr.count_sentinel(out) == (0, "")


import math

import pytest
import torch.nn.functional as F

from forge_pack.evaluate.verdict_rules import (allowance, bitwise_equal, derived_source, first_diff, input_change,
                                               repeat_change)
from forge_pack.targets import registry
from forge_pack.targets.rms_norm import composite_rms_norm


# What is particular to one kind (its inputs, reference, eager call) is its TargetSpec's; the rules
# take the spec. These name the kind the way the tests below do, by op name.
def adversarial_kinds(op):
    return list(registry.get(op).adversarial)


def make_inputs(inputs, kind, gen, device):
    return registry.get("batch_norm").make_inputs(inputs, kind, gen, device)  # declares a draw for every name


def reference64(op, params, t, lookup=None):
    return registry.get(op).reference64(params, t, lookup)


def eager_fn(op, params, out_dtype, lookup=None):
    return registry.get(op).eager(params, out_dtype, lookup)


def derive_inputs(op, params, kind, source, gen):
    return vr.derive_inputs(registry.get(op), params, kind, source, gen)


def judge_output(out, ref, dtype, op, atol_floor, kind, magnitude=None):
    return vr.judge_output(out, ref, dtype, registry.get(op), atol_floor, kind, magnitude)


# ---------------------------------------------------------------- sentinel, bitwise checks

@pytest.mark.parametrize("dtype,bits", [(torch.float32, 0x7FD5A5A5), (torch.bfloat16, 0x7FD5),
                                        (torch.float16, 0x7E55), (torch.float64, 0x7FFA5A5A5A5A5A5A)])
def test_the_sentinel_is_a_quiet_nan_with_its_own_payload_per_dtype(dtype, bits):
    out = torch.zeros(3, dtype=dtype)
    vr.fill_sentinel(out)
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[out.element_size()]
    assert out.view(ints).tolist() == [bits] * 3
    assert bool(torch.isnan(out).all())
    assert vr.count_sentinel(out) == (3, "first at index (0,)")


def test_a_computed_nan_is_not_mistaken_for_the_sentinel():
    out = torch.full((2,), float("nan"))
    assert vr.count_sentinel(out) == (0, "")


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.float32, torch.float64])
def test_bitwise_equal_tells_signed_zeros_apart_and_equal_nans_equal(dtype):
    a = torch.tensor([0, 1, 2], dtype=dtype)
    assert bitwise_equal(a, a.clone())
    b = a.clone()
    b[2] = 3
    assert not bitwise_equal(a, b)
    if dtype.is_floating_point:
        assert not bitwise_equal(torch.tensor([0.0], dtype=dtype), torch.tensor([-0.0], dtype=dtype))
        nan = torch.tensor([float("nan")], dtype=dtype)
        assert bitwise_equal(nan, nan.clone())


def test_first_diff_counts_the_differing_elements_and_shows_the_first():
    a = torch.zeros(2, 3)
    b = a.clone()
    b[0, 2] = 1.5
    b[1, 0] = -2.0
    assert first_diff(b, a) == "2 elements, first at (0, 2): 1.5 vs 0"
    assert first_diff(a, a.clone()) == "no difference"


def test_input_change_names_the_input_the_run_and_the_first_difference():
    saved = torch.arange(4.0)
    assert input_change("x", saved.clone(), saved, "fresh", "first") is None
    cur = saved.clone()
    cur[3] = 7.0
    assert input_change("weight", cur, saved, "large", "second") == (
        "input_mutated", "large: input `weight` changed during the second call (1 elements, first at (3,): 7 vs 3)")


def test_repeat_change_reports_a_bitwise_difference_between_two_calls():
    first = torch.ones(3)
    assert repeat_change(first.clone(), first, "fresh") is None
    second = first.clone()
    second[1] = 2.0
    assert repeat_change(second, first, "constant") == (
        "nondeterministic", "constant: two runs on the same input differ bitwise (1 elements, first at (1,): 2 vs 1): "
                            "a race or uninitialised memory")


# ---------------------------------------------------------------- judge_output

def _ref(n=6):
    return torch.linspace(-1, 1, n, dtype=torch.float64)


def test_judge_output_passes_an_exact_output_with_no_reason():
    ref = _ref()
    check, reason, detail = judge_output(ref.float(), ref, "float32", "softmax", 0.0, "fresh")
    assert (reason, detail) == (None, "")
    assert check.passed and check.input_kind == "fresh" and (check.atol, check.rtol) == (1e-8, 1e-4)


def test_judge_output_puts_an_unwritten_element_before_a_mismatch():
    ref = _ref()
    out = ref.float()
    vr.fill_sentinel(out[4:])
    out[0] = 5.0
    check, reason, detail = judge_output(out, ref, "float32", "layer_norm", 0.0, "large")
    assert reason == "unwritten_output"
    assert detail == "large: 2 of 6 output elements never written (first at index (4,))"
    assert check.mismatches == 3


def test_judge_output_reports_value_mismatches_with_the_nan_positions_counted_apart():
    ref = _ref()
    out = ref.float()
    out[1] = 9.0
    out[2] = float("nan")
    check, reason, detail = judge_output(out, ref, "float32", "layer_norm", 0.0, "offset")
    assert reason == "mismatch"
    assert detail == ("offset: 1 of 6 elements out of tolerance (and 1 NaN/Inf positions) (atol 1e-05, rtol 0.0001); "
                      "index (1,): got 9, expected -0.6")
    out[2] = ref[2]
    _, reason, detail = judge_output(out, ref, "float32", "layer_norm", 0.0, "offset")
    assert detail == ("offset: 1 of 6 elements out of tolerance (atol 1e-05, rtol 0.0001); "
                      "index (1,): got 9, expected -0.6")


def test_judge_output_reports_nan_parity_alone_as_nan():
    ref = _ref()
    out = ref.float()
    out[3] = float("inf")
    check, reason, detail = judge_output(out, ref, "float32", "layer_norm", 0.0, "constant")
    assert reason == "nan"
    assert detail == ("constant: 1 positions where NaN/Inf differ from the reference; "
                      "NaN/Inf parity at index (3,): got inf, expected 0.2")


def test_judge_output_raises_atol_to_the_floor_it_is_given():
    ref = _ref()
    out = ref.float() + 0.01
    assert judge_output(out, ref, "float32", "layer_norm", 0.0, "fresh")[1] == "mismatch"
    check, reason, _ = judge_output(out, ref, "float32", "layer_norm", 0.02, "fresh")
    assert reason is None and check.atol == 0.02


def test_allowance_is_none_when_eager_breaks_nan_parity_else_the_magnitude_table():
    ref = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    eager = torch.tensor([1.0, float("nan"), 4.0])
    assert allowance(eager, ref, "float32", None) is None
    eager = torch.tensor([1.0, 2.5, 4.0])
    table = allowance(eager, ref, "float32", None)
    assert table.shape == (2048,) and table.dtype == torch.float64
    assert float(table[1024]) == 1.0 and float(table[1023]) == 0.0  # 2 x |2.5 - 2| from bucket 2^1 up


# ---------------------------------------------------------------- inputs

SPEC = ("float32", (2, 8), (8, 1))


def test_fresh_inputs_are_drawn_per_name_with_their_scale_and_shift():
    inputs = [("x", SPEC), ("weight", ("float32", (8,), (1,))), ("bias", ("float32", (8,), (1,))),
              ("running_mean", ("float32", (8,), (1,))), ("running_var", ("float32", (8,), (1,))), ("skip", None)]
    t = make_inputs(inputs, "fresh", torch.Generator().manual_seed(3), "cpu")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 8, generator=g)
    w = torch.randn(8, generator=g) * 0.2 + 1.0
    b = torch.randn(8, generator=g) * 0.2
    m = torch.randn(8, generator=g) * 0.2
    v = (torch.randn(8, generator=g) * 0.2 + 1.0).abs() + 0.05
    assert list(t) == ["x", "weight", "bias", "running_mean", "running_var", "skip"]
    assert t["skip"] is None
    for name, want in [("x", x), ("weight", w), ("bias", b), ("running_mean", m), ("running_var", v)]:
        assert torch.equal(t[name], want), name


def test_inputs_keep_the_exact_strides_and_dtype_of_their_spec():
    t = make_inputs([("x", ("float16", (3, 4), (1, 3)))], "fresh", torch.Generator().manual_seed(0), "cpu")
    assert t["x"].dtype == torch.float16 and t["x"].stride() == (1, 3) and tuple(t["x"].shape) == (3, 4)
    want = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)).half()
    assert torch.equal(t["x"], want)


@pytest.mark.parametrize("dtype,factor", [("float32", 2500.0), ("float16", 7500.0)])
def test_large_inputs_are_fresh_ones_times_a_quarter_of_big(dtype, factor):
    spec = (dtype, (2, 8), (8, 1))
    fresh = make_inputs([("x", spec)], "fresh", torch.Generator().manual_seed(1), "cpu")["x"]
    large = make_inputs([("x", spec)], "large", torch.Generator().manual_seed(1), "cpu")["x"]
    assert torch.equal(large, fresh * factor)


@pytest.mark.parametrize("dtype,shift", [("float32", 2000.0), ("float16", 300.0)])
def test_offset_inputs_have_a_large_mean_and_half_the_spread(dtype, shift):
    spec = (dtype, (2, 8), (8, 1))
    fresh = make_inputs([("x", spec)], "fresh", torch.Generator().manual_seed(1), "cpu")["x"]
    off = make_inputs([("x", spec)], "offset", torch.Generator().manual_seed(1), "cpu")["x"]
    assert torch.equal(off, fresh * 0.5 + shift)


def test_neg_inf_rows_mask_every_seventh_column_a_whole_row_and_all_but_one_of_row_two():
    t = make_inputs([("x", ("float32", (4, 9), (9, 1)))], "neg_inf_rows", torch.Generator().manual_seed(0), "cpu")
    inf = torch.isinf(t["x"])
    assert bool((t["x"][inf] < 0).all())
    assert inf[0].all() and inf[2].tolist() == [True, False] + [True] * 7
    assert inf[1].tolist() == [True] + [False] * 6 + [True, False]
    assert inf[3].tolist() == inf[1].tolist()


def test_neg_inf_rows_work_on_non_contiguous_inputs_and_short_ones():
    t = make_inputs([("x", ("float32", (2, 8), (1, 2)))], "neg_inf_rows", torch.Generator().manual_seed(0), "cpu")
    inf = torch.isinf(t["x"])
    assert inf[0].all() and inf[1].tolist() == [True] + [False] * 6 + [True]


def test_constant_inputs_are_all_one_and_a_half_and_unknown_kinds_raise():
    t = make_inputs([("x", SPEC)], "constant", torch.Generator().manual_seed(0), "cpu")
    assert bool((t["x"] == 1.5).all())
    with pytest.raises(KeyError):
        make_inputs([("x", SPEC)], "huge", torch.Generator().manual_seed(0), "cpu")


def test_adversarial_kinds_per_op():
    assert adversarial_kinds("softmax") == ["large", "neg_inf_rows", "constant"]
    assert adversarial_kinds("log_softmax") == ["large", "neg_inf_rows", "constant"]
    for op in ("layer_norm", "group_norm", "rms_norm"):
        assert adversarial_kinds(op) == ["large", "offset", "constant"]
    assert adversarial_kinds("batch_norm") == ["large"]
    assert adversarial_kinds("adaptive_avg_pool2d") == ["large"]


def test_neg_inf_rows_reach_a_strided_input_that_reshape_would_copy():
    # (2, 3, 8) with the middle dimension outermost: its rows are not a view of the storage
    t = make_inputs([("x", ("float32", (2, 3, 8), (8, 16, 1)))], "neg_inf_rows", torch.Generator().manual_seed(0),
                    "cpu")
    x = t["x"]
    assert x.stride() == (8, 16, 1)
    rows = torch.isinf(x).reshape(-1, 8)
    assert rows[0].all() and rows[2].tolist() == [True, False] + [True] * 6
    assert rows[1].tolist() == [True] + [False] * 6 + [True]


# ---------------------------------------------------------------- reference and eager calls

def _t(shape=(2, 3, 4), seed=0, **extra):
    g = torch.Generator().manual_seed(seed)
    t = {"x": torch.randn(*shape, generator=g)}
    t.update(extra)
    return t


def _close64(a, b):
    assert a.dtype == torch.float64, a.dtype
    assert torch.allclose(a, b.double(), rtol=1e-12, atol=1e-12), (a - b.double()).abs().max()


def test_reference64_computes_each_op_in_float64():
    t = _t()
    x = t["x"].double()
    _close64(reference64("softmax", {"dim": 1}, t), torch.softmax(x, 1))
    _close64(reference64("log_softmax", {"dim": -1}, t), torch.log_softmax(x, -1))
    w, b = torch.rand(4) + 0.5, torch.rand(4)
    t2 = _t(weight=w, bias=b)
    _close64(reference64("layer_norm", {"normalized_shape": [4], "eps": 0.1}, t2),
             F.layer_norm(x, (4,), w.double(), b.double(), 0.1))
    _close64(reference64("layer_norm", {"normalized_shape": [4], "eps": 0.1}, _t(weight=None, bias=None)),
             F.layer_norm(x, (4,), None, None, 0.1))
    ms = x.pow(2).mean(-1, keepdim=True)
    _close64(reference64("rms_norm", {"normalized_shape": [4], "eps": 0.5}, _t()), x * torch.rsqrt(ms + 0.5))
    _close64(reference64("rms_norm", {"normalized_shape": [4], "eps": 0.5, "weight_offset": 1.0}, _t(weight=w)),
             x * torch.rsqrt(ms + 0.5) * (w.double() + 1.0))
    _close64(reference64("rms_norm", {"normalized_shape": [4], "eps": 0.5}, _t(weight=w)),
             x * torch.rsqrt(ms + 0.5) * w.double())
    ms2 = x.pow(2).mean((-2, -1), keepdim=True)
    _close64(reference64("rms_norm", {"normalized_shape": [3, 4], "eps": 1e-6}, _t()), x * torch.rsqrt(ms2 + 1e-6))
    x4 = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(1))
    t4 = {"x": x4, "weight": w, "bias": b}
    _close64(reference64("group_norm", {"num_groups": 2, "eps": 1e-3}, t4),
             F.group_norm(x4.double(), 2, w.double(), b.double(), 1e-3))
    rm, rv = torch.randn(4), torch.rand(4) + 0.1
    t5 = {"x": x4, "running_mean": rm, "running_var": rv, "weight": w, "bias": b}
    _close64(reference64("batch_norm", {"eps": 1e-2}, t5),
             F.batch_norm(x4.double(), rm.double(), rv.double(), w.double(), b.double(), False, 0.0, 1e-2))
    _close64(reference64("adaptive_avg_pool2d", {"output_size": [1, 2]}, {"x": x4}),
             F.adaptive_avg_pool2d(x4.double(), (1, 2)))
    with pytest.raises(KeyError):
        reference64("conv2d", {}, t)


def test_reference64_and_eager_fn_use_the_lookup_they_are_given():
    calls = []

    def lookup(owner, attr):
        calls.append((owner, attr))
        return lambda *a, **k: torch.zeros(1, dtype=torch.float64)

    assert float(reference64("softmax", {"dim": 0}, _t(), lookup)) == 0.0
    fn = eager_fn("group_norm", {"num_groups": 1, "eps": 1e-5}, None, lookup)
    assert calls == [("torch", "softmax"), ("torch.nn.functional", "group_norm")]
    assert float(fn(_t())) == 0.0


def test_eager_fn_makes_the_models_exact_call():
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(2))
    w, b = torch.rand(4) + 0.5, torch.rand(4)
    t = {"x": x, "weight": w, "bias": b}
    assert torch.equal(eager_fn("softmax", {"dim": 1}, None)(t), torch.softmax(x, 1))
    out = eager_fn("log_softmax", {"dim": -1, "dtype": "float64"}, None)(t)
    assert out.dtype == torch.float64 and torch.equal(out, torch.log_softmax(x, -1, dtype=torch.float64))
    assert torch.equal(eager_fn("layer_norm", {"normalized_shape": [4], "eps": 0.1}, None)(t),
                       F.layer_norm(x, (4,), w, b, 0.1))
    assert torch.equal(eager_fn("rms_norm", {"normalized_shape": [4], "eps": 0.1}, None)(t),
                       F.rms_norm(x, (4,), w, 0.1))
    comp = eager_fn("rms_norm", {"normalized_shape": [4], "eps": 0.1, "composite": True, "weight_offset": 1.0},
                    "float64")(t)
    assert comp.dtype == torch.float64 and torch.equal(comp, composite_rms_norm(x, w, 0.1, 1.0, torch.float64))
    assert eager_fn("rms_norm", {"normalized_shape": [4], "eps": 0.1, "composite": True}, None)(t).dtype == x.dtype
    x4 = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(3))
    t4 = {"x": x4, "weight": w, "bias": b, "running_mean": torch.randn(4), "running_var": torch.rand(4) + 0.1}
    assert torch.equal(eager_fn("group_norm", {"num_groups": 2, "eps": 0.1}, None)(t4),
                       F.group_norm(x4, 2, w, b, 0.1))
    assert torch.equal(eager_fn("batch_norm", {"eps": 0.1}, None)(t4),
                       F.batch_norm(x4, t4["running_mean"], t4["running_var"], w, b, False, 0.0, 0.1))
    assert torch.equal(eager_fn("adaptive_avg_pool2d", {"output_size": [1, 3]}, None)(t4),
                       F.adaptive_avg_pool2d(x4, (1, 3)))
    with pytest.raises(KeyError):
        eager_fn("conv2d", {}, None)


def test_composite_rms_norm_is_llama_style_without_offset_and_gemma_style_with_one():
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    w = (torch.rand(8, generator=torch.Generator().manual_seed(5)) + 0.5).to(torch.bfloat16)
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 0.25)
    assert torch.equal(composite_rms_norm(x, None, 0.25, 0.0), y.to(torch.bfloat16))
    assert torch.equal(composite_rms_norm(x, w, 0.25, 0.0), w * y.to(torch.bfloat16))
    gemma = composite_rms_norm(x, w, 0.25, 1.0)
    assert gemma.dtype == torch.bfloat16 and torch.equal(gemma, (y * (1.0 + w.float())).to(torch.bfloat16))
    assert composite_rms_norm(x, w, 0.25, 1.0, torch.float32).dtype == torch.float32


# ---------------------------------------------------------------- derived inputs

def _replay(seed):
    return torch.Generator().manual_seed(seed)


def test_derived_source_is_the_first_draw_of_the_sets_generator():
    for seed in range(5):
        assert derived_source(7, _replay(seed)) == int(torch.randint(7, (1,), generator=_replay(seed)))
    assert {derived_source(3, _replay(s)) for s in range(40)} == {0, 1, 2}


@pytest.mark.parametrize("seed", range(6))
def test_a_scale_multiplies_x_by_ten_to_a_signed_half_to_two_and_a_half_decades(seed):
    x = torch.randn(4, 6, generator=_replay(100 + seed))
    src = {"x": x, "weight": torch.ones(6)}
    out = derive_inputs("layer_norm", {"normalized_shape": [6]}, "scale", src, _replay(seed))
    g = _replay(seed)
    dec = float(torch.rand(1, generator=g, dtype=torch.float64) * 2.0 + 0.5)
    dec *= 1 if float(torch.rand(1, generator=g)) < 0.5 else -1
    assert torch.equal(out["x"], (x.double() * 10.0 ** dec).float())
    assert out["weight"] is not src["weight"] and torch.equal(out["weight"], src["weight"])
    assert torch.equal(src["x"], x)  # the source is left untouched


def test_a_scale_stops_at_a_64th_of_the_dtypes_range():
    x = torch.full((2, 4), 60000.0 / 64, dtype=torch.float16)  # already at the limit
    seed = next(s for s in range(50) if _scale_sign(s) > 0)
    out = derive_inputs("softmax", {"dim": -1}, "scale", {"x": x}, _replay(seed))
    limit = torch.finfo(torch.float16).max / 64
    assert torch.equal(out["x"], (x.double() * (limit / 937.5)).half())


def _scale_sign(seed):
    g = _replay(seed)
    torch.rand(1, generator=g, dtype=torch.float64)
    return 1 if float(torch.rand(1, generator=g)) < 0.5 else -1


@pytest.mark.parametrize("seed", range(6))
def test_a_shift_adds_two_to_eight_spreads_of_the_finite_values(seed):
    x = torch.randn(4, 6, generator=_replay(200 + seed))
    x[0, 0] = float("-inf")
    out = derive_inputs("softmax", {"dim": -1}, "shift", {"x": x}, _replay(seed))
    g = _replay(seed)
    spread = float(x[torch.isfinite(x)].double().std())
    off = float(torch.rand(1, generator=g, dtype=torch.float64) * 6.0 + 2.0) * spread
    off *= 1 if float(torch.rand(1, generator=g)) < 0.5 else -1
    assert torch.equal(out["x"], (x.double() + off).float())


def test_a_shift_of_a_constant_input_uses_the_smallest_spread_and_one_value_a_spread_of_one():
    g = _replay(1)
    u = float(torch.rand(1, generator=g, dtype=torch.float64) * 6.0 + 2.0)
    sign = 1 if float(torch.rand(1, generator=g)) < 0.5 else -1
    out = derive_inputs("softmax", {"dim": -1}, "shift", {"x": torch.full((2, 3), 5.0)}, _replay(1))
    assert torch.equal(out["x"], torch.full((2, 3), 5.0 + u * 1e-3 * sign))
    out = derive_inputs("softmax", {"dim": -1}, "shift", {"x": torch.full((1, 1), 5.0)}, _replay(1))
    assert torch.equal(out["x"], torch.tensor([[5.0 + u * sign]]))


def test_a_shift_stays_inside_the_dtype_range_either_way():
    fmax = torch.finfo(torch.float16).max
    limit, peak = fmax / 64, 900.0
    x = torch.tensor([[peak, -peak, 0.0]], dtype=torch.float16)  # spread ~900: an offset of thousands
    outs = {}
    for seed in range(20):
        s = _scale_sign(seed)
        outs.setdefault(s, derive_inputs("softmax", {"dim": -1}, "shift", {"x": x}, _replay(seed))["x"])
    assert torch.equal(outs[1], (x.double() + (limit - peak)).half())
    assert torch.equal(outs[-1], (x.double() - (limit - peak)).half())


def test_a_permutation_of_softmax_reorders_rows_and_columns_along_dim():
    x = torch.arange(24.0).reshape(2, 3, 4)
    out = derive_inputs("softmax", {"dim": 1}, "permute", {"x": x}, _replay(0))["x"]
    assert out.shape == x.shape and not torch.equal(out, x)
    rows_in = x.movedim(1, -1).reshape(-1, 3)
    rows_out = out.movedim(1, -1).reshape(-1, 3)
    # each output row holds one input row's values (a row permutation and one column permutation)
    assert sorted(map(tuple, rows_out.sort(dim=1).values.tolist())) == sorted(map(tuple, rows_in.tolist()))
    perm = torch.argsort(rows_out[0])
    for r in rows_out:
        assert torch.equal(torch.argsort(r), perm)  # one column order for every row (rows of x are increasing)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_a_permutation_of_a_norm_moves_weight_and_bias_with_their_columns(op):
    x = torch.randn(5, 6, generator=_replay(9))
    w, b = torch.arange(6.0) + 1, torch.arange(6.0) * 10
    params = {"normalized_shape": [6], "eps": 1e-5}
    src = {"x": x, "weight": w, "bias": b}
    out = derive_inputs(op, params, "permute", src, _replay(4))
    assert not torch.equal(out["weight"], w) and torch.equal(out["bias"], out["weight"] * 10 - 10)
    ref_in = reference64(op, params, src)
    ref_out = reference64(op, params, out)
    # the op's output is the same set of values, permuted alike
    assert torch.allclose(ref_out.sort(dim=1).values.sort(dim=0).values,
                          ref_in.sort(dim=1).values.sort(dim=0).values, atol=1e-12)
    assert torch.equal(w, torch.arange(6.0) + 1)  # the source's parameters untouched


def test_a_permutation_of_group_norm_keeps_channels_inside_their_group_and_moves_parameters():
    x = torch.arange(2 * 6 * 2 * 1, dtype=torch.float32).reshape(2, 6, 2, 1)
    w = torch.arange(6.0)
    out = derive_inputs("group_norm", {"num_groups": 3, "eps": 1e-5}, "permute", {"x": x, "weight": w, "bias": None},
                        _replay(2))
    chans = out["weight"].long()
    assert sorted(chans.tolist()) == list(range(6)) and out["bias"] is None
    for g in range(3):  # group blocks move whole
        assert len({int(c) // 2 for c in chans[2 * g:2 * g + 2]}) == 1
    for n in range(2):
        for c in range(6):
            assert sorted(out["x"][n, c].flatten().tolist()) == sorted(
                x[int(out["x"][n, c, 0, 0]) // 12, int(chans[c])].flatten().tolist())


def test_a_permutation_of_batch_norm_moves_its_statistics_and_pooling_keeps_spatial_layout():
    x = torch.arange(2 * 4 * 3 * 3, dtype=torch.float32).reshape(2, 4, 3, 3)
    rm, rv = torch.arange(4.0), torch.arange(4.0) + 10
    out = derive_inputs("batch_norm", {"eps": 1e-5}, "permute", {"x": x, "running_mean": rm, "running_var": rv},
                        _replay(5))
    assert torch.equal(out["running_var"], out["running_mean"] + 10) and not torch.equal(out["running_mean"], rm)
    spatial_moved = False
    for n in range(2):
        for c in range(4):
            plane = out["x"][n, c].flatten()
            src_plane = x.flatten(2)[:, int(out["running_mean"][c])]
            assert any(sorted(plane.tolist()) == sorted(p.tolist()) for p in src_plane)
            spatial_moved |= not any(torch.equal(plane, p) for p in src_plane)
    assert spatial_moved
    pooled = derive_inputs("adaptive_avg_pool2d", {"output_size": [1, 1]}, "permute", {"x": x}, _replay(5))["x"]
    for n in range(2):
        for c in range(4):
            assert any(torch.equal(pooled[n, c], x[m, k]) for m in range(2) for k in range(4))


@pytest.mark.parametrize("seed", range(4))
def test_mixed_scales_each_row_by_its_own_ten_to_minus_three_to_three(seed):
    x = torch.randn(5, 4, generator=_replay(300 + seed))
    out = derive_inputs("layer_norm", {"normalized_shape": [4]}, "mixed", {"x": x}, _replay(seed))["x"]
    factor = 10.0 ** (torch.rand(5, generator=_replay(seed), dtype=torch.float64) * 6.0 - 3.0)
    assert torch.equal(out, (x.double() * factor[:, None]).float())


def test_mixed_caps_each_rows_factor_at_the_dtype_limit_over_its_peak():
    x = torch.tensor([[900.0, 1.0], [0.0, 0.0], [float("-inf"), 1.0]], dtype=torch.float16)
    out = derive_inputs("softmax", {"dim": -1}, "mixed", {"x": x}, _replay(0))["x"]
    limit = torch.finfo(torch.float16).max / 64
    factor = torch.minimum(10.0 ** (torch.rand(3, generator=_replay(0), dtype=torch.float64) * 6.0 - 3.0),
                           torch.tensor([limit / 900.0, limit / 1e-30, limit / 1.0], dtype=torch.float64))
    assert torch.equal(out, (x.double() * factor[:, None]).half())


def test_flip_negates_some_all_finite_rows_and_never_a_row_with_inf():
    x = torch.randn(8, 3, generator=_replay(7)).abs() + 0.1
    x[5, 1] = float("-inf")
    out = derive_inputs("softmax", {"dim": 1}, "flip", {"x": x}, _replay(1))["x"]
    sign = torch.where(torch.rand(8, generator=_replay(1), dtype=torch.float64) < 0.5, -1.0, 1.0)
    sign[5] = 1.0
    assert torch.equal(out, x * sign[:, None].float())
    assert (sign < 0).any() and (sign[[0, 1, 2, 3, 4, 6, 7]] > 0).any()


def test_derived_inputs_keep_dtype_shape_strides_and_reject_unknown_kinds():
    x = torch.randn(3, 4, generator=_replay(0)).to(torch.bfloat16).t()
    for kind in vr.DERIVED_KINDS:
        out = derive_inputs("softmax", {"dim": 0}, kind, {"x": x}, _replay(1))["x"]
        assert out.dtype == torch.bfloat16 and out.stride() == x.stride() and out.shape == x.shape, kind
    with pytest.raises(KeyError):
        derive_inputs("softmax", {"dim": 0}, "rotate", {"x": x}, _replay(1))


# The transforms replayed from the set's generator, draw by draw: any other draw order, source of
# randomness or axis is a different verification set.

def _replay_rows_permutation(x, dim, seed):
    g = _replay(seed)
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    cols = torch.randperm(rows.shape[1], generator=g)
    rows = rows[torch.randperm(rows.shape[0], generator=g)][:, cols]
    return rows.reshape(moved.shape).movedim(-1, dim), cols


@pytest.mark.parametrize("op,dim", [("softmax", 1), ("log_softmax", -1)])
def test_a_softmax_permutation_is_one_row_and_one_column_draw_from_the_sets_generator(op, dim):
    x = torch.randn(2, 3, 4, generator=_replay(11))
    torch.manual_seed(123)  # the global generator plays no part
    out = derive_inputs(op, {"dim": dim}, "permute", {"x": x}, _replay(6))["x"]
    want, _ = _replay_rows_permutation(x, dim, 6)
    assert torch.equal(out, want)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_a_norm_permutation_replays_exactly_with_its_parameters(op):
    x = torch.randn(3, 2, 4, generator=_replay(12))
    w, b = torch.randn(2, 4, generator=_replay(13)), torch.randn(2, 4, generator=_replay(14))
    torch.manual_seed(321)
    out = derive_inputs(op, {"normalized_shape": [2, 4]}, "permute", {"x": x, "weight": w, "bias": b}, _replay(8))
    g = _replay(8)
    rows = x.reshape(-1, 8)
    cols = torch.randperm(8, generator=g)
    rows = rows[torch.randperm(3, generator=g)][:, cols]
    assert torch.equal(out["x"], rows.reshape(3, 2, 4))
    assert torch.equal(out["weight"], w.reshape(-1)[cols].reshape(2, 4))
    assert torch.equal(out["bias"], b.reshape(-1)[cols].reshape(2, 4))


def _replay_channel_permutation(x, seed, groups=None, spatial=True):
    g = _replay(seed)
    n, c = x.shape[:2]
    x = x[torch.randperm(n, generator=g)]
    if groups:
        per = c // groups
        within = torch.stack([torch.randperm(per, generator=g) for _ in range(groups)])
        chans = (torch.randperm(groups, generator=g)[:, None] * per + within).reshape(-1)
    else:
        chans = torch.randperm(c, generator=g)
    x = x[:, chans]
    if spatial and x.dim() > 2:
        flat = x.reshape(n, c, -1)
        x = flat[:, :, torch.randperm(flat.shape[2], generator=g)].reshape(x.shape)
    return x, chans


def test_a_group_norm_permutation_replays_exactly_with_weight_and_bias():
    x = torch.randn(3, 6, 2, 2, generator=_replay(15))
    w, b = torch.randn(6, generator=_replay(16)), torch.randn(6, generator=_replay(17))
    torch.manual_seed(5)
    out = derive_inputs("group_norm", {"num_groups": 3}, "permute", {"x": x, "weight": w, "bias": b}, _replay(9))
    want, chans = _replay_channel_permutation(x, 9, groups=3)
    assert torch.equal(out["x"], want)
    assert torch.equal(out["weight"], w[chans]) and torch.equal(out["bias"], b[chans])


@pytest.mark.parametrize("shape", [(3, 4, 5), (3, 4, 2, 3), (5, 4)])
def test_a_batch_norm_permutation_replays_exactly_with_all_four_parameters(shape):
    x = torch.randn(*shape, generator=_replay(18))
    ps = {n: torch.randn(4, generator=_replay(19 + i)) for i, n in enumerate(("weight", "bias", "running_mean",
                                                                              "running_var"))}
    torch.manual_seed(6)
    out = derive_inputs("batch_norm", {"eps": 1e-5}, "permute", {"x": x, **ps}, _replay(10))
    want, chans = _replay_channel_permutation(x, 10)
    assert torch.equal(out["x"], want)
    for name, v in ps.items():
        assert torch.equal(out[name], v[chans]), name


def test_a_pooling_permutation_moves_samples_and_channels_but_no_position():
    x = torch.randn(3, 4, 2, 3, generator=_replay(23))
    torch.manual_seed(7)
    out = derive_inputs("adaptive_avg_pool2d", {"output_size": [1, 1]}, "permute", {"x": x}, _replay(11))["x"]
    want, _ = _replay_channel_permutation(x, 11, spatial=False)
    assert torch.equal(out, want)


def _mixed_factor(rows, seed):
    return 10.0 ** (torch.rand(rows, generator=_replay(seed), dtype=torch.float64) * 6.0 - 3.0)


@pytest.mark.parametrize("op,params,shape,row_of", [
    ("log_softmax", {"dim": 1}, (2, 3, 4), lambda i: (i[0] * 4 + i[2])),
    ("layer_norm", {"normalized_shape": [3, 4]}, (2, 3, 4), lambda i: i[0]),
    ("rms_norm", {"normalized_shape": [4]}, (2, 3, 4), lambda i: i[0] * 3 + i[1]),
    ("group_norm", {"num_groups": 2}, (2, 4, 3), lambda i: i[0] * 2 + i[1] // 2),
    ("batch_norm", {}, (2, 3, 2), lambda i: i[1]),
    ("adaptive_avg_pool2d", {"output_size": [1, 1]}, (2, 3, 2, 2), lambda i: i[0] * 3 + i[1]),
])
def test_mixed_scales_exactly_the_elements_each_op_reduces_together(op, params, shape, row_of):
    x = torch.randn(*shape, generator=_replay(24)).double()
    out = derive_inputs(op, params, "mixed", {"x": x}, _replay(3))["x"]
    idx = list(torch.cartesian_prod(*[torch.arange(s) for s in shape]).reshape(-1, len(shape)).tolist())
    n_rows = len({row_of(i) for i in idx})
    factor = _mixed_factor(n_rows, 3)
    for i in idx:
        assert out[tuple(i)] == x[tuple(i)] * factor[row_of(i)], (i, row_of(i))


def test_flip_treats_batch_norm_channels_as_its_rows():
    x = torch.randn(2, 6, 3, generator=_replay(25)).abs() + 0.1
    out = derive_inputs("batch_norm", {}, "flip", {"x": x}, _replay(2))["x"]
    sign = torch.where(torch.rand(6, generator=_replay(2), dtype=torch.float64) < 0.5, -1.0, 1.0).float()
    assert torch.equal(out, x * sign[None, :, None])


def test_inputs_do_not_depend_on_the_default_dtype():
    want = make_inputs([("x", SPEC)], "fresh", _replay(4), "cpu")["x"]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = make_inputs([("x", SPEC)], "fresh", _replay(4), "cpu")["x"]
    finally:
        torch.set_default_dtype(old)
    assert torch.equal(got, want)


def test_judge_output_uses_the_declared_output_dtypes_tolerance_row():
    ref = torch.ones(4, dtype=torch.float64)
    out = torch.full((4,), 1.01)  # 1% off: inside bf16's 1.6e-2 rtol, far outside fp32's
    assert judge_output(out, ref, "bfloat16", "softmax", 0.0, "fresh")[1] is None
    assert judge_output(out, ref, "float32", "softmax", 0.0, "fresh")[1] == "mismatch"


def test_composite_rms_norm_normalises_over_the_last_dimension_only():
    x = torch.randn(2, 3, 4, generator=_replay(26))
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(composite_rms_norm(x, None, 1e-6, 0.0), y)
    w = torch.rand(4, generator=_replay(27)) + 0.5
    fn = eager_fn("rms_norm", {"normalized_shape": [4], "eps": 1e-6, "composite": True}, None)
    assert torch.equal(fn({"x": x, "weight": w}), w * y)  # no weight_offset: Llama style


@pytest.mark.parametrize("call", [lambda: reference64("conv2d", {}, {"x": torch.zeros(1)}),
                                  lambda: eager_fn("conv2d", {}, None),
                                  lambda: make_inputs([("x", SPEC)], "conv2d", _replay(0), "cpu"),
                                  lambda: derive_inputs("softmax", {"dim": 0}, "conv2d", {"x": torch.ones(2)},
                                                        _replay(0))])
def test_an_unknown_op_or_kind_is_a_key_error_naming_it(call):
    with pytest.raises(KeyError, match="conv2d"):
        call()


def test_neg_inf_rows_mask_row_two_of_a_three_row_input():
    t = make_inputs([("x", ("float32", (3, 9), (9, 1)))], "neg_inf_rows", _replay(0), "cpu")
    assert torch.isinf(t["x"][2]).tolist() == [True, False] + [True] * 7
    t = make_inputs([("x", ("float32", (2, 9), (9, 1)))], "neg_inf_rows", _replay(0), "cpu")
    assert torch.isinf(t["x"][1]).tolist() == [True] + [False] * 6 + [True, False]


def test_a_scale_or_shift_of_an_input_without_finite_values_leaves_it_as_it_is():
    x = torch.full((2, 3), float("-inf"))
    for kind in ("scale", "shift"):
        assert torch.equal(derive_inputs("softmax", {"dim": -1}, kind, {"x": x}, _replay(0))["x"], x), kind


def test_a_shift_of_two_finite_values_uses_their_spread():
    x = torch.tensor([[1.0, 3.0, float("nan")]])
    g = _replay(2)
    u = float(torch.rand(1, generator=g, dtype=torch.float64) * 6.0 + 2.0)
    sign = 1 if float(torch.rand(1, generator=g)) < 0.5 else -1
    out = derive_inputs("softmax", {"dim": -1}, "shift", {"x": x}, _replay(2))["x"]
    spread = float(torch.tensor([1.0, 3.0], dtype=torch.float64).std())
    assert torch.equal(out[0, :2], (x[0, :2].double() + u * spread * sign).float())


def test_mixed_caps_each_row_by_its_own_peak_not_the_largest_one():
    x = torch.tensor([[900.0, -900.0], [0.001, 0.002]], dtype=torch.float16)
    seed = next(s for s in range(100) if float(_mixed_factor(2, s)[1]) > 10.0)
    out = derive_inputs("layer_norm", {"normalized_shape": [2]}, "mixed", {"x": x}, _replay(seed))["x"]
    assert torch.equal(out[1], (x[1].double() * _mixed_factor(2, seed)[1]).half())  # far above 1023 / 900


def test_compare_names_no_input_kind_unless_given_one():
    ref = torch.ones(2, dtype=torch.float64)
    assert vr.compare(torch.ones(2), ref).input_kind == ""
    assert vr.compare(torch.ones(2), ref, input_kind="offset").input_kind == "offset"


def test_allowance_is_bucketed_by_the_kinds_magnitude_where_it_gives_one():
    # element 0: a tiny result (2^-10) of large terms (magnitude 100); element 1: 96 of the same terms
    ref = torch.tensor([2.0 ** -10, 96.0], dtype=torch.float64)
    eager = torch.tensor([2.0 ** -10 + 2.0 ** -20, 96.0 + 2.0 ** -6])
    mag = torch.tensor([100.0, 100.0], dtype=torch.float64)
    by_mag = allowance(eager, ref, "float32", registry.get("adaptive_avg_pool2d"), magnitude=mag)
    small, large = 1023 - 10, 1023 + 6  # the buckets of 2^-10 and of 64..128
    assert float(by_mag[small]) == 0.0  # nothing is keyed by |ref| = 2^-10 any more
    assert float(by_mag[large]) == 2.0 * 2.0 ** -6  # both errors in the bucket of 100: the larger, x2
    by_ref = allowance(eager, ref, "float32", registry.get("adaptive_avg_pool2d"))
    assert float(by_ref[small]) == 2.0 * 2.0 ** -20 and float(by_ref[large]) == 2.0 * 2.0 ** -6
    # a magnitude in another float dtype is bucketed by its float64 value
    assert torch.equal(allowance(eager, ref, "float32", None, magnitude=mag.float()), by_mag)


def test_a_region_transforms_its_main_input_and_copies_the_others():
    """A region's spec names the input it transforms (``main``); x, if it has one, is copied as is."""
    from types import SimpleNamespace

    a, x = torch.randn(3, 5, generator=_replay(7)), torch.randn(3, 5, generator=_replay(8))
    out = vr.derive_inputs(SimpleNamespace(main="a"), {}, "scale", {"x": x, "a": a}, _replay(2))
    g = _replay(2)
    dec = float(torch.rand(1, generator=g, dtype=torch.float64) * 2.0 + 0.5)
    dec *= 1 if float(torch.rand(1, generator=g)) < 0.5 else -1
    assert torch.equal(out["a"], (a.double() * 10.0 ** dec).float())
    assert out["x"] is not x and torch.equal(out["x"], x)


def test_finite_absmax_reads_every_chunk_from_the_first_element(monkeypatch):
    assert vr._finite_absmax(torch.tensor([-9.0, 1.0, 2.0])) == 9.0  # the largest is the very first element
    monkeypatch.setattr(vr, "_CHUNK", 2)
    t = torch.tensor([-3.0, float("inf"), 1.0, float("nan"), -7.5])
    assert vr._finite_absmax(t) == 7.5  # in the last, one-element chunk
    assert vr._finite_absmax(torch.tensor([float("-inf"), float("nan")])) == 0.0


def test_a_comparison_over_many_chunks_warns_nothing(monkeypatch):
    """Each chunk's counts and maxima are written into tables sized for them before the first chunk: a table of
    another width would have its rows resized under torch.stack(out=...), which warns."""
    import warnings

    monkeypatch.setattr(vr, "_CHUNK", 3)
    ref = torch.arange(10, dtype=torch.float64)
    out = ref.float().clone()
    out[7] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = vr.compare(out, ref, atol=0.0, rtol=0.0)
    assert (c.mismatches, c.nan_count, c.nonfinite_mismatches) == (1, 1, 1) and c.first_mismatch.startswith("NaN/Inf")


# ---------------------------------------------------------------- rejudge: a kind's second allowance key


def _keyed(key_fn):
    import dataclasses

    return dataclasses.replace(registry.get("softmax"), sensitivity=key_fn)


def test_rejudge_needs_a_kind_with_a_second_key_that_gives_one():
    ref = torch.zeros(2, 4, dtype=torch.float64)
    out, eager = torch.full((2, 4), 0.5), lambda: torch.full((2, 4), 0.4)
    assert vr.rejudge(out, ref, "float32", None, "k", {}, eager) is None
    assert vr.rejudge(out, ref, "float32", registry.get("softmax"), "k", {}, eager) is None
    assert vr.rejudge(out, ref, "float32", _keyed(lambda t: None), "k", {}, eager) is None
    nan_eager = lambda: torch.tensor([[float("nan"), 0, 0, 0], [0, 0, 0, 0]])  # noqa: E731
    assert vr.rejudge(out, ref, "float32", _keyed(lambda t: torch.ones(2, 4)), "k", {}, nan_eager) is None


def test_rejudge_builds_the_allowance_under_the_second_key_from_eagers_error_and_judges_with_it():
    """Eager erred by 0.4 on one element keyed 1: an error of 0.5 on an element keyed 1 is within 2 x 0.4; on an
    element keyed 1e-6 (the second row), where eager erred by nothing, it is not."""
    ref = torch.zeros(2, 4, dtype=torch.float64)
    inputs = {"x": torch.zeros(2, 4)}
    eager_out = torch.tensor([[0.4, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    key = torch.tensor([[1.0] * 4, [1e-6] * 4], dtype=torch.float64)
    seen = []
    spec = _keyed(lambda t: seen.append(t) or key)
    cmp, reason, detail, allow, got = vr.rejudge(torch.tensor([[0.5, 0, 0, 0], [0, 0, 0, 0.0]]), ref, "float32", spec,
                                                 "fresh[0]", inputs, lambda: eager_out)
    assert (reason, detail, cmp.passed) == (None, "", True) and seen == [inputs] and got is key
    assert float(allow.max()) == pytest.approx(0.8) and float(allow[vr._bucket(torch.tensor([1e-6],
                                                                        dtype=torch.float64))]) == 0.0
    cmp, reason, detail, _, _ = vr.rejudge(torch.tensor([[0.0, 0, 0, 0], [0.5, 0, 0, 0.0]]), ref, "float32", spec,
                                           "fresh[0]", inputs, lambda: eager_out)
    assert reason == "mismatch" and not cmp.passed and detail.startswith("fresh[0]: 1 of 8 elements out of tolerance")


def test_rejudge_judges_with_the_kinds_own_rows_for_the_dtype_it_is_given():
    """Eager exact (no allowance): an error of 1e-3 on a probability of 0.1 is 1% relative, within softmax's
    bf16 row (rtol 1.6e-2) and beyond its float32 row (1e-4), beyond the generic float32 row too (1e-5 + 1e-4 x
    0.1); the rows, not only the allowance, decide."""
    ref = torch.full((2, 10), 0.1, dtype=torch.float64)
    out = ref.float().clone()
    out[0, 0] += 1e-3
    spec = _keyed(lambda t: torch.ones(2, 10, dtype=torch.float64))
    exact = lambda: ref.float()  # noqa: E731
    assert vr.rejudge(out, ref, "bfloat16", spec, "k", {}, exact)[1] is None
    assert vr.rejudge(out, ref, "float32", spec, "k", {}, exact)[1] == "mismatch"
    zero = torch.zeros(2, 10, dtype=torch.float64)
    spike = torch.zeros(2, 10)
    spike[0, 0] = 5e-6  # where the reference is 0: within the generic float32 atol (1e-5), not softmax's (1e-8)
    assert vr.rejudge(spike, zero, "float32", spec, "k", {}, lambda: zero.float())[1] == "mismatch"
