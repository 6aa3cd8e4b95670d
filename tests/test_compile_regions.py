"""Compile mode with regions, on the CPU and without any region kernel: a region's op here is its own
eager reference registered as a torch.library op (tests/pack/compile_fakes.region_ops), so what is
tested is the package side: the region's form found in the graph Inductor compiles, swapped for one
op call, everything else left alone, output as eager's, a differing constant or shape untouched, and
the .pt2 export.

Most tests stop where Inductor's joint-graph pass would run (``aot_only``: AOTAutograd with Inductor's
decompositions, the package's region pass, the rewritten graph run eagerly), because an Inductor compile
costs ~20 s on a small CPU; one test goes through Inductor and one through AOTInductor."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "models" / "regions"))
import compile_fakes as cf  # noqa: E402
from compile_fakes import aot_only  # noqa: E402
import helpers  # noqa: E402
import llama_regions  # noqa: E402
from torch_export import LLAMA_SOFTMAX  # noqa: E402

from forge_pack.evaluate.model_accuracy import compare_outputs  # noqa: E402
from forge_pack.graph import region_match  # noqa: E402
from forge_pack.graph.capture import capture  # noqa: E402
from forge_pack.graph.regions import find_regions  # noqa: E402
from forge_pack.pack.packager import pack  # noqa: E402


def _regions(route: str = "export") -> list:
    g = capture(llama_regions.get_model(), llama_regions.get_inputs(), profile=False, routes=(route,))
    return find_regions(g)


@pytest.fixture(scope="module")
def llama_regions_export():
    return _regions("export")


@pytest.fixture(scope="module")
def base_doc(tmp_path_factory):
    base = tmp_path_factory.mktemp("regions_doc")
    run = helpers.make_cpu_run(base / "run")
    assert pack(run, base / "pkg", "cr_pkg", confirm=False).written
    return json.loads((base / "pkg" / "cr_pkg" / "manifest.json").read_text())


def _pick(regions: list) -> list:
    """[(id, region)]: one of each pattern the llama block has (rms_norm, mask softmax, silu*up)."""
    chosen, seen = [], set()
    for r in regions:
        if r.pattern in ("rms_norm", LLAMA_SOFTMAX, "silu+mul") and r.key not in seen:
            seen.add(r.key)
            chosen.append((f"r{len(chosen)}", r))
    return chosen


def _ids(chosen: list) -> dict:
    return {r.pattern: rid for rid, r in chosen}


def _region_nodes(graphs: list, namespace_prefix: str = "forge_cm_region_") -> dict:
    found: dict = {}
    for g in graphs:
        for n in g.graph.nodes:
            name = getattr(n.target, "name", None)
            if n.op == "call_function" and callable(name) and name().startswith(namespace_prefix):
                op = name().partition("::")[2].split(".")[0]
                found[op] = found.get(op, 0) + 1
    return found


def test_region_forms_of_both_capture_routes_are_found_in_inductors_graph():
    """The export route keeps softmax whole, make_fx spells _softmax, Inductor's graph amax/sub/exp/sum/div:
    respelled, each route's forms occur where the model computes them (the two RMSNorms share a form)."""
    graphs = []

    def keep(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._inductor.decomposition import select_decomp_table

        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: graphs.append(g) or g.forward,
                                     decompositions=select_decomp_table())

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(llama_regions.get_model(), backend=keep)(*llama_regions.get_inputs())
    from torch._inductor.decomposition import select_decomp_table

    for route in ("export", "make_fx"):
        counts = {}
        for r in _regions(route):
            if r.pattern in ("rms_norm", "silu+mul") or "softmax" in r.pattern:
                spelled = region_match.respell(r.form, "cpu", select_decomp_table())
                counts[r.pattern] = len(region_match.find(graphs[0].graph, spelled))
        softmax = LLAMA_SOFTMAX if route == "export" else "div+add+cast+softmax+cast"
        assert counts == {"rms_norm": 2, softmax: 1, "silu+mul": 1}, route


def test_used_regions_are_swapped_in_and_the_output_equals_eager(base_doc, llama_regions_export):
    chosen = _pick(llama_regions_export)
    ids = _ids(chosen)
    p = cf.region_patcher(base_doc, chosen, use=[rid for rid, _ in chosen])
    cm = cf.COMPILE.CompileMode(p)
    model, inputs = llama_regions.get_model(), llama_regions.get_inputs()
    with torch.no_grad():
        ref = model(*inputs)
    got, graphs = aot_only(cm, model, *inputs)
    want = {ids["rms_norm"]: 2, ids[LLAMA_SOFTMAX]: 1, ids["silu+mul"]: 1}
    assert cm.report()["regions"] == want
    assert _region_nodes(graphs) == want
    # the op computes the region's eager reference: bf16 rounding is all that may differ
    assert compare_outputs(ref, got)["within_tolerance"]
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


def test_a_region_through_a_permute_is_found_and_swapped_in_compile_mode(base_doc):
    """ConvNeXt's layer scale, permuted back, plus the residual (one region whose form holds the permute): found
    in the graph Inductor traces, once per block, and swapped for the region's op; the output equals eager."""
    import convnext_block

    model, inputs = convnext_block.get_model(), convnext_block.get_inputs()
    regions = find_regions(capture(model, inputs, profile=False, routes=("export",)))
    (scale,) = {r.key: r for r in regions if r.pattern == "mul+add"}.values()
    cm = cf.COMPILE.CompileMode(cf.region_patcher(base_doc, [("r0", scale)], use=["r0"]))
    with torch.no_grad():
        ref = model(*inputs)
    got, graphs = aot_only(cm, model, *inputs)
    assert cm.report()["regions"] == {"r0": 2}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_regions_without_compile_use_are_not_swapped_in(base_doc, llama_regions_export):
    chosen = _pick(llama_regions_export)
    ids = _ids(chosen)
    p = cf.region_patcher(base_doc, chosen, use=[ids["silu+mul"]])
    cm = cf.COMPILE.CompileMode(p)
    _, graphs = aot_only(cm, llama_regions.get_model(), *llama_regions.get_inputs())
    assert cm.report()["regions"] == {ids["silu+mul"]: 1}
    cm_none = cf.COMPILE.CompileMode(cf.region_patcher(base_doc, chosen, use=None))
    assert cm_none.use == frozenset()
    _, graphs = aot_only(cm_none, llama_regions.get_model(), *llama_regions.get_inputs())
    assert cm_none.report()["regions"] == {} and _region_nodes(graphs) == {}


def test_a_region_differing_in_a_constant_is_left_to_inductor(base_doc, llama_regions_export):
    """The norms' eps 1e-5 instead of the captured 1e-6: the RMSNorm form no longer matches; the rest does."""
    chosen = _pick(llama_regions_export)
    ids = _ids(chosen)
    cm = cf.COMPILE.CompileMode(cf.region_patcher(base_doc, chosen, use=[rid for rid, _ in chosen]))
    model = llama_regions.get_model()
    model.eps = 1e-5
    _, graphs = aot_only(cm, model, *llama_regions.get_inputs())
    assert cm.report()["regions"] == {ids[LLAMA_SOFTMAX]: 1, ids["silu+mul"]: 1}


def test_a_region_of_another_shape_is_left_to_inductor(base_doc, llama_regions_export):
    """Sequence length 8 instead of the captured 16: no region's input specs hold, nothing is swapped in."""
    chosen = _pick(llama_regions_export)
    cm = cf.COMPILE.CompileMode(cf.region_patcher(base_doc, chosen, use=[rid for rid, _ in chosen]))
    model, inputs = llama_regions.get_model(), llama_regions.get_inputs(seq=8)
    with torch.no_grad():
        ref = model(*inputs)
    got, graphs = aot_only(cm, model, *inputs)
    assert cm.report()["regions"] == {} and _region_nodes(graphs) == {}
    torch.testing.assert_close(got, ref)


def test_a_region_whose_intermediate_is_read_elsewhere_is_left_alone():
    """silu(g) * u where silu(g) is also returned: one op cannot stand for the pair, so it stays."""
    class Gate(torch.nn.Module):
        def forward(self, g, u):
            return torch.nn.functional.silu(g) * u

    class Leaky(torch.nn.Module):
        def forward(self, g, u):
            s = torch.nn.functional.silu(g)
            return s * u, s

    g, u = torch.randn(4, 32), torch.randn(4, 32)
    region = next(r for r in find_regions(capture(Gate(), (g, u), profile=False)) if r.pattern == "silu+mul")
    from torch._inductor.decomposition import select_decomp_table

    spelled = region_match.respell(region.form, "cpu", select_decomp_table())
    for model, want in ((Gate(), 1), (Leaky(), 0)):
        graphs = []

        def keep(gm, example_inputs):
            from torch._functorch.aot_autograd import aot_module_simplified

            return aot_module_simplified(gm, example_inputs, fw_compiler=lambda x, _: graphs.append(x) or x.forward,
                                         decompositions=select_decomp_table())

        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(model, backend=keep)(g, u)
        assert len(region_match.find(graphs[0].graph, spelled)) == want


def test_a_region_whose_output_is_not_the_kernels_is_not_used(base_doc, llama_regions_export):
    chosen = _pick(llama_regions_export)[:1]
    p = cf.region_patcher(base_doc, chosen, use=[chosen[0][0]])
    p.manifest["regions"][0]["output"] = {**p.manifest["regions"][0]["output"], "dtype": "float32"}
    cm = cf.COMPILE.CompileMode(p)
    with pytest.warns(RuntimeWarning, match=f"region {chosen[0][0]} is left to Inductor: traced, its output is"):
        aot_only(cm, llama_regions.get_model(), *llama_regions.get_inputs())
    assert cm.report()["regions"] == {}


@pytest.fixture
def no_inductor_cache():
    """A graph Inductor loads from its cache is not rewritten again: compile afresh so the count is this run's."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


@pytest.mark.slow  # ~20-80 s of Inductor's C++ compile; the aot_only tests above check the same pass without it
def test_inductor_compile_with_region_ops_equals_eager(base_doc, llama_regions_export, no_inductor_cache):
    """Through Inductor's C++ backend: the region ops are opaque nodes among Inductor's kernels."""
    chosen = _pick(llama_regions_export)
    ids = _ids(chosen)
    cm = cf.COMPILE.CompileMode(cf.region_patcher(base_doc, chosen, use=[rid for rid, _ in chosen]))
    model, inputs = llama_regions.get_model(), llama_regions.get_inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(*inputs)
        got = cm.compile(model)(*inputs)
    assert cm.report()["regions"] == {ids["rms_norm"]: 2, ids[LLAMA_SOFTMAX]: 1, ids["silu+mul"]: 1}
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


@pytest.mark.slow  # AOTInductor's C++ compile; the aot_only tests above check the pass without it
def test_export_writes_a_pt2_with_the_region_ops_that_loads_and_runs(base_doc, llama_regions_export, tmp_path,
                                                                      no_inductor_cache):
    chosen = _pick(llama_regions_export)
    ids = _ids(chosen)
    p = cf.region_patcher(base_doc, chosen, use=[ids["rms_norm"], ids["silu+mul"]])
    cm = cf.COMPILE.CompileMode(p)
    model, inputs = llama_regions.get_model(), llama_regions.get_inputs()
    done = cm.export(model, inputs, {}, str(tmp_path / "llama.pt2"))
    assert done["regions"] == {ids["rms_norm"]: 2, ids["silu+mul"]: 1}
    assert sorted(done["used"]) == sorted([ids["rms_norm"], ids["silu+mul"]]) and Path(done["path"]).is_file()
    run = cf.COMPILE.load_exported(p, done["path"])
    with torch.no_grad():
        torch.testing.assert_close(run(*inputs), model(*inputs), rtol=2e-2, atol=2e-2)


def test_pack_ships_the_graph_runtime_verbatim_with_its_digests(tmp_path):
    run = helpers.make_cpu_run(tmp_path / "run")
    assert pack(run, tmp_path / "pkg", "gr_pkg", confirm=False).written
    pkg = tmp_path / "pkg" / "gr_pkg"
    doc = json.loads((pkg / "manifest.json").read_text())
    record = doc["graph_runtime"]
    src = Path(__file__).resolve().parent.parent / "forge_pack" / "graph"
    assert sorted(record["files"]) == ["__init__.py", "canonical.py", "conv_fold.py", "opclass.py", "region_match.py"]
    for name, digest in record["files"].items():
        assert (pkg / "_graph" / name).read_bytes() == (src / name).read_bytes()
        assert digest == hashlib.sha256((src / name).read_bytes()).hexdigest()
    from forge_pack.evaluate.compile_gate import _compile_module

    shipped = _compile_module(tmp_path / "pkg", "gr_pkg")
    assert shipped._graph_runtime_problem(doc) is None
    (pkg / "_graph" / "canonical.py").write_text((src / "canonical.py").read_text() + "\n# edited\n")
    assert shipped._graph_runtime_problem(doc) == ("_graph/canonical.py is not the file the package was built "
                                                   "with; regions are left to Inductor")


class _Slowed(torch.nn.Module):
    """The plain compiled model made slower by a fixed delay: the gate's "faster" case, deterministically."""

    def __init__(self, inner, delay_s: float):
        super().__init__()
        self.inner, self.delay_s = inner, delay_s

    def forward(self, *args, **kwargs):
        import time

        time.sleep(self.delay_s)
        return self.inner(*args, **kwargs)


def _aot_only_mode(compile_mode_cls):
    class AotOnly(compile_mode_cls):
        """The region pass on AOTAutograd's graph without Inductor's C++ compile (~20 s each here)."""

        def compile(self, model, **kwargs):
            return torch.compile(model, backend=cf.aot_backend(self))

    return AotOnly


def test_compile_gate_measures_regions_and_records_each_decision(base_doc, llama_regions_export):
    """A region computing the right values is used (the plain compiled model pays 30 ms more); one computing
    1.5 times them is dropped as less accurate; an unused form (another eps) never matches."""
    from forge_pack.evaluate import compile_gate
    from forge_pack.pack import manifest
    from forge_pack.profile.load import load

    chosen = _pick(llama_regions_export)
    ids = _ids(chosen)
    stale = next(r for r in llama_regions_export if r.pattern == "rms_norm")
    stale_form = json.loads(json.dumps(stale.form).replace("1e-06", "1e-05"))
    stale = type(stale)(**{**stale.__dict__, "form": stale_form})
    chosen.append(("r9", stale))
    p = cf.region_patcher(base_doc, chosen, wrong={ids[LLAMA_SOFTMAX]})
    target = load(str(Path(llama_regions.__file__)), "cpu", None)
    torch._dynamo.reset()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = compile_gate.measure(target, p, _aot_only_mode(cf.COMPILE.CompileMode), budget_s=1.0, max_n=5,
                                      compile_plain=lambda m: _Slowed(torch.compile(m, backend="eager"), 0.030))
    finally:
        torch.set_num_threads(before)
    recs = result["targets"]
    assert sorted(result["used"]) == sorted([ids["rms_norm"], ids["silu+mul"]])
    assert recs[ids["rms_norm"]]["reason"].startswith("faster compiled: ")
    assert recs[ids[LLAMA_SOFTMAX]]["use"] is False
    assert recs[ids[LLAMA_SOFTMAX]]["reason"].startswith(
        "less accurate compiled: with only this kernel, the patched model's outputs differ from the original's")
    assert recs["r9"] == {"use": False, "reason": compile_gate.UNMATCHED_REASON, "compiled_ms": None,
                          "compiled_with_ms": None}
    doc = json.loads(json.dumps(p.manifest))
    compile_gate.record(doc, result)
    assert {r["id"]: r["compile"]["use"] for r in doc["regions"]} == {
        ids["rms_norm"]: True, ids[LLAMA_SOFTMAX]: False, ids["silu+mul"]: True, "r9": False}
    doc["schema_version"] = manifest.SCHEMA_VERSION
    manifest.validate(manifest._integrity().seal(doc), "regions manifest")


def test_a_manifest_needs_a_target_or_a_region(base_doc):
    from forge_pack.pack import manifest

    doc = {**json.loads(json.dumps(base_doc)), "targets": []}
    assert any(p.startswith("(top level): ") for p in manifest.problems(doc))
    r = _pick(_regions())[0][1]
    doc["regions"] = [{"id": "r0", "form": r.form, "op": "r0", "output": r.output_spec.to_json()}]
    assert manifest.problems(doc) == []


@pytest.mark.gpu
def test_reduce_overhead_cuda_graphs_run_the_region_ops(base_doc):
    """CUDA: mode="reduce-overhead" (CUDA graphs) with the region ops in the graph, output as eager's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model, inputs = llama_regions.get_model().cuda(), [t.cuda() for t in llama_regions.get_inputs()]
    g = capture(model, tuple(inputs), profile=False)
    regions = find_regions(g)
    # The mask softmax's pattern name depends on how the CUDA trace spells the score scaling; take the
    # one softmax region whatever its prologue, and show every pattern when one is missing.
    chosen, seen = [], set()
    for r in regions:
        if (r.pattern in ("rms_norm", "silu+mul") or "softmax" in r.pattern) and r.key not in seen:
            seen.add(r.key)
            chosen.append((f"r{len(chosen)}", r))
    ids = {("softmax" if "softmax" in r.pattern else r.pattern): rid for rid, r in chosen}
    assert sorted(ids) == ["rms_norm", "silu+mul", "softmax"], sorted({r.pattern for r in regions})
    doc = json.loads(json.dumps(base_doc))
    doc["backend"] = "cuda"
    doc["build"]["cuda_arch_list"] = "%d.%d" % torch.cuda.get_device_capability()
    p = cf.region_patcher(doc, chosen, use=[rid for rid, _ in chosen])
    cm = cf.COMPILE.CompileMode(p)
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(force_disable_caches=True):
        ref = model(*inputs)
        compiled = cm.compile(model, mode="reduce-overhead")
        for _ in range(3):  # warm-up, record, replay
            got = compiled(*inputs)
    assert cm.report()["regions"] == {ids["rms_norm"]: 2, ids["softmax"]: 1, ids["silu+mul"]: 1}
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


def test_a_chain_of_one_form_is_replaced_link_by_link(base_doc):
    """(x + y) + z with the region "add" of that shape: the second add reads the first one's replacement."""
    class Add(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    class Chain(torch.nn.Module):
        def forward(self, x, y, z):
            return (x + y) + z

    x, y, z = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    region = find_regions(capture(Add(), (x, y), profile=False))[0]
    cm = cf.COMPILE.CompileMode(cf.region_patcher(base_doc, [("r0", region)], use=["r0"]))
    got, graphs = aot_only(cm, Chain(), x, y, z)
    assert cm.report()["regions"] == {"r0": 2} and _region_nodes(graphs) == {"r0": 2}
    torch.testing.assert_close(got, (x + y) + z)
