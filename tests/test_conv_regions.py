"""Convolution epilogue regions: conv -> inference batch_norm (-> add) (-> activation) found in the captured
graph, the batch_norm folded into the convolution, the folded tensors tied to the model's parameters by a
digest, and compile mode swapping the chain for the package's op (the original ops when the parameters
changed after the build).

The compile-mode tests stop at Inductor's joint-graph pass (AOTAutograd with Inductor's decompositions,
the package's region pass, the rewritten graph run eagerly), as tests/test_compile_regions.py does; the
epilogue kernel there is a Python op computing the epilogue's own reference. One slow test builds a real
package with the CLI and runs it compiled."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "pack"))
sys.path.insert(0, str(HERE / "models" / "regions"))
import compile_fakes as cf  # noqa: E402
import conv_bn_block  # noqa: E402
import conv_downsample_block  # noqa: E402
import conv_variants  # noqa: E402

from forge_pack.evaluate import conv_check  # noqa: E402
from forge_pack.evaluate.model_accuracy import compare_outputs  # noqa: E402
from forge_pack.graph import conv_fold  # noqa: E402
from forge_pack.graph.capture import capture  # noqa: E402
from forge_pack.graph.conv_chain import epilogue_region, find_conv_chains  # noqa: E402
from forge_pack.graph.conv_hotspots import conv_hotspots, keep_names  # noqa: E402
from forge_pack.pack.conv_pack import choose, conv_regions  # noqa: E402

CL = torch.channels_last


def _block(fmt=torch.contiguous_format, dtype=torch.float32):
    model = conv_bn_block.get_model().to(dtype).to(memory_format=fmt)
    x = conv_bn_block.get_inputs()[0].to(dtype).contiguous(memory_format=fmt)
    return model, x


def _chains(model, x, route="export"):
    g = capture(model, (x,), profile=False, routes=(route,))
    chains = find_conv_chains(g)
    return g, chains, g.run(keep=keep_names(chains))


# ---- finding

@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["nchw", "channels_last"])
def test_basic_block_has_conv_bn_relu_and_conv_bn_add_relu_chains(fmt):
    _, chains, _ = _chains(*_block(fmt))
    assert [c.region.pattern for c in chains] == ["conv+batch_norm+relu", "conv+batch_norm+add+relu"]
    first, second = chains
    assert first.roles == ("x", "weight", "bn_weight", "bn_bias", "running_mean", "running_var")
    assert second.roles == ("x", "weight", "bn_weight", "bn_bias", "running_mean", "running_var", "residual")
    assert second.sources[-1] == "input:0" and second.sources[1] == "param:conv2.weight"
    assert (first.stride, first.padding, first.dilation, first.groups) == ((1, 1), (1, 1), (1, 1), 1)
    assert first.region.ops[:2] == ("aten.conv2d.default", "aten._native_batch_norm_legit_no_training.default")
    want = (1024, 64, 8, 1) if fmt == torch.contiguous_format else (1024, 1, 128, 16)
    assert first.region.output_spec.strides == want and first.region.input_specs[0].strides == want
    assert first.region.kind == "conv" and first.eps == 1e-5


def test_nchw_and_channels_last_chains_have_different_keys():
    _, nchw, _ = _chains(*_block())
    _, cl, _ = _chains(*_block(CL))
    assert nchw[0].region.key != cl[0].region.key


def test_strided_grouped_biased_conv_silu_gelu_tanh_and_add_without_activation_are_chains():
    g, chains, _ = _chains(conv_variants.get_model(), conv_variants.get_inputs()[0])
    got = [(c.region.pattern, c.stride, c.padding, c.dilation, c.groups) for c in chains]
    assert got == [("conv+batch_norm+silu", (2, 2), (1, 1), (1, 1), 2),
                   ("conv+batch_norm+gelu_tanh", (1, 1), (0, 0), (1, 1), 1),
                   ("conv+batch_norm+add", (1, 1), (2, 2), (2, 2), 1),
                   ("conv+batch_norm", (1, 1), (1, 1), (1, 1), 1)]  # + its own input: stops at the batch_norm
    assert "conv_bias" in chains[0].roles
    # the fourth conv has no batch_norm: no chain, whatever follows it
    assert sum(1 for n in g.nodes.values() if n.kind == "conv") == 5


def test_a_shortcut_add_of_two_conv_branches_joins_the_first_chain_only():
    model, x = conv_downsample_block.get_model().to(memory_format=CL), conv_downsample_block.get_inputs()[0]
    _, chains, _ = _chains(model, x.contiguous(memory_format=CL))
    assert [c.region.pattern for c in chains] == ["conv+batch_norm+relu", "conv+batch_norm+relu",
                                                 "conv+batch_norm+add+relu", "conv+batch_norm"]
    assert chains[1].stride == (2, 2) and chains[3].stride == (2, 2)
    assert not set(chains[2].region.nodes) & set(chains[3].region.nodes)


def test_make_fx_route_finds_the_same_chains():
    _, chains, _ = _chains(*_block(CL), route="make_fx")
    assert [c.region.pattern for c in chains] == ["conv+batch_norm+relu", "conv+batch_norm+add+relu"]
    assert chains[0].region.ops[0] == "aten.convolution.default"


def test_epilogue_is_a_pointwise_region_with_a_float32_bias_and_one_cast():
    _, chains, _ = _chains(*_block(CL, torch.bfloat16))
    epi = epilogue_region(chains[1])
    assert [o["op"] for o in epi.form["ops"]] == ["aten.add.Tensor", "aten.add.Tensor", "aten.relu.default",
                                                 "aten._to_copy.default"]
    assert epi.inputs == ("y", "b", "r")  # the activation first: the kernel iterates in its layout
    specs = dict(zip(epi.inputs, epi.input_specs))
    # channels_last: the epilogue runs over [N, H, W, C], the bias broadcast along the last dim
    assert specs["y"].shape == (2, 8, 8, 16) and specs["y"].strides == (1024, 128, 16, 1)
    assert specs["b"].dtype == "float32" and specs["b"].shape == (16,) and specs["y"].dtype == "bfloat16"
    assert epi.output_spec.strides == (1024, 128, 16, 1)
    assert epi.output_spec.dtype == "bfloat16"
    nchw = epilogue_region(_chains(*_block())[1][1])
    assert dict(zip(nchw.inputs, nchw.input_specs))["b"].shape == (16, 1, 1)
    assert epi.kind == "pointwise" and epi.pattern == "conv_epilogue+add+relu"


# ---- folding

def test_folded_conv_equals_the_float64_chain_exactly_in_float64():
    model, x = _block()
    model, x = model.double(), x.double()
    _, chains, vals = _chains(model, x)
    for c in chains:
        ins = [vals[n] for n in c.region.inputs]
        w, b, _ = conv_check.folded_params(c, ins)
        got = conv_check.folded_candidate(c, w, b.double())(*ins)
        want = c.region.reference()(*ins)
        assert (got - want).abs().max().item() < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_chain_passes_the_whole_model_rule_on_every_set(dtype):
    _, chains, vals = _chains(*_block(CL, dtype))
    for c in chains:
        ins = [vals[n] for n in c.region.inputs]
        w, b, _ = conv_check.folded_params(c, ins)
        assert w.dtype == dtype and b.dtype == torch.float32 and w.stride() == ins[1].stride()
        verdict = conv_check.check(c, conv_check.folded_candidate(c, w, b), conv_check.input_sets(c, ins))
        assert verdict["ok"], verdict["reason"]
        assert [r["kind"] for r in verdict["checks"]] == ["captured", "fresh[0]", "fresh[1]", "adversarial:large",
                                                         "adversarial:shift"]


def test_chain_check_rejects_a_wrongly_folded_weight():
    _, chains, vals = _chains(*_block())
    c = chains[0]
    ins = [vals[n] for n in c.region.inputs]
    w, b, _ = conv_check.folded_params(c, ins)
    verdict = conv_check.check(c, conv_check.folded_candidate(c, w * 1.01, b), conv_check.input_sets(c, ins))
    assert not verdict["ok"] and verdict["reason"].startswith("mismatch on captured")


def test_folded_tensors_round_trip_with_their_strides_in_both_formats(tmp_path, monkeypatch):
    w = torch.randn(8, 4, 3, 3).to(memory_format=CL).bfloat16()
    b = torch.randn(8)
    assert conv_fold.save(tmp_path / "a.safetensors", w, b) == "safetensors"
    w2, b2 = conv_fold.load(tmp_path / "a.safetensors")
    assert torch.equal(w2, w) and w2.stride() == w.stride() and torch.equal(b2, b)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # an image without safetensors
    assert conv_fold.save(tmp_path / "b.pt", w, b) == "torch"
    monkeypatch.setitem(sys.modules, "safetensors", None)
    w3, b3 = conv_fold.load(tmp_path / "b.pt")
    assert torch.equal(w3, w) and w3.stride() == w.stride() and torch.equal(b3, b)


def test_param_digest_changes_with_one_running_var_element():
    model, x = _block()
    _, chains, vals = _chains(model, x)
    c = chains[1]
    ins = [vals[n] for n in c.region.inputs]
    before = conv_fold.param_digest(conv_fold.params_of(ins, c.roles))
    ins[c.index("running_var")] = ins[c.index("running_var")].clone()
    ins[c.index("running_var")][3] += 1e-3
    assert conv_fold.param_digest(conv_fold.params_of(ins, c.roles)) != before


# ---- the package's op in compile mode

_N = iter(range(10 ** 6))


def _conv_patcher(base_doc, model, x, tmp_path, library=False):
    """A Patcher whose manifest holds the block's conv regions (packed by conv_pack from real hotspots),
    their epilogue kernels Python ops computing the epilogue's reference."""
    g, chains, vals = _chains(model, x)
    hotspots = conv_hotspots(chains, vals, tmp_path)
    by_key: dict = {}
    for c in chains:  # conv_hotspots' order: one hotspot per epilogue signature, first seen first
        by_key.setdefault(epilogue_region(c).key, epilogue_region(c))
    epis = [(f"e{i}", e) for i, e in enumerate(by_key.values())]
    ns = cf.region_ops(epis)
    targets = [{"hotspot_id": h.id, "id": eid, "torch_op": f"{ns}::{eid}", "timing": {"kernel": {"median_us": 5.0}}}
               for h, (eid, _) in zip(hotspots, epis)]
    winners = [types.SimpleNamespace(hotspot=h) for h in hotspots]
    pkg = tmp_path / "pkg"
    pkg.mkdir(exist_ok=True)
    regions = conv_regions(winners, targets, tmp_path, pkg, f"forge_conv_test_{next(_N)}")
    doc = copy.deepcopy(base_doc)
    doc.pop("integrity", None)
    doc["targets"] = []
    for r in regions:
        for inst in r["conv"]["instances"]:
            inst["file"] = str(pkg / inst["file"])  # the test's templates/package has no conv/ beside it
        r["compile"] = {"use": True, "reason": "test", "compiled_ms": 1.0, "compiled_with_ms": 0.9}
    doc["regions"] = regions
    return cf.PATCH.Patcher(doc, "cm_conv_pkg", lambda: None), regions


@pytest.fixture(scope="module")
def base_doc(tmp_path_factory):
    import helpers
    from forge_pack.pack.packager import pack

    base = tmp_path_factory.mktemp("conv_doc")
    run = helpers.make_cpu_run(base / "run")
    assert pack(run, base / "pkg", "cv_pkg", confirm=False).written
    return json.loads((base / "pkg" / "cv_pkg" / "manifest.json").read_text())


def _swapped(graphs) -> int:
    return sum(1 for g in graphs for n in g.graph.nodes
               if n.op == "call_function" and "forge_conv_test_" in str(n.target))


def test_compile_mode_swaps_every_chain_of_a_downsampling_bottleneck(base_doc, tmp_path):
    model = conv_downsample_block.get_model().to(memory_format=CL)
    x = conv_downsample_block.get_inputs()[0].contiguous(memory_format=CL)
    p, regions = _conv_patcher(base_doc, model, x, tmp_path)
    cm = cf.COMPILE.CompileMode(p)
    with torch.no_grad():
        want = model(x)
        fn, graphs = cf.aot_compiled(cm, model)
        got = fn(x)
    assert sum(cm.report()["regions"].values()) == 4 and _swapped(graphs) == 4
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["nchw", "channels_last"])
def test_compile_mode_swaps_both_chains_and_equals_eager(base_doc, tmp_path, fmt):
    model, x = _block(fmt)
    p, regions = _conv_patcher(base_doc, model, x, tmp_path)
    assert [r["conv"]["candidate"] for r in regions] == ["folded", "folded"]
    cm = cf.COMPILE.CompileMode(p)
    with torch.no_grad():
        want = model(x)
        fn, graphs = cf.aot_compiled(cm, model)
        got = fn(x)
    assert cm.report()["regions"] == {"c0": 1, "c1": 1}
    assert _swapped(graphs) == 2
    assert compare_outputs(want, got)["within_tolerance"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_inductor_compile_with_conv_region_ops_equals_eager(base_doc, tmp_path, monkeypatch):
    """Through Inductor's C++ backend: the conv region ops are extern kernels among Inductor's own, lowered by
    the fallback the package registered, not by Inductor's implicit one (torch 2.11's formats every argument's
    producer graph first: minutes on a ResNet-50)."""
    import torch._inductor.config as inductor_config
    import torch._inductor.graph as inductor_graph

    implicit = []
    make_fallback = inductor_graph.make_fallback

    def recording(op, *args, **kwargs):
        implicit.append(str(op))
        return make_fallback(op, *args, **kwargs)

    monkeypatch.setattr(inductor_graph, "make_fallback", recording)
    model, x = _block(CL)
    p, _ = _conv_patcher(base_doc, model, x, tmp_path)
    cm = cf.COMPILE.CompileMode(p)
    torch._dynamo.reset()
    # no cache: a graph Inductor loads from its cache skips the region pass, whose matches are counted here
    with torch.no_grad(), inductor_config.patch(force_disable_caches=True):
        want = model(x)
        got = cm.compile(model)(x)
    assert cm.report()["regions"] == {"c0": 1, "c1": 1}
    assert not [op for op in implicit if "forge_conv_test_" in op]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_folded_tensors_are_made_when_the_graph_compiles_not_in_the_first_call(base_doc, tmp_path):
    """Tensors an op first makes inside its first call, and caches, are made in mode="reduce-overhead"'s CUDA
    graph warm-up, in the graph's private memory pool, where CUDA graph trees later refuse them ("tensors in
    the cudagraph pool not tracked as outputs"): the region pass (Inductor's compile, before any call) loads
    every build instance's folded tensors and the original ops' reference on the graph's device."""
    model, x = _block(CL)
    p, regions = _conv_patcher(base_doc, model, x, tmp_path)
    cm = cf.COMPILE.CompileMode(p)
    ns = regions[0]["op"].partition("::")[0]
    at_compile: dict = {}

    def backend(gm, example_inputs):
        assert cm.region_pass(gm, example_inputs) is not None
        impls = sys.modules[f"{cf.COMPILE.__name__}_conv_regions"].IMPLS
        for qual, impl in impls.items():
            if qual.startswith(ns + "::"):
                at_compile[qual.partition("::")[2]] = (set(impl._tensors), set(impl._reference), dict(impl.calls),
                                                       set(impl.digests))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    assert set(at_compile) == {"c0", "c1"}
    for loaded, reference, calls, digests in at_compile.values():
        assert digests and loaded == {(d, "cpu") for d in digests}
        assert reference == {"cpu"}
        assert calls == {"folded": 0, "original": 0}


def test_a_changed_running_var_runs_the_original_ops_with_a_warning(base_doc, tmp_path):
    model, x = _block(CL)
    p, _ = _conv_patcher(base_doc, model, x, tmp_path)
    cm = cf.COMPILE.CompileMode(p)
    with torch.no_grad():
        fn, _ = cf.aot_compiled(cm, model)
        fn(x)
        model.bn2.running_var.mul_(4.0)  # after the build: the folded tensors no longer describe the model
        want = model(x)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = fn(x)
    impls = sys.modules[f"{cf.COMPILE.__name__}_conv_regions"].IMPLS
    ns = p.manifest["regions"][0]["op"].partition("::")[0]
    calls = {q.partition("::")[2]: i.calls for q, i in impls.items() if q.startswith(ns + "::")}
    assert calls == {"c0": {"folded": 2, "original": 0}, "c1": {"folded": 1, "original": 1}}
    assert any("not the ones the package folded at build time" in str(w.message) for w in seen)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_manifest_schema_takes_conv_regions_and_refuses_an_unknown_candidate(base_doc, tmp_path):
    from forge_pack.pack import manifest

    p, regions = _conv_patcher(base_doc, *_block(CL), tmp_path)
    doc = copy.deepcopy(base_doc)
    doc["regions"] = regions
    assert manifest.problems(doc) == []  # the schema only: the integrity digest is not recomputed here
    doc = copy.deepcopy(doc)
    doc["regions"][0]["conv"]["candidate"] = "handwritten"
    assert any("handwritten" in x for x in manifest.problems(doc))


def test_export_leaves_conv_regions_to_inductor(base_doc, tmp_path):
    """An AOTInductor package cannot call the conv regions' Python op: export's region pass skips them."""
    model, x = _block(CL)
    p, _ = _conv_patcher(base_doc, model, x, tmp_path)
    cm = cf.COMPILE.CompileMode(p)
    gm = torch.fx.symbolic_trace(model)
    assert cm.region_pass(gm, [x]) is not None
    assert cm.region_pass(gm, [x], export=True) is None


def test_library_candidate_is_chosen_only_when_verified_and_faster():
    chain = {"checks": {"library": {"ok": True, "label": conv_check.LIBRARY_ADD}},
             "timing": {"library": {"median_us": 40.0}, "folded_conv": {"median_us": 30.0}}}
    assert choose(chain, 15.0)[0] == conv_check.LIBRARY_ADD  # 40 us < 30 + 15 us
    assert choose(chain, 5.0)[0] == "folded"  # 30 + 5 us <= 40 us
    chain["checks"]["library"]["ok"] = False
    assert choose(chain, 15.0)[0] == "folded"
    assert choose({"checks": {}}, 1.0)[0] == "folded"


@pytest.mark.slow  # a real search, pack and extension compile (~1.5 min on 2 cores; `build`'s gates left out)
def test_cpu_search_and_pack_of_the_block_ship_conv_regions_whose_compile_mode_equals_eager(tmp_path):
    from forge_pack.evaluate import compile_gate
    from forge_pack.evaluate.confirm import dev_patcher

    out, run = tmp_path / "pkg", tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "forge_pack", "search", str(HERE / "models" / "regions" / "conv_bn_block.py"),
                        "--regions", "--device", "cpu", "--budget", "2", "--top", "4", "--run-dir", str(run)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "forge_pack", "pack", str(run), "--out", str(out), "--no-confirm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "conv_bn_block_forge" / "manifest.json").read_text())
    conv = [x for x in doc["regions"] if "conv" in x]
    if not conv:  # an epilogue is packed only where its kernel beat eager in the search (timing on a busy CPU)
        pytest.skip("no epilogue kernel beat eager on this machine: no conv region to pack")
    # one conv region per chain whose epilogue kernel won (both, where both won)
    assert {x["conv"]["pattern"] for x in conv} <= {"conv+batch_norm+add+relu", "conv+batch_norm+relu"}
    assert len({x["conv"]["pattern"] for x in conv}) == len(conv)
    assert all((out / "conv_bn_block_forge" / i["file"]).is_file() for x in conv for i in x["conv"]["instances"])
    p = dev_patcher(out, tmp_path / "builds")
    assert p.load(), p.load_error
    cm = compile_gate._compile_module(out, p.package).CompileMode(p, use=[x["id"] for x in conv])
    model, x = _block()
    with torch.no_grad():
        want = model(x)
        fn, _ = cf.aot_compiled(cm, model)
        got = fn(x)
    assert cm.report()["regions"] == {x["id"]: 1 for x in conv}
    assert compare_outputs(want, got)["within_tolerance"]


# ---- the epilogue kernel on CUDA (compiled here, run on a GPU by the gpu tests)

@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_epilogue_kernels_compile_and_read_the_bias_per_run(tmp_path):
    """bf16 epilogues of every chain kind (relu, add+relu, silu, gelu tanh, plain bias) at a ResNet size:
    nvcc for sm_90 without warnings or spills; in channels_last the float32 bias is a vector operand."""
    from forge_pack.search.templates_proposer import instantiate
    from forge_pack.targets.region_target import signature

    sources = {}
    for mod, size in ((conv_bn_block, 28), (conv_variants, 28), (conv_downsample_block, 28)):
        for fmt in (torch.contiguous_format, CL):
            model = mod.get_model().to(torch.bfloat16).to(memory_format=fmt)
            x = mod.get_inputs(size)[0].to(torch.bfloat16).contiguous(memory_format=fmt)
            for c in _chains(model, x)[1]:
                epi = epilogue_region(c)
                sources[epi.name] = instantiate("region", "cuda", "pointwise", None, signature(epi)).source
    assert {n.rsplit("_", 1)[0] for n in sources} == {
        "conv_epilogue_relu", "conv_epilogue_add_relu", "conv_epilogue_silu", "conv_epilogue_gelu_tanh",
        "conv_epilogue_add", "conv_epilogue"}
    cl_add_relu = [s for n, s in sources.items() if n.startswith("conv_epilogue_add_relu")]
    # every leaf read by 16-byte vectors in channels_last (C = 32 here), the bias once per run in NCHW
    assert any("u0=contig, u1=contig, u2=contig; output contig" in s for s in cl_add_relu)
    assert any("u0=contig, u1=uniform, u2=contig; output contig" in s for s in cl_add_relu)
    for name, source in sources.items():
        src = tmp_path / f"{name}.cu"
        src.write_text(source)
        res = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-std=c++17", "-Xptxas", "-v", "-o", f"{src}.cubin",
                              str(src)], capture_output=True, text=True)
        log = res.stdout + res.stderr
        assert res.returncode == 0 and "warning" not in log, log
        assert all(" 0 bytes spill stores" in line for line in log.splitlines() if "spill" in line), log


@pytest.mark.slow  # three Inductor compiles of the block on the CPU (~1 min on 2 busy cores)
def test_vision_bench_smoke_runs_both_chains_folded_and_within_tolerance(tmp_path):
    root = HERE.parent
    r = subprocess.run([sys.executable, str(root / "bench" / "vision.py"), str(tmp_path / "vision"), "--smoke"],
                       capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads((tmp_path / "vision.json").read_text())["rows"]
    assert sorted(row["region_calls"]) == ["c0", "c1"] and all(c["folded"] > 0 for c in row["region_calls"].values())
    assert row["max_abs_vs_fp32"]["compile_package"] < 1e-5
    assert [g["pattern"] for g in row["regions"]] == ["conv+batch_norm+relu", "conv+batch_norm+add+relu"]
