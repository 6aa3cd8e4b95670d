"""Eager rounds a 16-bit value after every op; the generated code skips the rounding only where it
is the identity (an op that returns one of its operands, or its negation or magnitude, when those
are already exact in the dtype), and the kernel still verifies."""

from __future__ import annotations


import pytest
import torch

from forge_pack.core.hotspot import Hotspot
from forge_pack.graph.capture import capture
from forge_pack.graph.regions import find_regions
from forge_pack.search.families.region import program
from forge_pack.search.templates_proposer import applicable_families, instantiate
from forge_pack.targets.region_target import signature


class Chain(torch.nn.Module):
    def forward(self, x, w):
        a = torch.relu(x * w)  # relu of a rounded product: exact
        b = torch.abs(-a)  # neg and abs of exact values: exact
        c = torch.maximum(b, x)  # max of two exact values (an input read in its dtype): exact
        return torch.maximum(c * 0.5 + 0.1, torch.full_like(c, 0.3)).to(torch.bfloat16)  # a rounded sum; a cast to its own dtype


class Pool(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.max_pool2d(torch.relu(x * 1.5), 3, 2, 1)


def _sig(model, *inputs):
    (region,) = find_regions(capture(model, inputs, profile=False))
    return signature(region)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 64).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16)


def test_the_rounding_is_kept_after_arithmetic_and_skipped_after_a_pick():
    x, w = _inputs()
    expr = program(_sig(Chain(), x, w)).out.expr
    # one rounding per multiply, add and the full_like constant's max; none for relu, neg, abs, the
    # maximum of two exact values or the cast
    assert expr.count("fp_round_bf16(") == 4, expr
    assert "fp_round_bf16(fp_relu(" not in expr and "fp_round_bf16(fp_abs(" not in expr, expr
    assert "fp_relu((fp_round_bf16(" in expr, expr  # the product is rounded before the relu sees it


def test_a_max_pool_of_exact_values_is_not_rounded_again_but_an_average_is():
    x = torch.randn(2, 8, 9, 9).to(torch.bfloat16)
    prog = program(_sig(Pool(), x))
    assert prog.out.expr == "{0}", prog.out.expr
    assert "fp_round_bf16(fp_relu(" not in prog.reductions[0].val.expr
    avg = program(_sig(torch.nn.AvgPool2d(3, 2, 1), x))
    assert avg.out.expr == "fp_round_bf16({0})", avg.out.expr


@pytest.mark.parametrize("case", ["chain", "pool"])
def test_the_kernels_without_the_identity_roundings_verify(cpu_evaluator, case):
    x, w = _inputs()
    sig = _sig(Chain(), x, w) if case == "chain" else _sig(Pool(), torch.randn(2, 8, 9, 9).to(torch.bfloat16))
    (fam,) = applicable_families(sig, "cpu")
    e = cpu_evaluator.evaluate(instantiate("region", "cpu", fam.name, None, sig),
                           Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cpu"))
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)
