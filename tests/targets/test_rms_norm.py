"""rms_norm: binder on every call path, package parity, reference (and the composite module
form), tolerance, ABI."""

import pytest
import torch
import torch.nn.functional as F

import kind_checks as kc
from forge_pack.targets import abi, registry
from forge_pack.targets.rms_norm import composite_rms_norm

x = torch.randn(2, 3, 8)
w = torch.randn(8)
F32_EPS = torch.finfo(torch.float32).eps

CALLS = [  # (call, style, tensors, params)
    (lambda: F.rms_norm(x, (8,), w), "F", {"x": x, "weight": w}, {"eps": F32_EPS}),
    (lambda: F.rms_norm(x, [8], eps=1e-6), "F", {"x": x, "weight": None}, {"eps": 1e-6}),
    (lambda: F.rms_norm(x, normalized_shape=[8], weight=w, eps=0.25), "F", {"x": x, "weight": w}, {"eps": 0.25}),
    (lambda: torch.rms_norm(x, [8], w, 1e-5), "torch", {"x": x, "weight": w}, {"eps": 1e-5}),
]
if hasattr(torch.nn, "RMSNorm"):
    norm = torch.nn.RMSNorm(8, eps=1e-4)
    CALLS.append((lambda: norm(x), "F", {"x": x, "weight": norm.weight}, {"eps": 1e-4}))


def _params(eps: float, shape=(8,)) -> dict:
    return {"normalized_shape": list(shape), "eps": eps, "weight_offset": 0.0, "composite": False}


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_binder_reads_every_call_path(call, style, tensors, params):
    kc.check_binds("rms_norm", call, style, tensors, _params(params["eps"]))


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_package_binds_each_call_as_the_profiler_does(tmp_path_factory, call, style, tensors, params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), "rms_norm", call)


def test_eps_none_is_the_epsilon_of_the_dtype_pytorch_computes_in():
    bound = registry.get("rms_norm").bind("F", (x.bfloat16(), (8,)), {})
    assert bound[1]["eps"] == F32_EPS  # float32's, not bfloat16's
    assert registry.get("rms_norm").bind("F", (x.double(), (8,)), {})[1]["eps"] == torch.finfo(torch.float64).eps


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (x.long(), (8,)), {}),  # an integer input: no default eps to read
    ("F", (x, (8,), None, "tiny"), {}),
    ("F", (x, "8"), {}),
])
def test_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "rms_norm", style, args, kwargs)


@pytest.mark.parametrize("composite, offset", [(False, 0.0), (True, 0.0), (True, 1.0)])
def test_the_float64_reference_agrees_with_eager(composite, offset):
    t = torch.empty(9, 64, dtype=torch.bfloat16)
    params = {**_params(1e-6, (64,)), "composite": composite, "weight_offset": offset}
    kc.check_reference_matches_eager(kc.signature("rms_norm", {"x": t, "weight": torch.empty(64, dtype=torch.bfloat16)},
                                                  params))


def test_the_composite_eager_call_is_the_model_code_form():
    t = {"x": torch.randn(3, 16), "weight": torch.randn(16)}
    params = {**_params(1e-6, (16,)), "composite": True, "weight_offset": 1.0}
    got = registry.get("rms_norm").eager(params, "float32")(t)
    assert torch.equal(got, composite_rms_norm(t["x"], t["weight"], 1e-6, 1.0, torch.float32))


def test_tolerance_rows():
    kc.check_tolerances("rms_norm", {"bfloat16": (1.6e-2, 1.6e-2)})


def test_abi_and_applicability():
    sig = kc.signature("rms_norm", {"x": torch.empty(5, 12), "weight": torch.empty(12)},
                       {**_params(1e-6, (12,)), "weight_offset": 1.0})
    kc.check_abi(sig, {"rows": 5, "cols": 12, "has_weight": 1})
    assert abi.scalars(sig) == {"eps": 1e-6, "weight_offset": 1.0}
    assert abi.supports(sig) is None


class _LlamaStyleNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))
        self.variance_epsilon = 1e-6

    def forward(self, h):
        return composite_rms_norm(h, self.weight, self.variance_epsilon, 0.0)


def test_a_composite_module_call_binds_its_input_weight_and_eps(tmp_path_factory):
    m = _LlamaStyleNorm()
    spec = registry.get("rms_norm")
    tensors, params = spec.bind_module(m, (x,), {})
    assert tensors["x"] is x and tensors["weight"] is m.weight and params == {"eps": 1e-6}
    assert spec.bind_module(m, (x,), {"extra": 1}) is None and spec.bind_module(m, (x, x), {}) is None
    m.variance_epsilon = True  # not a number: no eps to match on
    assert spec.bind_module(m, (x,), {}) is None
    patch_mod = kc.package_runtime(tmp_path_factory.getbasetemp())
    assert patch_mod.TARGETS.get("rms_norm").bind_module(_LlamaStyleNorm(), (x,), {})[1] == {"eps": 1e-6}


def test_the_default_eps_is_float32s_for_every_dtype_but_float64():
    from forge_pack.targets.rms_norm import default_eps

    assert default_eps(torch.float64) == 2.220446049250313e-16
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert default_eps(dtype) == 1.1920928955078125e-07


def test_a_modules_eps_is_read_from_the_first_numeric_attribute_of_the_usual_names():
    from forge_pack.targets.rms_norm import module_eps

    class M:
        pass

    m = M()
    assert module_eps(m) is None
    m.epsilon = 3
    assert module_eps(m) == 3.0 and type(module_eps(m)) is float
    m.variance_epsilon = 1e-6
    assert module_eps(m) == 1e-6
    m.eps = 1e-5
    assert module_eps(m) == 1e-5
    m.eps = False  # a flag, not a number: the next name counts
    assert module_eps(m) == 1e-6


def test_a_composite_module_without_a_weight_binds_none():
    class NoWeight(torch.nn.Module):
        eps = 1e-6

    spec = registry.get("rms_norm")
    assert spec.bind_module(NoWeight(), (x,), {}) == ({"x": x, "weight": None}, {"eps": 1e-6})
    assert spec.bind_module(NoWeight(), ([1.0],), {}) is None  # not a tensor
    assert spec.bind_module(torch.nn.Identity(), (x,), {}) is None  # no eps attribute


def test_calls_with_too_many_arguments_are_refused_not_raised():
    assert registry.get("rms_norm").bind("F", (x, [8], w, 1e-6, 1), {}) is None


def test_the_float64_reference_is_exact_on_a_small_row():
    spec = registry.get("rms_norm")
    t = {"x": torch.tensor([[3.0, 4.0]]), "weight": torch.tensor([1.0, 2.0])}
    rms = 12.5 ** 0.5
    plain = spec.reference64({**_params(0.0, (2,))}, t)
    assert plain.dtype == torch.float64 and torch.allclose(plain, torch.tensor([[3 / rms, 8 / rms]], dtype=torch.float64),
                                                           rtol=1e-15, atol=0)
    gemma = spec.reference64({**_params(0.0, (2,)), "weight_offset": 1.0}, t)
    assert torch.allclose(gemma, torch.tensor([[6 / rms, 12 / rms]], dtype=torch.float64), rtol=1e-15, atol=0)
    bare = spec.reference64({**_params(0.0, (2,))}, {"x": t["x"], "weight": None})
    assert torch.allclose(bare, torch.tensor([[3 / rms, 4 / rms]], dtype=torch.float64), rtol=1e-15, atol=0)
    both = spec.reference64({**_params(0.0, (1, 2))}, {"x": t["x"].view(1, 1, 2), "weight": None})
    assert torch.allclose(both.flatten(), bare.flatten(), rtol=1e-15, atol=0)


def test_the_composite_eager_call_without_an_offset_param_is_llama_style():
    t = {"x": torch.randn(3, 16).bfloat16(), "weight": torch.randn(16).bfloat16()}
    params = {"normalized_shape": [16], "eps": 1e-6, "composite": True}  # no weight_offset: none
    got = registry.get("rms_norm").eager(params, "bfloat16")(t)
    assert torch.equal(got, composite_rms_norm(t["x"], t["weight"], 1e-6, 0.0, torch.bfloat16))
