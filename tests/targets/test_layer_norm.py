"""layer_norm: binder on every call path, package parity, reference, tolerance, ABI."""

import pytest
import torch
import torch.nn.functional as F

import kind_checks as kc
from forge_pack.targets import abi

x = torch.randn(2, 3, 8)
w, b = torch.randn(8), torch.randn(8)
ln = torch.nn.LayerNorm(8, eps=1e-3)

CALLS = [  # (call, style, tensors, params)
    (lambda: F.layer_norm(x, (8,), w, b), "F", {"x": x, "weight": w, "bias": b},
     {"normalized_shape": [8], "eps": 1e-5}),
    (lambda: F.layer_norm(x, [8], eps=1e-3), "F", {"x": x, "weight": None, "bias": None},
     {"normalized_shape": [8], "eps": 1e-3}),
    (lambda: F.layer_norm(x, normalized_shape=(3, 8), weight=None, bias=None, eps=0.5), "F",
     {"x": x, "weight": None, "bias": None}, {"normalized_shape": [3, 8], "eps": 0.5}),
    (lambda: torch.layer_norm(x, [8], w, None, 1e-5, True), "torch", {"x": x, "weight": w, "bias": None},
     {"normalized_shape": [8], "eps": 1e-5}),
    (lambda: ln(x), "F", {"x": x, "weight": ln.weight, "bias": ln.bias}, {"normalized_shape": [8], "eps": 1e-3}),
]


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_binder_reads_every_call_path(call, style, tensors, params):
    kc.check_binds("layer_norm", call, style, tensors, params)


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_package_binds_each_call_as_the_profiler_does(tmp_path_factory, call, style, tensors, params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), "layer_norm", call)


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (x,), {}),  # no normalized_shape
    ("F", (x, (8,)), {"eps": "small"}),  # eps not a number
    ("F", (x, (8,), None, None, 1e-5), {"cudnn_enable": True}),  # F.layer_norm has no cudnn_enable
])
def test_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "layer_norm", style, args, kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_float64_reference_agrees_with_eager(dtype):
    t = torch.empty(7, 40, dtype=dtype)
    sig = kc.signature("layer_norm", {"x": t, "weight": torch.empty(40, dtype=dtype), "bias": torch.empty(40, dtype=dtype)},
                       {"normalized_shape": [40], "eps": 1e-5})
    kc.check_reference_matches_eager(sig)


def test_tolerance_rows():
    kc.check_tolerances("layer_norm", {"bfloat16": (1.6e-2, 1.6e-2)})


def test_abi_and_applicability():
    sig = kc.signature("layer_norm", {"x": torch.empty(4, 6, 10), "weight": torch.empty(6, 10), "bias": None},
                       {"normalized_shape": [6, 10], "eps": 1e-5})
    kc.check_abi(sig, {"rows": 4, "cols": 60, "has_weight": 1, "has_bias": 0})
    assert abi.scalars(sig) == {"eps": 1e-5}
    assert abi.supports(sig) is None
    strided_w = kc.signature("layer_norm", {"x": torch.empty(4, 10), "weight": torch.empty(20)[::2], "bias": None},
                             {"normalized_shape": [10], "eps": 1e-5})
    assert abi.supports(strided_w) == "non-contiguous weight"


def test_the_binders_defaults_are_pytorchs_on_both_paths():
    from forge_pack.targets import registry

    spec = registry.get("layer_norm")
    for style in ("F", "torch"):
        tensors, params = spec.bind(style, (x, [8]), {})
        assert params == {"normalized_shape": [8], "eps": 1e-5} and tensors == {"x": x, "weight": None, "bias": None}
    assert spec.bind("torch", (x, 8), {"cudnn_enable": False})[1] == {"normalized_shape": [8], "eps": 1e-5}


def test_the_float64_reference_and_eager_call_normalize_the_trailing_shape():
    from forge_pack.targets import registry

    spec = registry.get("layer_norm")
    t = {"x": torch.tensor([[1.0, 3.0], [0.0, 4.0]]), "weight": torch.tensor([2.0, 3.0]), "bias": torch.tensor([1.0, 1.0])}
    ref = spec.reference64({"normalized_shape": [2], "eps": 0.0}, t)
    assert ref.dtype == torch.float64 and ref.tolist() == [[-1.0, 4.0], [-1.0, 4.0]]
    assert spec.eager({"normalized_shape": [2], "eps": 0.0}, "float32")(t).tolist() == [[-1.0, 4.0], [-1.0, 4.0]]
    whole = spec.reference64({"normalized_shape": [2, 2], "eps": 0.0}, {"x": t["x"], "weight": None, "bias": None})
    # mean 2, variance (1 + 1 + 4 + 4) / 4 = 2.5 over all four
    assert torch.allclose(whole, torch.tensor([[-1.0, 1.0], [-2.0, 2.0]], dtype=torch.float64) / 2.5 ** 0.5, rtol=1e-15)
