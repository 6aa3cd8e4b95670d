"""Window regions (2-d pooling with its pointwise prologue and epilogue): found in a ResNet stem
and in the pooling variants models use, lowered with PyTorch's window rules, and their generated
CPU kernels verified against the float64 reference; a kernel that pads a max with 0 or counts
padding in an average that excludes it is rejected."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from forge_pack.core.hotspot import Hotspot
from forge_pack.graph.capture import capture
from forge_pack.graph.regions import find_regions
from forge_pack.search.families.region import coverage, program
from forge_pack.search.region_lower import Window, _pool_size
from forge_pack.search.region_window import vector_dim
from forge_pack.search.templates_proposer import applicable_families, instantiate
from forge_pack.targets.region_target import signature

sys.path.insert(0, str(Path(__file__).resolve().parent / "models" / "regions"))
import pool_variants  # noqa: E402
import resnet_stem  # noqa: E402

POOL_PATTERNS = {"batch_norm+max_pool2d", "avg_pool2d+mul+add", "avg_pool2d", "silu+avg_pool2d",
                 "sub+relu+adaptive_avg_pool2d"}


def _regions(mod, channels_last: bool = False, dtype=torch.float32, **kw):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = mod.get_model().to(dtype).to(memory_format=fmt)
    x = mod.get_inputs()[0].to(dtype).contiguous(memory_format=fmt)
    return {r.pattern: r for r in find_regions(capture(model, (x,), profile=False, **kw))}


def _hotspot(region):
    return Hotspot(signature(region), ("region",), 1.0, 1.0, 1.0, 0.5, device="cpu")


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_resnet_stem_bn_relu_max_pool_is_one_window_region(channels_last):
    regions = _regions(resnet_stem, channels_last)
    assert list(regions) == ["batch_norm+relu+max_pool2d"]
    r = regions["batch_norm+relu+max_pool2d"]
    assert r.kind == "window" and r.compute_ops[-1] == "max_pool2d"
    assert r.domain == {"shape": [2, 16, 9, 9], "dims": [2, 3], "extra": [[3, 3], [2, 2], [1, 1]]}
    assert r.output_spec.shape == (2, 16, 5, 5)
    prog = program(signature(r))
    assert (prog.kind, prog.space, [red.combine for red in prog.reductions]) == ("window", (2, 16, 5, 5), ["max"])
    assert prog.window == Window("max", (2, 16, 9, 9), (3, 3), (2, 2), (1, 1), (1, 1))
    # channels_last: elements walk C innermost (the vector dim); NCHW pools its innermost dim
    assert vector_dim(prog) == (1 if channels_last else None)
    assert [f.name for f in applicable_families(signature(r), "cpu")] == ["window"]
    assert [f.name for f in applicable_families(signature(r), "cuda")] == ["window"]


def test_max_pool_with_unused_indices_ends_its_region_with_the_values():
    """make_fx spells max_pool2d as max_pool2d_with_indices + getitem 0: the select stays with the
    pool (the region outputs only the values), not with the next region's ops."""
    regions = _regions(pool_variants, routes=("make_fx",))
    r = regions["batch_norm+max_pool2d"]
    assert r.short_ops[-2:] == ("max_pool2d_with_indices", "getitem") and r.output_spec.shape == (2, 8, 5, 5)
    assert coverage(signature(r)) == ""


def test_pool_variants_are_window_regions_with_their_rules():
    regions = _regions(pool_variants)
    assert set(regions) == POOL_PATTERNS and {r.kind for r in regions.values()} == {"window"}
    win = {p: program(signature(r)).window for p, r in regions.items()}
    assert win["batch_norm+max_pool2d"] == Window("max", (2, 8, 9, 9), (3, 3), (2, 2), (1, 1), (1, 1))
    assert win["avg_pool2d+mul+add"] == Window("avg", (2, 8, 9, 9), (3, 3), (2, 2), (1, 1), (1, 1), False, 0)
    assert win["avg_pool2d"] == Window("avg", (2, 8, 9, 9), (2, 2), (2, 2), (0, 0), (1, 1), True, 0)
    assert win["silu+avg_pool2d"] == Window("avg", (2, 8, 5, 5), (3, 3), (1, 1), (1, 1), (1, 1), True, 4)
    assert win["sub+relu+adaptive_avg_pool2d"] == Window("adaptive", (2, 8, 9, 9))
    # ceil_mode: 9 -> 5 windows, the last starting inside the input and ending past it
    assert regions["avg_pool2d"].output_spec.shape == (2, 8, 5, 5)


@pytest.mark.parametrize("n,k,s,p,d,ceil", [(9, 3, 2, 1, 1, False), (9, 3, 2, 1, 1, True), (9, 2, 2, 0, 1, True),
                                            (10, 3, 2, 1, 1, True), (8, 3, 3, 1, 1, True), (11, 3, 2, 1, 2, False),
                                            (7, 2, 3, 1, 1, True)])
def test_pooled_size_is_torchs(n, k, s, p, d, ceil):
    out = torch.nn.functional.max_pool2d(torch.zeros(1, 1, n, n), k, s, p, d, ceil_mode=ceil)
    assert _pool_size(n, k, s, p, d, ceil) == out.shape[-1]


CASES = [(resnet_stem, "batch_norm+relu+max_pool2d", False, torch.float32),
         (resnet_stem, "batch_norm+relu+max_pool2d", True, torch.bfloat16)] + [
    (pool_variants, p, cl, torch.float32) for p in sorted(POOL_PATTERNS) for cl in (False, True)] + [
    (pool_variants, "avg_pool2d+mul+add", True, torch.float16)]


@pytest.mark.parametrize("mod,pattern,cl,dtype", CASES,
                         ids=[f"{c[1]}-{'cl' if c[2] else 'nchw'}-{str(c[3])[6:]}" for c in CASES])
def test_generated_window_kernel_verifies_against_float64(cpu_evaluator, mod, pattern, cl, dtype):
    region = _regions(mod, cl, dtype)[pattern]
    e = cpu_evaluator.evaluate(instantiate("region", "cpu", "window", None, signature(region)), _hotspot(region))
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)
    kinds = {c.input_kind for c in e.verdict.checks}
    assert "fresh[0]" in kinds and any(k.startswith("derived:") for k in kinds)
    assert ("adversarial:neg_inf_rows" in kinds) == ("max_pool2d" in pattern), kinds  # windows of -inf only


def _mutated(region, old: str, new: str):
    cand = instantiate("region", "cpu", "window", None, signature(region))
    head, generated = cand.source.split("// generated for ops:")
    assert old in generated, generated
    return type(cand)(cand.op, cand.backend, head + "// generated for ops:" + generated.replace(old, new),
                      cand.spec, cand.family, dict(cand.params), "user")


def test_a_max_pool_padded_with_zero_is_rejected(cpu_evaluator):
    """batch_norm + max_pool2d without a ReLU: border windows hold negative values, so a pad of 0
    instead of -inf changes them."""
    region = _regions(pool_variants)["batch_norm+max_pool2d"]
    bad = _mutated(region, ": acc0;", ": fp_maxnan(acc0, 0.0f);")  # a cell outside the input counts as 0
    e = cpu_evaluator.evaluate(bad, _hotspot(region))
    assert not e.verdict.ok and e.verdict.reason == "mismatch", (e.verdict.reason, e.verdict.detail)


def test_an_average_counting_excluded_padding_is_rejected(cpu_evaluator):
    """count_include_pad=False divides a border window by its cells inside the input; dividing by
    the cells up to the padded edge is wrong there."""
    region = _regions(pool_variants)["avg_pool2d+mul+add"]
    bad = _mutated(region, "fp_max_idx(h0, 0)", "h0")
    e = cpu_evaluator.evaluate(bad, _hotspot(region))
    assert not e.verdict.ok and e.verdict.reason == "mismatch", (e.verdict.reason, e.verdict.detail)


def test_a_ceil_window_divided_by_the_whole_kernel_is_rejected(cpu_evaluator):
    """avg_pool2d(2, ceil_mode=True) on 9 rows: the last window starts at row 8 and ends past the
    input (no padding), so count_include_pad divides it by the one row inside, not by 2."""
    region = _regions(pool_variants)["avg_pool2d"]
    bad = _mutated(region, "(fp_min_idx(h0 + 2, 9) - h0)", "2")
    e = cpu_evaluator.evaluate(bad, _hotspot(region))
    assert not e.verdict.ok and e.verdict.reason == "mismatch", (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("mod,channels_last", [(resnet_stem, False), (pool_variants, True)],
                         ids=["stem-nchw", "pools-channels_last"])
def test_window_region_forms_are_found_in_inductors_graph(mod, channels_last):
    """Compile mode: each window region's form, respelled with Inductor's decompositions (max_pool2d
    becomes _low_memory_max_pool_with_offsets + getitem), occurs once in the graph Inductor gets."""
    import torch._inductor.lowering  # noqa: F401  (the decomposition table's max-pool entries use it)
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.decomposition import select_decomp_table

    from forge_pack.graph import region_match

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = mod.get_model().to(memory_format=fmt)
    x = mod.get_inputs()[0].contiguous(memory_format=fmt)
    graphs = []

    def keep(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: graphs.append(g) or g.forward,
                                     decompositions=select_decomp_table())

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=keep)(x)
    regions = find_regions(capture(model, (x,), profile=False))
    counts = {r.pattern: len(region_match.find(graphs[0].graph, region_match.respell(r.form, "cpu", select_decomp_table())))
              for r in regions}
    assert counts == {p: 1 for p in (["batch_norm+relu+max_pool2d"] if mod is resnet_stem else POOL_PATTERNS)}


# ---- runs along W (NCHW): wrun outputs per call, the overlapping windows' cells read once

def _even_regions(mod, size: int, dtype=torch.float32):
    model = mod.get_model().to(dtype)
    x = mod.get_inputs(size)[0].to(dtype)
    return {r.pattern: r for r in find_regions(capture(model, (x,), profile=False))}


# pooled W = 8 (a multiple of 2 and 4); the stem's 15-wide input and the ceil-mode pools have a last
# window that reaches past the input, so the runs' last windows take the padding paths
WRUN_CASES = [(resnet_stem, 30, "batch_norm+relu+max_pool2d", torch.float32),
              (resnet_stem, 30, "batch_norm+relu+max_pool2d", torch.bfloat16),
              (pool_variants, 15, "avg_pool2d+mul+add", torch.float32),  # count_include_pad=False, an epilogue input
              (pool_variants, 15, "avg_pool2d", torch.float32),  # 2x2 / 2: windows do not overlap
              (pool_variants, 15, "silu+avg_pool2d", torch.float32)]  # stride 1, divisor_override


@pytest.mark.parametrize("wrun", [2, 4])
@pytest.mark.parametrize("mod,size,pattern,dtype", WRUN_CASES,
                         ids=[f"{c[2]}-{str(c[3]).replace('torch.', '')}" for c in WRUN_CASES])
def test_runs_along_w_verify(cpu_evaluator, mod, size, pattern, dtype, wrun):
    region = _even_regions(mod, size, dtype)[pattern]
    cand = instantiate("region", "cpu", "window", {"wrun": wrun}, signature(region))
    assert f"fp_window_wrun(REGION_ARGS" in cand.source and f"#define WRUN {wrun}" in cand.source
    e = cpu_evaluator.evaluate(cand, _hotspot(region))
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


def test_a_run_combining_a_cell_into_the_wrong_window_is_rejected(cpu_evaluator):
    """The stem at wrun 2 (3x3 / 2): column 2 of a run belongs to both windows; leaving it out of the
    second one changes that output wherever column 2 holds its window's max."""
    region = _even_regions(resnet_stem, 30)["batch_norm+relu+max_pool2d"]
    cand = instantiate("region", "cpu", "window", {"wrun": 2}, signature(region))
    head, generated = cand.source.split("// generated for ops:")
    shared = "      acc0_1 = ok ? fp_maxnan(acc0_1, v0) : acc0_1;\n"
    first = generated.index("const fp_idx iw = w0 + 2;")
    assert generated.index(shared, first) < generated.index("const fp_idx iw = w0 + 3;")
    bad_src = generated[:first] + generated[first:].replace(shared, "", 1)
    bad = type(cand)(cand.op, cand.backend, head + "// generated for ops:" + bad_src, cand.spec, cand.family,
                     dict(cand.params), "user")
    e = cpu_evaluator.evaluate(bad, _hotspot(region))
    assert not e.verdict.ok and e.verdict.reason == "mismatch", (e.verdict.reason, e.verdict.detail)


def test_runs_along_w_need_a_fixed_window_and_a_pooled_w_that_they_divide():
    adaptive = _even_regions(pool_variants, 15)["sub+relu+adaptive_avg_pool2d"]
    with pytest.raises(ValueError, match="wrun 2: needs a fixed window"):
        instantiate("region", "cpu", "window", {"wrun": 2}, signature(adaptive))
    odd = _regions(resnet_stem)["batch_norm+relu+max_pool2d"]  # pooled W = 5
    with pytest.raises(ValueError, match="a multiple of 2"):
        instantiate("region", "cpu", "window", {"wrun": 2}, signature(odd))
    cl = _regions(resnet_stem, channels_last=True)["batch_norm+relu+max_pool2d"]  # C innermost
    with pytest.raises(ValueError, match="innermost output dim"):
        instantiate("region", "cuda", "window", {"wrun": 2, "vec": 1}, signature(cl))
    with pytest.raises(ValueError, match="vec and wrun together"):
        instantiate("region", "cuda", "window", {"wrun": 2, "vec": 4}, signature(cl))


@pytest.mark.parametrize("mod,size,pattern,cl,want", [
    (resnet_stem, 30, "batch_norm+relu+max_pool2d", False, 4),   # 3x3 / 2 overlapping, pooled W 8
    (pool_variants, 15, "silu+avg_pool2d", False, 4),            # 3x3 / 1
    (pool_variants, 15, "avg_pool2d", False, 1),                 # 2x2 / 2: no cell shared along W
    (pool_variants, 15, "sub+relu+adaptive_avg_pool2d", False, 1),
    (resnet_stem, 34, "batch_norm+relu+max_pool2d", False, 1),   # pooled W 9: no run divides it
    (resnet_stem, 30, "batch_norm+relu+max_pool2d", True, 1),    # channels_last: vectors along C
])
def test_cuda_defaults_run_along_w_where_nchw_windows_overlap(mod, size, pattern, cl, want):
    """The window family's CUDA defaults: wrun 4 (else 2) where NCHW windows overlap along W and a run
    divides the pooled W (measured 1.64x against 1.06x at wrun 1 on the stem, bench/results/window.md),
    one output per call otherwise; channels_last gets vectors along C instead."""
    model = mod.get_model().to(memory_format=torch.channels_last if cl else torch.contiguous_format)
    x = mod.get_inputs(size)[0].contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
    (region,) = [r for r in find_regions(capture(model, (x,), profile=False)) if r.pattern == pattern]
    cand = instantiate("region", "cuda", "window", None, signature(region))
    assert cand.params["wrun"] == want and (cand.params["vec"] > 1) == cl
    assert f"#define WRUN {want}" in cand.source and ("FP_FN void fp_window_wrun(" in cand.source) == (want > 1)
