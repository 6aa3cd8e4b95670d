"""group_norm: binder on every call path (torch.group_norm's cudnn_enabled included), package
parity, reference, tolerance, ABI."""

import pytest
import torch
import torch.nn.functional as F

import kind_checks as kc
from forge_pack.targets import abi

x = torch.randn(2, 4, 3, 3)
w, b = torch.randn(4), torch.randn(4)
gn = torch.nn.GroupNorm(2, 4, eps=1e-3)

CALLS = [  # (call, style, tensors, params)
    (lambda: F.group_norm(x, 2, w, b), "F", {"x": x, "weight": w, "bias": b}, {"num_groups": 2, "eps": 1e-5}),
    (lambda: F.group_norm(x, num_groups=4, eps=1e-6), "F", {"x": x, "weight": None, "bias": None},
     {"num_groups": 4, "eps": 1e-6}),
    # torch.group_norm takes cudnn_enabled: the profiler once refused what the package took
    (lambda: torch.group_norm(x, 2, w, b, 1e-6, True), "torch", {"x": x, "weight": w, "bias": b},
     {"num_groups": 2, "eps": 1e-6}),
    (lambda: torch.group_norm(x, 2, w, b, 1e-6, cudnn_enabled=False), "torch", {"x": x, "weight": w, "bias": b},
     {"num_groups": 2, "eps": 1e-6}),
    (lambda: gn(x), "F", {"x": x, "weight": gn.weight, "bias": gn.bias}, {"num_groups": 2, "eps": 1e-3}),
]


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_binder_reads_every_call_path(call, style, tensors, params):
    kc.check_binds("group_norm", call, style, tensors, params)


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_package_binds_each_call_as_the_profiler_does(tmp_path_factory, call, style, tensors, params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), "group_norm", call)


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (x, 2.0), {}),  # num_groups not an int
    ("F", (x, 2, w, b, 1e-5), {"cudnn_enabled": True}),  # F.group_norm has no cudnn_enabled
    ("torch", (x, 2, w, b, 1e-5, True, 0), {}),  # too many positionals
])
def test_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "group_norm", style, args, kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_float64_reference_agrees_with_eager(dtype):
    t = torch.empty(2, 8, 5, 7, dtype=dtype)
    sig = kc.signature("group_norm", {"x": t, "weight": torch.empty(8, dtype=dtype), "bias": None},
                       {"num_groups": 4, "eps": 1e-5})
    kc.check_reference_matches_eager(sig)


def test_tolerance_rows():
    kc.check_tolerances("group_norm", {"float32": (1e-4, 1e-4), "bfloat16": (1.6e-2, 1.6e-2),
                                       "float16": (2e-3, 2e-3)})


def test_abi_and_applicability():
    sig = kc.signature("group_norm", {"x": torch.empty(2, 8, 5, 7), "weight": None, "bias": None},
                       {"num_groups": 4, "eps": 1e-5})
    kc.check_abi(sig, {"N": 2, "C": 8, "G": 4, "HW": 35, "CPG": 2, "GROUP_SIZE": 70, "has_weight": 0})
    assert abi.supports(sig) is None
    cl = kc.signature("group_norm", {"x": torch.empty(2, 8, 5, 7).to(memory_format=torch.channels_last),
                                     "weight": None, "bias": None}, {"num_groups": 4, "eps": 1e-5})
    assert abi.supports(cl) == "non-contiguous input"
