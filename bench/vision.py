"""Vision models with forge-pack's convolution epilogue regions in compile mode, on the GPU.

    python bench/vision.py [BASE] [--models resnet18,resnet50] [--batches 1,256] [--dtype bfloat16]
                           [--region-compile 2] [--smoke] [--merge A.json B.json]

Per model (torchvision, built from its config with random weights and randomised batch_norm statistics,
eval, channels_last, --dtype) and batch, one process, CUDA events (median of 30 calls after 10):

  eager             the model as it is
  compile           torch.compile(model) (Inductor, default mode)
  compile_freezing  torch.compile(model, options={"freezing": True}) (Inductor folds the batch_norms itself)
  compile_ro        torch.compile(model, mode="reduce-overhead") (CUDA graphs; GPU only)
  compile_package   the package's compile mode (templates/package/_compile.py): Inductor, with every
                    conv -> batch_norm (-> add) (-> relu) chain swapped for the conv region's op
  compile_package_ro  the same with mode="reduce-overhead" (GPU only)
  eager_package     not measured: eager apply() leaves conv regions to compile mode (docs/package.md)

The package is assembled in this process from forge-pack's own parts, without a search: the graph
captured (graph/capture, export route), the chains found (graph/conv_chain), folded, checked and timed
(graph/conv_hotspots: folded conv + eager epilogue and cuDNN's fused call against the float64 chain,
timing.time_calls), each epilogue signature's kernel the generated `region` pointwise family at its
default knobs (compiled with NVRTC, launched in this process, checked against the epilogue's reference
on the captured inputs; a search would pick knobs), the manifest regions written by pack/conv_pack
(the library call where it verified and was faster than folded conv + kernel). Per conv region: eager
chain, folded conv, epilogue kernel, ours (folded conv + kernel), cuDNN's fused call, the candidate
chosen, and for the --region-compile largest regions Inductor's time for the chain alone.

Max |difference| of each variant's output against the same model in float32. Writes BASE.{md,json}
(default bench/results/vision). --smoke runs the plumbing on the CPU on tests/models/regions/conv_bn_block.py
(the epilogue then runs eagerly). --merge joins result files of several calls.

On the H200, in two device calls (estimated, dominated by Inductor's cold compiles, three per case):
    R=bench/results
    python bench/vision.py $R/vision_resnet50 --models resnet50     # ~5 min
    python bench/vision.py $R/vision_resnet18 --models resnet18     # ~3 min
    python bench/vision.py --merge $R/vision_resnet50.json $R/vision_resnet18.json    # writes $R/vision.{md,json}
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import itertools
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import _common  # noqa: E402

_COUNT = itertools.count()
_LIBS: list = []


def _template(file: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "templates" / "package" / file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def time_ms(fn, device: str, reps: int = 30, warm: int = 10) -> float:
    import torch

    for _ in range(warm):
        fn()
    if device != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def epilogue_op(ns: str, name: str, sig, device: str, lib):
    """Define ``ns::name`` computing the epilogue: the generated CUDA kernel (default knobs) on CUDA, the
    epilogue's eager reference on the CPU. Returns a label of what runs."""
    import torch

    from forge_pack.graph import canonical

    out = sig.output
    form = sig.param("form")
    args = ", ".join(f"Tensor in{k}" for k in range(len(sig.inputs)))
    lib.define(f"{name}({args}) -> Tensor")
    if device == "cuda":
        from forge_pack.evaluate.compile import compile_candidate
        from forge_pack.evaluate.launch import load_module, plan
        from forge_pack.search.templates_proposer import applicable_families, instantiate

        fam = applicable_families(sig, "cuda")[0]
        cand = instantiate("region", "cuda", fam.name, None, sig)
        build = compile_candidate(cand)
        if not build.ok:
            raise RuntimeError(f"the epilogue kernel did not compile: {build.log[-2000:]}")
        module = load_module("cuda", build.path, [k.name for k in cand.spec.kernels])
        launch = _launcher(module, plan(cand.spec, sig))
        label = f"{fam.name}({', '.join(f'{k}={v}' for k, v in sorted(cand.params.items()))})"

        def impl(*tensors):
            res = torch.empty_strided(out.shape, out.strides, dtype=getattr(torch, out.dtype), device=tensors[0].device)
            launch({**{f"in{k}": t for k, t in enumerate(tensors)}, "out": res})
            return res
    else:
        ref = canonical.rebuild(form, device)
        label = "eager epilogue (CPU smoke run)"

        def impl(*tensors):
            return ref(*tensors)

    lib.impl(name, impl, "CompositeExplicitAutograd")

    def fake(*tensors):
        return torch.empty_strided(out.shape, out.strides, dtype=getattr(torch, out.dtype), device=tensors[0].device)

    torch.library.register_fake(f"{ns}::{name}", lib=lib)(fake)
    return label, impl


def _launcher(module, p):
    """Launch the planned kernels with the tensors given, the argument array built once (the package's
    compiled binding does the same in C++; the evaluator's ``bind`` rebuilds it per call, ~tens of µs)."""
    import ctypes

    import torch

    from forge_pack.evaluate.launch import check_dims

    if p.workspaces:
        raise RuntimeError("the epilogue kernel needs a workspace: not supported by this bench")
    slots: dict[str, ctypes.c_void_p] = {}
    calls, keep = [], []
    for launch in p.launches:
        problem = check_dims(launch, "cuda")
        if problem:
            raise RuntimeError(problem)
        module.prepare(launch)
        values = []
        for kind, value in launch.args:
            if kind == "ptr":
                values.append(slots.setdefault(value, ctypes.c_void_p(0)))
            else:
                values.append({"i32": ctypes.c_int32, "i64": ctypes.c_int64}.get(kind, ctypes.c_float)(value))
        params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        keep.append((values, params))
        calls.append((module.funcs[launch.name], launch, params))
    lib, check = module.driver.lib, module.driver.check

    def run(tensors: dict) -> None:
        for name, slot in slots.items():
            slot.value = tensors[name].data_ptr()
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for f, l, params in calls:
            code = lib.cuLaunchKernel(f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
                                      l.shared_mem, stream, params, None)
            if code:
                check(code, f"cuLaunchKernel({l.name})")

    run._keep = keep  # type: ignore[attr-defined]
    return run


def build_package(model, x, workdir: Path, device: str, say):
    """(CompileMode, manifest regions, per-epilogue notes) for `model` on input `x`."""
    import torch

    from forge_pack.evaluate import conv_check
    from forge_pack.graph import canonical, conv_fold
    from forge_pack.graph.capture import capture
    from forge_pack.graph.conv_chain import epilogue_perm, epilogue_region, find_conv_chains
    from forge_pack.graph.conv_hotspots import conv_hotspots, keep_names
    from forge_pack.pack.conv_pack import conv_regions

    t0 = time.perf_counter()
    g = capture(model, (x,), profile=False, routes=("export",))
    chains = find_conv_chains(g)
    values = g.run(keep=keep_names(chains))
    say(f"captured: {len(chains)} conv chains ({time.perf_counter() - t0:.1f} s)")
    # no captures on disk (a B256 activation is hundreds of MB): the epilogue's inputs are made here
    hotspots = conv_hotspots(chains, values, workdir, say=say, captures_per_region=0)
    first = {}
    for c in chains:
        first.setdefault(epilogue_region(c).key, c)
    ns = f"forge_vision_{next(_COUNT)}"
    lib = torch.library.Library(ns, "DEF")
    _LIBS.append(lib)
    targets, winners, epilogues = [], [], []
    for i, h in enumerate(hotspots):
        if h.unsupported:
            say(f"epilogue {h.id}: skipped ({h.unsupported})")
            continue
        label, impl = epilogue_op(ns, f"e{i}", h.signature, device, lib)
        c = first[canonical.key(h.signature.param("form"))]
        epi = epilogue_region(c)
        cin = [values[n] for n in c.region.inputs]
        w, b, _ = conv_check.folded_params(c, cin)
        with torch.no_grad():
            y = conv_fold.conv(cin[c.index("x")], w, None, c.conv_args())
            ins = conv_fold.epilogue_args(epi.inputs, epilogue_perm(c), y, b,
                                          cin[c.index("residual")] if c.residual else None)
            want = epi.reference(device)(*ins)
            got = impl(*ins)
        diff = (got.double() - want.double()).abs().max().item()
        kernel_us = conv_check.time_us(impl, ins, device).get("median_us", float("nan"))
        epilogues.append({"id": f"e{i}", "name": h.id, "kernel": label, "max_abs_vs_reference": diff,
                          "kernel_us": kernel_us})
        targets.append({"hotspot_id": h.id, "id": f"e{i}", "torch_op": f"{ns}::e{i}",
                        "timing": {"kernel": {"median_us": kernel_us}}})
        winners.append(types.SimpleNamespace(hotspot=h))
    del values
    pkg = workdir / "pkg"
    pkg.mkdir(exist_ok=True)
    regions = conv_regions(winners, targets, workdir, pkg, ns)
    for r in regions:
        for inst in r["conv"]["instances"]:
            inst["file"] = str(pkg / inst["file"])
        r["compile"] = {"use": True, "reason": "bench: every conv region", "compiled_ms": None, "compiled_with_ms": None}
    arch = "%d.%d" % torch.cuda.get_device_capability() if device == "cuda" else None
    doc = {"package": {"name": "vision_bench", "version": "0", "namespace": ns}, "backend": device,
           "targets": [], "build": {"cuda_arch_list": arch}, "regions": regions}
    patch = _template("_patch.py", f"_vision_patch_{ns}")
    comp = _template("_compile.py", f"_vision_compile_{ns}")
    cm = comp.CompileMode(patch.Patcher(doc, "vision_bench", lambda: None))
    say(f"package: {len(regions)} conv regions, {len(epilogues)} epilogue kernels ({time.perf_counter() - t0:.1f} s)")
    return cm, regions, epilogues


def region_rows(regions: list[dict], epilogues: list[dict]) -> list[dict]:
    kernel = {e["id"]: e for e in epilogues}
    rows = []
    for r in regions:
        c = r["conv"]
        t = c["timing"]
        e = kernel[c["epilogue"]["target"]]
        eager = (t.get("eager") or {}).get("median_us")
        conv = (t.get("folded_conv") or {}).get("median_us")
        lib = (t.get("library") or {}).get("median_us")
        ours = conv + e["kernel_us"] if conv is not None else None
        rows.append({"id": r["id"], "name": r["name"], "pattern": c["pattern"], "instances": len(c["instances"]),
                     "eager_us": eager, "folded_conv_us": conv, "epilogue_us": e["kernel_us"], "ours_us": ours,
                     "library_us": lib, "candidate": c["candidate"], "choice": c["choice"],
                     "library_check": (c["checks"].get("library") or {}).get("reason"),
                     "ours_vs_eager": eager / ours if eager and ours else None,
                     "library_vs_eager": eager / lib if eager and lib else None})
    return rows


def chain_compile_us(regions: list[dict], top: int, device: str) -> dict:
    """Inductor's time for the `top` largest chains alone (their reference subgraph compiled)."""
    import torch

    from forge_pack.graph import canonical

    out = {}
    ranked = sorted(regions, key=lambda r: -((r["conv"]["timing"].get("eager") or {}).get("median_us") or 0)
                    * len(r["conv"]["instances"]))
    for r in ranked[:top]:
        ref = canonical.rebuild(r["form"], device)
        ins = [torch.empty_strided(s["shape"], s["strides"], dtype=getattr(torch, s["dtype"]), device=device).normal_()
               for s in r["form"]["inputs"]]
        var = r["conv"]["roles"].index("running_var")
        ins[var] = ins[var].abs() + 0.5
        torch._dynamo.reset()
        fn = torch.compile(ref)
        with torch.no_grad():
            out[r["id"]] = 1e3 * time_ms(lambda: fn(*ins), device)
    return out


def _model(name: str, device: str, dtype, smoke: bool):
    import torch

    if smoke:
        sys.path.insert(0, str(ROOT / "tests" / "models" / "regions"))
        import conv_bn_block

        m = conv_bn_block.get_model()
    else:
        import torchvision

        torch.manual_seed(0)
        m = getattr(torchvision.models, name)(weights=None)
        with torch.no_grad():
            for mod in m.modules():
                if isinstance(mod, torch.nn.BatchNorm2d):
                    mod.running_mean.normal_(0.0, 0.1)
                    mod.running_var.uniform_(0.5, 2.0)
                    mod.weight.normal_(1.0, 0.1)
                    mod.bias.normal_(0.0, 0.1)
    return m.eval().to(device).to(memory_format=torch.channels_last), m


def run_case(name: str, batch: int, device: str, dtype, smoke: bool, region_compile: int, say,
             progress=lambda row: None) -> dict:
    """One model at one batch. ``progress(row)`` is called with the row so far after each step, so a
    run cut short (a time-limited device call) still leaves what it measured."""
    import torch

    m32, _ = _model(name, device, torch.float32, smoke)
    model = copy.deepcopy(m32).to(dtype)
    shape = (batch, 16, 8, 8) if smoke else (batch, 3, 224, 224)
    torch.manual_seed(1)
    x32 = torch.randn(shape, device=device).contiguous(memory_format=torch.channels_last)
    x = x32.to(dtype)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # the yardstick in full float32, not TF32
    with torch.no_grad():
        gold = m32(x32).double()
    torch.backends.cudnn.allow_tf32 = tf32
    row = {"model": name, "batch": batch, "dtype": str(dtype).replace("torch.", ""), "ms": {}, "max_abs_vs_fp32": {},
           "compile_s": {}}

    def measure(label, fn, compile_first=False):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = fn(x)
        if compile_first:
            row["compile_s"][label] = time.perf_counter() - t0
        row["max_abs_vs_fp32"][label] = (out.double() - gold).abs().max().item()
        del out  # a CUDA graph's output: the next replay overwrites it
        with torch.no_grad():
            row["ms"][label] = time_ms(lambda: fn(x), device)
        took = f" (compiled in {row['compile_s'][label]:.1f} s)" if compile_first else ""
        say(f"{name} B{batch} {label}: {row['ms'][label]:.3f} ms{took}")
        progress(row)

    measure("eager", model)
    torch._dynamo.reset()
    measure("compile", torch.compile(model), True)
    torch._dynamo.reset()
    measure("compile_freezing", torch.compile(model, options={"freezing": True}), True)
    if device == "cuda":  # CUDA graphs: what a small batch deploys with (no launch overhead)
        torch._dynamo.reset()
        measure("compile_ro", torch.compile(model, mode="reduce-overhead"), True)
    with tempfile.TemporaryDirectory() as tmp:
        cm, regions, epilogues = build_package(model, x, Path(tmp), device, say)
        row["regions"] = region_rows(regions, epilogues)
        progress(row)
        say(f"{name} B{batch} compile_package: compiling")
        torch._dynamo.reset()
        measure("compile_package", cm.compile(model), True)
        # the op's own calls count the replacements (cm.report() counts only graphs Inductor compiled
        # anew, not those it loaded from its cache)
        row["regions_replaced"] = cm.report()["regions"]
        if device == "cuda":
            torch._dynamo.reset()
            measure("compile_package_ro", cm.compile(model, mode="reduce-overhead"), True)
        row["regions"] = region_rows(regions, epilogues)
        row["epilogues"] = epilogues
        if region_compile and device == "cuda":
            comp = chain_compile_us(regions, region_compile, device)
            for r in row["regions"]:
                if r["id"] in comp:
                    r["compile_us"] = comp[r["id"]]
                    r["ours_vs_compile"] = comp[r["id"]] / r["ours_us"] if r["ours_us"] else None
                    r["library_vs_compile"] = comp[r["id"]] / r["library_us"] if r["library_us"] else None
        calls = {}
        impls = [m for k, m in sys.modules.items() if k.endswith("_conv_regions") and hasattr(m, "IMPLS")]
        for mod in impls:
            for qual, impl in mod.IMPLS.items():
                if regions and qual.startswith(regions[0]["op"].partition("::")[0] + "::"):
                    calls[qual.partition("::")[2]] = dict(impl.calls)
        row["region_calls"] = calls
    row["eager_package"] = "not measured: eager apply() leaves conv regions to compile mode"
    ms = row["ms"]
    row["speedup"] = {"package_vs_compile": ms["compile"] / ms["compile_package"],
                      "package_vs_freezing": ms["compile_freezing"] / ms["compile_package"],
                      "package_vs_eager": ms["eager"] / ms["compile_package"],
                      "best_package_vs_best_compile": best_compile(ms) / best_package(ms)}
    if "compile_package_ro" in ms:
        row["speedup"]["package_ro_vs_compile_ro"] = ms["compile_ro"] / ms["compile_package_ro"]
    return row


def best_compile(ms: dict) -> float:
    """The fastest of torch.compile's modes measured (default, freezing, reduce-overhead)."""
    return min(ms[k] for k in ("compile", "compile_freezing", "compile_ro") if k in ms)


def best_package(ms: dict) -> float:
    return min(ms[k] for k in ("compile_package", "compile_package_ro") if k in ms)


def markdown(doc: dict) -> str:
    lines = ["# Vision: convolution epilogue regions in compile mode", "",
             f"Command: `{doc['command']}`  ", f"Environment: {doc['environment']}  ",
             f"Commit: {doc.get('commit') or '?'}", "",
             "| model | batch | eager ms | compile ms | compile freezing ms | compile reduce-overhead ms "
             "| compile+package ms | compile+package reduce-overhead ms | package vs compile | vs freezing "
             "| best package vs best compile | max abs vs fp32 (eager / compile / package) | conv regions run folded |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["rows"]:
        ms, d = r["ms"], r["max_abs_vs_fp32"]

        def cell(k):
            return f"{ms[k]:.3f}" if k in ms else "-"

        lines.append(f"| {r['model']} | {r['batch']} | {ms['eager']:.3f} | {ms['compile']:.3f} | "
                     f"{ms['compile_freezing']:.3f} | {cell('compile_ro')} | {ms['compile_package']:.3f} | "
                     f"{cell('compile_package_ro')} | "
                     f"{r['speedup']['package_vs_compile']:.2f}x | {r['speedup']['package_vs_freezing']:.2f}x | "
                     f"{best_compile(ms) / best_package(ms):.2f}x | "
                     f"{d['eager']:.3g} / {d['compile']:.3g} / {d['compile_package']:.3g} | "
                     f"{sum(1 for c in r['region_calls'].values() if c['folded'])} of {len(r['regions'])} |")
    lines += ["", "eager + package: not measured (eager `apply()` leaves conv regions to compile mode).", ""]
    for r in doc["rows"]:
        lines += [f"## {r['model']} batch {r['batch']}: per conv region", "",
                  "| region | pattern | x | eager µs | folded conv µs | epilogue µs | ours µs | cuDNN fused µs "
                  "| Inductor µs | ours vs eager | ours vs Inductor | chosen |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

        def f(v, fmt="{:.1f}"):
            return fmt.format(v) if isinstance(v, (int, float)) else "-"

        for g in r["regions"]:
            lines.append(f"| {g['id']} | {g['pattern']} | {g['instances']} | {f(g['eager_us'])} | "
                         f"{f(g['folded_conv_us'])} | {f(g['epilogue_us'])} | {f(g['ours_us'])} | {f(g['library_us'])} | "
                         f"{f(g.get('compile_us'))} | {f(g['ours_vs_eager'], '{:.2f}x')} | "
                         f"{f(g.get('ours_vs_compile'), '{:.2f}x')} | {g['candidate']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("base", nargs="?")
    p.add_argument("--models", default="resnet18,resnet50")
    p.add_argument("--batches", default="1,256")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--region-compile", type=int, default=2, help="Inductor times for this many largest chains")
    p.add_argument("--smoke", action="store_true", help="CPU plumbing run on tests/models/regions/conv_bn_block.py")
    p.add_argument("--merge", nargs="+", help="join these result .json files into BASE (no measurement)")
    a = p.parse_args()
    if a.merge:
        import json

        docs = [json.loads(Path(f).read_text()) for f in a.merge]
        commits = list(dict.fromkeys(d.get("commit") or "?" for d in docs))
        doc = {"command": " && ".join(d["command"] for d in docs), "environment": docs[0]["environment"],
               "commit": " / ".join(commits),
               "seconds": sum(d["seconds"] for d in docs), "rows": [r for d in docs for r in d["rows"]]}
        _common.write(_common.out_path("vision"), doc, markdown(doc))
        return
    base = _common.out_path("vision_smoke" if a.smoke else "vision")
    device = "cpu" if a.smoke else "cuda"
    dtype = torch.float32 if a.smoke else getattr(torch, a.dtype)
    models = ["conv_bn_block"] if a.smoke else a.models.split(",")
    batches = [2] if a.smoke else [int(b) for b in a.batches.split(",")]
    say = lambda m: print(f"[vision] {m}", file=sys.stderr, flush=True)  # noqa: E731

    rows = []
    t0 = time.perf_counter()
    partial = Path(f"{base}.partial.json")

    def progress(row):
        import json

        partial.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "complete": False,
                                       "rows": rows + [row]}, indent=1, default=str))

    for name in models:
        for batch in batches:
            rows.append(run_case(name, batch, device, dtype, a.smoke, a.region_compile, say, progress))
    doc = {"command": "python " + " ".join(sys.argv), "environment": _common.environment(),
           "commit": _common.commit(), "seconds": time.perf_counter() - t0, "rows": rows}
    _common.write(base, doc, markdown(doc))
    partial.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
