"""How a region's verification inputs are made (forge_pack/targets/region_target.py): each input drawn by its role
(``_draw``: a mask is 0 or the dtype's lowest value, a positive input is at least 0.1, booleans are Bernoulli(0.2),
integers are 0..3, the rest N(0, 1)) with the input's own strides; the adversarial transform applied to the main
input alone; and the rows a region's reduction groups together (``rows``), read from its domain."""

from __future__ import annotations

import pytest
import torch

from forge_pack.targets import inputs as _inputs
from forge_pack.targets.region_target import MASK_FRACTION, RegionSpec, _draw

N = 64 * 1024  # enough elements that a fraction or a moment is known to ~1%


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _spec(dtype: str, shape=(256, 256), strides=None) -> tuple:
    if strides is None:
        strides = tuple(torch.empty(shape).stride())
    return (dtype, list(shape), list(strides))


def test_nothing_is_drawn_for_a_missing_input():
    assert _draw(None, "data", _gen(), "cpu") is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_mask_is_zero_or_the_dtypes_lowest_value_on_a_fifth_of_the_positions(dtype):
    out = _draw(_spec(dtype), "mask", _gen(), "cpu")
    lo = torch.finfo(out.dtype).min
    assert out.dtype == getattr(torch, dtype)
    assert bool(((out == 0) | (out == lo)).all())
    frac = (out == lo).double().mean().item()
    assert abs(frac - MASK_FRACTION) < 0.01, frac
    # every row holds masked and unmasked positions: no row is masked whole by the draw
    assert bool((out == lo).any(-1).all()) and bool((out == 0).any(-1).all())


def test_a_boolean_input_is_true_on_a_fifth_of_the_positions():
    out = _draw(_spec("bool"), "bool", _gen(), "cpu")
    assert out.dtype == torch.bool
    assert abs(out.double().mean().item() - MASK_FRACTION) < 0.01


def test_an_integer_input_takes_every_value_from_0_to_3_and_no_other():
    out = _draw(_spec("int64"), "int", _gen(), "cpu")
    assert out.dtype == torch.int64
    assert sorted(out.unique().tolist()) == [0, 1, 2, 3]
    counts = torch.bincount(out.reshape(-1)).double() / out.numel()
    assert bool(((counts - 0.25).abs() < 0.01).all()), counts


def test_a_positive_input_is_the_magnitude_of_a_normal_draw_moved_up_by_a_tenth():
    out = _draw(_spec("float32"), "positive", _gen(), "cpu")
    assert out.min().item() >= 0.1 and out.min().item() < 0.1 + 1e-3
    # E|N(0,1)| = sqrt(2 / pi)
    assert abs(out.mean().item() - (0.1 + (2 / torch.pi) ** 0.5)) < 0.01


def test_a_data_input_is_standard_normal():
    out = _draw(_spec("float32"), "data", _gen(), "cpu")
    assert abs(out.mean().item()) < 0.01 and abs(out.std().item() - 1) < 0.01
    assert out.min().item() < -3 and out.max().item() > 3


@pytest.mark.parametrize("role", ["data", "positive", "mask", "bool", "int"])
def test_a_draw_keeps_the_inputs_strides_and_depends_on_the_generator_alone(role):
    dtype = {"bool": "bool", "int": "int32"}.get(role, "bfloat16")
    spec = _spec(dtype, (32, 48), (1, 32))  # a transposed (column-major) input
    a = _draw(spec, role, _gen(3), "cpu")
    assert tuple(a.shape) == (32, 48) and a.stride() == (1, 32) and a.dtype == getattr(torch, dtype)
    assert torch.equal(a, _draw(spec, role, _gen(3), "cpu"))
    assert not torch.equal(a, _draw(spec, role, _gen(4), "cpu"))
    # the values are the draw's in logical order, whatever the layout: the same as a contiguous input's
    assert torch.equal(a, _draw(_spec(dtype, (32, 48)), role, _gen(3), "cpu"))


# a softmax of scores plus a mask broadcast over them, by hand (the form capture gives it)
def _masked_softmax_form() -> dict:
    spec = lambda shape: {"dtype": "float32", "shape": list(shape),  # noqa: E731
                          "strides": list(torch.empty(shape).stride())}
    return {"inputs": [spec((1, 1, 8, 16)), spec((2, 3, 8, 16))],
            "ops": [{"op": "aten.add.Tensor", "args": [{"in": 1}, {"in": 0}], "kwargs": {}},
                    {"op": "aten._softmax.default", "args": [{"n": 0}, -1, False], "kwargs": {}}]}


def _inputs_of(form: dict) -> list:
    return [(f"in{k}", (s["dtype"], s["shape"], s["strides"])) for k, s in enumerate(form["inputs"])]


def test_inputs_are_drawn_by_role_and_an_adversarial_set_changes_the_main_input_alone():
    form = _masked_softmax_form()
    spec = RegionSpec(form, "row")
    assert spec.roles == ["mask", "data"] and spec.main == "in1"
    fresh = spec.make_inputs(_inputs_of(form), "fresh", _gen(5), "cpu")
    lo = torch.finfo(torch.float32).min
    assert bool(((fresh["in0"] == 0) | (fresh["in0"] == lo)).all()) and bool((fresh["in0"] == lo).any())
    assert fresh["in1"].min() < -1 and fresh["in1"].max() > 1  # scores, not a mask
    for kind in ("large", "constant", "neg_inf_rows"):
        adv = spec.make_inputs(_inputs_of(form), kind, _gen(5), "cpu")
        assert torch.equal(adv["in0"], fresh["in0"]), kind  # the mask as drawn
        want = fresh["in1"].clone()
        _inputs.ADVERSARIAL[kind](want)
        assert torch.equal(adv["in1"], want), kind
        assert not torch.equal(adv["in1"], fresh["in1"]), kind


def test_a_regions_rows_are_the_elements_of_its_reduced_dims_and_go_back_to_the_shape():
    spec = RegionSpec(_masked_softmax_form(), "row")
    x = torch.arange(2 * 3 * 8 * 16, dtype=torch.float64).reshape(2, 3, 8, 16)
    # a group norm's domain: 4 groups of 6 x 16 elements
    rows, back = spec.rows({"domain": {"shape": [2, 4, 6, 16], "dims": [2, 3]}}, x)
    assert tuple(rows.shape) == (8, 96) and torch.equal(rows[1], x.reshape(-1)[96:192])
    assert torch.equal(back(rows * 2), x * 2) and tuple(back(rows).shape) == (2, 3, 8, 16)
    # a row of one element is a row too
    rows, back = spec.rows({"domain": {"shape": [768, 1], "dims": [1]}}, x)
    assert tuple(rows.shape) == (768, 1) and torch.equal(back(rows), x)


@pytest.mark.parametrize("domain", [None, {}, {"shape": [5, 7], "dims": [1]}, {"shape": [4, 2000], "dims": [1]}])
def test_without_a_domain_that_divides_the_input_a_region_is_one_row(domain):
    spec = RegionSpec(_masked_softmax_form(), "row")
    x = torch.randn(2, 3, 8, 16, dtype=torch.float64)
    rows, back = spec.rows({"domain": domain}, x)
    assert tuple(rows.shape) == (1, 768) and torch.equal(back(rows), x)
    scalar = torch.tensor(2.5, dtype=torch.float64)
    rows, back = spec.rows({"domain": {"shape": [1], "dims": [0]}}, scalar)
    assert tuple(rows.shape) == (1, 1) and torch.equal(back(rows), scalar)
    empty = torch.empty(0, 16, dtype=torch.float64)  # no element: one empty row, not zero rows of 16
    rows, back = spec.rows({"domain": {"shape": [4, 16], "dims": [1]}}, empty)
    assert tuple(rows.shape) == (1, 0) and tuple(back(rows).shape) == (0, 16)
