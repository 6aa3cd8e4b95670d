"""Eager attention chains in real transformers models (bench/models' Gemma 4 and Qwen3.5-MoE prefill at
their CPU smoke-test sizes): each layer's ``eager_attention_forward`` is found as a chain, its reading
proven against the attention reference, and compile mode finds every chain in the graph Inductor compiles
and swaps it for the attention op (here the op computes HF's eager attention in Python, so the compiled
output equals eager's). Needs transformers (not a forge-pack dependency; the GPU machine has it):
skipped without it."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "pack"))
sys.path.insert(0, str(ROOT / "tests"))
import compile_fakes as cf  # noqa: E402
import helpers  # noqa: E402

from forge_pack.graph.attention_chain import check, find_attention_chains  # noqa: E402
from forge_pack.graph.capture import capture  # noqa: E402
from forge_pack.pack.packager import pack  # noqa: E402
from forge_pack.targets import registry  # noqa: E402

pytest.importorskip("transformers")

# (model file, chains found, distinct forms): Gemma's 2 layers (sliding, full: head_dim 256 and 512),
# Qwen's 1 full-attention layer (the others are linear attention)
MODELS = [("gemma4_prefill", 2, 2), ("qwen35_moe_prefill", 1, 1)]


def _load(name: str, monkeypatch):
    monkeypatch.setenv("FORGE_BENCH_SMALL", "1")
    monkeypatch.setenv("FORGE_BENCH_DEVICE", "cpu")
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "models"))
    sys.modules.pop("_bench_env", None)  # it reads the environment when imported
    spec = importlib.util.spec_from_file_location(f"_hf_{name}", ROOT / "bench" / "models" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules.pop("_bench_env", None)
    return mod.get_model(), tuple(mod.get_inputs())


@pytest.fixture(scope="module")
def base_doc(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_doc")
    assert pack(helpers.make_cpu_run(base / "run"), base / "pkg", "hf_pkg", confirm=False).written
    return json.loads((base / "pkg" / "hf_pkg" / "manifest.json").read_text())


@pytest.mark.parametrize("causal", [False, True], ids=["mask_read", "mask_computed"])
@pytest.mark.parametrize("name, count, forms", MODELS)
def test_hf_eager_attention_is_found_and_swapped_in_compile_mode(name, count, forms, causal, monkeypatch, base_doc):
    """mask_computed: the kernel computes the causal mask; compile mode evaluates transformers' mask builder
    (a constant of the compiled graph at these sizes, its window wider than the prompt) and proves it causal."""
    model, inputs = _load(name, monkeypatch)
    chains = find_attention_chains(capture(model, inputs, profile=False, routes=("export",)))
    assert len(chains) == count
    chains = [dataclasses.replace(c, causal_mask=causal) for c in chains]
    for c in chains:
        assert check(c) is None and c.signature().param("composite") is True
    cm = _compile_mode(base_doc, chains)
    assert len(cm.regions) == forms
    with torch.no_grad():
        ref = model(*inputs)
    got, _ = cf.aot_only(cm, model, *inputs)
    assert sum(cm.report()["regions"].values()) == count
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def _compile_mode(base_doc, chains):
    """Compile mode over one region per distinct chain form, each op computing HF's eager attention with the
    chain's reading (its causal pattern and window where it computes the mask): the package without a compiler."""
    doc = copy.deepcopy(base_doc)
    doc.pop("integrity", None)
    doc["targets"], doc["regions"] = [], []
    ns = f"forge_hf_att_{len(cf._LIBS)}"
    lib = torch.library.Library(ns, "DEF")
    cf._LIBS.append(lib)
    for c in chains:
        if any(r["form"] == c.region.form for r in doc["regions"]):
            continue
        rid = f"a{len(doc['regions'])}"
        present = c.kernel_roles()
        lib.define(f"{rid}({', '.join('Tensor ' + p for p in present)}) -> Tensor")
        fn = registry.get("attention").eager(c.params(), c.region.output_spec.dtype)
        lib.impl(rid, lambda *t, fn=fn, present=present: fn(dict(zip(present, t))), "CPU")
        causal = {"causal_mask": c.mask_index(), **({"window": c.window} if c.window else {})} if c.causal_mask else {}
        doc["regions"].append({"id": rid, "name": c.name, "form": c.region.form, "op": f"{ns}::{rid}",
                               "output": c.region.output_spec.to_json(), "args": c.abi_order(), **causal,
                               "compile": {"use": True, "reason": "test", "compiled_ms": 1.0, "compiled_with_ms": 0.9}})
    return cf.COMPILE.CompileMode(cf.PATCH.Patcher(doc, "hf_pkg", lambda: None))


def _gemma_windowed(monkeypatch, base_doc, tmp_path):
    """Gemma 4 at a prompt longer than its 512-key window: (hotspots, compile mode with a region per hotspot
    whose op computes HF's eager attention with the hotspot's causal pattern, model, inputs)."""
    from forge_pack.graph.attention_hotspots import attention_hotspots, keep_names

    monkeypatch.setenv("FORGE_BENCH_SEQ", "600")
    model, inputs = _load("gemma4_prefill", monkeypatch)
    graph = capture(model, inputs, profile=False, routes=("export",))
    chains = find_attention_chains(graph)
    assert len(chains) == 2
    hs = attention_hotspots(chains, graph.run(keep=keep_names(chains)), tmp_path)
    read = [dataclasses.replace(c, causal_mask=True, window=h.signature.param("window", 0)) for h, c in zip(hs, chains)]
    return hs, _compile_mode(base_doc, read), model, inputs


def test_gemma_sliding_layers_compute_their_window_and_the_full_layers_the_causal_mask(monkeypatch, base_doc,
                                                                                          tmp_path):
    """A prompt longer than Gemma 4's 512-key window: the sliding layer's captured mask is transformers'
    sliding-window causal mask, so its hotspot is causal with window 512; the full layer's is plainly causal.
    Compile mode proves each mask builder a constant of its own pattern and swaps both chains in, with the
    same logits as eager."""
    hs, cm, model, inputs = _gemma_windowed(monkeypatch, base_doc, tmp_path)
    windows = sorted((h.signature.param("causal"), h.signature.param("window", 0)) for h in hs)
    assert windows == [(True, 0), (True, 512)] and all(h.signature.input("mask") is None for h in hs)
    with torch.no_grad():
        ref = model(*inputs)
    got, _ = cf.aot_only(cm, model, *inputs)
    assert cm.report()["regions"] == {"a0": 1, "a1": 1}
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.slow
def test_the_pt2_export_holds_both_mask_computing_regions(monkeypatch, base_doc, tmp_path):
    """The deployment artifact: an AOTInductor .pt2 of the model holds both attention ops, transformers' mask
    builders (aranges, comparisons, a tensor constant) proven constant there too; loaded and run, it is as
    close to eager as a plain AOTInductor package of the model (the rest of the model is Inductor's either
    way)."""
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    _, cm, model, inputs = _gemma_windowed(monkeypatch, base_doc, tmp_path)
    with torch.no_grad():
        ref = model(*inputs).float()
    res = cm.export(model, inputs, path=str(tmp_path / "g.pt2"))
    assert res["regions"] == {"a0": 1, "a1": 1}
    with torch.no_grad():
        plain = torch.export.export(model, inputs, strict=False)
        aoti_compile_and_package(plain, package_path=str(tmp_path / "plain.pt2"))
        outs = [aoti_load_package(str(tmp_path / f))(*inputs) for f in ("g.pt2", "plain.pt2")]
    ours, theirs = ((o[0] if isinstance(o, (list, tuple)) else o).float() for o in outs)
    assert (ours - ref).abs().max() <= (theirs - ref).abs().max() + 2 ** -7 * ref.abs().max()
