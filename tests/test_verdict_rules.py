"""Unit tests of forge_pack/verdict_rules.py's per-call checks, input makers and reference: each
asserts the exact verdict reason, detail text or value, so a changed rule shows up here (these
are also the tests `bench/mutation.sh verdict_rules` mutates the module against)."""

import torch

from forge_pack import verdict_rules as vr


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

from forge_pack.verdict_rules import (adversarial_kinds, allowance, bitwise_equal, composite_rms_norm,
                                      derive_inputs, derived_source, eager_fn, first_diff, input_change,
                                      judge_output, make_inputs, reference64, repeat_change)


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


@pytest.mark.parametrize("dtype,shift", [("float32", 2000.0), ("bfloat16", 300.0)])
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
