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
