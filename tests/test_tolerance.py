import math

import pytest
import torch

from forge_pack.evaluate import tolerance, verdict_rules
from forge_pack.evaluate.tolerance import compare
from forge_pack.targets import registry

POOL = registry.get("adaptive_avg_pool2d")


def test_every_tolerance_entry_has_a_reason():
    for key, tol in [*tolerance.TABLE.items(), *tolerance.OP_TABLE.items()]:
        assert tol.reason and len(tol.reason) > 20, key
        assert 0 <= tol.atol < 1 and 0 < tol.rtol < 0.1, key


def test_compare_passes_within_tolerance_and_records_errors():
    ref = torch.linspace(-3, 3, 1000, dtype=torch.float64)
    out = (ref * (1 + 5e-6)).float()
    c = compare(out, ref, op="layer_norm")
    assert c.passed and c.mismatches == 0 and (c.atol, c.rtol) == (1e-5, 1e-4)
    # 5e-6 relative by construction, plus fp32 rounding of the largest value (|3| * 2^-24 ~ 1.8e-7)
    assert c.max_abs_err == pytest.approx(1.5027530200661943e-05, rel=1e-9)
    assert c.max_rel_err == pytest.approx(5.058254964559037e-06, rel=1e-9)


def test_compare_reports_first_mismatch_with_index():
    ref = torch.zeros(4, 5, dtype=torch.float64)
    out = torch.zeros(4, 5)
    out[2, 3] = 0.5
    c = compare(out, ref)
    assert not c.passed and c.mismatches == 1
    assert c.first_mismatch.startswith("index (2, 3): got 0.5, expected 0")


def test_nan_must_match_position_by_position():
    ref = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64)
    good = torch.tensor([1.0, float("nan"), 3.0])
    assert compare(good, ref).passed
    wildcard = torch.tensor([float("nan"), float("nan"), 3.0])
    c = compare(wildcard, ref)
    assert not c.passed and c.nonfinite_mismatches == 1 and c.first_mismatch.startswith("NaN/Inf parity")
    missing = torch.tensor([1.0, 2.0, 3.0])
    assert compare(missing, ref).nonfinite_mismatches == 1


def test_inf_must_match_with_its_sign():
    ref = torch.tensor([float("inf"), float("-inf"), 0.0], dtype=torch.float64)
    assert compare(torch.tensor([float("inf"), float("-inf"), 0.0]), ref).passed
    assert not compare(torch.tensor([float("-inf"), float("-inf"), 0.0]), ref).passed
    assert not compare(torch.tensor([float("inf"), float("-inf"), float("inf")]), ref).passed


def test_softmax_atol_rejects_all_zero_probabilities():
    ref = torch.full((4, 262144), 1 / 262144, dtype=torch.float64)
    c = compare(torch.zeros(4, 262144, dtype=torch.bfloat16), ref, op="softmax")
    assert not c.passed and c.mismatches == ref.numel()


def test_bf16_rounding_passes_but_fp16_rounding_of_fp32_claim_fails():
    ref = torch.rand(10000, dtype=torch.float64) + 0.5
    assert compare(ref.to(torch.bfloat16), ref).passed
    assert not compare(ref.to(torch.bfloat16).float(), ref).passed  # fp32 output with bf16 precision


def test_atol_floor_relaxes_to_eager_error():
    ref = torch.ones(10, dtype=torch.float64)
    out = torch.full((10,), 1.001)
    assert not compare(out, ref).passed
    c = compare(out, ref, atol_floor=2e-3)
    assert c.passed and c.atol == pytest.approx(2e-3)


def test_shape_mismatch_is_a_failed_check_not_an_exception():
    c = compare(torch.zeros(3), torch.zeros(4, dtype=torch.float64), input_kind="odd:3")
    assert c == tolerance.Check("odd:3", math.inf, math.inf, 3, 1e-5, 1e-4, "shape (3,) != expected (4,)",
                                passed=False)


def test_chunked_comparison_counts_every_element(monkeypatch):
    monkeypatch.setattr(verdict_rules, "_CHUNK", 7)
    ref = torch.arange(100, dtype=torch.float64)
    out = ref.float().clone()
    out[50:] += 1
    c = compare(out, ref)
    assert c.mismatches == 50 and c.first_mismatch == "index (50,): got 51, expected 50"


def test_eager_allowance_is_by_magnitude_so_tiny_probabilities_cannot_be_flushed_to_zero():
    from forge_pack.evaluate.tolerance import EAGER_SLACK, eager_allowance

    torch.manual_seed(0)
    x = torch.randn(64, 1000) * 3
    ref = torch.softmax(x.double(), -1)
    eager = torch.softmax(x.bfloat16(), -1)  # bf16 rounding: errors largest on the largest values
    table = eager_allowance(eager, ref)
    assert compare(eager, ref, "bfloat16", "softmax", atol_floor=table).passed
    flushed = torch.where(ref < 1e-4, torch.zeros_like(eager), eager)
    assert int((ref < 1e-4).sum()) > 1000
    # one global allowance (2x eager's largest error) let this pass; by magnitude it does not
    global_floor = EAGER_SLACK * float((eager.double() - ref).abs().max())
    assert compare(flushed, ref, "bfloat16", "softmax", atol_floor=global_floor).passed
    bad = compare(flushed, ref, "bfloat16", "softmax", atol_floor=table)
    # only flushed elements fail (eager itself passed), nearly all of them, each off by 100% of itself
    assert not bad.passed and 0.98 * int((ref < 1e-4).sum()) < bad.mismatches <= int((ref < 1e-4).sum())
    assert bad.max_rel_err == 1.0 and bad.first_mismatch.startswith("index (0, 0): got 0, expected ")


def test_eager_allowance_still_forgives_a_uniform_absolute_error_like_eagers():
    """Large offsets: eager's statistics are off, so every output element is off by about the same
    absolute amount, small values included; a kernel 1.5x as far off must still pass."""
    from forge_pack.evaluate.tolerance import eager_allowance

    torch.manual_seed(1)
    ref = torch.randn(4096, dtype=torch.float64)
    eager = (ref + 3e-3).float()  # shifted statistics: a constant error well above fp32 tolerance
    kernel = (ref - 4.5e-3).float()
    table = eager_allowance(eager, ref)
    assert not compare(kernel, ref, "float32", "group_norm").passed
    assert compare(kernel, ref, "float32", "group_norm", atol_floor=table).passed
    assert not compare((ref + 7e-3).float(), ref, "float32", "group_norm", atol_floor=table).passed


def test_max_rel_error_ignores_nan_references_elsewhere():
    """A fully masked softmax row has a NaN reference; the relative error of the other rows is still reported."""
    ref = torch.tensor([float("nan"), 0.5, 0.25], dtype=torch.float64)
    c = compare(torch.tensor([float("nan"), 0.5, 0.5]), ref, "float32", "softmax")
    assert c.max_rel_err == pytest.approx(1.0) and c.max_abs_err == pytest.approx(0.25) and c.mismatches == 1


# ---- exact values: what a verification records must not drift (mutation testing, docs/testing.md)

def test_tolerance_lookup_prefers_the_op_entry_and_falls_back_to_the_dtype():
    assert tolerance.tolerance("softmax", "float32") == tolerance.OP_TABLE[("softmax", "float32")]
    assert tolerance.tolerance(None, "float32") is tolerance.TABLE["float32"]
    assert tolerance.tolerance("softmax", "float64") is tolerance.TABLE["float64"]
    assert tolerance.tolerance("layer_norm", "float32") is tolerance.TABLE["float32"]
    with pytest.raises(KeyError, match="no tolerance for dtype 'int8'"):
        tolerance.tolerance("softmax", "int8")


def test_dtype_names_drop_the_torch_prefix():
    assert tolerance.dtype_name(torch.bfloat16) == "bfloat16"
    assert tolerance.dtype_name(torch.float32) == "float32"


def test_magnitude_buckets_are_the_float64_exponent():
    r = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.5, 5e-324, 1e300], dtype=torch.float64)
    assert verdict_rules._bucket(r).tolist() == [0, 1023, 1024, 1024, 1022, 0, 2019]


def test_eager_allowance_is_slack_times_the_running_max_by_magnitude():
    ref = torch.tensor([0.5, 1.5, 3.0, -6.0, float("nan"), 100.0], dtype=torch.float64)
    # errors 1e-3 at |ref| 0.5, 4e-3 at 1.5, 2e-3 at 3, 0 at 6; the NaN and the Inf positions add nothing
    eager = torch.tensor([0.5 + 1e-3, 1.5 - 4e-3, 3.0 + 2e-3, -6.0, 7.0, float("inf")], dtype=torch.float64)
    table = tolerance.eager_allowance(eager, ref)
    assert table.shape == (2048,) and table.dtype == torch.float64
    assert table[0].item() == 0.0 and table[1021].item() == 0.0
    assert table[1022].item() == pytest.approx(2e-3, rel=1e-12)  # [0.5, 1): 2 x 1e-3
    for bucket in (1023, 1024, 1025, 1030, 2047):  # [1, 2) onwards: 2 x 4e-3, carried up by the running max
        assert table[bucket].item() == pytest.approx(8e-3, rel=1e-12)
    assert tolerance.eager_allowance(eager, ref, slack=1.0)[1022].item() == pytest.approx(1e-3, rel=1e-12)


def test_eager_allowance_covers_every_chunk(monkeypatch):
    monkeypatch.setattr(verdict_rules, "_CHUNK", 2)
    ref = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    eager = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.25], dtype=torch.float64)  # the error is in the last chunk
    assert tolerance.eager_allowance(eager, ref)[1023].item() == 0.5


@pytest.mark.parametrize("spread", [2, 3, 1024])
def test_eager_allowance_spread_over_table_copies_is_the_same_table(monkeypatch, spread):
    """CUDA scatters into SCATTER_SPREAD copies of the table (atomics into one address serialise); the
    table must be the one-copy table exactly, whatever lane an element lands in, chunked or not."""
    monkeypatch.setattr(verdict_rules, "_CHUNK", 7)  # a partial last chunk: its lanes differ in length
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(61, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 61, dtype=torch.float64)
    eager = ref + torch.randn(61, generator=g, dtype=torch.float64) * 1e-4
    eager[5], ref[9] = float("nan"), float("inf")
    one = tolerance.eager_allowance(eager, ref, spread=1)
    assert one.abs().sum() > 0
    assert torch.equal(tolerance.eager_allowance(eager, ref, spread=spread), one)
    monkeypatch.setitem(verdict_rules.SCATTER_SPREAD, "cpu", spread)  # the device default is used
    assert torch.equal(tolerance.eager_allowance(eager, ref), one)


def test_eager_allowance_scatters_into_spread_copies_neighbours_apart(monkeypatch):
    """The spread is the table copies scattered into: the explicit one, else the device's default
    (none listed: one copy), and neighbouring elements land in different copies."""
    seen = []
    real = torch.Tensor.scatter_reduce_

    def spy(self, dim, index, src, **kw):
        seen.append((self.numel(), int(index[1]) - int(index[0])))
        return real(self, dim, index, src, **kw)

    monkeypatch.setattr(torch.Tensor, "scatter_reduce_", spy)
    ref = torch.ones(4, dtype=torch.float64)  # one magnitude bucket: neighbours differ only by their copy
    eager = ref + 1e-3
    B = verdict_rules._BUCKETS
    for spread, want in ((1, (B, 0)), (2, (2 * B, B)), (None, (B, 0))):
        seen.clear()
        tolerance.eager_allowance(eager, ref, spread=spread)
        assert seen == [want], spread
    monkeypatch.setitem(verdict_rules.SCATTER_SPREAD, "cpu", 8)
    for spread, want in ((None, (8 * B, B)), (3, (3 * B, B))):
        seen.clear()
        tolerance.eager_allowance(eager, ref, spread=spread)
        assert seen == [want], spread


def test_max_abs_error_ignores_non_finite_positions():
    out = torch.tensor([1.0, float("nan"), 2.5, 4.0])
    ref = torch.tensor([1.5, 3.0, float("inf"), 3.75], dtype=torch.float64)
    assert tolerance.max_abs_error(out, ref) == 0.5
    assert tolerance.max_abs_error(torch.tensor([float("nan")]), torch.tensor([1.0], dtype=torch.float64)) == 0.0


def test_a_failed_comparison_records_exact_errors_counts_and_the_first_mismatch():
    ref = torch.tensor([1.0, 2.0, 4.0, 0.0], dtype=torch.float64)
    out = torch.tensor([1.0, 2.5, 4.0, 2.0 ** -15])  # 0.5 off at index 1; 2^-15 off where the reference is 0
    c = compare(out, ref, input_kind="fresh[0]")
    assert c == tolerance.Check("fresh[0]", 0.5, 2.0 ** -15 / 1e-5, 2, 1e-5, 1e-4,
                                "index (1,): got 2.5, expected 2", 0, 0, passed=False, nonfinite_mismatches=0)


def test_an_element_exactly_at_the_bound_passes_and_just_beyond_fails():
    ref = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert compare(torch.tensor([1.5, 2.5], dtype=torch.float64), ref, atol=0.5, rtol=0.0).passed
    assert compare(torch.tensor([1.5, 3.0], dtype=torch.float64), ref, atol=0.0, rtol=0.5).passed
    c = compare(torch.tensor([1.5, 3.0 + 2 ** -40], dtype=torch.float64), ref, atol=0.0, rtol=0.5)
    assert (c.passed, c.mismatches, c.atol, c.rtol) == (False, 1, 0.0, 0.5)


def test_the_output_dtype_argument_picks_the_tolerance_row():
    ref = torch.ones(3, dtype=torch.float64)
    out = torch.full((3,), 1.0 + 2 ** -9)  # inside bf16's 1.6e-2 rtol, outside fp32's 1e-4
    assert not compare(out, ref).passed
    c = compare(out, ref, dtype="bfloat16")
    assert (c.passed, c.atol, c.rtol) == (True, 1e-3, 1.6e-2)


def test_a_numeric_atol_floor_only_ever_raises_atol():
    ref = torch.ones(2, dtype=torch.float64)
    assert compare(ref.float(), ref, atol_floor=1e-9).atol == 1e-5
    assert compare(ref.float(), ref, atol_floor=0.25).atol == 0.25


def test_a_table_atol_floor_is_looked_up_by_each_elements_magnitude():
    table = torch.zeros(2048, dtype=torch.float64)
    table[1023] = 0.25  # |ref| in [1, 2)
    ref = torch.tensor([1.0, 4.0], dtype=torch.float64)
    ok = compare(torch.tensor([1.25, 4.0], dtype=torch.float64), ref, atol=0.0, rtol=0.0, atol_floor=table)
    assert (ok.passed, ok.atol) == (True, 0.0)
    bad = compare(torch.tensor([1.0, 4.25], dtype=torch.float64), ref, atol=0.0, rtol=0.0, atol_floor=table)
    assert (bad.passed, bad.mismatches, bad.first_mismatch) == (False, 1, "index (1,): got 4.25, expected 4")
    # the table never lowers the row's own atol
    c = compare(torch.tensor([1.0, 4.0 + 1e-6], dtype=torch.float64), ref, atol=1e-5, rtol=0.0, atol_floor=table)
    assert c.passed


def test_non_finite_parity_counts_and_the_parity_prefix():
    ref = torch.tensor([float("inf"), float("nan"), 1.0, 2.0], dtype=torch.float64)
    c = compare(torch.tensor([float("-inf"), float("nan"), float("inf"), 2.0]), ref)
    assert (c.passed, c.mismatches, c.nonfinite_mismatches, c.nan_count, c.inf_count) == (False, 2, 2, 1, 2)
    assert c.first_mismatch == "NaN/Inf parity at index (0,): got -inf, expected inf"
    assert (c.max_abs_err, c.max_rel_err) == (0.0, 0.0)
    # a finite output where the reference is +Inf is a parity failure too
    c = compare(torch.tensor([5.0]), torch.tensor([float("inf")], dtype=torch.float64))
    assert (c.mismatches, c.nonfinite_mismatches, c.first_mismatch) == (1, 1, "NaN/Inf parity at index (0,): got 5, "
                                                                               "expected inf")


def test_a_value_mismatch_before_a_nan_is_reported_without_the_parity_prefix():
    ref = torch.tensor([1.0, 1.0], dtype=torch.float64)
    c = compare(torch.tensor([2.0, float("nan")]), ref)
    assert (c.mismatches, c.nonfinite_mismatches, c.nan_count) == (2, 1, 1)
    assert c.first_mismatch == "index (0,): got 2, expected 1"


def test_chunks_accumulate_counts_maxima_and_keep_the_first_mismatch(monkeypatch):
    monkeypatch.setattr(verdict_rules, "_CHUNK", 4)
    ref = torch.zeros(10, dtype=torch.float64)
    out = torch.zeros(10, dtype=torch.float64)
    out[5], out[9], out[2] = 0.5, 0.75, float("nan")
    ref[0], out[0], ref[6], out[6] = float("inf"), float("inf"), float("-inf"), float("-inf")  # Infs in two chunks
    c = compare(out, ref, atol=0.1, rtol=0.0)
    assert (c.mismatches, c.nonfinite_mismatches, c.nan_count, c.inf_count) == (3, 1, 1, 2)
    assert (c.max_abs_err, c.max_rel_err) == (0.75, 7.5)
    assert c.first_mismatch == "NaN/Inf parity at index (2,): got nan, expected 0"


def test_empty_tensors_compare_equal_and_an_empty_shape_mismatch_still_counts_one():
    empty = torch.zeros(0, dtype=torch.float64)
    c = compare(torch.zeros(0), empty)
    assert (c.passed, c.mismatches, c.max_abs_err) == (True, 0, 0.0)
    c = compare(torch.zeros(0), torch.zeros(2, dtype=torch.float64))
    assert (c.passed, c.mismatches, c.first_mismatch) == (False, 1, "shape (0,) != expected (2,)")


def test_mismatch_indices_are_unravelled_row_major_even_with_empty_dimensions():
    assert verdict_rules._describe(23, (2, 3, 4), 0.123456789, -2e-9) == "index (1, 2, 3): got 0.123457, expected -2e-09"
    assert verdict_rules._describe(7, (2, 3, 4), 1.0, 2.0) == "index (0, 1, 3): got 1, expected 2"
    assert verdict_rules._describe(7, (2, 0, 3), 1.0, 2.0) == "index (0, 0, 1): got 1, expected 2"
    assert verdict_rules._describe(1, (3, 1), 1.0, 2.0) == "index (1, 0): got 1, expected 2"


def test_a_passing_comparison_has_no_first_mismatch_and_an_empty_input_kind():
    c = compare(torch.ones(3), torch.ones(3, dtype=torch.float64))
    assert c == tolerance.Check("", 0.0, 0.0, 0, 1e-5, 1e-4, "", 0, 0, passed=True, nonfinite_mismatches=0)


def test_a_float32_reference_is_widened_to_float64_before_the_bound():
    # 0.1 * |ref| in float32 is 0.10000000149: a 0.1000000000000001 error would slip under it
    ref32 = torch.tensor([1.0])
    c = compare(torch.tensor([1.1], dtype=torch.float64), ref32, atol=0.0, rtol=0.1)
    assert (c.passed, c.mismatches) == (False, 1)
    ref64 = torch.tensor([0.5, 1.5, 3.0], dtype=torch.float64)
    eager = torch.tensor([0.5 + 1e-3, 1.5 - 4e-3, 3.0 + 2e-3], dtype=torch.float64)
    assert torch.equal(tolerance.eager_allowance(eager, ref64.float()), tolerance.eager_allowance(eager, ref64.float().double()))


# ---------------------------------------------------------------- surely_within: the per-call fast path

def test_surely_within_vouches_inside_nine_tenths_of_the_tolerance_and_not_beyond():
    ref = torch.linspace(1.0, 2.0, 64, dtype=torch.float64)
    # float32 row: |err| <= 1e-5 + 1e-4 * |ref|; 0.8x that bound passes, 0.95x is left to compare
    bound = 1e-5 + 1e-4 * ref
    assert tolerance.surely_within((ref + 0.8 * bound).float(), ref)
    near = (ref + 0.8 * bound).float()
    near[40] = float(ref[40] + 0.95 * bound[40])
    assert not tolerance.surely_within(near, ref)
    assert compare(near, ref).passed  # still within tolerance: compare decides it


def test_surely_within_takes_the_row_of_the_named_dtype_and_op():
    ref = torch.full((16,), 0.5, dtype=torch.float64)
    out = (ref * 1.01).float()  # 1% off: inside bf16's rtol, outside fp32's
    assert tolerance.surely_within(out, ref, "bfloat16")
    assert not tolerance.surely_within(out, ref)
    tiny = torch.full((16,), 1e-7, dtype=torch.float64)
    # fp32's atol (1e-5) would cover zeros here; softmax's atol (1e-8) does not
    assert tolerance.surely_within(torch.zeros(16), tiny, "float32")
    assert not tolerance.surely_within(torch.zeros(16), tiny, "float32", "softmax")


def test_surely_within_never_vouches_for_non_finite_values_shapes_or_float64_outputs():
    ref = torch.ones(8, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        out = torch.ones(8)
        out[3] = bad
        assert not tolerance.surely_within(out, ref)
        ref_bad = ref.clone()
        ref_bad[5] = bad
        assert not tolerance.surely_within(torch.ones(8), ref_bad)
    assert not tolerance.surely_within(torch.ones(2, 4), ref)
    assert tolerance.surely_within(torch.ones(2, 4), ref.reshape(2, 4))
    assert not tolerance.surely_within(ref.clone(), ref)  # float64: compare in float64 decides


def test_surely_within_checks_every_chunk(monkeypatch):
    monkeypatch.setattr(verdict_rules, "_CHUNK", 4)
    ref = torch.ones(10, dtype=torch.float64)
    out = torch.ones(10)
    assert tolerance.surely_within(out, ref)
    out[9] = 2.0
    assert not tolerance.surely_within(out, ref)
    out[9] = 1.0
    ref[9] = float("nan")
    assert not tolerance.surely_within(out, ref)


def test_as_check_carries_every_field_of_the_comparison():
    ref = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64)
    c = verdict_rules.compare(torch.tensor([1.0, 2.0, float("inf")]), ref, input_kind="large")
    check = tolerance.as_check(c)
    assert type(check).__name__ == "Check"
    for field in ("input_kind", "max_abs_err", "max_rel_err", "mismatches", "atol", "rtol", "first_mismatch",
                  "nan_count", "inf_count", "passed", "nonfinite_mismatches"):
        assert getattr(check, field) == getattr(c, field), field
    assert tolerance.compare(torch.tensor([1.0, 2.0, float("inf")]), ref, input_kind="large") == check
    assert tolerance.compare(torch.ones(3) * 1.5, torch.ones(3, dtype=torch.float64), atol=0.6).passed
    assert not tolerance.compare(torch.ones(3) * 1.5, torch.ones(3, dtype=torch.float64), rtol=0.4).passed


def test_the_compare_wrapper_forwards_dtype_op_and_floor():
    ref = torch.full((4,), 0.5, dtype=torch.float64)
    out = (ref * 1.01).float()
    assert tolerance.compare(out, ref, "bfloat16").passed and not tolerance.compare(out, ref).passed
    assert tolerance.compare(out, ref, None, "softmax").atol == 1e-8
    c = tolerance.compare(out, ref, atol_floor=0.01)
    assert c.passed and c.atol == 0.01


def test_surely_within_checks_the_first_element_and_admits_exactly_nine_tenths():
    ref = torch.zeros(4, dtype=torch.float64)
    edge = float(torch.zeros(1).mul_(0.9 * 1e-4).add_(0.9 * 1e-5))  # the bound for |ref| = 0, in float32
    assert tolerance.surely_within(torch.full((4,), edge), ref)
    out = torch.zeros(4)
    out[0] = 1.0
    assert not tolerance.surely_within(out, ref)


def _sequential_mean(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """An honest fp32 pooling kernel that sums in another order than eager: one float32 add at a time."""
    v = x.flatten(2)[..., perm]
    acc = torch.zeros(v.shape[:2], dtype=torch.float32)
    for i in range(v.shape[-1]):
        acc = acc + v[..., i]
    return (acc / v.shape[-1]).reshape(*v.shape[:2], 1, 1)


def test_a_near_zero_mean_of_large_values_is_allowed_eagers_error_at_the_size_of_its_terms():
    # A mean of large values of both signs cancels: its rounding error follows mean |x|, not the
    # small result. Bucketed by |ref|, the one near-zero output met the allowance of near-zero
    # outputs (none but itself) and an honest kernel failed on some seeds; by magnitude it never does,
    # and an output off by 5e-3 or accumulated in bf16 still fails.
    from forge_pack.evaluate import verdict_rules as R
    old_failures = 0
    for seed in range(24):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(8, 128, 7, 7, generator=g) * 2500).float()
        x[0, :1] -= x[0, :1].mean(dim=(1, 2), keepdim=True)
        x[0, :1] += 0.06
        ref = torch.nn.functional.adaptive_avg_pool2d(x.double(), 1)
        eager = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        honest = _sequential_mean(x, torch.randperm(49, generator=g))
        mag = R.magnitude(POOL, {"x": x})
        assert mag.shape == ref.shape and float(mag[0, 1, 0, 0]) == pytest.approx(float(x[0, 1].double().abs().mean()))
        by_ref = R.compare(honest, ref, "float32", POOL, atol_floor=R.eager_allowance(eager, ref))
        old_failures += not by_ref.passed
        table = R.eager_allowance(eager, ref, magnitude=mag)
        assert R.compare(honest, ref, "float32", POOL, atol_floor=table, magnitude=mag).passed, seed
        off = ref.float() + torch.where(ref.abs() < 1, 5e-3, 0.0).float()
        bad = R.compare(off, ref, "float32", POOL, atol_floor=table, magnitude=mag)
        assert not bad.passed and bad.mismatches == int((ref.abs() < 1).sum())
        bf16 = x.flatten(2).to(torch.bfloat16).float().mean(-1).reshape(8, 128, 1, 1)
        assert not R.compare(bf16, ref, "float32", POOL, atol_floor=table, magnitude=mag).passed
        # the verdict path takes the same key: judge_output passes it through
        assert R.judge_output(honest, ref, "float32", POOL, table, "large", mag)[1] is None
        assert R.judge_output(off, ref, "float32", POOL, table, "large", mag)[1] == "mismatch"
    assert old_failures >= 3  # the false rejection this key removes is real, not hypothetical


def test_only_a_mean_has_a_magnitude_other_than_its_result():
    from forge_pack.evaluate import verdict_rules as R
    x = torch.randn(2, 3, 4, 4)
    for op in ("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm", None):
        assert R.magnitude(registry.get(op) if op else None, {"x": x}) is None
    got = R.magnitude(POOL, {"x": -x})
    assert got.dtype == torch.float64 and torch.equal(got, x.double().abs().mean(dim=(2, 3), keepdim=True))


def test_the_allowance_for_one_input_set_uses_the_magnitude_it_is_given():
    from forge_pack.evaluate import verdict_rules as R
    ref = torch.tensor([0.001, 100.0], dtype=torch.float64)
    eager = torch.tensor([0.001, 100.5], dtype=torch.float64)
    mag = torch.tensor([100.0, 100.0], dtype=torch.float64)
    by_ref = R.allowance(eager, ref, "float64", None)
    by_mag = R.allowance(eager, ref, "float64", None, mag)
    bucket_small = int(R._bucket(torch.tensor([0.001], dtype=torch.float64)))
    assert float(by_ref[bucket_small]) == 0.0
    assert float(by_mag[int(R._bucket(mag[:1]))]) == 1.0  # 2 x eager's 0.5 on the element of magnitude 100
    kernel = torch.tensor([0.4, 100.0], dtype=torch.float64)
    assert not R.compare(kernel, ref, "float64", atol_floor=by_ref).passed
    assert R.compare(kernel, ref, "float64", atol_floor=by_mag, magnitude=mag).passed


def _chunked_case():
    """An output with: a value out of tolerance at 40, NaN parity broken at 90 (NaN where the reference is
    finite), a matching NaN at 95 and a matching Inf at 97, the largest error at 60 (within a loose atol)."""
    ref = torch.linspace(-3, 3, 100, dtype=torch.float64)
    ref[95], ref[97] = float("nan"), float("inf")
    out = ref.float().clone()
    out[40] += 0.5
    out[60] += 0.75
    out[90] = float("nan")
    return out, ref


@pytest.mark.parametrize("chunk", [1, 3, 7, 100, 1 << 24])
def test_a_chunked_comparison_is_the_whole_ones_result_whatever_the_chunk(monkeypatch, chunk):
    """compare reads its counts and maxima back once, after every chunk (a read per chunk idled the GPU):
    the result, the first failing element included, must not depend on where the chunks fall."""
    out, ref = _chunked_case()
    monkeypatch.setattr(verdict_rules, "_CHUNK", chunk)
    c = compare(out, ref)
    assert (c.mismatches, c.nonfinite_mismatches, c.nan_count, c.inf_count) == (3, 1, 2, 1)
    assert c.first_mismatch == "index (40,): got -0.0757576, expected -0.575758" and not c.passed
    assert c.max_abs_err == pytest.approx(0.75, rel=1e-6)
    assert c.max_rel_err == pytest.approx(0.75 / abs(ref[60].item()), rel=1e-6)
    loose = compare(out, ref, atol=1.0)  # only the NaN is left: the parity message comes from its own chunk
    assert loose.mismatches == 1 and loose.first_mismatch.startswith("NaN/Inf parity at index (90,)")
    fine = compare(ref.float(), ref.float().double())
    assert fine.passed and fine.mismatches == 0 and fine.first_mismatch == "" and fine.max_abs_err == 0.0


@pytest.mark.parametrize("chunk", [1, 7, 1 << 24])
def test_surely_within_folds_every_chunk(monkeypatch, chunk):
    """The quick test's chunks are folded on the device and read once: a failing element in the last chunk
    or the first makes it False, all within makes it True, whatever the chunk."""
    monkeypatch.setattr(verdict_rules, "_CHUNK", chunk)
    ref = torch.linspace(1, 2, 50, dtype=torch.float64)
    assert tolerance.surely_within(ref.float(), ref)
    for i in (0, 49):
        out = ref.float().clone()
        out[i] += 0.01
        assert not tolerance.surely_within(out, ref)
        out[i] = float("inf")
        assert not tolerance.surely_within(out, ref)
    assert tolerance.surely_within(torch.zeros(0), torch.zeros(0, dtype=torch.float64))


def test_an_empty_comparison_has_no_error():
    c = compare(torch.zeros(0), torch.zeros(0, dtype=torch.float64))
    assert c.passed and (c.max_abs_err, c.max_rel_err, c.mismatches) == (0.0, 0.0, 0)


@pytest.mark.parametrize("chunk", [2, 1 << 24])
@pytest.mark.parametrize("keyed", ["reference", "magnitude"])
def test_the_first_mismatch_is_named_under_the_same_allowance_as_the_count(monkeypatch, chunk, keyed):
    """The failing chunk is computed again to name its first failing element: with the eager allowance table and
    the magnitude the count used, so an element the allowance covers is never named. Element 0 is 0.25 off and
    covered (its key is in [1, 2), allowed 0.5); element 2 is 0.5 off with no allowance: the one failure."""
    monkeypatch.setattr(verdict_rules, "_CHUNK", chunk)
    table = torch.zeros(2048, dtype=torch.float64)
    table[1023] = 0.5  # keys in [1, 2)
    if keyed == "reference":
        ref, mag = torch.tensor([1.0, 1.0, 4.0], dtype=torch.float64), None
    else:  # element 0's reference is 8 (no allowance by |ref|); its magnitude is 1
        ref, mag = torch.tensor([8.0, 1.0, 4.0], dtype=torch.float64), torch.tensor([1.0, 1.0, 4.0])
    out = (ref + torch.tensor([0.25, 0.0, 0.5], dtype=torch.float64)).float()
    c = compare(out, ref, atol_floor=table, magnitude=mag)
    assert c.mismatches == 1, c
    assert c.first_mismatch == "index (2,): got 4.5, expected 4", c
