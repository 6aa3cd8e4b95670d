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


def test_the_binder_reads_a_none_size_as_the_inputs_own_and_takes_any_input_of_two_dims_or_more():
    spec = registry.get("adaptive_avg_pool2d")
    x3 = torch.randn(3, 5, 7)
    assert spec.bind("F", (x3, (None, 2)), {}) == ({"x": x3}, {"output_size": [5, 2]})
    assert spec.bind("F", (x3, (2, None)), {}) == ({"x": x3}, {"output_size": [2, 7]})
    x2 = torch.randn(5, 7)
    assert spec.bind("F", (x2, 1), {}) == ({"x": x2}, {"output_size": [1, 1]})
    assert spec.bind("F", (x, 1, 2), {}) is None  # too many arguments: refused, never raised


def test_applicability_names_the_kind_for_other_ranks_and_refuses_other_layouts():
    three_d = kc.signature("adaptive_avg_pool2d", {"x": torch.empty(3, 5, 7)}, {"output_size": [1, 1]})
    assert abi.supports(three_d) == "adaptive_avg_pool2d is targeted on 4-d inputs only"
    strided = kc.signature("adaptive_avg_pool2d", {"x": torch.empty(2, 8, 5, 14)[..., ::2]}, {"output_size": [1, 1]})
    assert abi.supports(strided) == "input is neither contiguous nor channels_last"


def test_a_parsed_signature_defaults_to_the_global_pool():
    spec = registry.get("adaptive_avg_pool2d")
    kwargs = {"input": torch.empty(2, 8, 5, 7, device="meta")}
    assert spec.complete(kwargs) is None and kwargs["output_size"] == [1, 1]
    given = {"input": kwargs["input"], "output_size": [2, 3]}
    assert spec.complete(given) is None and given["output_size"] == [2, 3]


def test_the_float64_reference_and_eager_call_are_the_plane_means():
    spec = registry.get("adaptive_avg_pool2d")
    t = {"x": torch.tensor([[[[1.0, 2.0], [3.0, 6.0]], [[-1.0, -1.0], [-1.0, 7.0]]]])}
    ref = spec.reference64({"output_size": [1, 1]}, t)
    assert ref.dtype == torch.float64 and ref.flatten().tolist() == [3.0, 1.0] and tuple(ref.shape) == (1, 2, 1, 1)
    out = spec.eager({"output_size": [1, 1]}, "float32")(t)
    assert out.dtype == torch.float32 and out.flatten().tolist() == [3.0, 1.0]
    rows = spec.reference64({"output_size": [2, 1]}, t)
    assert rows.flatten().tolist() == [1.5, 4.5, -1.0, 3.0]  # the output size is the call's


def test_the_spec_carries_the_pools_contract():
    spec = registry.get("adaptive_avg_pool2d")
    assert (spec.tensors, spec.scalars, spec.params, spec.adversarial) == (("x",), (), ("output_size",), ("large",))
    assert [p.label for p in spec.call_paths] == ["F.adaptive_avg_pool2d", "nn.AdaptiveAvgPool2d"]
