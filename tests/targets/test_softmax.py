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


def _size_vars(shape):
    from forge_pack.targets import ops, registry

    return registry.get("softmax").size_vars(ops.make_signature("softmax", {"x": torch.empty(shape)},
                                                                {"dim": max(len(shape) - 1, 0), "dtype": None}))


def test_size_vars_are_integers_and_a_scalar_is_one_row_of_one():
    got = _size_vars((4, 6, 10))
    assert got == {"rows": 24, "cols": 10} and all(type(v) is int for v in got.values())
    assert _size_vars(()) == {"rows": 1, "cols": 1}
    assert _size_vars((5, 1)) == {"rows": 5, "cols": 1}


def test_odd_shapes_keep_the_row_length_then_shorten_it_by_one_when_rows_are_longer_than_two():
    from forge_pack.targets import registry

    def odd(shape):
        return registry.get("softmax").odd_shapes(kc.signature("softmax", {"x": torch.empty(shape)},
                                                               {"dim": len(shape) - 1, "dtype": None}))

    assert odd((4, 6, 10)) == [((37, 10), False), ((3, 9), False)]
    assert odd((5, 3)) == [((37, 3), False), ((3, 2), False)]
    assert odd((5, 2)) == [((37, 2), False)]
    assert odd((4, 6, 2)) == [((37, 2), False)]  # the row length decides, not another dim
    assert odd((4, 2, 10)) == [((37, 10), False), ((3, 9), False)]


@pytest.mark.parametrize("shape, dim, problem", [
    ((2, 3), 2, ("dim=2 is out of range for a 2-d tensor", "dim=-1 is the last dim")),
    ((2, 3), -3, ("dim=-3 is out of range for a 2-d tensor", "dim=-1 is the last dim")),
    ((7,), 1, ("dim=1 is out of range for a 1-d tensor", "dim=-1 is the last dim")),
    ((), 1, ("dim=1 is out of range for a 0-d tensor", "dim=-1 is the last dim")),
    ((2, 3), 1, None), ((2, 3), -2, None), ((2, 3), None, None), ((7,), -1, None), ((), 0, None),
])
def test_a_parsed_signature_is_refused_only_for_a_dim_outside_the_tensor(shape, dim, problem):
    from forge_pack.targets import registry

    for name in ("softmax", "log_softmax"):
        kwargs = {"input": torch.empty(shape, device="meta"), "dim": dim}
        assert registry.get(name).complete(dict(kwargs)) == problem


def test_the_float64_references_are_exact_on_a_small_row():
    from forge_pack.targets import registry

    t = {"x": torch.tensor([[0.0, 3.0, 3.0]], dtype=torch.float32)}
    got = registry.get("softmax").reference64({"dim": 1, "dtype": None}, t)
    e3 = torch.exp(torch.tensor(3.0, dtype=torch.float64))
    want = torch.stack([1 / (1 + 2 * e3), e3 / (1 + 2 * e3), e3 / (1 + 2 * e3)]).view(1, 3)
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=1e-15, atol=0)
    log = registry.get("log_softmax").reference64({"dim": 1, "dtype": None}, t)
    assert torch.allclose(log, want.log(), rtol=1e-15, atol=0)
    column = registry.get("softmax").reference64({"dim": 0, "dtype": None}, {"x": torch.zeros(2, 3)})
    assert column.tolist() == [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]  # dim is the one reduced over


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_the_eager_call_is_the_op_named_with_the_dim_and_output_dtype_of_the_call(name):
    from forge_pack.targets import registry

    x32 = torch.tensor([[1.0, 2.0], [4.0, 0.5]])
    fn = getattr(torch, name)
    plain = registry.get(name).eager({"dim": 0, "dtype": None}, "float32")({"x": x32})
    assert plain.dtype == torch.float32 and torch.equal(plain, fn(x32, 0))
    wide = registry.get(name).eager({"dim": 1, "dtype": "float64"}, "float64")({"x": x32})
    assert wide.dtype == torch.float64 and torch.equal(wide, fn(x32, 1, dtype=torch.float64))


def test_the_binders_defaults_are_the_implicit_dim_and_no_dtype():
    from forge_pack.targets import registry

    spec = registry.get("softmax")
    x2 = torch.randn(3, 4)
    assert spec.bind("F", (x2,), {})[1] == {"dim": 1, "dtype": None}  # 2-d: implicit dim 1
    assert spec.bind("torch", (x2, -1), {})[1] == {"dim": 1, "dtype": None}
    assert spec.bind("F", (x2, 0, 3, None), {})[1] == {"dim": 0, "dtype": None}
    assert spec.bind("method", (x2, 1, torch.float16), {})[1] == {"dim": 1, "dtype": "float16"}
    assert spec.bind("F", (x2, 1.0), {}) is None and spec.bind("F", (x2, 1), {"dtype": "float16"}) is None


def test_the_adversarial_kinds_and_draws_are_softmaxs():
    from forge_pack.targets import registry

    for name in ("softmax", "log_softmax"):
        spec = registry.get(name)
        assert spec.adversarial == ("large", "neg_inf_rows", "constant")
        assert (spec.tensors, spec.scalars, spec.params, spec.own_params) == (("x",), (), ("dim", "dtype"), ())
        assert [p.label for p in spec.call_paths] == [f"F.{name}", f"torch.{name}", f"Tensor.{name}",
                                                      "nn." + {"softmax": "Softmax", "log_softmax": "LogSoftmax"}[name]]
