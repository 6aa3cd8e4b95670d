"""A region's target facts, from regions captured of small models: what each input means (mask, positive, bool,
int, data: the verification sets draw each by its role), the main input the adversarial transforms act on, the
region spec found again from a signature or from its parameters, and its float64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from forge_pack.graph.capture import capture
from forge_pack.graph.regions import find_regions
from forge_pack.targets import ops
from forge_pack.targets.region_target import is_region, main_input, roles, signature, spec_for, spec_for_params


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _sig(fn, *inputs):
    regions = find_regions(capture(_Fn(fn), inputs, profile=False))
    assert len(regions) == 1, [r.name for r in regions]
    return signature(regions[0])


def _roles(fn, *inputs) -> list[str]:
    return roles(_sig(fn, *inputs).param("form"))


g = torch.Generator().manual_seed(0)
x = torch.randn(2, 3, 8, 16, generator=g)
wide_mask = torch.randn(1, 1, 8, 16, generator=g)
same_mask = torch.randn(2, 3, 8, 16, generator=g)


def test_an_additive_mask_of_a_softmax_is_a_mask_broadcast_or_second():
    assert _roles(lambda s, m: torch.softmax(s * 0.125 + m, dim=-1), x, wide_mask) == ["data", "mask"]
    # broadcast over the scores, as the first operand of an add of two inputs
    assert _roles(lambda m, s: torch.softmax(m + s, dim=-1), wide_mask, x) == ["mask", "data"]
    # the same shape: the second operand of the add, beside an intermediate or beside an input
    assert _roles(lambda s, m: torch.softmax(s * 0.125 + m, dim=-1), x, same_mask) == ["data", "mask"]
    assert _roles(lambda s, m: torch.softmax(s + m, dim=-1), x, same_mask) == ["data", "mask"]
    # a log-softmax and a max reduction read a mask the same way
    assert _roles(lambda s, m: F.log_softmax(s + m, dim=-1), x, wide_mask) == ["data", "mask"]
    assert _roles(lambda s, m: (s + m).amax(dim=-1), x, wide_mask) == ["data", "mask"]


def test_an_add_is_no_mask_without_a_softmax_or_max_and_one_operand_is_no_pair():
    assert _roles(lambda s, m: torch.relu(s + m), x, wide_mask) == ["data", "data"]
    # a product with the probabilities is not an additive mask
    assert _roles(lambda s, m: torch.softmax(s, dim=-1) * m, x, wide_mask) == ["data", "data"]
    # one tensor and a number: nothing to be a mask of
    assert _roles(lambda s: torch.softmax(s + 1.0, dim=-1), x) == ["data"]


def test_inputs_read_by_a_root_a_log_or_a_fractional_power_are_positive():
    v = torch.rand(2, 3, 8, 1, generator=g) + 0.5
    # (a region's inputs are numbered in the order its ops first read them: the variance first here)
    assert _roles(lambda s, var: torch.rsqrt(var) * s, x, v) == ["positive", "data"]
    assert _roles(lambda s, var: torch.sqrt(var) * s, x, v) == ["positive", "data"]
    assert _roles(lambda s, var: torch.log(var) * s, x, v) == ["positive", "data"]
    assert _roles(lambda s, var: var.pow(0.5) * s, x, v) == ["positive", "data"]
    assert _roles(lambda s, var: var.pow(2.0) * s, x, v) == ["data", "data"]  # a whole power takes any sign
    # only the op that reads the input itself decides: here rsqrt reads var + eps
    assert _roles(lambda s, var: torch.rsqrt(var + 1e-6) * s, x, v) == ["data", "data"]


def test_a_batch_norms_running_variance_is_positive():
    mean, var = torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5
    w, b = torch.randn(3, generator=g), torch.randn(3, generator=g)
    got = _roles(lambda s, m_, v_, w_, b_: torch.relu(F.batch_norm(s, m_, v_, w_, b_, training=False)),
                 x, mean, var, w, b)
    assert got == ["data", "data", "data", "data", "positive"]  # (x, weight, bias, running mean, running var)


def test_boolean_and_integer_inputs_keep_their_kind():
    keep = torch.rand(2, 3, 8, 16, generator=g) > 0.5
    assert _roles(lambda s, k_: torch.softmax(s.masked_fill(k_, float("-inf")), dim=-1), x, keep) == ["data", "bool"]
    steps = torch.randint(0, 4, (2, 3, 8, 16), generator=g)
    assert _roles(lambda s, i: torch.relu(s * 2 + i), x, steps) == ["data", "int"]


def test_the_main_input_is_the_largest_plain_floating_one():
    assert main_input(_sig(lambda s, m: torch.softmax(s * 0.125 + m, dim=-1), x, wide_mask).param("form")) == 0
    # the larger input second, the smaller first: still the larger
    small = torch.randn(1, 3, 1, 16, generator=g)
    assert main_input(_sig(lambda a, b_: torch.relu(a * b_ + 1), small, x).param("form")) == 1
    # a mask as large as the scores is not the main input, whatever its size
    assert main_input(_sig(lambda s, m: torch.softmax(s * 0.125 + m, dim=-1), x, same_mask).param("form")) == 0
    # a positive input larger than the data is not either, read first or last
    v = torch.rand(2, 3, 8, 16, generator=g) + 0.5
    col = x[:, :, :, :1].contiguous()
    assert main_input(_sig(lambda s, var: torch.rsqrt(var) * s, col, v).param("form")) == 1
    assert main_input(_sig(lambda s, var: (s * 2) * torch.rsqrt(var), col, v).param("form")) == 0
    # one element is an input too
    assert main_input(_sig(lambda s, var: torch.rsqrt(var) * s, torch.randn(1, generator=g), v).param("form")) == 1
    # of inputs alike, the first; with no plain floating input, the first
    assert main_input(_sig(lambda a, b_: torch.relu(a * b_ + 1), x, same_mask).param("form")) == 0
    assert main_input(_sig(lambda a, b_: torch.rsqrt(a) * torch.log(b_), v, v + 1).param("form")) == 0


def test_the_spec_is_found_again_from_the_signature_or_its_parameters_and_references_in_float64():
    sig = _sig(lambda s, m: torch.softmax(s * 0.125 + m, dim=-1), x.bfloat16(), wide_mask.bfloat16())
    assert is_region(sig) and not is_region(ops.make_signature("softmax", {"x": x}, {"dim": -1}))
    assert not is_region(object())  # anything without an op
    spec = spec_for(sig)
    assert spec_for_params(dict(sig.params)) is spec
    t = {"in0": x.bfloat16(), "in1": wide_mask.bfloat16()}
    ref = spec.reference64(sig.params, t)
    want = torch.softmax(x.bfloat16().double() * 0.125 + wide_mask.bfloat16().double(), dim=-1)
    assert ref.dtype == torch.float64 and torch.allclose(ref, want, rtol=1e-12, atol=1e-15)
    # the spec's own float64 reference field gives the same on tensors already in float64
    d = {k: v.double() for k, v in t.items()}
    assert torch.equal(spec.float64_reference(sig.params, d, None).double(), ref)


def test_the_float64_reference_keeps_the_casts_of_the_region_out():
    """A region that casts its float32 result to bf16: the reference is the float64 value, not its bf16 rounding."""
    sig = _sig(lambda s: torch.softmax(s.float() * 0.3, dim=-1).to(torch.bfloat16), x.bfloat16())
    spec = spec_for(sig)
    d = {"in0": x.bfloat16().double()}
    ref = spec.float64_reference(sig.params, d, None)
    assert ref.dtype == torch.float64 and not torch.equal(ref, ref.bfloat16().double())
    assert torch.allclose(ref, torch.softmax(d["in0"] * 0.3, dim=-1), rtol=1e-12, atol=1e-15)


def _form(op: str, mask_shape=(1, 1, 8, 16)) -> dict:
    """An additive mask then ``op`` by hand: the names another capture route gives the softmax (decomposed, or SDPA's
    math path) and the max."""
    spec = lambda shape: {"dtype": "bfloat16", "shape": list(shape), "strides": []}  # noqa: E731
    return {"inputs": [spec((2, 3, 8, 16)), spec(mask_shape)],
            "ops": [{"op": "aten.add.Tensor", "args": [{"in": 0}, {"in": 1}], "kwargs": {}},
                    {"op": op, "args": [{"n": 0}, -1], "kwargs": {}}]}


@pytest.mark.parametrize("op", ["aten.softmax.int", "aten._softmax.default", "aten._safe_softmax.default",
                                "aten.log_softmax.int", "aten._log_softmax.default", "aten.amax.default"])
def test_every_softmax_and_max_spelling_reads_an_additive_mask(op):
    assert roles(_form(op)) == ["data", "mask"]
    assert roles(_form("aten.exp.default")) == ["data", "data"]


def test_a_boolean_or_integer_input_read_first_leaves_the_others_their_roles():
    keep = torch.rand(2, 3, 8, 16, generator=g) > 0.5
    assert _roles(lambda k_, s: torch.softmax(torch.where(k_, s, -1e4), dim=-1), keep, x) == ["bool", "data"]
    steps = torch.randint(0, 4, (2, 3, 8, 16), generator=g)
    assert _roles(lambda i, s: torch.relu(i * 2 + s), steps, x) == ["int", "data"]
    # bf16 inputs are floating ones
    assert _roles(lambda s, m: torch.softmax(s + m, dim=-1), x.bfloat16(), wide_mask.bfloat16()) == ["data", "mask"]


@pytest.mark.parametrize("op", ["aten.softmax.int", "aten._softmax.default", "aten._safe_softmax.default",
                                "aten.log_softmax.int", "aten._log_softmax.default", "aten.amax.default",
                                "aten.max_pool2d.default", "aten.max_pool2d_with_indices.default"])
def test_a_region_through_a_max_is_verified_on_rows_of_minus_infinity(op):
    from forge_pack.targets.region_target import RegionSpec

    assert RegionSpec(_form(op), "row").adversarial == ("large", "constant", "neg_inf_rows")


def test_other_regions_get_large_and_constant_inputs_and_a_pointwise_one_large_ones():
    from forge_pack.targets.region_target import RegionSpec

    assert RegionSpec(_form("aten.exp.default"), "row").adversarial == ("large", "constant")
    assert RegionSpec(_form("aten.exp.default"), "pointwise").adversarial == ("large",)


def test_a_region_prompt_describes_the_region_call():
    from forge_pack.llm.prompts import _abi_doc

    sig = _sig(lambda s, m: torch.softmax(s * 0.125 + m, dim=-1), x.bfloat16(), wide_mask.bfloat16())
    assert _abi_doc(sig) == ("A fused region: out = the subgraph below, called with the inputs in0..inK in form "
                             "order; out is one tensor with the output's dtype, shape and strides. Every shape and "
                             "stride is fixed.")
