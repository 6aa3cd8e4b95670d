"""Regions: the fused chains found in small models, their references against the model's own
intermediates, and the stability of their signatures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from forge_pack.graph import canonical, opclass
from forge_pack.graph.capture import capture
from forge_pack.graph.regions import REASONS, Region, find_regions, pattern_name, uncovered
from forge_pack.graph.report import format_regions, group_regions, regions_json

# Not in tests/models/ itself: the GPU build round trip (test_pack_cuda) builds every file there.
MODELS = Path(__file__).resolve().parent / "models" / "regions"
sys.path.insert(0, str(MODELS))
import conv_bn_block  # noqa: E402
import convnext_block  # noqa: E402
import llama_regions  # noqa: E402
import vae_resblock  # noqa: E402
from torch_export import LLAMA_SOFTMAX, llama_softmax  # noqa: E402

RMS_OPS = ("_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "mul")


def _regions(model, inputs, **kw):
    g = capture(model, inputs, profile=False, **kw)
    return g, find_regions(g)


def _table(regions):
    return sorted((r.pattern, r.compute_ops) for r in regions)


def _hooked(model, points):
    """Run the eager model and keep the tensors at points: {name: (module, "in" | "out")}."""
    seen, handles = {}, []
    for name, (mod, where) in points.items():
        if where == "in":
            handles.append(mod.register_forward_pre_hook(lambda m, a, name=name: seen.__setitem__(name, a[0])))
        else:
            handles.append(mod.register_forward_hook(lambda m, a, o, name=name: seen.__setitem__(name, o)))
    return seen, handles


def _region_output(graph, region):
    vals = graph.run(keep=region.inputs)
    return region.reference()(*[vals[n] for n in region.inputs]), [vals[n] for n in region.inputs]


def test_llama_block_regions_are_the_rms_norms_mask_softmax_and_silu_gate():
    g, regions = _regions(llama_regions.get_model(), llama_regions.get_inputs())
    softmax = llama_softmax()
    assert _table(regions) == sorted([
        ("rms_norm", RMS_OPS), ("rms_norm", RMS_OPS),
        softmax,
        ("silu+mul", ("silu", "mul")),
        ("add", ("add",)), ("add", ("add",)),  # the residuals: their sums feed the next norm too
        ("clone", ("clone",)),  # transpose(1, 2).reshape: the head merge copy
    ])
    kinds = {r.pattern: r.kind for r in regions}
    assert kinds["rms_norm"] == "row" and kinds[softmax[0]] == "row" and kinds["silu+mul"] == "pointwise"
    # the rms norm reads the block input and its weight, nothing else
    first = next(r for r in regions if r.pattern == "rms_norm")
    assert first.inputs == ("x", "p_input_weight")
    assert [s.shape for s in first.input_specs] == [(2, 16, 64), (64,)]


def test_llama_regions_on_the_make_fx_route_are_the_same_chains_in_decomposed_ops():
    g, regions = _regions(llama_regions.get_model(), llama_regions.get_inputs(), routes=("make_fx",))
    table = _table(regions)
    assert ("rms_norm", RMS_OPS) in table
    assert ("div+add+cast+softmax+cast", ("div", "add", "_to_copy", "_softmax", "_to_copy")) in table
    assert ("silu+mul", ("silu", "mul")) in table


def test_llama_sdpa_leaves_attention_out_and_says_why():
    g, regions = _regions(llama_regions.get_model("sdpa"), llama_regions.get_inputs())
    assert LLAMA_SOFTMAX not in {r.pattern for r in regions}
    reasons = {u["reason"]: u["ops"] for u in uncovered(g, regions)}
    assert reasons[REASONS["attention"]] == {
        "scaled_dot_product_attention": 1}


def test_llama_region_references_equal_the_models_intermediates():
    model, inputs = llama_regions.get_model(), llama_regions.get_inputs()
    seen, handles = _hooked(model, {"normed": (model.self_attn, "in"), "probs": (model.self_attn.attn_dropout, "in"),
                                    "gated": (model.mlp.down_proj, "in")})
    with torch.no_grad():
        model(*inputs)
    for h in handles:
        h.remove()
    g, regions = _regions(model, inputs)
    by_pattern = {}
    for r in regions:
        by_pattern.setdefault(r.pattern, r)
    for pattern, point in (("rms_norm", "normed"), (LLAMA_SOFTMAX, "probs"), ("silu+mul", "gated")):
        out, ins = _region_output(g, by_pattern[pattern])
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, seen[point], rtol=0, atol=0)
        f64 = by_pattern[pattern].reference_f64()(*ins)
        assert f64.dtype == torch.float64
        torch.testing.assert_close(f64.to(torch.bfloat16), out, rtol=2e-2, atol=2e-2)  # bf16: 8 mantissa bits


def test_vae_resblock_regions_and_references():
    model, inputs = vae_resblock.get_model(), vae_resblock.get_inputs()
    seen, handles = _hooked(model, {"act1": (model.conv1, "in"), "act2": (model.conv2, "in"), "out": (model, "out")})
    with torch.no_grad():
        model(*inputs)
    for h in handles:
        h.remove()
    g, regions = _regions(model, inputs)
    assert _table(regions) == sorted([
        ("group_norm+silu", ("group_norm", "silu")),
        ("add+group_norm+silu", ("add", "group_norm", "silu")),  # the time embedding added before norm2
        ("add+div", ("add", "div")),  # residual / output_scale_factor
        ("silu", ("silu",)),  # silu(temb) before the projection
    ])
    assert {r.pattern: r.kind for r in regions}["add+group_norm+silu"] == "group"
    for pattern, point in (("group_norm+silu", "act1"), ("add+group_norm+silu", "act2"), ("add+div", "out")):
        region = next(r for r in regions if r.pattern == pattern)
        out, _ = _region_output(g, region)
        torch.testing.assert_close(out, seen[point], rtol=0, atol=0)


def test_conv_bn_block_regions_are_batch_norm_relu_and_batch_norm_add_relu():
    model, inputs = conv_bn_block.get_model(), conv_bn_block.get_inputs()
    seen, handles = _hooked(model, {"r1": (model.relu1, "out"), "r2": (model.relu2, "out")})
    with torch.no_grad():
        model(*inputs)
    for h in handles:
        h.remove()
    g, regions = _regions(model, inputs)
    bn = "_native_batch_norm_legit_no_training"
    assert _table(regions) == [("batch_norm+add+relu", (bn, "add", "relu")), ("batch_norm+relu", (bn, "relu"))]
    for pattern, point in (("batch_norm+relu", "r1"), ("batch_norm+add+relu", "r2")):
        out, _ = _region_output(g, next(r for r in regions if r.pattern == pattern))
        torch.testing.assert_close(out, seen[point], rtol=0, atol=0)


def test_kernelbench_file_loads_and_its_gelu_scale_softmax_is_one_row_region():
    from forge_pack.profile.load import load

    target = load(MODELS / "kb_gemm_gelu_softmax.py", "cpu")
    g = capture(target.module, target.args, target.kwargs, profile=False)
    (region,) = find_regions(g)
    assert (region.pattern, region.compute_ops, region.kind) == ("gelu+mul+softmax", ("gelu", "mul", "softmax"), "row")
    out, _ = _region_output(g, region)
    with torch.no_grad():
        torch.testing.assert_close(out, target.forward(), rtol=0, atol=0)


def test_region_signatures_are_equal_across_captures_and_differ_when_a_shape_changes():
    def digests(seq):
        _, regions = _regions(llama_regions.get_model(), llama_regions.get_inputs(seq))
        return {r.pattern: r.digest for r in regions}, [r.name for r in regions]

    first, names1 = digests(16)
    again, names2 = digests(16)
    longer, _ = digests(24)
    assert first == again and names1 == names2
    for pattern in ("rms_norm", "silu+mul", LLAMA_SOFTMAX):
        assert longer[pattern] != first[pattern]


def test_identical_layers_share_one_signature_and_group_into_one_target():
    _, regions = _regions(llama_regions.get_model(), llama_regions.get_inputs())
    groups = {g.first.pattern: g for g in group_regions(regions)}
    assert len(groups["rms_norm"].regions) == 2  # input and post-attention norms: same shapes, same eps
    assert groups["rms_norm"].time_share == pytest.approx(sum(r.time_share for r in regions if r.pattern == "rms_norm"))


def test_region_form_alone_rebuilds_the_subgraph_after_a_json_round_trip():
    g, regions = _regions(vae_resblock.get_model(), vae_resblock.get_inputs())
    region = next(r for r in regions if r.pattern == "add+group_norm+silu")
    body = json.loads(json.dumps(region.form))
    assert canonical.digest(body) == region.digest and region.name.endswith(region.digest[:10])
    vals = g.run(keep=region.inputs)
    ins = [vals[n] for n in region.inputs]
    torch.testing.assert_close(canonical.rebuild(body)(*ins), region.reference()(*ins), rtol=0, atol=0)
    back = Region.from_json(json.loads(json.dumps(region.to_json())))
    assert back.key == region.key and back.env() == region.env() and back.tensor_names() == ["in0", "in1", "in2",
                                                                                              "in3", "out"]


def test_region_env_gives_the_size_variables_of_its_reduction():
    _, regions = _regions(vae_resblock.get_model(), vae_resblock.get_inputs())
    gn = next(r for r in regions if r.pattern == "group_norm+silu")
    assert gn.env() == {"numel": 2 * 64 * 64, "N": 2, "C": 64, "G": 32, "HW": 64, "CPG": 2, "GROUP_SIZE": 128}
    assert gn.unsupported() == ""
    _, regions = _regions(llama_regions.get_model(), llama_regions.get_inputs())
    rms = next(r for r in regions if r.pattern == "rms_norm")
    assert rms.env() == {"numel": 2 * 16 * 64, "rows": 32, "cols": 64}
    assert rms.bytes_moved() == 2 * 16 * 64 * 2 + 64 * 2 + 2 * 16 * 64 * 2  # bf16 x and weight in, bf16 out


class Rules(nn.Module):
    def forward(self, x):
        y = x.exp()  # read by two ops: its own region
        a = y.sum(-1)
        b = (y * 2).softmax(-1).sum(1)  # two reductions over different dims: two regions
        c = (x + 1).transpose(1, 2).contiguous() * 3  # a transpose inside a pointwise chain: one region
        d = (x * 4)[:, 1:] - 1  # a slice ends a region
        e = (x - 2).transpose(1, 2).softmax(-1)  # so does a transpose next to a reduction
        return a, b, c, d, e


def test_region_boundaries_other_consumers_other_reduction_dims_and_layout_views():
    g, regions = _regions(Rules(), (torch.randn(2, 3, 4),))
    assert _table(regions) == sorted([
        ("exp", ("exp",)), ("sum", ("sum",)), ("mul+softmax", ("mul", "softmax")), ("sum", ("sum",)),
        ("add+clone+mul", ("add", "clone", "mul")), ("mul", ("mul",)), ("sub", ("sub",)),
        ("sub", ("sub",)), ("softmax", ("softmax",)),
    ])
    (c,) = [r for r in regions if r.pattern == "add+clone+mul"]
    assert c.short_ops == ("add", "transpose", "clone", "mul")
    kinds = sorted((r.pattern, r.kind) for r in regions if r.compute_ops[-1] == "sum")
    assert kinds == [("sum", "row"), ("sum", "strided")]  # sum(-1) of exp; sum(1) of the softmax


def test_convnext_layer_scale_is_one_region_through_its_permute_and_the_norms_stay_strided():
    """ConvNeXt's gamma * y, permuted back to NCHW, plus the residual: one pointwise region (the permute is a
    reordering of strides a pointwise kernel reads through); its LayerNorms over permuted views stay strided
    reductions with the permutes outside."""
    _, regions = _regions(convnext_block.get_model(), convnext_block.get_inputs())
    assert _table(regions) == sorted([("layer_norm", ("layer_norm",))] * 3 + [("gelu", ("gelu",))] * 2
                                     + [("mul+add", ("mul", "add"))] * 2)
    scale = [r for r in regions if r.pattern == "mul+add"]
    assert all(r.short_ops == ("mul", "permute", "add") and r.kind == "pointwise" for r in scale)
    assert {r.kind for r in regions if r.pattern == "layer_norm"} == {"strided"}


class _ViewsBetweenMatmuls(nn.Module):
    def forward(self, x, w):
        h = (x @ w).view(2, 4, 3, 2).transpose(1, 2).unsqueeze(0)  # views and a transpose: nothing to compute
        g = (h[0].reshape(2, 3, 8) * 2).transpose(1, 2).unsqueeze(0)  # a product, then a trailing transpose + view
        return h @ torch.ones(2, 5), g @ torch.ones(3, 5)


def test_a_permute_neither_makes_a_region_alone_nor_ends_one():
    _, regions = _regions(_ViewsBetweenMatmuls(), (torch.randn(2, 4, 6), torch.randn(6, 6)))
    assert all(r.compute_ops for r in regions)
    (mul,) = [r for r in regions if "mul" in r.compute_ops]
    assert mul.short_ops[-1] == "mul" and mul.output_spec.shape == (2, 3, 8)


class _WindowPartition(nn.Module):
    """Swin's window partition: a permuted view reshaped (a copy, then a view that merges the window dims)."""

    def forward(self, x):
        b, h, w, c = x.shape
        win = (x * 2.0).view(b, h // 7, 7, w // 7, 7, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 49, c)
        return win + 1.0


def test_a_copy_that_makes_a_view_possible_ends_its_own_region(cpu_evaluator):
    """The reshape's copy writes the windows in order and ends a region; the view of it starts the next. Kept in
    one region, the kernel would have to index the copy's input through a view no strides express (its lowering
    says so, and the region was found but not computed)."""
    from forge_pack.core.hotspot import Hotspot
    from forge_pack.search.families.region import coverage
    from forge_pack.search.templates_proposer import instantiate
    from forge_pack.targets.region_target import signature

    _, regions = _regions(_WindowPartition(), (torch.randn(2, 14, 21, 8),))
    assert sorted(r.short_ops for r in regions) == [("_unsafe_view", "add"),
                                                    ("mul", "view", "permute", "clone")]
    for r in regions:
        sig = signature(r)
        assert coverage(sig) == "", coverage(sig)
        e = cpu_evaluator.evaluate(instantiate("region", "cpu", "pointwise", None, sig),
                                   Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cpu"))
        assert e.verdict.ok, (r.short_ops, e.verdict.reason, e.verdict.detail)


def test_a_region_through_a_permute_verifies_on_the_cpu(cpu_evaluator):
    """The generated kernel reads the pre-permute operand at the permuted strides: the float64 reference of the
    region's own subgraph agrees; a kernel that ignored the permute (its strides as given) would not."""
    from forge_pack.core.hotspot import Hotspot
    from forge_pack.search.templates_proposer import applicable_families, instantiate
    from forge_pack.targets.region_target import signature

    _, regions = _regions(convnext_block.get_model(), convnext_block.get_inputs())
    sig = signature(next(r for r in regions if r.pattern == "mul+add"))
    hot = Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cpu")
    for fam in applicable_families(sig, "cpu"):
        e = cpu_evaluator.evaluate(instantiate("region", "cpu", fam.name, None, sig), hot)
        assert e.verdict.ok, (fam.name, e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("ops,name", [
    (("_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "mul"), "rms_norm"),  # Llama
    (("_to_copy", "pow", "mean", "add", "pow", "mul", "mul", "type_as"), "rms_norm"),  # Gemma: pow(var + eps, -0.5)
    (("_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "mul", "_to_copy", "silu", "mul"),
     "rms_norm+silu"),  # gated RMSNorm (Qwen3.5 linear attention)
    (("pow", "mean", "add", "rsqrt", "mul", "add", "pow", "mean", "add", "rsqrt", "mul"), "rms_norm x2"),
    (("amax", "sub", "exp", "sum", "div"), "softmax"),
    (("var_mean", "getitem", "getitem", "sub", "add", "rsqrt", "mul", "mul", "add"), "layer_norm"),
    (("div", "add", "softmax", "_to_copy"), "div+add+softmax+cast"),
    (("native_group_norm", "getitem", "silu"), "group_norm+silu"),
])
def test_pattern_names_recognise_norms_written_as_eager_ops(ops, name):
    assert pattern_name(ops) == name


class MaskFill(nn.Module):
    def forward(self, x, keep):
        scores = x.masked_fill(~keep, torch.finfo(x.dtype).min)  # the largest negative float32 as a constant
        return scores.softmax(-1), torch.empty_like(x)


def test_a_float32_min_constant_survives_the_canonical_form_and_allocations_are_not_regions():
    x, keep = torch.randn(2, 5, 5), torch.rand(2, 5, 5) > 0.3
    g, regions = _regions(MaskFill(), (x, keep))
    assert _table(regions) == [("bitwise_not+masked_fill+softmax", ("bitwise_not", "masked_fill", "softmax"))]
    (region,) = regions
    out, _ = _region_output(g, region)
    torch.testing.assert_close(out, MaskFill()(x, keep)[0], rtol=0, atol=0)


@pytest.mark.parametrize("shape,strides,dims,kind", [
    ((2, 8, 4, 4), (128, 16, 4, 1), [2, 3], "row"),  # NCHW spatial mean
    ((2, 8, 4, 4), (128, 1, 32, 8), [2, 3], "strided"),  # channels_last spatial mean
    ((2, 8, 4, 4), (128, 16, 4, 1), [1], "strided"),  # over channels
    ((2, 8, 4, 4), (128, 16, 4, 1), None, "global"),
])
def test_reduction_kind_follows_the_memory_order_of_the_reduced_dims(shape, strides, dims, kind):
    args = ("x",) if dims is None else ("x", dims)
    assert opclass.reduction_domain("aten.mean.dim", args, {}, shape, strides, 1 if dims is None else 2)[0] == kind


def test_report_lists_regions_and_uncovered_time_with_reasons():
    g = capture(vae_resblock.get_model(), vae_resblock.get_inputs(), iterations=1)
    text = format_regions(g)
    assert "group_norm+silu: group_norm silu" in text
    assert "convolution: bounds a region" in text and "(conv2d x2)" in text
    doc = regions_json(g)
    assert doc["route"] == "export" and doc["time_source"] == "profile"
    assert 0 < doc["region_share"] < 1
    assert sum(r["calls"] for r in doc["regions"]) == 4


def test_cli_profile_regions_prints_the_region_table(tmp_path):
    r = subprocess.run([sys.executable, "-m", "forge_pack", "profile", str(MODELS / "conv_bn_block.py"), "--device",
                        "cpu", "--regions", "--iterations", "1", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Regions (export graph" in r.stdout
    assert "batch_norm+add+relu: _native_batch_norm_legit_no_training getitem add relu" in r.stdout
    assert "Convolution epilogue regions (batch_norm folded into the convolution): 2 signatures" in r.stdout
    assert "conv+batch_norm+add+relu: stride [1, 1] padding [1, 1] groups 1" in r.stdout
    assert "convolution: bounds a region" not in r.stdout  # both convolutions head a conv epilogue region
    r = subprocess.run([sys.executable, "-m", "forge_pack", "profile", str(MODELS / "kb_gemm_gelu_softmax.py"),
                        "--device", "cpu", "--regions", "--json", "--iterations", "1",
                        "--run-dir", str(tmp_path / "kb")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (group,) = json.loads(r.stdout)["regions"]["regions"]
    assert (group["pattern"], group["ops"], group["calls"]) == ("gelu+mul+softmax", ["gelu", "mul", "softmax"], 1)


@pytest.mark.gpu
def test_llama_block_regions_on_cuda_have_device_times_and_exact_references():
    model = llama_regions.get_model().cuda()
    inputs = tuple(t.cuda() for t in llama_regions.get_inputs())
    g = capture(model, inputs, iterations=2)
    regions = find_regions(g)
    # device times from the profiler; on CUDA a few nodes (the attention's own kernels) may be estimated
    assert g.device == "cuda" and g.time_source in ("profile", "profile+estimate")
    assert ("rms_norm", RMS_OPS) in _table(regions)
    for r in regions:
        assert r.time_us > 0 and r.device == "cuda"
        vals = g.run(keep=(*r.inputs, r.nodes[-1]))
        out = r.reference()(*[vals[n] for n in r.inputs])
        assert out.is_cuda
        torch.testing.assert_close(out, vals[r.nodes[-1]], rtol=0, atol=0)
