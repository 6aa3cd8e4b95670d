"""softmax and log_softmax: binder on every call path, package parity, reference, tolerance, ABI."""

import pytest
import torch
import torch.nn.functional as F

import kind_checks as kc
from forge_pack.targets import abi

x = torch.randn(2, 3, 8)

CALLS = [  # (kind, call, style, params)
    ("softmax", lambda: F.softmax(x, -1), "F", {"dim": 2, "dtype": None}),
    ("softmax", lambda: F.softmax(x, dim=1, dtype=torch.float64), "F", {"dim": 1, "dtype": "float64"}),
    ("softmax", lambda: F.softmax(x, -1, 3, torch.float16), "F", {"dim": 2, "dtype": "float16"}),
    ("softmax", lambda: torch.softmax(x, -1, torch.float64), "torch", {"dim": 2, "dtype": "float64"}),
    ("softmax", lambda: x.softmax(0), "method", {"dim": 0, "dtype": None}),
    ("softmax", lambda: x.softmax(dim=-1, dtype=torch.float32), "method", {"dim": 2, "dtype": "float32"}),
    ("softmax", lambda: torch.nn.Softmax(dim=-1)(x), "F", {"dim": 2, "dtype": None}),
    ("log_softmax", lambda: F.log_softmax(x, dim=2), "F", {"dim": 2, "dtype": None}),
    ("log_softmax", lambda: torch.log_softmax(x, 1, torch.float64), "torch", {"dim": 1, "dtype": "float64"}),
    ("log_softmax", lambda: x.log_softmax(-1), "method", {"dim": 2, "dtype": None}),
    ("log_softmax", lambda: torch.nn.LogSoftmax(dim=1)(x), "F", {"dim": 1, "dtype": None}),
]


@pytest.mark.parametrize("name, call, style, params", CALLS)
def test_the_binder_reads_every_call_path(name, call, style, params):
    kc.check_binds(name, call, style, {"x": x}, params)


@pytest.mark.parametrize("name, call, style, params", CALLS)
def test_the_package_binds_each_call_as_the_profiler_does(tmp_path_factory, name, call, style, params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), name, call)


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (x,), {"dim": -1, "out": None}),  # an unknown keyword
    ("F", (x, -1), {"dim": -1}),  # a duplicate
    ("method", (x, -1, None, 5), {}),  # too many positionals
    ("F", (x, "channels"), {}),  # a named dimension
    ("F", ([1.0, 2.0], -1), {}),  # not a tensor
])
def test_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "softmax", style, args, kwargs)


def test_the_implicit_dim_follows_pytorchs_rule():
    from forge_pack.targets import registry

    assert registry.get("softmax").bind("F", (x,), {})[1]["dim"] == 0  # 3-d: dim 0
    assert registry.get("softmax").bind("F", (torch.randn(2, 3, 4, 5),), {})[1]["dim"] == 1


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype, out_dtype", [(torch.float32, None), (torch.bfloat16, torch.float32)])
def test_the_float64_reference_agrees_with_eager(name, dtype, out_dtype):
    t = torch.empty(16, 33, dtype=dtype)
    sig = kc.signature(name, {"x": t}, {"dim": 1, "dtype": str(out_dtype).replace("torch.", "") if out_dtype else None})
    kc.check_reference_matches_eager(sig)


def test_tolerance_rows():
    kc.check_tolerances("softmax", {"float32": (1e-8, 1e-4), "bfloat16": (1e-8, 1.6e-2), "float16": (6e-8, 2e-3)})
    kc.check_tolerances("log_softmax", {"float32": (1e-5, 1e-5)})


def test_abi_and_applicability():
    sig = kc.signature("softmax", {"x": torch.empty(4, 6, 10)}, {"dim": 2, "dtype": None})
    kc.check_abi(sig, {"rows": 24, "cols": 10, "numel": 240, "has_x": 1})
    assert abi.supports(sig) is None
    other_dim = kc.signature("softmax", {"x": torch.empty(4, 6, 10)}, {"dim": 1, "dtype": None})
    assert abi.supports(other_dim) == "softmax over a dimension other than the last"
    strided = kc.signature("softmax", {"x": torch.empty(10, 4).t()}, {"dim": 1, "dtype": None})
    assert abi.supports(strided) == "non-contiguous input"
