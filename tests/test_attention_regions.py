"""Eager attention chains as regions (graph/attention_chain, graph/attention_hotspots): found in the
forms model code writes, read with the right scale, soft cap, mask and key/value groups (and proven
so on the chain's own subgraph), captured as attention hotspots, packed as compile-mode regions, and
swapped into the graph Inductor compiles with the op's arguments in the attention op's order."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "models" / "regions"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))
import attention_block  # noqa: E402
import compile_fakes as cf  # noqa: E402
import gemma_attention  # noqa: E402
import helpers  # noqa: E402
import llama_regions  # noqa: E402

from forge_pack.graph import region_match  # noqa: E402
from forge_pack.graph.attention_chain import check, find_attention_chains  # noqa: E402
from forge_pack.graph.capture import capture  # noqa: E402
from forge_pack.pack import packager  # noqa: E402
from forge_pack.pack.packager import pack  # noqa: E402
from forge_pack.profile.capture import load_capture  # noqa: E402
from forge_pack.targets import registry  # noqa: E402


def _chains(model, inputs):
    return find_attention_chains(capture(model, inputs, profile=False, routes=("export",)))


def _bf16(module):
    model = module.get_model().to(torch.bfloat16)
    inputs = tuple(t.to(torch.bfloat16) for t in module.get_inputs())
    return model, inputs


@pytest.fixture(scope="module")
def block_chain():
    chains = _chains(*_bf16(attention_block))
    assert len(chains) == 1  # the SDPA layer calls one op: no chain
    return chains[0]


def test_hf_eager_attention_is_one_chain_with_its_scale_mask_and_groups(block_chain):
    c = block_chain
    assert (c.scale, c.softcap, c.groups) == (0.25, None, 2)
    assert sorted(c.roles) == ["k", "mask", "v", "x"]
    sig = c.signature()
    assert sig.op == "attention" and sig.param("composite") is True and sig.param("enable_gqa") is True
    # the kernel reads the key/value heads before repeat_kv, the mask operand of the add, and writes [B, L, H, D]
    assert sig.input("k").shape == (1, 2, 48, 16) and sig.input("v").shape == (1, 2, 48, 16)
    assert sig.input("mask").shape == (1, 1, 48, 48)
    assert sig.output.shape == (1, 48, 4, 16) and sig.output.strides == (3072, 64, 16, 1)
    ops = [o.split(".")[1] for o in c.region.ops]
    assert ops.count("matmul") == 2 and ops.count("expand") == 2 and "softmax" in ops
    assert [c.roles[i] for i in c.abi_order()] == ["x", "k", "v", "mask"]
    assert c.region.kind == "attention" and c.region.pattern == "attention+mask+gqa2"
    assert check(c) is None


def test_gemma_softcap_sliced_mask_and_eval_dropout_are_read(tmp_path):
    (c,) = _chains(gemma_attention.get_model(), gemma_attention.get_inputs())
    assert c.scale == gemma_attention.SCALING and c.softcap == gemma_attention.SOFTCAP and c.groups == 2
    assert c.spec("mask").shape == (1, 1, 40, 40) and c.spec("mask").strides[-2] == gemma_attention.CACHE
    assert check(c) is None


@pytest.mark.parametrize("fmt, chains", [(None, 1), (torch.contiguous_format, 1), (torch.channels_last, 0)])
def test_eval_dropout_exported_as_a_clone_is_read_and_a_relayout_is_not(monkeypatch, fmt, chains):
    """torch 2.11's export writes eval dropout as aten.clone of the probabilities (2.14 drops it): a copy to
    the same strides is read through as dropout is; a clone to another layout ends the match."""
    def clone(w, p=0.5, training=False, inplace=False):
        return w.clone() if fmt is None else w.clone(memory_format=fmt)

    monkeypatch.setattr(torch.nn.functional, "dropout", clone)
    found = _chains(gemma_attention.get_model(), gemma_attention.get_inputs())
    assert len(found) == chains
    if chains:
        assert "clone" in [o.split(".")[1] for o in found[0].region.ops] and check(found[0]) is None


def test_scaling_by_a_division_reads_as_its_reciprocal():
    model = llama_regions.get_model()
    (c,) = _chains(model, llama_regions.get_inputs())
    assert c.scale == pytest.approx(1 / 4) and c.groups == 1 and c.softcap is None
    assert check(c) is None


@pytest.mark.parametrize("how, scale", [("q", 0.5), ("q_div", 0.5), ("q_and_k", 0.5 * 0.25), ("k_transposed", 0.125)])
def test_a_scale_on_the_operands_before_the_product_is_read_into_the_scale(how, scale):
    """q * s, q / c, k * s (before or after its transpose), or both operands scaled (q * d^-0.25 and k * d^-0.25)
    scale the logits all the same: one chain whose scale is the product of every factor, proven in float64."""
    class Prescaled(nn.Module):
        def forward(self, q, k, v):
            if how in ("q", "q_and_k"):
                q = q * 0.5
            if how == "q_div":
                q = q / 2.0
            if how == "q_and_k":
                k = k * 0.25
            kt = k.transpose(2, 3) * 0.125 if how == "k_transposed" else k.transpose(2, 3)
            p = torch.softmax(torch.matmul(q, kt), dim=-1)
            return torch.matmul(p, v).transpose(1, 2).contiguous()

    torch.manual_seed(0)
    (c,) = _chains(Prescaled().eval(), tuple(torch.randn(1, 2, 8, 4, dtype=torch.bfloat16) for _ in range(3)))
    assert c.scale == pytest.approx(scale) and check(c) is None
    assert check(dataclasses.replace(c, scale=2 * scale)) is not None


def _swapped_in_compile_mode(base_doc, c, model, *inputs):
    """Compile mode with the chain's region finds it in Inductor's graph once and calls the attention op there
    (the op computing HF's attention in Python: the compiled output equals eager's within bf16 rounding)."""
    with torch.no_grad():
        ref = model(*inputs)
    cm = cf.COMPILE.CompileMode(_patcher(base_doc, c, c.abi_order()))
    got, _ = cf.aot_only(cm, model, *inputs)
    assert cm.report()["regions"] == {"a0": 1}
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


class _Einsum(nn.Module):
    """Attention written with einsum (any letters, spaces allowed), for one or both products."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, q, k, v, mask):
        if self.how == "mixed":
            w = torch.einsum("bhid,bhjd->bhij", q, k) * 0.25
        elif self.how == "spaced":
            w = torch.einsum("n h q c, n h k c -> n h q k", q, k) * 0.25
        else:
            w = torch.einsum("bhqd,bhkd->bhqk", q, k) * 0.25
        p = torch.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(p, v) if self.how == "mixed" else torch.einsum("bhqk,bhkd->bhqd", p, v)
        return out.transpose(1, 2).contiguous()


@pytest.mark.parametrize("how", ["both", "spaced", "mixed"])
def test_einsum_attention_is_a_chain_and_is_swapped_in_compile_mode(base_doc, how):
    """einsum("bhqd,bhkd->bhqk") for the logits and einsum("bhqk,bhkd->bhqd") for the output (or a matmul) are
    the same products: one chain, proven in float64; compile mode finds its form in Inductor's graph (where
    einsum is decomposed) and calls the attention op there."""
    model = _Einsum(how).eval()
    inputs = _masked_inputs()
    (c,) = _chains(model, inputs)
    assert c.scale == 0.25 and sorted(c.roles) == ["k", "mask", "v", "x"] and check(c) is None
    _swapped_in_compile_mode(base_doc, c, model, *inputs)


@pytest.mark.parametrize("equation", ["bhqd,bhkd->bhkq", "bhqd,bhkd->hbqk", "bhqd,bhkc->bhqk"])
def test_an_einsum_of_other_products_is_not_the_logits(equation):
    """k q^T, heads and batch swapped, or each operand summed on its own: other computations, no chain."""
    class Other(nn.Module):
        def forward(self, q, k, v):
            w = torch.einsum(equation, q, k) * 0.25
            if w.shape[-1] != v.shape[-2] or w.shape[:2] != v.shape[:2]:
                w = w.reshape(v.shape[0], v.shape[1], w.shape[-2], -1)[..., : v.shape[-2]]
            p = torch.softmax(w, dim=-1)
            return torch.matmul(p, v).transpose(1, 2).contiguous()

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    assert _chains(Other().eval(), (q, k, v)) == []


class _VitAttention(nn.Module):
    """A vision transformer's attention written out (timm's with fused_attn off): q, k, v unbound from one
    permuted qkv projection (strided views), the query pre-scaled, `@`, softmax, transpose + reshape."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


def test_a_hand_written_vit_attention_is_a_chain_over_strided_views_and_is_swapped(base_doc):
    torch.manual_seed(0)
    model = _VitAttention().to(torch.bfloat16).eval()
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    (c,) = _chains(model, (x,))
    assert c.scale == 0.25 and c.spec("x").strides == (3072, 16, 192, 1) and check(c) is None
    assert registry.spec_for(c.signature()).supports(c.signature()) is None
    _swapped_in_compile_mode(base_doc, c, model, x)


@pytest.mark.parametrize("field", ["scale", "softcap", "roles"])
def test_check_rejects_a_chain_read_with_other_parameters(block_chain, field):
    """The chain's own subgraph in float64 against the attention reference: a misread parameter, or keys and
    values taken for each other, shows."""
    swap = {"k": "v", "v": "k"}
    value = {"scale": 0.3, "softcap": 30.0, "roles": tuple(swap.get(r, r) for r in block_chain.roles)}[field]
    wrong = dataclasses.replace(block_chain, **{field: value})
    assert "differs from softmax" in check(wrong)


class _Variant(nn.Module):
    """Attention written almost as a chain, but not one kernel's computation (`how`)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, q, k, v):
        if self.how == "keys_are_queries":
            k = q
        if self.how == "q_scaled_by_a_tensor":  # a per-element factor: not a scale of the logits
            q = q * torch.linspace(0.5, 1.5, q.shape[-1], dtype=q.dtype)
        side = None
        if self.how == "scaled_q_read_twice":  # the scaled queries are also an output: not inside one kernel
            q = side = q * 0.5
        w = torch.matmul(q, k.transpose(2, 3)) * 0.25
        p = torch.softmax(w, dim=-2 if self.how == "softmax_dim" else -1)
        if self.how == "dropout_train":
            p = nn.functional.dropout(p, 0.1, training=True)
        out = torch.matmul(p, v)
        if self.how == "no_transpose":
            return out
        if self.how == "same_view":  # Falcon: a view to the product's own shape before the permute
            return out.view(out.shape).permute(0, 2, 1, 3).reshape(out.shape[0], out.shape[2], -1)
        if self.how == "other_view":  # a view that regroups the rows: not the composite's layout
            b, h, n, d = out.shape
            return out.view(b, n, h, d).permute(0, 2, 1, 3).reshape(b, h, -1)
        if self.how == "permute":  # einops' "b h n d -> b n (h d)": the same [B, L, H, D] copy
            return out.permute(0, 2, 1, 3).reshape(out.shape[0], out.shape[2], -1)
        if self.how == "other_permute":  # [B, D, L, H]: not the composite's layout
            return out.permute(0, 3, 2, 1).contiguous()
        out = out.transpose(1, 2).contiguous()
        if side is not None:
            return out, side
        return (out, p) if self.how == "weights_returned" else out


@pytest.mark.parametrize("how", ["plain", "softmax_dim", "dropout_train", "no_transpose", "weights_returned",
                                 "keys_are_queries", "permute", "other_permute", "same_view", "other_view"])
def test_only_the_exact_computation_is_a_chain(how):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.bfloat16) for _ in range(3))
    chains = _chains(_Variant(how).eval(), (q, k, v))
    assert len(chains) == (1 if how in ("plain", "permute", "same_view") else 0)
    if chains:
        assert chains[0].roles.count("mask") == 0 and check(chains[0]) is None


# --- the hotspot ---------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["q_scaled_by_a_tensor", "scaled_q_read_twice"])
def test_a_factor_that_is_not_the_logits_scale_stays_outside_the_chain(how):
    """A per-element factor, or scaled queries another op reads too: the chain starts after it (its input is the
    product) and its scale is the logits' own."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.bfloat16) for _ in range(3))
    (c,) = _chains(_Variant(how).eval(), (q, k, v))
    assert c.scale == 0.25 and c.region.ops.count("aten.mul.Tensor") == 1 and check(c) is None


def test_the_hotspot_captures_the_chains_own_inputs_and_output(tmp_path):
    from forge_pack.graph.attention_hotspots import attention_hotspots

    model, inputs = _bf16(attention_block)
    graph = capture(model, inputs, profile=False, routes=("export",))
    chains = find_attention_chains(graph)
    values = graph.run(keep={n for c in chains for n in (*c.region.inputs, c.region.nodes[-1])})
    (h,) = attention_hotspots(chains, values, tmp_path)
    assert h.unsupported == "" and h.call_paths == ("region",) and len(h.captures) == 1
    # its mask is full(finfo.min).triu(1): the kernel computes it (causal=True) and reads no mask
    causal = dataclasses.replace(chains[0], causal_mask=True)
    assert h.signature.param("causal") is True and h.signature.input("mask") is None
    assert h.extra["attention"]["abi_order"] == causal.abi_order() and len(causal.abi_order()) == 3
    assert h.extra["attention"]["causal_mask"] == chains[0].roles.index("mask")
    tensors, out = load_capture(tmp_path / h.captures[0], h.signature)
    spec = registry.spec_for(h.signature)
    ref = spec.reference64(dict(h.signature.params), tensors)
    # the model's own bf16 output against the float64 attention of its own inputs: bf16 rounding only
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    assert out.stride() == h.signature.output.strides


class _MaskedAttention(nn.Module):
    """HF-style attention over a mask given as an input (a padding mask, say): not the causal one."""

    def forward(self, q, k, v, mask):
        w = torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask
        p = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, v).transpose(1, 2).contiguous()


def _masked_inputs(causal: bool = False):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.bfloat16) for _ in range(3))
    mask = (torch.full((8, 8), torch.finfo(torch.bfloat16).min).triu(1) if causal
            else torch.randn(8, 8) * 3).to(torch.bfloat16)[None, None]
    return q, k, v, mask


def test_a_mask_that_is_not_causal_is_read_by_the_kernel(tmp_path):
    from forge_pack.graph.attention_hotspots import attention_hotspots

    inputs = _masked_inputs()
    graph = capture(_MaskedAttention().eval(), inputs, profile=False, routes=("export",))
    chains = find_attention_chains(graph)
    values = graph.run(keep={n for c in chains for n in (*c.region.inputs, c.region.nodes[-1])})
    (h,) = attention_hotspots(chains, values, tmp_path)
    assert h.signature.param("causal") is False and h.signature.input("mask") is not None
    assert h.extra["attention"]["causal_mask"] is None and len(h.extra["attention"]["abi_order"]) == 4


def test_causal_mask_recognition():
    from forge_pack.graph.region_match import causal_window, is_causal_mask

    bf = torch.bfloat16
    low = torch.finfo(bf).min
    causal = torch.full((5, 7), low, dtype=bf).triu(1)
    assert is_causal_mask(causal) and is_causal_mask(causal[None, None].expand(2, 3, 5, 7))
    assert is_causal_mask(torch.zeros(5, 7).masked_fill(torch.ones(5, 7, dtype=torch.bool).triu(1), float("-inf")))
    assert not is_causal_mask(causal.triu(2))  # the first superdiagonal kept: not causal
    assert not is_causal_mask(torch.full((5, 7), -1e4).triu(1))  # masked too weakly to be exactly zero
    window = causal.clone()
    window[4, 0] = low  # a sliding window of 4 keys drops the oldest key of the last row
    assert not is_causal_mask(window) and causal_window(window) == 4
    padded = causal[None].repeat(2, 1, 1)
    padded[1, :, 0] = low  # one sequence left-padded
    assert not is_causal_mask(padded) and causal_window(padded) is None
    assert causal_window(causal) == 0 and causal_window(torch.zeros(5, 7)) is None


@pytest.mark.parametrize("w", [1, 2, 3, 6])
def test_a_sliding_window_mask_reads_as_its_window(w):
    """transformers' sliding-window causal mask (key j visible to row i when i - W < j <= i) gives W, in any
    broadcast; a window no row reaches the edge of is the plain causal mask (0); one key more or less in any
    row, or one slice of the broadcast with another window, is not the pattern."""
    from forge_pack.graph.region_match import causal_window

    low = torch.finfo(torch.float32).min
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    mask = torch.zeros(9, 9).masked_fill((j > i) | (i - j >= w), low)
    assert causal_window(mask) == w and causal_window(mask[None, None].expand(2, 2, 9, 9)) == w
    assert causal_window(torch.zeros(9, 9).masked_fill((j > i) | (i - j >= 9), low)) == 0
    for r, c in ((8, 8 - w), (8, 8 - w + 1), (3, 4)):
        odd = mask.clone()
        odd[r, c] = low if odd[r, c] == 0 else 0
        assert causal_window(odd) is None, (r, c)
    two = torch.stack([mask, torch.zeros(9, 9).masked_fill((j > i) | (i - j >= w + 1), low)])
    assert causal_window(two) is None


def test_check_proves_the_causal_reading_on_the_chains_own_subgraph(block_chain):
    """With the causal pattern as its mask the chain's subgraph is causal attention; a chain whose kernel would
    compute the causal mask but whose scale is misread still fails."""
    causal = dataclasses.replace(block_chain, causal_mask=True)
    assert check(causal) is None
    assert "differs" in check(dataclasses.replace(causal, scale=0.3))


def test_a_chain_whose_subgraph_is_not_the_reference_is_skipped_with_the_reason(tmp_path, monkeypatch):
    from forge_pack.graph import attention_hotspots as ah

    model, inputs = _bf16(attention_block)
    graph = capture(model, inputs, profile=False, routes=("export",))
    chains = [dataclasses.replace(c, scale=0.5) for c in find_attention_chains(graph)]
    (h,) = ah.attention_hotspots(chains, {}, tmp_path)
    assert "differs from softmax" in h.unsupported and h.captures == ()


# --- the package and compile mode ----------------------------------------------------------------

_OPS = iter(range(10 ** 6))


def _attention_op(chain, strides: list | None = None) -> str:
    """The attention target as a Python op of a fresh namespace, (x, k, v[, mask]) -> out, computing HF's eager
    attention (with the causal mask where the kernel computes it): the package's op, without a compiler.
    Each call's input strides go into `strides` when given. Returns 'ns::att'."""
    ns = f"forge_att_region_{next(_OPS)}"
    lib = torch.library.Library(ns, "DEF")
    cf._LIBS.append(lib)
    names = chain.kernel_roles()
    lib.define(f"att({', '.join('Tensor ' + n for n in names)}) -> Tensor")
    fn = registry.get("attention").eager(chain.params(), "bfloat16")

    def impl(*tensors):
        if strides is not None:
            strides.append([t.stride() for t in tensors])
        return fn(dict(zip(names, tensors)))

    lib.impl("att", impl, "CPU")
    return f"{ns}::att"


@pytest.fixture(scope="module")
def base_doc(tmp_path_factory):
    base = tmp_path_factory.mktemp("att_doc")
    run = helpers.make_cpu_run(base / "run")
    assert pack(run, base / "pkg", "att_pkg", confirm=False).written
    return json.loads((base / "pkg" / "att_pkg" / "manifest.json").read_text())


def _patcher(doc, chain, args, strides: list | None = None):
    doc = copy.deepcopy(doc)
    doc.pop("integrity", None)
    doc["targets"] = []
    causal = {"causal_mask": chain.mask_index(), **({"window": chain.window} if chain.window else {})} \
        if chain.causal_mask else {}
    doc["regions"] = [{"id": "a0", "name": chain.name, "form": chain.region.form, "op": _attention_op(chain, strides),
                       "output": chain.region.output_spec.to_json(), "args": args, **causal,
                       "compile": {"use": True, "reason": "test", "compiled_ms": 1.0, "compiled_with_ms": 0.9}}]
    return cf.PATCH.Patcher(doc, "att_region_pkg", lambda: None)


def _causal_block(triu: int, window: int = 0):
    """attention_block whose eager layer's mask is full(finfo.min).triu(`triu`): 1 is the causal mask; with a
    `window` W, also finfo.min where j <= i - W (transformers' sliding-window mask, built from aranges)."""
    class Model(attention_block.Model):
        def forward(self, x):
            s = x.shape[1]
            mask = torch.full((s, s), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device).triu(triu)
            if window:
                i = torch.arange(s, device=x.device)[:, None]
                j = torch.arange(s, device=x.device)[None, :]
                mask = mask.masked_fill(i - j >= window, torch.finfo(x.dtype).min)
            x = x + self.sdpa(x, None)
            return x + self.eager(x, mask[None, None])

    torch.manual_seed(0)
    model = Model().to(torch.bfloat16).eval()
    return model, tuple(t.to(torch.bfloat16) for t in attention_block.get_inputs())


def _swap_computed_mask(base_doc, chain, triu: int, window: int, swapped: bool) -> list:
    """Compile `_causal_block(triu, window)` with `chain`'s region (its kernel computing its mask): swapped once, or
    left to Inductor with the warning, and the output within bf16 of eager's either way; the forward graphs."""
    model, inputs = _causal_block(triu, window=window)
    with torch.no_grad():
        ref = model(*inputs)
    cm = cf.COMPILE.CompileMode(_patcher(base_doc, chain, chain.abi_order()))
    with pytest.warns(RuntimeWarning, match="not a constant causal") if not swapped else contextlib.nullcontext():
        got, graphs = cf.aot_only(cm, model, *inputs)
    assert cm.report()["regions"] == ({"a0": 1} if swapped else {})
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)
    return graphs


@pytest.mark.parametrize("triu, swapped", [(1, True), (2, False)])
def test_a_computed_causal_mask_is_swapped_only_where_the_compiled_graph_proves_it(base_doc, block_chain, triu,
                                                                                   swapped):
    """The causal variant's op reads no mask: compile mode evaluates the mask the graph builds (a constant of
    the compiled graph) and swaps the chain in only when it is the causal one; triu(2) keeps the first
    superdiagonal, has the same form, and stays Inductor's."""
    graphs = _swap_computed_mask(base_doc, dataclasses.replace(block_chain, causal_mask=True), triu, 0, swapped)
    calls = [n for g in graphs for n in g.graph.nodes if "forge_att_region_" in str(n.target)]
    assert len(calls) == int(swapped)
    if swapped:
        assert [tuple(a.meta["val"].shape) for a in calls[0].args] == [(1, 4, 48, 16), (1, 2, 48, 16), (1, 2, 48, 16)]


@pytest.mark.parametrize("built, region, swapped", [(5, 5, True), (5, 6, False), (5, 0, False), (0, 5, False)])
def test_a_sliding_window_mask_is_swapped_only_for_the_kernel_of_its_window(base_doc, block_chain, built, region,
                                                                           swapped):
    """A region whose kernel computes a sliding window of W is swapped in only where the compiled graph's
    constant mask is that window's; another window, or the plain causal mask (and the other way round), stays
    Inductor's."""
    _swap_computed_mask(base_doc, dataclasses.replace(block_chain, causal_mask=True, window=region), 1, built, swapped)


def test_a_windowed_chain_is_searched_as_causal_attention_with_its_window(tmp_path, monkeypatch):
    """Every layer's mask the same sliding window: the hotspot is causal with that window and reads no mask;
    its check fed the window's pattern passes, and the manifest entry carries the window."""
    from forge_pack.graph.attention_hotspots import attention_hotspots, keep_names

    model, inputs = _causal_block(1, window=5)
    graph = capture(model, inputs, profile=False, routes=("export",))
    chains = find_attention_chains(graph)
    values = graph.run(keep=keep_names(chains))
    (h,) = attention_hotspots(chains, values, tmp_path)
    assert h.unsupported == "" and h.signature.param("causal") is True and h.signature.param("window") == 5
    assert h.signature.input("mask") is None and h.extra["attention"]["window"] == 5
    entry = packager._attention_entry(h, "ns::t0")["region"]
    assert entry["window"] == 5 and entry["causal_mask"] == h.extra["attention"]["causal_mask"]
    windowed = dataclasses.replace(chains[0], causal_mask=True, window=5)
    assert check(windowed) is None
    # the check feeds the subgraph the window's pattern and compares with the windowed reference: fed the plain
    # causal mask instead, the subgraph is another computation
    from forge_pack.graph import attention_chain as ac

    plain = ac.causal_pattern
    monkeypatch.setattr(ac, "causal_pattern", lambda spec, dtype=torch.float64, window=0: plain(spec, dtype))
    assert "differs" in (check(windowed) or "")


def test_a_causal_mask_given_as_an_input_is_not_trusted(base_doc):
    """A mask that is an input of the graph can change from call to call: even causal when compiled, the chain
    whose kernel computes the causal mask is left to Inductor."""
    inputs = _masked_inputs(causal=True)
    model = _MaskedAttention().eval()
    (chain,) = find_attention_chains(capture(model, inputs, profile=False, routes=("export",)))
    causal = dataclasses.replace(chain, causal_mask=True)
    cm = cf.COMPILE.CompileMode(_patcher(base_doc, causal, causal.abi_order()))
    with pytest.warns(RuntimeWarning, match="not a constant causal"):
        cf.aot_only(cm, model, *inputs)
    assert cm.report()["regions"] == {}


def test_compile_mode_swaps_the_chain_for_the_attention_op_in_its_argument_order(base_doc, block_chain):
    model, inputs = _bf16(attention_block)
    with torch.no_grad():
        ref = model(*inputs)
    cm = cf.COMPILE.CompileMode(_patcher(base_doc, block_chain, block_chain.abi_order()))
    got, graphs = cf.aot_only(cm, model, *inputs)
    assert cm.report()["regions"] == {"a0": 1}
    calls = [n for g in graphs for n in g.graph.nodes if "forge_att_region_" in str(n.target)]
    assert len(calls) == 1
    # the op's arguments are the query [B, H, L, D], the key and value heads before repeat_kv, the mask
    shapes = [tuple(a.meta["val"].shape) for a in calls[0].args]
    assert shapes == [(1, 4, 48, 16), (1, 2, 48, 16), (1, 2, 48, 16), (1, 1, 48, 48)]
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


@pytest.mark.slow
def test_inductor_hands_the_swapped_op_its_inputs_in_the_verified_layouts(base_doc, block_chain):
    """The form fixes every input's strides, and the kernel was verified on them; Inductor, free to lay out a node
    a pass inserts, gave this model's query in the layout of the projection it is a view of ([B, L, H, D] in
    memory), and the package's binding copied it back on every call. The region pass records the traced
    layouts on the node (``eager_input_vals``), so Inductor's own kernels write them (a real Inductor compile)."""
    model, inputs = _bf16(attention_block)
    with torch.no_grad():
        ref = model(*inputs)
    args, seen = block_chain.abi_order(), []
    cm = cf.COMPILE.CompileMode(_patcher(base_doc, block_chain, args, seen))
    torch._dynamo.reset()
    # Inductor's caches off: a graph it loads skips the pass (and the report counts none)
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        got = cm.compile(model)(*inputs)
    assert cm.report()["regions"] == {"a0": 1} and seen
    form_inputs = block_chain.region.form["inputs"]
    assert seen[-1] == [tuple(form_inputs[i]["strides"]) for i in args]
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


def test_the_attention_form_is_found_although_its_branches_are_traced_in_another_order(block_chain):
    """Inductor's graph interleaves the key and value paths unlike the respelled form: the matcher compares
    in the form's own op order (canonical.form's ``order``), so the form is still found once."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.decomposition import select_decomp_table

    graphs = []

    def keep(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: graphs.append(g) or g.forward,
                                     decompositions=select_decomp_table())

    model, inputs = _bf16(attention_block)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=keep)(*inputs)
    spelled = region_match.respell(block_chain.region.form, "cpu", select_decomp_table())
    assert len(region_match.find(graphs[0].graph, spelled)) == 1


def test_packed_attention_regions_come_first_with_their_argument_order():
    targets = [{"id": "t0", "region": {"name": "softmax_1", "form": {"inputs": [], "ops": []}, "entry": "ns::t0",
                                       "output": {}}},
               {"id": "t1", "region": {"name": "attention_2", "form": {"inputs": [], "ops": []}, "entry": "ns::t1",
                                       "output": {}, "args": [1, 0, 3, 2]}}]
    entries = packager._compile_regions(targets)
    assert [e["id"] for e in entries] == ["t1", "t0"]
    assert entries[0]["args"] == [1, 0, 3, 2] and "args" not in entries[1]


def test_the_manifest_entry_of_an_attention_hotspot(block_chain, tmp_path):
    from forge_pack.graph.attention_hotspots import attention_hotspots

    (h,) = attention_hotspots([block_chain], {}, tmp_path)
    entry = packager._attention_entry(h, "ns::t3")["region"]
    assert entry["form"] == block_chain.region.form and entry["entry"] == "ns::t3"
    assert entry["args"] == block_chain.abi_order() and entry["inputs"] == list(block_chain.roles)
    assert [entry["inputs"][i] for i in entry["args"]] == ["x", "k", "v", "mask"]
    assert packager._attention_entry(dataclasses.replace(h, extra={}), "ns::t3") == {}


def test_profile_regions_lists_the_chain_and_counts_its_matmuls_as_covered():
    from forge_pack.graph.report import format_regions, regions_json

    model, inputs = _bf16(attention_block)
    graph = capture(model, inputs, profile=False, routes=("export",))
    doc = regions_json(graph)
    (g,) = doc["attention_regions"]
    assert g["pattern"] == "attention+mask+gqa2" and g["calls"] == 1
    matmuls = [u["ops"] for u in doc["uncovered"] if u["reason"].startswith("matmul")]
    assert all("matmul" not in ops for ops in matmuls)  # the linears stay uncovered, the chain's matmuls do not
    assert "Attention regions (eager attention as one flash-attention kernel): 1 signatures" in format_regions(graph)


@pytest.mark.gpu
def test_the_flash_family_verifies_on_a_chains_captured_signature(tmp_path):
    """On the GPU: Gemma's chain (soft cap, a mask sliced from a wider one, strided key/value heads) captured
    on CUDA, its hotspot's real inputs included, judged by the evaluator with the flash family's defaults."""
    from forge_pack.evaluate.evaluator import Evaluator
    from forge_pack.evaluate.timing import TimingConfig
    from forge_pack.graph.attention_hotspots import attention_hotspots
    from forge_pack.search.templates_proposer import instantiate

    model = gemma_attention.get_model().cuda()
    inputs = tuple(t.cuda() for t in gemma_attention.get_inputs())
    graph = capture(model, inputs, profile=False, routes=("export",))
    chains = find_attention_chains(graph)
    values = graph.run(keep={n for c in chains for n in (*c.region.inputs, c.region.nodes[-1])})
    (h,) = attention_hotspots(chains, values, tmp_path)
    assert h.unsupported == "" and h.captures
    h = dataclasses.replace(h, captures=tuple(str(tmp_path / c) for c in h.captures))
    ev = Evaluator("cuda", workers=1, timeout_s=60, timing=TimingConfig(warmup=2, reps=10, flush=False,
                                                                        compile_baseline=False),
                   log_dir=tmp_path / "workers")
    try:
        e = ev.evaluate(instantiate("attention", "cuda", "flash", {}, h.signature), h)
    finally:
        ev.close()
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


def test_check_compares_fully_masked_rows_nan_for_nan(block_chain, monkeypatch):
    """Eager's plain softmax makes an all -inf row NaN, as the composite's reference does; a reference with
    SDPA's safe softmax (zeros there) is another computation, and the check's masked-row set shows it."""
    from forge_pack.targets import attention as att

    assert check(block_chain) is None
    plain = att._probs64

    def safe(params, s):
        p = plain(params, s)
        return torch.where(torch.isneginf(s).all(dim=-1, keepdim=True), torch.zeros_like(p), p)

    monkeypatch.setattr(att, "_probs64", safe)
    assert "NaNs" in check(block_chain) and "a mask row all -inf" in check(block_chain)


_COMPILE_SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import attention_block, att_region_pkg
from att_region_pkg import _compile
model = attention_block.get_model().to(torch.bfloat16)
x = attention_block.get_inputs()[0].to(torch.bfloat16)
with torch.no_grad():
    ref = model(x)
cm = _compile.CompileMode(att_region_pkg._PATCHER, use=[sys.argv[2]])
with torch.no_grad():
    got = cm.compile(model)(x)
print(json.dumps({"report": cm.report(), "max_diff": (got.float() - ref.float()).abs().max().item(),
                  "max_ref": ref.abs().max().item()}))
"""


@pytest.mark.slow
def test_a_packed_attention_region_runs_the_extensions_kernel_in_compile_mode(tmp_path):
    """The whole package path with a real kernel: the chain's hotspot from ``search --regions``' profiler, the CPU
    `online` attention kernel as its winner, packed, pip-installed, and compile mode (Inductor) calling the
    extension's op where the chain was, with the form's inputs in the op's order (a wrong order fails the op's
    shape check)."""
    import subprocess

    from forge_pack.graph.region_hotspots import profile_regions
    from forge_pack.profile.load import load
    from forge_pack.search.templates_proposer import instantiate

    model_file = Path(attention_block.__file__)
    run = tmp_path / "run"
    target = load(str(model_file), "cpu", "bfloat16")
    prof = profile_regions(target, run, quiet=True)
    (h,) = [h for h in prof.hotspots if h.op == "attention"]
    cand = instantiate("attention", "cpu", "online", {}, h.signature)
    env = {"torch": torch.__version__, "python": sys.version.split()[0], "platform": "test"}
    helpers.store_winners(run, [h], {h.id: cand}, str(model_file), target.model_hash, "cpu", env)
    res = pack(run, tmp_path / "pkg", "att_region_pkg", confirm=False, model_check=False)
    assert res.written
    doc = json.loads((tmp_path / "pkg" / "att_region_pkg" / "manifest.json").read_text())
    (t,) = doc["targets"]
    assert t["region"]["kind"] == "attention" and doc["regions"][0]["args"] == h.extra["attention"]["abi_order"]
    site = tmp_path / "site"
    installed = helpers.pip_install(tmp_path / "pkg", site)
    assert installed.returncode == 0, installed.stderr[-2000:]
    # a fresh Inductor cache: the report counts the regions of graphs Inductor compiles, not of ones it loads
    r = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, str(model_file.parent), t["id"]], capture_output=True,
                       text=True, timeout=900, env=helpers.env_with(site, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind")))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "arrived with strides" not in r.stderr  # Inductor hands the op the verified layouts: no copy per call
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["report"]["regions"] == {t["id"]: 1}
    assert out["max_diff"] <= 2 ** -7 * max(out["max_ref"], 1.0)  # one bf16 rounding of the output
    # the deployment check verifies the attention kernel like any target (captured, fresh, adversarial sets)
    v = subprocess.run([sys.executable, "-m", "att_region_pkg", "verify"], capture_output=True, text=True,
                       timeout=900, env=helpers.env_with(site))
    assert v.returncode == 0, (v.stdout[-2000:], v.stderr[-2000:])
    assert t["id"] in v.stdout


def test_the_eager_baseline_of_a_computed_causal_mask_masks_as_the_model_does(block_chain):
    """The eager call a causal chain is timed and its error allowance measured against adds HF's causal mask:
    it agrees with the causal float64 reference to bf16 rounding (unmasked, it would not)."""
    sig = dataclasses.replace(block_chain, causal_mask=True).signature()
    spec, params = registry.spec_for(sig), dict(sig.params)
    torch.manual_seed(0)
    t = {}
    for name, s in sig.inputs:
        if s is not None:
            t[name] = torch.empty_strided(s.shape, s.strides, dtype=torch.bfloat16).copy_(torch.randn(s.shape))
    ref = spec.reference64(params, t)
    got = spec.eager(params, "bfloat16")(t).double()
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)
    unmasked = spec.eager({**params, "causal": False}, "bfloat16")(t).double()
    assert (unmasked - ref).abs().max() > 0.1


class _Layers(nn.Module):
    """Layers of one attention form, each building its mask from aranges as a model's layer types do: "causal",
    "window" (sliding, 4 keys) or "padded" (causal with the first key hidden: no causal pattern)."""

    def __init__(self, kinds: tuple[str, ...]):
        super().__init__()
        self.att, self.kinds = _MaskedAttention(), kinds

    def forward(self, q, k, v):
        s, low = q.shape[2], torch.finfo(q.dtype).min
        i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
        masks = {"causal": torch.zeros(s, s, dtype=q.dtype).masked_fill(j > i, low)}
        masks["window"] = masks["causal"].masked_fill(i - j >= 4, low)
        masks["padded"] = masks["causal"].masked_fill(j == 0, low)
        return sum(self.att(q, k, v, masks[kind][None, None]).float() for kind in self.kinds)


def _layer_hotspots(kinds, tmp_path):
    from forge_pack.graph.attention_hotspots import attention_hotspots, keep_names

    q, k, v, _ = _masked_inputs()
    graph = capture(_Layers(kinds).eval(), (q, k, v), profile=False, routes=("export",))
    chains = find_attention_chains(graph)
    assert len(chains) == len(kinds) and len({c.region.key for c in chains}) == 1
    return chains, attention_hotspots(chains, graph.run(keep=keep_names(chains)), tmp_path)


@pytest.mark.parametrize("kinds, want", [
    (("causal",) * 3, [(True, 0, 3)]),
    (("window",) * 3, [(True, 4, 3)]),
    # one form, two layer types (Gemma 3's sliding and full layers): a hotspot per pattern
    (("window", "causal", "window"), [(True, 4, 2), (True, 0, 1)]),
    # a layer whose mask is no causal pattern: the mask-reading kernel for it, listed last
    (("causal", "padded", "window", "causal"), [(True, 0, 2), (True, 4, 1), (False, 0, 1)]),
])
def test_each_mask_pattern_of_a_form_gets_its_own_kernel(tmp_path, kinds, want):
    """(causal, window, instances) per hotspot: the kernel computes a mask only for the instances whose captured
    mask is that pattern (every instance's mask is kept by the run); the others read theirs."""
    _, hs = _layer_hotspots(kinds, tmp_path)
    got = [(h.signature.param("causal"), h.signature.param("window", 0), int(h.calls_per_forward)) for h in hs]
    assert got == want
    for h, (causal, _, _) in zip(hs, want):
        assert (h.signature.input("mask") is None) is causal and h.unsupported == "" and h.captures
    assert len({h.signature.key() for h in hs}) == len(hs) and len({c for h in hs for c in h.captures}) == sum(
        len(h.captures) for h in hs)  # distinct targets, and capture files that do not overwrite each other


def test_a_forms_causal_regions_are_tried_first_and_the_mask_reading_one_takes_the_rest(base_doc, tmp_path):
    """Compile mode with the three regions of one form: each causal region swaps the layers whose mask it proves
    its own pattern, the mask-reading region the remaining layer, with no warning (every match was taken)."""
    import warnings

    kinds = ("causal", "padded", "window", "causal")
    chains, hs = _layer_hotspots(kinds, tmp_path)
    entries = [dict(packager._attention_entry(h, "x::y")["region"], id=f"t{n}") for n, h in enumerate(hs)]
    doc = copy.deepcopy(base_doc)
    doc.pop("integrity", None)
    doc["targets"] = []
    regions = []
    for e, h in zip(entries, hs):
        c = dataclasses.replace(chains[0], causal_mask=h.signature.param("causal"),
                                window=h.signature.param("window", 0))
        regions.append({"id": e["id"], "name": e["name"], "form": e["form"], "op": _attention_op(c),
                        "output": e["output"], "args": e["args"],
                        **{k: e[k] for k in ("causal_mask", "window") if k in e},
                        "compile": {"use": True, "reason": "test", "compiled_ms": 1.0, "compiled_with_ms": 0.9}})
    # the packer's order, whatever order the hotspots came in: causal regions first
    doc["regions"] = packager._compile_regions([{"id": r["id"], "region": {**r, "entry": r["op"]}} for r in
                                                reversed(regions)])
    for r, full in zip(doc["regions"], [next(x for x in regions if x["id"] == r["id"]) for r in doc["regions"]]):
        r.update(op=full["op"], compile=full["compile"])
    assert "causal_mask" not in doc["regions"][-1]
    model = _Layers(kinds).eval()
    inputs = _masked_inputs()[:3]
    with torch.no_grad():
        ref = model(*inputs)
    cm = cf.COMPILE.CompileMode(cf.PATCH.Patcher(doc, "att_region_pkg", lambda: None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got, _ = cf.aot_only(cm, model, *inputs)
    assert cm.report()["regions"] == {"t0": 2, "t1": 1, "t2": 1}
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


def test_a_causal_reading_that_fails_its_check_falls_back_to_reading_the_mask(tmp_path, monkeypatch):
    from forge_pack.graph import attention_hotspots as ah

    model, inputs = _bf16(attention_block)
    graph = capture(model, inputs, profile=False, routes=("export",))
    chains = find_attention_chains(graph)
    values = graph.run(keep=ah.keep_names(chains))
    monkeypatch.setattr(ah, "check", lambda c, *a, **k: "not causal here" if c.causal_mask else None)
    (h,) = ah.attention_hotspots(chains, values, tmp_path)
    assert h.unsupported == "" and h.signature.param("causal") is False and h.signature.input("mask") is not None


def test_the_manifest_key_is_the_forms_canonical_key(block_chain, tmp_path):
    """Compile mode matches on the key: the packer's is the hotspot's, canonical.key of the form."""
    from forge_pack.graph import canonical
    from forge_pack.graph.attention_hotspots import attention_hotspots

    (h,) = attention_hotspots([block_chain], {}, tmp_path)
    assert packager._attention_entry(h, "ns::t3")["region"]["key"] == canonical.key(block_chain.region.form)


def test_a_view_to_the_products_own_shape_is_read_through_and_swapped_in_compile_mode(base_doc):
    """Falcon's eager attention views the value product to the shape it already has before the permute: the view
    joins the chain, which compile mode finds in Inductor's graph and calls the attention op for."""
    torch.manual_seed(0)
    model = _Variant("same_view").eval()
    inputs = tuple(torch.randn(1, 2, 8, 4, dtype=torch.bfloat16) for _ in range(3))
    (c,) = _chains(model, inputs)
    assert "aten.view.default" in c.region.ops and check(c) is None
    _swapped_in_compile_mode(base_doc, c, model, *inputs)
