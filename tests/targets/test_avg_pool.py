"""adaptive_avg_pool2d: binder on every call path, package parity, reference, the magnitude its
allowance is looked up by, tolerance, ABI."""

import pytest
import torch
import torch.nn.functional as F

import kind_checks as kc
from forge_pack.evaluate import verdict_rules
from forge_pack.targets import abi, registry

x = torch.randn(2, 4, 3, 5)
pool = torch.nn.AdaptiveAvgPool2d((1, 1))

CALLS = [  # (call, style, params)
    (lambda: F.adaptive_avg_pool2d(x, 1), "F", {"output_size": [1, 1]}),
    (lambda: F.adaptive_avg_pool2d(x, (1, None)), "F", {"output_size": [1, 5]}),
    (lambda: F.adaptive_avg_pool2d(x, output_size=[2, 3]), "F", {"output_size": [2, 3]}),
    (lambda: pool(x), "F", {"output_size": [1, 1]}),
]


@pytest.mark.parametrize("call, style, params", CALLS)
def test_the_binder_reads_every_call_path(call, style, params):
    kc.check_binds("adaptive_avg_pool2d", call, style, {"x": x}, params)


@pytest.mark.parametrize("call, style, params", CALLS)
def test_the_package_binds_each_call_as_the_profiler_does(tmp_path_factory, call, style, params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), "adaptive_avg_pool2d", call)


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (x, (1, 1, 1)), {}),  # three output sizes
    ("F", (x, 1.5), {}),
    ("F", (torch.randn(4), 1), {}),  # fewer than 2 dims
])
def test_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "adaptive_avg_pool2d", style, args, kwargs)


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_float64_reference_agrees_with_eager(channels_last):
    t = torch.empty(3, 16, 7, 7)
    if channels_last:
        t = t.to(memory_format=torch.channels_last)
    kc.check_reference_matches_eager(kc.signature("adaptive_avg_pool2d", {"x": t}, {"output_size": [1, 1]}))


def test_the_allowance_of_a_mean_is_looked_up_by_the_mean_of_its_absolute_terms():
    t = torch.tensor([[[[3.0, -3.0], [1.0, -1.0]]]])
    got = verdict_rules.magnitude(registry.get("adaptive_avg_pool2d"), {"x": t})
    assert got.dtype == torch.float64 and got.flatten().tolist() == [2.0]
    assert verdict_rules.magnitude(registry.get("softmax"), {"x": t}) is None


def test_tolerance_rows():
    kc.check_tolerances("adaptive_avg_pool2d", {"float32": (1e-6, 1e-4)})


def test_abi_and_applicability():
    sig = kc.signature("adaptive_avg_pool2d", {"x": torch.empty(2, 8, 5, 7)}, {"output_size": [1, 1]})
    kc.check_abi(sig, {"N": 2, "C": 8, "H": 5, "W": 7, "HW": 35, "channels_last": 0})
    assert abi.supports(sig) is None
    wide = kc.signature("adaptive_avg_pool2d", {"x": torch.empty(2, 8, 5, 7)}, {"output_size": [2, 2]})
    assert abi.supports(wide) == "only output size (1, 1) is targeted"
