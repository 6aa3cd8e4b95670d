"""The index type of generated region kernels: 32-bit where every offset fits (``FP_IDX_T int``),
64-bit otherwise, and a kernel verifies with either (the CPU kernels share the generated code)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from forge_pack.core.hotspot import Hotspot
from forge_pack.graph.capture import capture
from forge_pack.graph.regions import find_regions
from forge_pack.search.region_emit import INDEX_LIMIT, index_type
from forge_pack.search.templates_proposer import instantiate
from forge_pack.targets.region_target import signature

sys.path.insert(0, str(Path(__file__).resolve().parent / "models" / "regions"))
import llama_regions  # noqa: E402
from torch_export import LLAMA_SOFTMAX  # noqa: E402
import pool_variants  # noqa: E402
import resnet_stem  # noqa: E402


def test_index_type_is_int_only_below_the_limit():
    assert index_type(1000, [((10, 100), (100, 1))]) == "int"
    assert index_type(INDEX_LIMIT - 1, []) == "int"
    assert index_type(INDEX_LIMIT, []) == "long long"  # the iteration space itself
    # few elements, but the furthest one is far: a strided view of a large buffer
    assert index_type(4, [((4,), (INDEX_LIMIT // 3 + 1,))]) == "long long"
    assert index_type(4, [((4,), ((INDEX_LIMIT - 2) // 3,))]) == "int"  # furthest: 1 + 3 * stride < limit
    # a broadcast (stride 0) adds nothing; an empty dim neither
    assert index_type(8, [((8, INDEX_LIMIT), (1, 0))]) == "int"
    assert index_type(0, [((0, 5), (5, 1))]) == "int"
    # ResNet-50's stem at batch 256: the pool reads 256x64x112x112 (205 M) elements
    assert index_type(256 * 64 * 56 * 56, [((256, 64, 112, 112), (802816, 12544, 112, 1))]) == "int"


def _region(mod, pattern=None):
    regions = find_regions(capture(mod.get_model(), mod.get_inputs(), profile=False))
    return next(r for r in regions if pattern is None or r.pattern == pattern)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_generated_kernels_of_small_regions_index_in_32_bits(backend):
    region = _region(resnet_stem)
    for family in ("window",):  # the row and pointwise code: test_a_region_kernel_verifies_with_either_index_type
        src = instantiate("region", backend, family, None, signature(region)).source
        assert "#define FP_IDX_T int\n" in src
        generated = src.split("// generated for ops:")[1]
        generated = generated.split("#define TILE")[0].split('extern "C"')[0]  # the skeleton's loops follow
        assert "fp_window_value(REGION_PARAMS, fp_idx e, fp_idx* o)" in generated
        assert "long long" not in generated and not re.search(r"\dLL\b", generated), generated


CASES = [(resnet_stem, None, "window"), (pool_variants, "avg_pool2d+mul+add", "window"),
         (llama_regions, LLAMA_SOFTMAX, "row"), (llama_regions, "silu+mul", "pointwise")]


@pytest.mark.parametrize("index", ["int", "long long"])
@pytest.mark.parametrize("mod,pattern,family", CASES, ids=[f"{c[0].__name__}-{c[2]}" for c in CASES])
def test_a_region_kernel_verifies_with_either_index_type(cpu_evaluator, mod, pattern, family, index):
    region = _region(mod, pattern)
    sig = signature(region)
    cand = instantiate("region", "cpu", family, None, sig)
    assert "#define FP_IDX_T int\n" in cand.source
    cand = type(cand)(cand.op, cand.backend, cand.source.replace("#define FP_IDX_T int\n", f"#define FP_IDX_T {index}\n"),
                      cand.spec, cand.family, dict(cand.params), "user")
    e = cpu_evaluator.evaluate(cand, Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cpu"))
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


def test_an_adaptive_window_whose_bounds_overflow_int_indexes_in_64_bits():
    """adaptive_avg_pool2d of a 1 x 60000 row to 1 x 40000: few elements, but a window's end
    ((o + 1) * 60000 + ...) passes 2^31 before the division; a 1 x 60 row to 1 x 40 stays in int."""
    import torch

    from forge_pack.search.families.region import _index_extent, program

    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.adaptive_avg_pool2d(x, (1, x.shape[-1] * 2 // 3))

    for width, want in ((60000, "long long"), (60, "int")):
        (region,) = find_regions(capture(Pool(), (torch.randn(1, 1, 1, width),), profile=False))
        sig = signature(region)
        assert _index_extent(program(sig)) == (width + 1) * (width * 2 // 3)
        assert f"#define FP_IDX_T {want}\n" in instantiate("region", "cpu", "window", None, sig).source
