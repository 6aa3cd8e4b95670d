"""Regions as search targets: generated kernels for the test models' regions verify on the CPU,
a wrong generated expression is rejected, and an op outside the table is reported, not raised."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from forge_pack.core.hotspot import Hotspot
from forge_pack.graph.capture import capture
from forge_pack.graph.regions import find_regions
from forge_pack.search.families.region import coverage, program
from forge_pack.search.region_lower import Uncovered, lower, view_strides
from forge_pack.search.templates_proposer import applicable_families, instantiate
from forge_pack.targets import registry
from forge_pack.targets.region_target import roles, signature

sys.path.insert(0, str(Path(__file__).resolve().parent / "models" / "regions"))
import conv_bn_block  # noqa: E402
import unseen_ops  # noqa: E402
import llama_regions  # noqa: E402
from torch_export import LLAMA_SOFTMAX  # noqa: E402
import vae_resblock  # noqa: E402


def _regions(mod):
    return {r.pattern: r for r in find_regions(capture(mod.get_model(), mod.get_inputs(), profile=False))}


def _hotspot(region):
    return Hotspot(signature(region), ("region",), 1.0, 1.0, 1.0, 0.5, device="cpu")


CASES = [(llama_regions, "rms_norm", "row"), (llama_regions, "silu+mul", "pointwise"),
         (llama_regions, LLAMA_SOFTMAX, "row"), (vae_resblock, "group_norm+silu", "row"),
         (conv_bn_block, "batch_norm+add+relu", "pointwise")]


@pytest.mark.parametrize("mod,pattern,family", CASES, ids=[c[1] for c in CASES])
def test_generated_region_kernel_verifies_on_every_input_set(cpu_evaluator, mod, pattern, family):
    region = _regions(mod)[pattern]
    sig = signature(region)
    assert coverage(sig) == ""
    assert [f.name for f in applicable_families(sig, "cpu")] == [family]
    e = cpu_evaluator.evaluate(instantiate("region", "cpu", family, None, sig), _hotspot(region))
    assert e.verdict.ok, e.verdict.detail
    kinds = {c.input_kind for c in e.verdict.checks}
    assert "fresh[0]" in kinds and any(k.startswith("derived:") for k in kinds)


def _verifies(cpu_evaluator, region):
    """The region is computed (coverage "") and its one CPU family's kernel verifies."""
    sig = signature(region)
    assert coverage(sig) == "", coverage(sig)
    (fam,) = applicable_families(sig, "cpu")
    e = cpu_evaluator.evaluate(instantiate("region", "cpu", fam.name, None, sig), _hotspot(region))
    assert e.verdict.ok, (region.pattern, e.verdict.reason, e.verdict.detail)


class _Act(nn.Module):
    def __init__(self, act: nn.Module):
        super().__init__()
        self.act = act

    def forward(self, x):
        return self.act(x * 1.5 + 0.25)


class _Addc(nn.Module):
    """ConvNeXt V2's global response norm ends in torch.addcmul(bias, weight, x * n) (and addcdiv alike)."""

    def __init__(self, op: str, value: float):
        super().__init__()
        self.op, self.value = getattr(torch, op), value

    def forward(self, x):
        return self.op(x[..., :1] + 1.0, x * 0.5, x.abs() + 2.0, value=self.value)


ACTIVATIONS = {"hardswish": nn.Hardswish(), "hardsigmoid": nn.Hardsigmoid(), "elu": nn.ELU(alpha=0.7),
               "selu": nn.SELU(), "celu": nn.CELU(alpha=1.3), "softplus": nn.Softplus(beta=2.0, threshold=5.0),
               "mish": nn.Mish(), "addcmul": _Addc("addcmul", 1.0), "addcdiv": _Addc("addcdiv", -0.75)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_of_vision_and_detection_models_lower_and_verify(cpu_evaluator, name, dtype):
    """MobileNetV3's hardswish / hardsigmoid, ELU, SELU, CELU, softplus (beta, threshold) and mish (one region with
    the affine before them), and addcmul / addcdiv with a value (broadcast operands): lowered from the op table
    and verified against the float64 reference."""
    model = ACTIVATIONS[name] if name.startswith("addc") else _Act(ACTIVATIONS[name])
    (region,) = find_regions(capture(model.eval(), (torch.randn(4, 33, 20).to(dtype),), profile=False))
    assert region.short_ops[-1] == name, region.short_ops
    _verifies(cpu_evaluator, region)


class _SpatialNorm(nn.Module):
    """ConvNeXt V2's global response norm statistic: the norm over H, W of an NHWC view of an NCHW tensor (the
    reduced dims are not the trailing ones of the view, but contiguous in memory), and a mean over them too."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x):
        y = x.permute(0, 2, 3, 1)
        if self.how == "mean":
            return (y * 2.0).mean(dim=(1, 2), keepdim=True)
        p = {"norm2": 2, "norm1": 1, "norm_inf": float("inf")}[self.how]
        return torch.linalg.vector_norm(y, ord=p, dim=(1, 2), keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("how", ["norm2", "norm1", "norm_inf", "mean"])
def test_a_reduction_over_dims_that_are_not_trailing_lowers_and_verifies(cpu_evaluator, how, dtype):
    (region,) = find_regions(capture(_SpatialNorm(how).eval(), (torch.randn(2, 24, 7, 9).to(dtype),), profile=False))
    prog = program(signature(region))
    assert prog.space == (2, 24, 7, 9) and prog.nred == 2 and prog.per_row  # the rows: (n, c); the columns: h, w
    _verifies(cpu_evaluator, region)


class _GemmaRmsNorm(nn.Module):
    """Gemma's RMSNorm: in fp32, times (1 + weight), then ``type_as(x)`` (a cast to another tensor's dtype)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64) * 0.1)

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (out * (1.0 + self.weight.float())).type_as(x)


class _Rope(nn.Module):
    """Llama's rotary tables: cos and sin of the fp32 angles, scaled, cast to the model's dtype."""

    def forward(self, emb):
        return (emb.cos() * 0.5).to(torch.bfloat16) + (emb.sin() * 0.5).to(torch.bfloat16)


class _MaskBuilder(nn.Module):
    """transformers' mask builders: comparisons of positions, & with new_ones, where into the logits."""

    def forward(self, x, pos):
        keep = (pos[:, None] >= pos[None, :]) & (pos[:, None] - pos[None, :] < 4)
        keep = keep & x.new_ones(x.shape, dtype=torch.bool)
        return torch.where(keep, x, torch.finfo(x.dtype).min)


def _small_models():
    torch.manual_seed(0)
    return {"gemma_rms_norm": (_GemmaRmsNorm().to(torch.bfloat16), (torch.randn(4, 9, 64).to(torch.bfloat16),)),
            "rope_cos_sin": (_Rope(), (torch.randn(2, 16, 32) * 4,)),
            "mask_builder": (_MaskBuilder(), (torch.randn(16, 16).to(torch.bfloat16), torch.arange(16)))}


@pytest.mark.parametrize("name", sorted(_small_models()))
def test_llm_regions_gemma_norm_rope_tables_and_mask_builders_lower_and_verify(cpu_evaluator, name):
    """type_as (Gemma's RMSNorm), cos / sin (RoPE's tables), new_ones and & of booleans (transformers' masks)."""
    model, inputs = _small_models()[name]
    regions = [r for r in find_regions(capture(model.eval(), inputs, profile=False)) if r.output_spec.dtype != "int64"]
    (region,) = [r for r in regions if r.output_spec.numel == max(x.output_spec.numel for x in regions)]
    _verifies(cpu_evaluator, region)


class _ShiftedWindowLogits(nn.Module):
    """Swin's shifted-window attention logits: a per-window mask added over [B, nW, heads, L, L], viewed back to
    [B * nW, heads, L, L] (the mask's broadcast batch dim merged with its window dim: no strides read the mask in
    that shape), then the softmax."""

    def forward(self, attn, mask):
        nw, heads, length = mask.shape[0], attn.shape[1], attn.shape[-1]
        attn = attn.view(attn.shape[0] // nw, nw, heads, length, length) + mask.unsqueeze(1).unsqueeze(0)
        return torch.softmax(attn.view(-1, heads, length, length), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_view_that_merges_a_broadcast_dim_keeps_its_index_space_and_verifies(cpu_evaluator, dtype):
    attn, mask = torch.randn(2 * 4, 3, 16, 16).to(dtype), (torch.randn(4, 16, 16) * 3).to(dtype)
    (region,) = find_regions(capture(_ShiftedWindowLogits(), (attn, mask), profile=False))
    prog = program(signature(region))
    assert prog.space == (2, 4, 3, 16, 16) and prog.nred == 1  # the rows: the unmerged leading dims
    _verifies(cpu_evaluator, region)


class _Spread(nn.Module):
    """A variance or standard deviation spelled each way models write it; ``group``: a group norm by hand (x viewed
    as [B, G, -1], normalised by its own statistics, viewed back: the inline spelling of nn.GroupNorm)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x):
        h = self.how
        if h == "group":
            b, c, hh, w = x.shape
            y = x.view(b, 2, -1)
            y = (y - y.mean(-1, keepdim=True)) * torch.rsqrt(y.var(-1, keepdim=True, unbiased=False) + 1e-6)
            return y.view(b, c, hh, w) * 2 + 1
        if h == "var_dim":  # aten.var.dim(x, [-1], unbiased, keepdim) with the flags positional
            return x * torch.rsqrt(x.var(-1, keepdim=True) + 1)
        if h == "var_correction":  # aten.var.correction(x, [-1], correction=0, keepdim=True)
            return x * torch.rsqrt(torch.var(x, dim=-1, keepdim=True, correction=0) + 1)
        if h == "std_dim":
            return x / (x.std(-1, keepdim=True, unbiased=False) + 1)
        if h == "var_mean":
            v, m = torch.var_mean(x, -1, keepdim=True, correction=2)
            return (x - m) * torch.rsqrt(v + 1)
        return x * torch.rsqrt(x.var() + 1)  # aten.var.default(x): every dim, unbiased


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("how", ["group", "var_dim", "var_correction", "std_dim", "var_mean", "var_default"])
def test_variance_spellings_lower_with_their_correction_and_keepdim(cpu_evaluator, how, dtype):
    """Each overload's correction (unbiased, the correction keyword, the default) and keepdim read where that
    overload puts them: a wrong correction or a dropped keepdim fails the float64 comparison or the lowering. In
    bf16 the statistic is the input's dtype, as eager returns it (it was fp32, and the kernel wrote fp32 values
    into the bf16 output, past its end)."""
    torch.manual_seed(0)
    (region,) = find_regions(capture(_Spread(how), (torch.randn(2, 6, 5, 8).to(dtype),), profile=False))
    assert program(signature(region)).out_dtype == str(dtype).replace("torch.", "")
    _verifies(cpu_evaluator, region)


def test_a_lowering_whose_output_dtype_is_not_the_regions_is_uncovered():
    """Whatever op's result dtype the lowering mis-models, the kernel's stores must have the output's width: a
    mismatch is no kernel."""
    (region,) = find_regions(capture(_Spread("group"), (torch.randn(2, 6, 5, 8).bfloat16(),), profile=False))
    form = signature(region).param("form")
    out = {"dtype": "float16", "shape": [2, 6, 5, 8], "strides": [240, 40, 8, 1]}
    with pytest.raises(Uncovered, match="the lowered output is bfloat16, the region's is float16"):
        lower(form, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("how", ["plain", "affine", "running_stats"])
def test_instance_norm_lowers_and_verifies(cpu_evaluator, how, dtype):
    """KernelBench's InstanceNorm2d (fp32, as published; and bf16): each (n, c) plane by its own statistics
    (shifted by its first element, so a constant plane gives exactly 0, as eager's Welford statistics do), with the
    per-channel affine, or, with running statistics in eval, batch_norm's map. In bf16 the prologue's roundings
    near the shifted sets' offsets cancel in the normalisation: verified with the sensitivity key
    (tests/test_region_sensitivity.py); with -march=native its vector code can hold the bytes cd 80 inside a
    vpblendvb, which the object check excuses (tests/test_x86_listing.py)."""
    torch.manual_seed(0)
    norm = nn.InstanceNorm2d(6, affine=how != "plain", track_running_stats=how == "running_stats")
    if how == "running_stats":
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
    if how != "plain":
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
    model = _Act(norm).to(dtype).eval()
    (region,) = find_regions(capture(model, (torch.randn(2, 6, 7, 9).to(dtype),), profile=False))
    if how == "running_stats":  # nothing is reduced
        assert region.kind == "pointwise" and not region.domain
    else:  # the planes are the rows, not batch_norm's channels
        assert region.kind == "row" and region.domain["dims"] == [2, 3], (region.kind, region.domain)
    _verifies(cpu_evaluator, region)


def _channel_rms() -> nn.Module:
    """KernelBench's RMSNorm (bench/kernelbench/l1_36_rms_norm.py): over the channels of NCHW (dim 1, not the
    trailing dims), the input divided by it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "kernelbench"))
    from l1_36_rms_norm import Model

    return Model(8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_norm_over_channels_computes_its_epilogue_in_the_reductions_dim_order(cpu_evaluator, dtype):
    """The rows are (n, h, w) and the columns c; the division, in the model's NCHW order, is computed over that
    space too, its output written at NCHW's strides read in that order."""
    (region,) = find_regions(capture(_channel_rms(), (torch.randn(2, 8, 5, 7).to(dtype),), profile=False))
    prog = program(signature(region))
    assert prog.space == (2, 5, 7, 8) and prog.out_perm == (0, 2, 3, 1) and prog.out_strides == (280, 7, 1, 35)
    _verifies(cpu_evaluator, region)


def _unseen_regions(dtype):
    model, inputs = unseen_ops.get_model(), unseen_ops.get_inputs()
    if dtype is not None:
        model, inputs = model.to(dtype), [t.to(dtype) if t.is_floating_point() else t for t in inputs]
    regions = find_regions(capture(model, tuple(inputs), profile=False))
    return list({r.key: r for r in regions}.values())


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["f32", "bf16"])
def test_every_region_of_the_unseen_ops_block_is_computed_and_verifies(cpu_evaluator, dtype):
    """tests/models/regions/unseen_ops.py (the ops the vision and LLM coverage surveys found uncomputed): each
    region's generated kernel verifies; the GPU side is built by test_region_cuda_compile."""
    regions = _unseen_regions(dtype)
    assert len(regions) == 8
    for region in regions:
        _verifies(cpu_evaluator, region)


def test_bitwise_and_of_integers_is_not_read_as_logic():
    class Bits(nn.Module):
        def forward(self, a, b):
            return (a & b).float() * 2.0

    (region,) = [r for r in find_regions(capture(Bits(), (torch.arange(8, dtype=torch.int32),
                                                         torch.full((8,), 6, dtype=torch.int32)), profile=False))]
    assert coverage(signature(region)) == "not covered: __and__ of non-boolean tensors"


def test_a_mutated_generated_expression_is_rejected_as_mismatch(cpu_evaluator):
    region = _regions(llama_regions)["rms_norm"]
    cand = instantiate("region", "cpu", "row", None, signature(region))
    head, generated = cand.source.split("// generated for ops:")
    assert "fp_rsqrt(" in generated  # the norm's rsqrt, written by the op table
    source = head + "// generated for ops:" + generated.replace("fp_rsqrt(", "fp_sqrt(")
    bad = type(cand)(cand.op, cand.backend, source, cand.spec,
                     cand.family, dict(cand.params), "user")
    e = cpu_evaluator.evaluate(bad, _hotspot(region))
    assert not e.verdict.ok and e.verdict.reason == "mismatch", (e.verdict.reason, e.verdict.detail)


def test_an_op_outside_the_table_is_reported_not_covered():
    region = _regions(llama_regions)["silu+mul"]
    form = dict(region.form)
    form["ops"] = [{"op": "aten.cumsum.default", "args": [{"in": 0}, 2], "kwargs": {}}] + [
        {**o, "args": [{"n": a["n"] + 1} if isinstance(a, dict) and "n" in a else a for a in o["args"]]}
        for o in form["ops"]]
    sig = signature(region)
    params = tuple((k, form if k == "form" else v) for k, v in sig.params)
    sig = type(sig)(sig.op, sig.inputs, params, sig.output)
    assert coverage(sig) == "not covered: aten.cumsum.default"
    assert applicable_families(sig, "cpu") == []


def test_region_spec_is_looked_up_by_signature_and_draws_masks_by_meaning():
    region = _regions(llama_regions)[LLAMA_SOFTMAX]
    sig = signature(region)
    assert sig.slug() == region.name
    spec = registry.spec_for(sig)
    assert spec.tensors == ("in0", "in1") and spec.main == "in0"
    assert roles(region.form) == ["data", "mask"]
    import torch

    t = spec.make_inputs([(n, (s.dtype, s.shape, s.strides)) for n, s in sig.inputs], "fresh",
                         torch.Generator().manual_seed(0), "cpu")
    assert set(t["in1"].unique().tolist()) == {0.0, torch.finfo(torch.bfloat16).min}
    ref = spec.reference64({}, t)
    assert ref.dtype == torch.float64 and torch.allclose(ref.sum(-1), torch.ones(2, 4, 16, dtype=torch.float64))


def test_group_norm_reads_its_input_as_groups_and_weights_per_channel():
    region = _regions(vae_resblock)["group_norm+silu"]
    prog = program(signature(region))
    assert (prog.kind, prog.space, prog.nred, len(prog.reductions)) == ("row", (2, 32, 2, 64), 2, 2)
    weights = {leaf.strides for leaf in prog.out.leaves if leaf.source == ("in", 1)}
    assert weights == {(0, 2, 1, 0)}  # channel = group * 2 + channel-in-group, nothing else


def test_view_strides_follow_torch():
    assert view_strides((2, 6), (6, 1), (2, 2, 3)) == (6, 3, 1)
    assert view_strides((4, 3), (1, 4), (12,)) is None  # a transposed tensor flattens only by copy
    assert view_strides((8, 4), (0, 1), (2, 4, 4)) == (0, 0, 1)


def test_search_regions_end_to_end_stores_resumes_and_packs_the_region(tmp_path, monkeypatch):
    """`search --regions` on a model: the region is a hotspot named by its signature, its winner is
    stored, a resumed run re-searches nothing, and pack writes its form, entry op and ABI."""
    import json

    from forge_pack.pack.packager import pack
    from forge_pack.search.pipeline import RunConfig, run
    from forge_pack.store.run_store import Store

    monkeypatch.setenv("FORGE_PACK_CPU_THREADS", "1")
    model = str(Path(__file__).resolve().parent / "models" / "regions" / "conv_bn_block.py")
    run_dir = tmp_path / "run"
    config = RunConfig(model=model, device="cpu", budget=2, top=1, run_dir=str(run_dir), regions=True,
                       )
    summary = run(config, quiet=True, say=lambda s: None)
    searched = [o for o in summary.outcomes if not o.skipped]
    assert [o.hotspot.op for o in searched] == ["region"]
    region = searched[0].hotspot.extra["region"]
    assert searched[0].hotspot.id == region["name"] and region["name"].startswith(("batch_norm_", "conv_epilogue_"))  # the larger share of the two
    assert searched[0].hotspot.captures  # the real inputs, saved from the graph's own run
    with Store(run_dir) as store:
        ids = {r["id"] for r in store.hotspots()}
    assert region["name"] in ids
    again = run(config, resume=True, quiet=True, say=lambda s: None)
    assert [o.hotspot.id for o in again.outcomes if not o.skipped] == [region["name"]]
    if not summary.winners:
        pytest.skip("no kernel beat eager on this machine: nothing to pack")
    res = pack(run_dir, tmp_path / "pkg", confirm=False, say=lambda s: None)
    assert res.written, res.message
    entry = res.targets[0]["region"]
    assert entry["inputs"] == [f"in{k}" for k in range(len(entry["form"]["inputs"]))]
    assert entry["entry"].endswith("::t0") and entry["name"] == region["name"]
    assert json.loads(entry["key"]) == entry["form"]
    # compile mode's graph pass reads the manifest's `regions`: the region under the target's id, its
    # op the target's torch op, and the compile gate's record for that id on both entries
    doc = json.loads((Path(res.out_dir) / res.package / "manifest.json").read_text())
    # the region under t0; a searched conv epilogue also ships its chain's conv region (c0, listed first)
    # whose epilogue is that kernel
    assert [r["id"] for r in doc["regions"]] in (["t0"], ["c0", "t0"]), [r["id"] for r in doc["regions"]]
    reg = doc["regions"][-1]
    if len(doc["regions"]) == 2:
        assert region["name"].startswith("conv_epilogue_") and doc["regions"][0]["conv"]["epilogue"]["target"] == "t0"
    assert (reg["id"], reg["op"], reg["form"], reg["output"]) == ("t0", entry["entry"], entry["form"], entry["output"])
    assert reg.get("compile") == doc["targets"][0].get("compile")  # one record per id (None: gate not run)


def test_derived_sets_keep_a_non_dense_input_layout():
    """A region input that is a slice of a larger buffer keeps its strides in every derived set
    (the kernel is specialised to them; a dense copy would be read at the wrong places)."""
    import torch

    from forge_pack.targets import ops

    region = _regions(llama_regions)["silu+mul"]
    sig = signature(region)
    spec = sig.inputs[0][1]
    wide = type(spec)(spec.dtype, spec.shape, (spec.strides[0] * 3, spec.strides[1] * 3, 1))
    sig = type(sig)(sig.op, ((sig.inputs[0][0], wide), sig.inputs[1]), sig.params, sig.output)
    src = ops.make_inputs(sig, "fresh", torch.Generator().manual_seed(0), "cpu")
    for kind in ops.DERIVED_KINDS:
        out = ops.derive_inputs(sig, kind, src, torch.Generator().manual_seed(1))
        assert out["in0"].stride() == wide.strides and out["in1"].stride() == src["in1"].stride()
