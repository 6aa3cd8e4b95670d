"""batch_norm (inference): binder on every call path, package parity, reference, tolerance, ABI."""

import pytest
import torch
import torch.nn.functional as F

import kind_checks as kc
from forge_pack.targets import abi, registry

x = torch.randn(2, 4, 3, 3)
w, b = torch.randn(4), torch.randn(4)
rm, rv = torch.randn(4), torch.rand(4) + 0.5
bn = torch.nn.BatchNorm2d(4, eps=1e-3).eval()

CALLS = [  # (call, style, tensors, params)
    (lambda: F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5), "F",
     {"x": x, "running_mean": rm, "running_var": rv, "weight": w, "bias": b}, {"eps": 1e-5, "training": False}),
    (lambda: F.batch_norm(x, rm, rv, weight=w, eps=1e-4), "F",
     {"x": x, "running_mean": rm, "running_var": rv, "weight": w, "bias": None}, {"eps": 1e-4, "training": False}),
    (lambda: torch.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5, True), "torch",
     {"x": x, "running_mean": rm, "running_var": rv, "weight": w, "bias": b}, {"eps": 1e-5, "training": False}),
    (lambda: bn(x), "F", {"x": x, "running_mean": bn.running_mean, "running_var": bn.running_var,
                          "weight": bn.weight, "bias": bn.bias}, {"eps": 1e-3, "training": False}),
]


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_binder_reads_every_call_path(call, style, tensors, params):
    kc.check_binds("batch_norm", call, style, tensors, params)


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_package_binds_each_call_as_the_profiler_does(tmp_path_factory, call, style, tensors, params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), "batch_norm", call)


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (x, rm, rv, w, b, True), {}),  # training mode updates the running statistics
    ("F", (x, None, None), {}),  # no running statistics
    ("torch", (x, w, b, rm, rv, False, 0.1, 1e-5), {}),  # torch.batch_norm without cudnn_enabled
])
def test_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "batch_norm", style, args, kwargs)


def test_a_module_in_training_mode_is_not_bound():
    train = torch.nn.BatchNorm2d(4).train()
    calls = [h for h in kc.recorded(lambda: train(x)) if h[0] == "batch_norm"]
    assert calls and registry.get("batch_norm").bind(calls[0][1], calls[0][2], calls[0][3]) is None


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_float64_reference_agrees_with_eager(channels_last):
    t = torch.empty(3, 8, 5, 7)
    if channels_last:
        t = t.to(memory_format=torch.channels_last)
    c = torch.empty(8)
    sig = kc.signature("batch_norm", {"x": t, "running_mean": c, "running_var": c, "weight": c, "bias": c},
                       {"eps": 1e-5, "training": False})
    kc.check_reference_matches_eager(sig)


def test_fresh_running_variances_are_positive():
    sig = kc.signature("batch_norm", {"x": torch.empty(2, 64, 3, 3), "running_mean": torch.empty(64),
                                      "running_var": torch.empty(64), "weight": None, "bias": None},
                       {"eps": 1e-5, "training": False})
    from forge_pack.targets import ops

    t = ops.make_inputs(sig, "fresh", torch.Generator().manual_seed(0), "cpu")
    assert float(t["running_var"].min()) >= 0.05 and t["weight"] is None


def test_tolerance_rows():
    kc.check_tolerances("batch_norm", {})


def test_abi_and_applicability():
    t = torch.empty(2, 8, 5, 7).to(memory_format=torch.channels_last)
    c = torch.empty(8)
    sig = kc.signature("batch_norm", {"x": t, "running_mean": c, "running_var": c, "weight": None, "bias": None},
                       {"eps": 1e-5, "training": False})
    kc.check_abi(sig, {"N": 2, "C": 8, "H": 5, "W": 7, "HW": 35, "channels_last": 1})
    assert abi.supports(sig) is None
    three_d = kc.signature("batch_norm", {"x": torch.empty(2, 8, 5), "running_mean": c, "running_var": c,
                                          "weight": None, "bias": None}, {"eps": 1e-5, "training": False})
    assert abi.supports(three_d) == "batch_norm is targeted on 4-d inputs only"


def test_the_binders_defaults_are_pytorchs_and_keywords_bind_on_both_paths():
    spec = registry.get("batch_norm")
    tensors, params = spec.bind("F", (x, rm, rv), {})
    assert params == {"eps": 1e-5, "training": False} and tensors["weight"] is None and tensors["bias"] is None
    kw = {"training": False, "momentum": 0.1, "eps": 1e-4, "cudnn_enabled": True}
    tensors, params = spec.bind("torch", (x, w, b, rm, rv), kw)
    assert params == {"eps": 1e-4, "training": False}
    assert tensors["running_mean"] is rm and tensors["running_var"] is rv and tensors["weight"] is w
    assert spec.bind("F", (x, rm, rv), {"momentum": 0.2}) is not None


@pytest.mark.parametrize("args", [(x, None, rv), (x, rm, None)])
def test_a_missing_running_statistic_is_refused(args):
    assert registry.get("batch_norm").bind("F", args, {}) is None


def test_training_mode_is_refused_by_applicability_after_the_layout():
    c = torch.empty(8)
    t = {"running_mean": c, "running_var": c, "weight": None, "bias": None}
    train = kc.signature("batch_norm", {"x": torch.empty(2, 8, 5, 7), **t}, {"eps": 1e-5, "training": True})
    assert abi.supports(train) == "batch_norm in training mode is not targeted"
    train_3d = kc.signature("batch_norm", {"x": torch.empty(2, 8, 5), **t}, {"eps": 1e-5, "training": True})
    assert abi.supports(train_3d) == "batch_norm is targeted on 4-d inputs only"


def test_a_parsed_signature_needs_both_running_statistics():
    spec = registry.get("batch_norm")
    c = torch.empty(8, device="meta")
    want = ("batch_norm needs running_mean and running_var tensors",
            "e.g. 'x: f32[32,64,56,56], running_mean: f32[64], running_var: f32[64]'")
    assert spec.complete({"input": c, "running_mean": c}) == want
    assert spec.complete({"input": c, "running_var": c}) == want
    assert spec.complete({"input": c, "running_mean": c, "running_var": c}) is None


def test_the_float64_reference_and_eager_call_use_the_running_statistics_exactly():
    spec = registry.get("batch_norm")
    t = {"x": torch.tensor([3.0, 5.0]).view(1, 2, 1, 1), "running_mean": torch.tensor([1.0, 1.0]),
         "running_var": torch.tensor([4.0, 16.0]), "weight": torch.tensor([2.0, 3.0]), "bias": torch.tensor([0.0, 1.0])}
    ref = spec.reference64({"eps": 0.0, "training": False}, t)
    assert ref.dtype == torch.float64 and ref.flatten().tolist() == [2.0, 4.0]
    assert spec.eager({"eps": 0.0, "training": False}, "float32")(t).flatten().tolist() == [2.0, 4.0]
    bare = {**t, "running_var": torch.tensor([4.0, 52.0]), "weight": None, "bias": None}
    assert spec.reference64({"eps": 12.0, "training": False}, bare).flatten().tolist() == [0.5, 0.5]  # eps is added
