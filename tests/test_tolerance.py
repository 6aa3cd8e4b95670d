import math

import pytest
import torch

from forge_pack import tolerance, verdict_rules
from forge_pack.tolerance import compare


def test_every_tolerance_entry_has_a_reason():
    for key, tol in [*tolerance.TABLE.items(), *tolerance.OP_TABLE.items()]:
        assert tol.reason and len(tol.reason) > 20, key
        assert 0 <= tol.atol < 1 and 0 < tol.rtol < 0.1, key


def test_compare_passes_within_tolerance_and_records_errors():
    ref = torch.linspace(-3, 3, 1000, dtype=torch.float64)
    out = (ref * (1 + 5e-6)).float()
    c = compare(out, ref, op="layer_norm")
    assert c.passed and c.mismatches == 0
    assert 0 < c.max_abs_err < 1e-4 and 0 < c.max_rel_err < 1e-5


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
    c = compare(torch.zeros(3), torch.zeros(4, dtype=torch.float64))
    assert not c.passed and math.isinf(c.max_abs_err) and "shape" in c.first_mismatch


def test_chunked_comparison_counts_every_element(monkeypatch):
    monkeypatch.setattr(verdict_rules, "_CHUNK", 7)
    ref = torch.arange(100, dtype=torch.float64)
    out = ref.float().clone()
    out[50:] += 1
    c = compare(out, ref)
    assert c.mismatches == 50 and c.first_mismatch.startswith("index (50,)")


def test_eager_allowance_is_by_magnitude_so_tiny_probabilities_cannot_be_flushed_to_zero():
    from forge_pack.tolerance import EAGER_SLACK, eager_allowance

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
    assert not bad.passed and bad.mismatches >= 1000


def test_eager_allowance_still_forgives_a_uniform_absolute_error_like_eagers():
    """Large offsets: eager's statistics are off, so every output element is off by about the same
    absolute amount, small values included; a kernel 1.5x as far off must still pass."""
    from forge_pack.tolerance import eager_allowance

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
