"""What the row and channel norms share (targets/norm_common.py): contiguity, the size variables and
rows of a trailing normalized_shape, odd sizes, the parsed signature's default normalized_shape."""

from types import SimpleNamespace

import pytest
import torch

import kind_checks as kc
from forge_pack.targets import norm_common, registry


def _ln(shape, normalized, weight=None):
    return kc.signature("layer_norm", {"x": torch.empty(shape), "weight": weight, "bias": None},
                        {"normalized_shape": normalized, "eps": 1e-5})


def test_size_vars_are_integer_rows_and_columns_of_the_normalized_shape():
    got = norm_common.row_size_vars(_ln((4, 6, 10), [6, 10]))
    # a contiguous x: its rows start every `cols` elements (x_inner rows, then the next outer block)
    assert got == {"rows": 4, "cols": 60, "x_inner": 4, "x_so": 240, "x_si": 60}
    assert all(type(v) is int for v in got.values())
    assert norm_common.row_size_vars(_ln((5, 1), [1])) == {"rows": 5, "cols": 1, "x_inner": 5, "x_so": 5, "x_si": 1}


def test_without_a_normalized_shape_the_last_dim_is_normalized():
    x = torch.empty(2, 3, 8)
    assert norm_common.normalized_size({}, (2, 3, 8)) == 8
    assert norm_common.normalized_size({"normalized_shape": [3, 8]}, (2, 3, 8)) == 24
    sig = SimpleNamespace(params=(), param=lambda name: None,
                          x=SimpleNamespace(shape=(2, 3, 8), strides=(24, 8, 1), numel=48))
    assert norm_common.row_size_vars(sig) == {"rows": 6, "cols": 8, "x_inner": 6, "x_so": 48, "x_si": 8}
    rows, _ = norm_common.rows({}, x.double())
    assert tuple(rows.shape) == (6, 8)
    rows, _ = norm_common.rows({"normalized_shape": [3, 8]}, x.double())
    assert tuple(rows.shape) == (2, 24)


def test_odd_shapes_keep_the_normalized_dims_under_37_rows():
    assert norm_common.row_odd_shapes(_ln((4, 6, 10), [10])) == [((37, 10), False)]
    assert norm_common.row_odd_shapes(_ln((4, 6, 10), [6, 10])) == [((37, 6, 10), False)]
    sig = SimpleNamespace(param=lambda name: None, x=SimpleNamespace(shape=(4, 6, 10)))
    assert norm_common.row_odd_shapes(sig) == [((37, 10), False)]


def test_a_non_contiguous_tensor_is_named():
    assert norm_common.contiguous_inputs(_ln((4, 10), [10])) is None
    assert norm_common.contiguous_inputs(_ln((4, 10), [10], torch.empty(20)[::2])) == "non-contiguous weight"
    strided = kc.signature("layer_norm", {"x": torch.empty(10, 4).t(), "weight": None, "bias": None},
                           {"normalized_shape": [10], "eps": 1e-5})
    assert norm_common.contiguous_inputs(strided) == "non-contiguous input"


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_a_parsed_signature_defaults_to_the_last_dim(name):
    complete = registry.get(name).complete
    kwargs = {"input": torch.empty(2, 3, 8, device="meta")}
    assert complete(kwargs) is None and kwargs["normalized_shape"] == [8]
    given = {"input": kwargs["input"], "normalized_shape": [3, 8]}
    assert complete(given) is None and given["normalized_shape"] == [3, 8]
    explicit_none = {"input": kwargs["input"], "normalized_shape": None}
    assert complete(explicit_none) is None and explicit_none["normalized_shape"] == [8]


def _strided(shape, strides, normalized):
    from forge_pack.targets.sigparse import parse_signature

    dims = ",".join(map(str, shape))
    return parse_signature("layer_norm", f"x: f32[{dims}]{{strides={','.join(map(str, strides))}}}, "
                                         f"normalized_shape=({','.join(map(str, normalized))},)")


# (shape, strides, normalized_shape) -> row_layout: each case sits on an edge of one rule
ROW_LAYOUTS = [
    ((4, 6, 32), (192, 32, 1), (32,), (24, 768, 32)),  # packed: the leading dims merge, a stride of exactly cols
    ((1, 4, 32), (128, 32, 1), (32,), (4, 128, 32)),  # a leading dim of 1 is skipped, the dims after it still count
    ((1, 32), (32, 1), (32,), (1, 32, 32)),  # no leading dim but 1s: one row
    ((5, 2, 3, 4), (24, 12, 4, 1), (2, 3, 4), (5, 120, 24)),  # three packed normalized dims: strides 12 = 3 * 4, 4, 1
    ((4, 1, 32), (32, 7, 1), (1, 32), (4, 128, 32)),  # a normalized dim of 1 may have any stride
    ((4, 32), (64, 2), (32,), None),  # a strided row
    ((4, 32), (16, 1), (32,), None),  # overlapping rows: a row stride below cols
    ((4, 6, 32), (32, 128, 1), (32,), (6, 32, 128)),  # transposed: outer rows exactly fill each inner step
    ((2, 3, 32), (100, 32, 1), (32,), (3, 100, 32)),  # inner rows exactly cols apart, inside each outer step
    ((2, 3, 32), (1000, 16, 1), (32,), None),  # inner rows overlap (16 < cols) though the outer step is wide
    ((2, 3, 32), (64, 40, 1), (32,), None),  # the inner rows run past the next outer step
    ((4, 6, 32), (32, 100, 1), (32,), None),  # the outer rows run past the next inner step
    ((2, 3, 4, 32), (128, 256, 32, 1), (32,), None),  # three strides
]


@pytest.mark.parametrize("shape, strides, normalized, layout", ROW_LAYOUTS)
def test_row_layout_at_the_edge_of_each_rule(shape, strides, normalized, layout):
    assert norm_common.row_layout(_strided(shape, strides, normalized)) == layout


def test_a_strided_x_is_a_row_input_only_when_its_rows_have_a_layout():
    assert norm_common.row_inputs(_strided((4, 6, 32), (32, 128, 1), (32,))) is None
    assert norm_common.row_inputs(_strided((4, 6, 32), (192, 32, 1), (32,))) is None
    assert norm_common.row_inputs(_strided((2, 3, 4, 32), (128, 256, 32, 1), (32,))) == (
        "non-contiguous input whose rows need more than two strides")
    assert norm_common.row_inputs(_ln((4, 10), [10], torch.empty(20)[::2])) == "non-contiguous weight"


def test_size_vars_carry_a_strided_xs_row_starts_and_fall_back_to_packed_rows():
    assert norm_common.row_size_vars(_strided((4, 6, 32), (32, 128, 1), (32,))) == {
        "rows": 24, "cols": 32, "x_inner": 6, "x_so": 32, "x_si": 128}
    # rows that need three strides are not targeted; their size variables read as packed rows
    got = norm_common.row_size_vars(_strided((2, 3, 4, 32), (128, 256, 32, 1), (32,)))
    assert got == {"rows": 24, "cols": 32, "x_inner": 24, "x_so": 768, "x_si": 32}
    assert all(type(v) is int for v in got.values())
