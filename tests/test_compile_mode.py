"""Compile mode on the CPU: the package's backend swaps in exactly the verified calls the manifest
marks ``compile.use``, leaves every other call (another shape, dtype, dynamic shapes) to Inductor,
and its output equals eager's; the compile gate keeps a replacement only when the compiled model
is faster and as accurate with it.

Most tests stop at the rewritten Dynamo graph (``capture``: the backend's graph pass, then the graph
run eagerly) because an Inductor compile costs ~20 s on a small CPU; two tests go through Inductor.
The package's ops are Python ops here (tests/pack/compile_fakes.py); the kernels built from C++
are exercised by the build's own compile gate in test_build_e2e-style runs."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import compile_fakes as cf  # noqa: E402
import helpers  # noqa: E402

from forge_pack.core.verdict import Timing  # noqa: E402
from forge_pack.evaluate import compile_gate  # noqa: E402
from forge_pack.evaluate.model_accuracy import compare_outputs  # noqa: E402
from forge_pack.pack import manifest  # noqa: E402
from forge_pack.pack.packager import pack  # noqa: E402
from forge_pack.profile.load import load  # noqa: E402

MODELS = Path(__file__).resolve().parent / "models"
TWO_OPS = Path(__file__).resolve().parent / "pack" / "two_op_model.py"


def _packed_doc(tmp_path_factory, model: Path) -> dict:
    base = tmp_path_factory.mktemp(model.stem)
    run = helpers.make_cpu_run(base / "run", model)
    out = base / "pkg"
    assert pack(run, out, "cm_pkg", confirm=False).written
    return json.loads((out / "cm_pkg" / "manifest.json").read_text())


@pytest.fixture(scope="module")
def tiny_doc(tmp_path_factory):
    return _packed_doc(tmp_path_factory, helpers.TINY_MODEL)


def _ids(doc: dict, op: str | None = None) -> list[str]:
    return [t["id"] for t in doc["targets"] if not dict(t["signature"]["params"]).get("composite")
            and (op is None or t["op"] == op)]


def capture(cm, model, *inputs, **compile_kwargs):
    """torch.compile through the backend's graph pass only (no Inductor): the rewritten graph runs."""
    def backend(gm, example_inputs):
        cm.rewrite(gm, example_inputs)
        return gm.forward

    torch._dynamo.reset()
    with torch.inference_mode():
        return torch.compile(model, backend=backend, **compile_kwargs)(*inputs)


def _tiny():
    target = load(str(helpers.TINY_MODEL), "cpu", None)
    return target.module, target.args


def test_replacement_is_used_only_where_the_manifest_says_use(tiny_doc):
    ln = _ids(tiny_doc, "layer_norm")
    p = cf.patcher(tiny_doc, use=ln)
    cm = cf.COMPILE.CompileMode(p)
    model, args = _tiny()
    capture(cm, model, *args)
    assert cf.COMPILE.our_nodes(cm.graphs[-1], p.namespace) == {ln[0]: 1}
    assert cm.replaced == {ln[0]: 1}


def test_targets_without_a_compile_record_are_not_used(tiny_doc):
    p = cf.patcher(tiny_doc, use=None)  # the manifest as packed: no target carries `compile`
    cm = cf.COMPILE.CompileMode(p)
    model, args = _tiny()
    capture(cm, model, *args)
    assert cm.use == frozenset() and cm.replaced == {}
    assert cf.COMPILE.our_nodes(cm.graphs[-1], p.namespace) == {}


def test_every_used_call_path_is_replaced_and_output_equals_eager(tiny_doc):
    """softmax through nn.Softmax, torch.softmax, Tensor.softmax and F.softmax: four nodes, one target."""
    ids = _ids(tiny_doc)
    p = cf.patcher(tiny_doc, use=ids)
    cm = cf.COMPILE.CompileMode(p)
    model, args = _tiny()
    with torch.inference_mode():
        ref = model(*args)
    got = capture(cm, model, *args)
    sm = _ids(tiny_doc, "softmax")[0]
    assert cm.replaced[sm] == 4
    assert set(cm.replaced) == set(ids)
    assert compare_outputs(ref, got)["within_tolerance"]


def test_another_shape_is_left_to_inductor(tiny_doc):
    """layer_norm was verified on [4, 16, 64]; traced on [8, 16, 64] it stays Inductor's."""
    p = cf.patcher(tiny_doc, use=_ids(tiny_doc))
    cm = cf.COMPILE.CompileMode(p)
    model = _tiny()[0]
    capture(cm, torch.nn.Sequential(model.proj, model.ln), torch.randn(4, 16, 64))
    assert cm.replaced == {_ids(tiny_doc, "layer_norm")[0]: 1}
    cm2 = cf.COMPILE.CompileMode(p)
    capture(cm2, torch.nn.Sequential(model.proj, model.ln), torch.randn(8, 16, 64))
    assert cm2.replaced == {}


def test_another_dtype_is_left_to_inductor(tiny_doc):
    p = cf.patcher(tiny_doc, use=_ids(tiny_doc))
    cm = cf.COMPILE.CompileMode(p)
    model = _tiny()[0].double()
    capture(cm, model, torch.randn(4, 16, 64, dtype=torch.float64))
    assert cm.replaced == {}


def test_dynamic_shapes_are_left_to_inductor(tiny_doc):
    """A symbolic batch size stands for sizes never verified (a size the graph pins, as Tiny's reshape
    pins its batch, is a plain int again and may be replaced)."""
    p = cf.patcher(tiny_doc, use=_ids(tiny_doc))
    cm = cf.COMPILE.CompileMode(p)
    model = _tiny()[0]
    capture(cm, torch.nn.Sequential(model.proj, model.ln), torch.randn(4, 16, 64), dynamic=True)
    assert cm.replaced == {}


def test_a_graph_that_needs_autograd_is_left_to_inductor(tiny_doc):
    """Grad mode on and the weights requiring grad: the kernels have no backward."""
    p = cf.patcher(tiny_doc, use=_ids(tiny_doc, "layer_norm"))
    cm = cf.COMPILE.CompileMode(p)
    model, args = _tiny()

    def backend(gm, example_inputs):
        cm.rewrite(gm, example_inputs)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(*args)
    assert cm.replaced == {}


def test_disabled_package_compiles_without_replacing(tiny_doc, monkeypatch):
    monkeypatch.setenv("FORGE_PACK_DISABLE", "1")
    p = cf.patcher(tiny_doc, use=_ids(tiny_doc))
    cm = cf.COMPILE.CompileMode(p)
    model, args = _tiny()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        capture(cm, model, *args)
    assert cm.replaced == {}
    assert any("disabled by FORGE_PACK_DISABLE" in str(x.message) for x in w)


def test_compile_refuses_another_backend(tiny_doc):
    cm = cf.COMPILE.CompileMode(cf.patcher(tiny_doc, use=[]))
    with pytest.raises(TypeError, match="chooses the backend itself"):
        cm.compile(torch.nn.Identity(), backend="eager")


@pytest.mark.parametrize("model_file", ["vision_net.py", "vae_decoder.py", "llm_block.py"])
def test_example_models_compiled_with_the_package_equal_eager(tmp_path_factory, model_file):
    doc = _packed_doc(tmp_path_factory, MODELS / model_file)
    ids = _ids(doc)
    p = cf.patcher(doc, use=ids)
    cm = cf.COMPILE.CompileMode(p)
    target = load(str(MODELS / model_file), "cpu", None)
    with torch.inference_mode():
        ref = target.module(*target.args, **target.kwargs)
    got = capture(cm, target.module, *target.args, **{})
    assert cm.replaced, f"no verified call of {model_file} was replaced"
    assert set(cm.replaced) <= set(ids)
    assert compare_outputs(ref, got)["within_tolerance"]


def test_inductor_compile_with_the_package_equals_eager(tiny_doc, monkeypatch):
    """Through Inductor's C++ backend: our op is an opaque node among Inductor's kernels, given its fallback
    lowering before Inductor meets it (torch 2.11's implicit one formats the argument graphs first)."""
    ids = _ids(tiny_doc)
    p = cf.patcher(tiny_doc, use=ids)
    cm = cf.COMPILE.CompileMode(p)
    lowered = []
    real = cf.COMPILE.lower_as_fallback
    monkeypatch.setattr(cf.COMPILE, "lower_as_fallback", lambda op: (lowered.append(op), real(op)))
    model, args = _tiny()
    torch._dynamo.reset()
    with torch.inference_mode():
        ref = model(*args)
        got = cm.compile(model)(*args)
    assert set(cm.replaced) == set(ids)
    assert {t.fn for t in p.targets if t.id in ids} <= set(lowered)
    assert compare_outputs(ref, got)["within_tolerance"]
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ the compile gate


def _timing(median_us: float, iqr_us: float, n: int = 30) -> Timing:
    return Timing(median_us, iqr_us, n, median_us - iqr_us, "monotonic")


def test_gate_judges_slower_beyond_noise_not_faster_and_faster():
    ok, why = compile_gate.judge(_timing(1000, 10), _timing(1200, 10))
    assert not ok and why.startswith("makes the compiled model slower: 0.83x the plain compiled model")
    ok, why = compile_gate.judge(_timing(1000, 100), _timing(1010, 100))
    assert not ok and why.startswith("not faster compiled (within measurement noise)")
    ok, why = compile_gate.judge(_timing(1000, 10), _timing(800, 10))
    assert ok and why.startswith("faster compiled: 1.25x")


class _Slowed(torch.nn.Module):
    """The plain compiled model made slower by a fixed delay: the gate's "faster" case, deterministically."""

    def __init__(self, inner, delay_s: float):
        super().__init__()
        self.inner, self.delay_s = inner, delay_s

    def forward(self, *args, **kwargs):
        import time

        time.sleep(self.delay_s)
        return self.inner(*args, **kwargs)


@pytest.fixture
def one_thread():
    """Sleep-based timings on a shared CPU: one intra-op thread, so no OpenMP barrier waits on a busy core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _graph_only(compile_mode_cls):
    class GraphOnly(compile_mode_cls):
        """The graph pass without Inductor (its C++ compile costs ~20 s each here)."""

        def backend(self, gm, example_inputs, **kwargs):
            self.rewrite(gm, example_inputs)
            return gm.forward

    return GraphOnly


def test_compile_gate_drops_a_slower_replacement_and_keeps_a_faster_one(tmp_path_factory, one_thread):
    doc = _packed_doc(tmp_path_factory, TWO_OPS)
    by_op = {t["op"]: t["id"] for t in doc["targets"]}
    slow, fast = by_op["softmax"], by_op["layer_norm"]
    p = cf.patcher(doc, slow_s={slow: 0.090})  # the plain model pays 0.030 s, the slow kernel 0.090 s
    target = load(str(TWO_OPS), "cpu", None)
    torch._dynamo.reset()
    result = compile_gate.measure(target, p, _graph_only(cf.COMPILE.CompileMode), budget_s=2.0, max_n=9,
                                  compile_plain=lambda m: _Slowed(torch.compile(m, backend="eager"), 0.030))
    recs = result["targets"]
    assert recs[slow]["use"] is False
    assert recs[slow]["reason"].startswith("makes the compiled model slower: ")
    assert recs[slow]["compiled_with_ms"] > recs[slow]["compiled_ms"] + 40
    assert recs[fast]["use"] is True and recs[fast]["reason"].startswith("faster compiled: ")
    assert result["used"] == [fast]
    summary = compile_gate.record(doc, result)
    assert summary["used"] == [fast] and summary["compiled_with_ms"] < summary["compiled_ms"]
    assert {t["id"]: t["compile"]["use"] for t in doc["targets"]} == {slow: False, fast: True}
    doc["schema_version"] = manifest.SCHEMA_VERSION
    manifest.validate(manifest._integrity().seal(doc), "compile-gate manifest")


def test_compile_gate_leaves_the_least_gain_to_inductor_when_winners_lose_together(tmp_path_factory, one_thread):
    """Each wins alone (20 ms and 25 ms against the plain model's 30 ms), together they lose (45 ms): the
    one that gained least alone (softmax) goes, and the other's alone figures are the package's."""
    doc = _packed_doc(tmp_path_factory, TWO_OPS)
    by_op = {t["op"]: t["id"] for t in doc["targets"]}
    ln, sm = by_op["layer_norm"], by_op["softmax"]
    p = cf.patcher(doc, slow_s={ln: 0.020, sm: 0.025})
    target = load(str(TWO_OPS), "cpu", None)
    torch._dynamo.reset()
    result = compile_gate.measure(target, p, _graph_only(cf.COMPILE.CompileMode), budget_s=2.0, max_n=9,
                                  compile_plain=lambda m: _Slowed(torch.compile(m, backend="eager"), 0.030))
    recs = result["targets"]
    assert recs[ln]["use"] is True and result["used"] == [ln]
    assert recs[sm]["use"] is False
    assert recs[sm]["reason"].startswith("faster compiled alone, but the kernels used together lose (makes the "
                                         "compiled model slower: ")
    assert recs[sm]["reason"].endswith("it gained least alone, so it is left to Inductor")
    assert Timing.from_json(result["compiled_with"]).median_us == pytest.approx(recs[ln]["compiled_with_ms"] * 1e3)


def _counting(compile_mode_cls, sets: list):
    class Counting(compile_mode_cls):
        def __init__(self, patcher, use=None):
            sets.append(sorted(use))
            super().__init__(patcher, use=use)

    return Counting


def test_compile_gate_compiles_once_with_every_kernel_when_they_win_together(tmp_path_factory, one_thread):
    """Both kernels cost nothing against the plain model's 30 ms: one compile with both, no per-kernel ones."""
    doc = _packed_doc(tmp_path_factory, TWO_OPS)
    ids = sorted(t["id"] for t in doc["targets"])
    p = cf.patcher(doc)
    target = load(str(TWO_OPS), "cpu", None)
    torch._dynamo.reset()
    sets: list = []
    result = compile_gate.measure(target, p, _counting(_graph_only(cf.COMPILE.CompileMode), sets), budget_s=2.0,
                                  max_n=9, compile_plain=lambda m: _Slowed(torch.compile(m, backend="eager"), 0.030))
    assert sets == [ids]
    assert sorted(result["used"]) == ids
    for tid in ids:
        rec = result["targets"][tid]
        assert rec["use"] is True and rec["reason"].startswith("faster compiled: ")
        assert rec["reason"].endswith(f"(with {', '.join(ids)} swapped in together)")


def test_compile_gate_bisects_only_when_the_kernels_lose_together(tmp_path_factory, one_thread):
    """The slow kernel makes the set lose: each half is compiled once, and the set is not compiled again."""
    doc = _packed_doc(tmp_path_factory, TWO_OPS)
    by_op = {t["op"]: t["id"] for t in doc["targets"]}
    p = cf.patcher(doc, slow_s={by_op["softmax"]: 0.090})
    target = load(str(TWO_OPS), "cpu", None)
    torch._dynamo.reset()
    sets: list = []
    compile_gate.measure(target, p, _counting(_graph_only(cf.COMPILE.CompileMode), sets), budget_s=1.0, max_n=5,
                         compile_plain=lambda m: _Slowed(torch.compile(m, backend="eager"), 0.030))
    ids = [t.id for t in p.targets]
    assert sets == [sorted(ids), [ids[0]], [ids[1]]]


def test_compile_gate_drops_a_less_accurate_replacement(tmp_path_factory, one_thread):
    doc = _packed_doc(tmp_path_factory, TWO_OPS)
    sm = next(t["id"] for t in doc["targets"] if t["op"] == "softmax")
    p = cf.patcher(doc, wrong={sm})
    target = load(str(TWO_OPS), "cpu", None)
    torch._dynamo.reset()
    result = compile_gate.measure(target, p, _graph_only(cf.COMPILE.CompileMode), budget_s=1.0, max_n=5,
                                  compile_plain=lambda m: _Slowed(torch.compile(m, backend="eager"), 0.010))
    rec = result["targets"][sm]
    assert rec["use"] is False
    assert rec["reason"].startswith("less accurate compiled: with only this kernel, the patched model's outputs "
                                    "differ from the original's by up to")


def test_compile_gate_keeps_a_replacement_that_leaves_torch_compiles_accuracy_as_it_is(tmp_path_factory,
                                                                                       one_thread):
    """The plain compiled model is the other yardstick of "less accurate compiled": where torch.compile's own
    output is as far from eager's as the package's (ResNet-50 bf16 on an H100: 0.75, 96-99% argmax agreement,
    which dropped every conv region), the replacement makes the compiled model no less accurate than what the
    user runs instead. Here torch.compile itself computes the softmax 1.5 times too large, as the kernel does."""
    doc = _packed_doc(tmp_path_factory, TWO_OPS)
    sm = next(t["id"] for t in doc["targets"] if t["op"] == "softmax")
    p = cf.patcher(doc, wrong={sm})
    target = load(str(TWO_OPS), "cpu", None)
    torch._dynamo.reset()
    plain_mode = _graph_only(cf.COMPILE.CompileMode)(p, use=[sm])
    result = compile_gate.measure(target, p, _graph_only(cf.COMPILE.CompileMode), budget_s=1.0, max_n=5,
                                  compile_plain=lambda m: _Slowed(plain_mode.compile(m), 0.030))
    rec = result["targets"][sm]
    assert rec["use"] is True and rec["reason"].startswith("faster compiled: "), rec
    assert result["within_tolerance"] is True and result["max_abs_diff"] > 0.01  # the difference from eager's


def test_a_less_accurate_replacement_is_told_against_both_yardsticks():
    eager = torch.zeros(4, 8)
    plain = eager + 1e-4
    wrong = eager + 1.0
    acc = compile_gate.accuracy(eager, plain, wrong, None, None)
    assert acc["within_tolerance"] is False and acc["max_abs_diff"] == 1.0
    assert acc["against_compiled"].startswith("; and from the model compiled without it by up to 1 ")
    near_plain = compile_gate.accuracy(eager, wrong, wrong + 1e-6, None, None)
    assert near_plain["within_tolerance"] is True and near_plain["max_abs_diff"] > 0.99
    assert near_plain["vs_compiled"]["max_abs_diff"] < 1e-5
    assert near_plain["accuracy"]["basis"].startswith("against the model compiled without the package")
    exact = compile_gate.accuracy(eager, wrong, eager.clone(), None, None)  # eager's yardstick passes first
    assert exact["within_tolerance"] is True and exact["against_compiled"] == "" and "vs_compiled" not in exact


def test_a_model_torch_compile_cannot_compile_leaves_compile_mode_unused(tiny_doc):
    doc = json.loads(json.dumps(tiny_doc))
    summary = compile_gate.run_compile_gate(Path("."), None, doc,
                                            check=lambda d, i: {"error": "torch.compile failed on the model: X"})
    assert summary["used"] == [] and summary["error"] == "torch.compile failed on the model: X"
    assert all(t["compile"] == {"use": False, "reason": "torch.compile failed on the model: X", "compiled_ms": None,
                                "compiled_with_ms": None} for t in doc["targets"])
    line = compile_gate.summary_line(None, summary)
    assert line == "Whole model: compile mode unavailable: torch.compile failed on the model: X"


def test_a_version_2_manifest_without_compile_fields_still_loads_and_checks(tiny_doc, tmp_path):
    doc = json.loads(json.dumps(tiny_doc))
    assert doc["schema_version"] == 3 and manifest.integrity(doc)[0] == "ok"
    doc["schema_version"] = 2
    sealed = manifest._integrity().seal(doc)
    manifest.validate(sealed, "v2")
    assert manifest.integrity(sealed)[0] == "ok"
    edited = json.loads(json.dumps(sealed))
    edited["targets"][0]["compile"] = {"use": True, "reason": "x", "compiled_ms": 1.0, "compiled_with_ms": 0.5}
    assert manifest.integrity(edited)[0] == "edited"  # the compile figures are covered by the digest


def test_the_emitted_package_exports_compile_and_backend(tmp_path, monkeypatch):
    """The packed package's own __init__: compile / backend exist; with its extension missing it warns
    once and compiles with plain Inductor (no replacement), output as eager's."""
    run = helpers.make_cpu_run(tmp_path / "run")
    out = tmp_path / "pkg"
    assert pack(run, out, "cm_export_pkg", confirm=False).written
    path = out / "cm_export_pkg" / "manifest.json"
    doc = json.loads(path.read_text())
    for t in doc["targets"]:
        t["compile"] = {"use": True, "reason": "test", "compiled_ms": 1.0, "compiled_with_ms": 0.5}
    manifest.write(path, doc)
    monkeypatch.syspath_prepend(str(out))
    import cm_export_pkg as pkg

    assert callable(pkg.compile) and callable(pkg.backend)
    assert pkg._COMPILE.use == frozenset(t["id"] for t in doc["targets"])
    model, args = _tiny()
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as w, torch.inference_mode():
        warnings.simplefilter("always")
        ref = model(*args)
        got = torch.compile(model, backend=pkg.backend)(*args)
    assert any("compile mode runs plain Inductor: its compiled extension failed to load" in str(x.message) for x in w)
    assert pkg._COMPILE.replaced == {}
    assert compare_outputs(ref, got)["within_tolerance"]


def test_the_package_readme_says_what_compile_mode_uses(tiny_doc):
    from forge_pack.pack import readme

    doc = json.loads(json.dumps(tiny_doc))
    assert readme.compile_note(doc) == ("This package was built without measuring compile mode, so `compile` uses "
                                        "none of its kernels.")
    ids = [t["id"] for t in doc["targets"]]
    compile_gate.record(doc, {"targets": {i: {"use": i == ids[0], "reason": "faster compiled: x" if i == ids[0]
                                              else "makes the compiled model slower: y", "compiled_ms": 2.0,
                                              "compiled_with_ms": 1.0}
                                          for i in ids},
                              "used": [ids[0]], "compiled": _timing(2000, 10).to_json(),
                              "compiled_with": _timing(1600, 10).to_json()})
    note = readme.compile_note(doc)
    assert note.startswith(f"Measured: `torch.compile` 2.000 ms, with {ids[0]} 1.600 ms (1.25x); "
                           f"{ids[1]} not used: makes the compiled model slower: y")
    assert note in readme.render(doc) and "$compile_note" not in readme.render(doc)


class _ScaledSoftmax(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.softmax(x * 2.0, dim=2, dtype=torch.float32) + 1.0


def _cuda_softmax_patcher(tmp_path: Path, name: str):
    """A CUDA run packed as `name`, its float32 softmax target alone and used, the op's CUDA kernel torch's own
    softmax (skips without a GPU); (patcher, target)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run = helpers.make_cuda_run(tmp_path / "run")
    out = tmp_path / "pkg"
    assert pack(run, out, name, confirm=False).written
    doc = json.loads((out / name / "manifest.json").read_text())
    doc["build"]["cuda_arch_list"] = "%d.%d" % torch.cuda.get_device_capability()
    sm = next(t for t in doc["targets"] if t["op"] == "softmax" and t["signature"]["output"]["dtype"] == "float32")
    p = cf.patcher({**doc, "targets": [sm]}, use=[sm["id"]])
    cf._LIBS[-1].impl(sm["id"], lambda x: torch.softmax(x, 2, dtype=torch.float32), "CUDA")
    return p, sm


@pytest.mark.gpu
def test_reduce_overhead_cuda_graphs_run_the_package_op(tmp_path):
    """CUDA: mode="reduce-overhead" (CUDA graphs) with the package's op in the graph, output as eager's."""
    p, sm = _cuda_softmax_patcher(tmp_path, "cm_cuda_pkg")
    cm = cf.COMPILE.CompileMode(p)
    M = _ScaledSoftmax
    x = torch.randn(4, 8, 256, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.inference_mode():
        ref = M()(x)
        compiled = cm.compile(M(), mode="reduce-overhead")
        for _ in range(3):  # warm-up, record, replay
            got = compiled(x)
    assert cm.replaced == {sm["id"]: 1}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_the_gate_measures_a_replacement_under_cuda_graphs(tmp_path):
    """CUDA: the compile gate run with mode="reduce-overhead" on both sides (as the build runs it on a GPU):
    the plain and the package's models both compiled with CUDA graphs, alternated in timing, the package's
    op matched, and a decision with a measured reason for it."""
    from types import SimpleNamespace

    p, sm = _cuda_softmax_patcher(tmp_path, "cm_cuda_ro_pkg")
    x = torch.randn(4, 8, 256, device="cuda", dtype=torch.bfloat16)
    target = SimpleNamespace(module=_ScaledSoftmax(), args=(x,), kwargs={}, device="cuda")
    torch._dynamo.reset()
    result = compile_gate.measure(target, p, cf.COMPILE.CompileMode, budget_s=1.0, max_n=5, mode="reduce-overhead")
    rec = result["targets"][sm["id"]]
    assert result["mode"] == "reduce-overhead" and rec["compiled_ms"] is not None
    assert rec["reason"].startswith(("faster compiled: ", "makes the compiled model slower: ",
                                     "not faster compiled ")), rec["reason"]
    assert result["used"] == ([sm["id"]] if rec["use"] else [])


def test_export_writes_a_pt2_with_only_the_used_kernels_that_runs_as_eager(tmp_path_factory, tmp_path):
    doc = _packed_doc(tmp_path_factory, TWO_OPS)
    sm = next(t["id"] for t in doc["targets"] if t["op"] == "softmax")
    p = cf.patcher(doc, use=[sm])
    cm = cf.COMPILE.CompileMode(p)
    model, args, kwargs = cf.COMPILE.load_model_file(str(TWO_OPS))
    done = cm.export(model, args, kwargs, str(tmp_path / "two.pt2"))
    assert done["nodes"] == {sm: 1} and Path(done["path"]).is_file()
    assert not p.applied and torch.nn.functional.softmax is cf.PATCH.ORIGINALS[("torch.nn.functional", "softmax")]
    run = cf.COMPILE.load_exported(p, done["path"])
    with torch.no_grad():
        torch.testing.assert_close(run(*args), model(*args), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_pack_runs_the_compile_gate_and_records_each_targets_decision(tmp_path):
    """The real thing on the CPU: pack (winners pre-confirmed) builds the extension, passes the
    whole-model gate, measures the model compiled with and without each C++ kernel, and records it."""
    from forge_pack.cli.build import format_result
    from forge_pack.core.verdict import Baseline, Evaluation, Verdict
    from forge_pack.evaluate import confirm
    from forge_pack.pack.packager import collect, read_run

    run = helpers.make_cpu_run(tmp_path / "run", TWO_OPS)
    info, (winners, _) = read_run(run), collect(run)
    base = Baseline(_timing(10.0, 0.4), _timing(12.0, 0.4))
    ev = Evaluation(Verdict(True, "ok"), _timing(5.0, 0.2), speedup_vs_eager=2.0)
    (info.run_dir / confirm.CONFIRM_FILE).write_text(json.dumps(
        {w.hotspot.id: confirm.KernelConfirmation(w.hotspot.id, w.node_id, w.candidate.content_hash, True, "2.00x",
                                                  ev, base).to_json() for w in winners}))
    result = pack(run, tmp_path / "pkg", "gate_cm_pkg", say=lambda s: None)
    assert result.written
    doc = manifest.load(tmp_path / "pkg" / "gate_cm_pkg" / "manifest.json")
    assert doc["schema_version"] == 3 and manifest.integrity(doc)[0] == "ok"
    for t in doc["targets"]:
        c = t["compile"]
        assert c["compiled_ms"] > 0 and c["compiled_with_ms"] > 0
        assert c["use"] == c["reason"].startswith("faster compiled: ")
    c = doc["compile_result"]
    assert c["used"] == [t["id"] for t in doc["targets"] if t["compile"]["use"]]
    assert c["compiled_ms"] > 0 and c["compile_s"] > 0
    line = next(x for x in format_result(result).splitlines() if x.startswith("Whole model: eager "))
    assert ", eager+package " in line and ", compile " in line and "compile+package" in line


SETTLE_SCRIPT = r"""
import json, sys
sys.path.insert(0, {pack_dir!r})
import torch
import compile_fakes as cf
doc = json.loads(open({doc!r}).read())
p = cf.patcher(doc, use=[])
assert "torch._dynamo" not in sys.modules, "the check needs a process where Dynamo was never imported"
original = torch.nn.functional.softmax
assert p.apply()
assert "torch._dynamo" in sys.modules
p.revert()
from torch._dynamo import trace_rules
rules = trace_rules.get_torch_obj_rule_map()
print(json.dumps({{"original_known": original in rules, "restored": torch.nn.functional.softmax is original}}))
"""


def test_apply_settles_dynamo_even_when_nothing_imported_it(tiny_doc, tmp_path):
    """Dynamo's map of torch functions is built before the patches, so a torch.compile after revert()
    still knows torch's own F.softmax; in a fresh process where no one imported torch._dynamo."""
    import subprocess

    doc_path = tmp_path / "doc.json"
    doc_path.write_text(json.dumps(tiny_doc))
    script = SETTLE_SCRIPT.format(pack_dir=str(Path(__file__).resolve().parent / "pack"), doc=str(doc_path))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       cwd=str(Path(__file__).resolve().parent.parent))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"original_known": True, "restored": True}


def _with_mode_decisions(doc: dict, default: list[str], reduce_overhead: list[str]):
    """A patcher whose manifest says `default` for the default mode and `reduce_overhead` under CUDA graphs."""
    p = cf.patcher(doc, use=default)
    for t in p.manifest["targets"]:
        t["compile"]["modes"] = {"reduce-overhead": {"use": t["id"] in reduce_overhead, "reason": "test",
                                                     "compiled_ms": 1.0, "compiled_with_ms": 0.9}}
    return p


def test_each_torch_compile_mode_uses_the_targets_the_build_measured_for_it(tiny_doc):
    """The build's gate decides per mode (a conv region losing in the default mode at batch 1 can win under
    CUDA graphs): <pkg>.compile(model, mode=m) follows that mode's decisions, a mode never measured the
    default's."""
    ln = _ids(tiny_doc, "layer_norm")
    model, args = _tiny()
    p = _with_mode_decisions(tiny_doc, default=[], reduce_overhead=ln)
    cm = cf.COMPILE.CompileMode(p)
    assert cm.use_for(None) == cm.use_for("default") == frozenset() and cm.use_for("reduce-overhead") == set(ln)
    assert cm.use_for("max-autotune") == frozenset()  # not measured: the default mode's decisions
    capture(cm, model, *args)  # the default mode
    assert cf.COMPILE.our_nodes(cm.graphs[-1], p.namespace) == {} and cm.replaced == {}
    # the backend as torch.compile(mode="reduce-overhead") calls it (mode passed through; CUDA graphs are
    # Inductor's and only act on CUDA graphs, so on the CPU the rewrite is what can be seen)
    torch._dynamo.reset()
    with torch.inference_mode():
        torch.compile(model, backend=lambda gm, ex: (cm.rewrite(gm, ex, cm.use_for("reduce-overhead")), gm)[1])(*args)
    assert cf.COMPILE.our_nodes(cm.graphs[-1], p.namespace) == {ln[0]: 1}
    # and the reverse: used by default, left to Inductor under CUDA graphs
    p2 = _with_mode_decisions(tiny_doc, default=ln, reduce_overhead=[])
    cm2 = cf.COMPILE.CompileMode(p2)
    assert cm2.use_for(None) == set(ln) and cm2.use_for("reduce-overhead") == frozenset()
    assert cf.COMPILE.CompileMode(p2, use=ln).use_for("reduce-overhead") == set(ln)  # explicit: every mode


def test_the_backend_follows_the_mode_torch_compile_passes_it(tiny_doc, monkeypatch):
    """torch.compile(model, backend=<pkg>.backend, mode=m) hands the backend mode=m: its rewrite uses that
    mode's targets (Inductor itself stubbed: what it compiles is not the question here)."""
    ln = _ids(tiny_doc, "layer_norm")
    cm = cf.COMPILE.CompileMode(_with_mode_decisions(tiny_doc, default=[], reduce_overhead=ln))
    seen = []
    monkeypatch.setattr(cf.COMPILE, "_inductor", lambda mode, options: (lambda gm, ex: gm))
    real = cm.rewrite
    monkeypatch.setattr(cm, "rewrite", lambda gm, ex, use=None: seen.append(use) or real(gm, ex, use))
    model, args = _tiny()
    for mode in (None, "reduce-overhead"):
        torch._dynamo.reset()
        with torch.inference_mode():
            cm.compile(model, **({"mode": mode} if mode else {}))(*args)
    assert seen == [frozenset(), frozenset(ln)]


def test_the_gate_records_each_modes_decisions_and_measures_cuda_graphs_only_on_a_gpu(tiny_doc):
    from types import SimpleNamespace

    ids = [t["id"] for t in tiny_doc["targets"]]
    calls = []

    def check(d, info, mode=None):
        calls.append(mode)
        used = ids[:1] if mode else []
        return {"targets": {tid: {"use": tid in used, "reason": f"{mode or 'default'} says", "compiled_ms": 2.0,
                                  "compiled_with_ms": 1.5 if tid in used else 2.1} for tid in ids},
                "used": used, "mode": mode or "default",
                "compiled": _timing(2000.0, 10.0).to_json(),
                "compiled_with": _timing(1500.0, 10.0).to_json() if used else None}

    for device, modes in (("cpu", [None]), ("cuda", [None, "reduce-overhead"])):
        calls.clear()
        doc = json.loads(json.dumps(tiny_doc))
        summary = compile_gate.run_compile_gate(Path("."), SimpleNamespace(device=device), doc, check=check)
        assert calls == modes
        if device == "cpu":
            assert "modes" not in summary and all("modes" not in t["compile"] for t in doc["targets"])
            continue
        assert summary["used"] == [] and summary["modes"] == {
            "reduce-overhead": {"used": ids[:1], "compiled_ms": 2.0, "compiled_with_ms": 1.5}}
        first = doc["targets"][0]["compile"]
        assert first["use"] is False and first["modes"]["reduce-overhead"]["use"] is True
        assert first["modes"]["reduce-overhead"]["reason"] == "reduce-overhead says"
        doc.pop("integrity", None)
        manifest.validate(manifest._integrity().seal(doc), "modes")  # the schema takes it
        cm = cf.COMPILE.CompileMode(cf.PATCH.Patcher(doc, "cm_test_pkg", lambda: None))
        assert cm.use_for(None) == frozenset() and cm.use_for("reduce-overhead") == {ids[0]}
        from forge_pack.pack.readme import compile_note

        assert compile_gate.summary_line(None, summary) == (
            "Whole model: compile 2.000 ms, compile+package: no kernel used compiled (each loses to Inductor's own "
            f"code in context), mode=reduce-overhead: compile 2.000 ms, compile+package 1.500 ms (1.33x, using {ids[0]})")
        assert compile_note(doc).endswith(f'With `mode="reduce-overhead"` (measured on its own): `torch.compile` '
                                          f'2.000 ms, with {ids[0]} 1.500 ms (1.33x).')


class _Hiding:
    """A compile mode over two regions where "big" (1.5 times the right output: less accurate) takes the subgraph
    "small" (right, and cheap) would match: the compiled model is the module, scaled where "big" is used, and
    the regions matched follow the use set as Inductor's region pass would (the first in the manifest first)."""

    sets: list = []

    def __init__(self, patcher, use=None):
        self.use = list(use or [])
        _Hiding.sets.append(sorted(self.use))
        self.replaced = {}
        self.matched = {"big": 1} if "big" in self.use else {"small": 1} if "small" in self.use else {}

    def compile(self, module, **kwargs):
        factor = 1.5 if "big" in self.use else 1.0
        return lambda *a, **k: module(*a, **k) * factor


def test_a_region_hidden_by_a_dropped_one_is_tried_once_that_one_is_dropped():
    import types

    module = torch.nn.Linear(8, 8).eval()
    target = types.SimpleNamespace(module=module, args=(torch.randn(4, 8),), kwargs={}, device="cpu")
    patcher = types.SimpleNamespace(targets=[], manifest={"regions": [{"id": "big"}, {"id": "small"}]})
    _Hiding.sets = []
    result = compile_gate.measure(target, patcher, _Hiding, budget_s=0.5, max_n=5,
                                  compile_plain=lambda m: _Slowed(m, 0.010))
    # all at once ("small" hidden: that compile is "big"'s alone, dropped), then what it hid with what is kept
    assert _Hiding.sets == [["big", "small"], ["small"]]
    assert result["used"] == ["small"]
    assert result["targets"]["big"]["reason"].startswith("less accurate compiled: with only this kernel")
    assert result["targets"]["small"]["use"] is True
    assert result["targets"]["small"]["reason"].startswith("faster compiled: ")


def test_compile_modes_are_torch_compile_modes_with_default_among_them():
    from forge_pack.core.errors import ForgeError

    assert compile_gate.parse_modes("default") == ("default",)
    assert compile_gate.parse_modes(" default , reduce-overhead,default,") == ("default", "reduce-overhead")
    assert compile_gate.parse_modes("max-autotune,default") == ("max-autotune", "default")
    with pytest.raises(ForgeError) as e:
        compile_gate.parse_modes("default,fast")
    assert "'fast'" in e.value.message and "reduce-overhead" in e.value.hint
    with pytest.raises(ForgeError) as e:
        compile_gate.parse_modes("reduce-overhead")
    assert "must include default" in e.value.message and e.value.hint == "e.g. --compile-modes default,reduce-overhead"
    assert compile_gate.extra_modes("cuda") == ("reduce-overhead",) and compile_gate.extra_modes("cpu") == ()
    assert compile_gate.extra_modes("cuda", ("default",)) == ()
    assert compile_gate.extra_modes("cpu", ("max-autotune", "default")) == ("max-autotune",)


def test_the_gate_measures_the_modes_asked_for_in_place_of_the_devices_own(tiny_doc):
    from types import SimpleNamespace

    calls = []

    def check(d, info, mode=None):
        calls.append(mode)
        return {"targets": {}, "used": [], "mode": mode or "default", "compiled": _timing(2000.0, 10.0).to_json(),
                "compiled_with": None}

    for device, modes, want in (("cuda", ("default",), [None]), ("cpu", ("default", "max-autotune"),
                                                                  [None, "max-autotune"]),
                                ("cuda", None, [None, "reduce-overhead"])):
        calls.clear()
        summary = compile_gate.run_compile_gate(Path("."), SimpleNamespace(device=device),
                                                json.loads(json.dumps(tiny_doc)), check=check, modes=modes)
        assert calls == want, (device, modes)
        assert set(summary.get("modes") or {}) == {m for m in want if m}


FAKE_GATE = '''#!/usr/bin/env python3
# stands in for `python -m forge_pack.evaluate.compile_gate`: progress lines, other output, then its result file
import json, os, sys, time
a = sys.argv
out = a[a.index("--out") + 1]
open(out + ".pid", "w").write(str(os.getpid()))
print("Inductor says something", flush=True)
print("{line}compiled without the package: compile 1 s", file=sys.stderr, flush=True)
time.sleep(float({pause}))
print("{line}compiled with 2 swapped in", file=sys.stderr, flush=True)
print("x" * 3000 + " last words", file=sys.stderr, flush=True)
if {write}:
    open(out, "w").write(json.dumps({{"used": ["r0"], "mode": "default"}}))
sys.exit({code})
'''


def _fake_gate(tmp_path, monkeypatch, pause=0.0, write=True, code=0):
    from types import SimpleNamespace

    script = tmp_path / "fake_python"
    script.write_text(FAKE_GATE.format(line=compile_gate.GATE_LINE, pause=pause, write=write, code=code))
    script.chmod(0o755)
    monkeypatch.setattr(compile_gate.sys, "executable", str(script))
    return SimpleNamespace(model_path="m.py", device="cpu", run_dir=str(tmp_path / "run"), dtype=None)


def test_the_gates_progress_reaches_the_build_as_it_is_printed(tmp_path, monkeypatch):
    info = _fake_gate(tmp_path, monkeypatch, pause=1.5)
    seen = []
    import time

    t0 = time.perf_counter()
    result = compile_gate.check_compiled(tmp_path, info, say=lambda s: seen.append((s, time.perf_counter() - t0)))
    assert result == {"used": ["r0"], "mode": "default"}
    assert [s for s, _ in seen] == ["compiled without the package: compile 1 s", "compiled with 2 swapped in"]
    assert seen[1][1] - seen[0][1] > 1.0  # the first line arrived before the subprocess went on
    assert not (tmp_path / ".compile_check.json").exists()  # the result file is removed


def test_a_gate_that_writes_no_result_reports_the_tail_of_its_other_output(tmp_path, monkeypatch):
    info = _fake_gate(tmp_path, monkeypatch, write=False, code=3)
    seen = []
    result = compile_gate.check_compiled(tmp_path, info, say=seen.append)
    err = result["error"]
    assert err.startswith("the compiled-model check wrote no result (exit 3): ") and err.endswith("last words\n")
    assert len(err) < 2100 and compile_gate.GATE_LINE not in err and len(seen) == 2


def test_a_gate_past_its_time_is_stopped_with_that_reason(tmp_path, monkeypatch):
    info = _fake_gate(tmp_path, monkeypatch, pause=30)
    import time

    t0 = time.perf_counter()
    result = compile_gate.check_compiled(tmp_path, info, timeout_s=1.0, say=lambda s: None)
    assert result == {"error": "the compiled-model check ran longer than 1 s"}
    assert time.perf_counter() - t0 < 20


class _Breaking:
    """A compile mode over three regions: with "bad" swapped in the compiled model raises when called (as CUDA
    graphs did on a ResNet-50 whose region op held tensors outside the graph's pool); "good" and "fine" are
    right and matched."""

    sets: list = []

    def __init__(self, patcher, use=None):
        self.use = list(use or [])
        _Breaking.sets.append(sorted(self.use))
        self.replaced = {}
        self.matched = {tid: 1 for tid in self.use}

    def compile(self, module, **kwargs):
        def run(*a, **k):
            if "bad" in self.use:
                raise RuntimeError("Detected 3 tensor(s) in the cudagraph pool not tracked as outputs.")
            return module(*a, **k)

        return run


def test_a_replacement_that_breaks_the_compiled_model_is_dropped_with_the_error_and_the_rest_kept(one_thread):
    import types

    module = torch.nn.Linear(8, 8).eval()
    target = types.SimpleNamespace(module=module, args=(torch.randn(4, 8),), kwargs={}, device="cpu")
    patcher = types.SimpleNamespace(targets=[], manifest={"regions": [{"id": "good"}, {"id": "bad"}, {"id": "fine"}]})
    _Breaking.sets = []
    said = []
    result = compile_gate.measure(target, patcher, _Breaking, budget_s=0.5, max_n=5, say=said.append,
                                  compile_plain=lambda m: _Slowed(m, 0.010))
    assert result["used"] == ["good", "fine"]
    bad = result["targets"]["bad"]
    assert bad["use"] is False and bad["compiled_ms"] is None and bad["reason"] == (
        "fails compiled: RuntimeError: Detected 3 tensor(s) in the cudagraph pool not tracked as outputs.")
    assert result["targets"]["good"]["use"] and result["targets"]["fine"]["use"]
    assert result["compiled_with"] is not None  # the kept set was measured, the error did not end the gate
    # all at once, then bisected: "good" alone, then "bad" and "fine", each alone, then the two winners together
    assert _Breaking.sets[0] == ["bad", "fine", "good"] and ["bad"] in _Breaking.sets
    assert _Breaking.sets[-1] == ["fine", "good"]
    assert any("fails compiled: RuntimeError" in s for s in said)


def test_an_interrupted_build_stops_the_gates_subprocess(tmp_path, monkeypatch):
    import _thread
    import os
    import threading

    info = _fake_gate(tmp_path, monkeypatch, pause=30)
    ctrl_c = threading.Timer(3.0, _thread.interrupt_main)  # the stand-in has started (and written its pid) by then
    ctrl_c.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            compile_gate.check_compiled(tmp_path, info, say=lambda s: None)
    finally:
        ctrl_c.cancel()
    pid = int((tmp_path / ".compile_check.json.pid").read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running for 30 s
        os.kill(pid, 0)
