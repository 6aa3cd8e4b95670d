"""python -m <package> verify | bench | info

verify  re-runs the build's final check on this machine (the same rules file, shipped verbatim):
        the model's own tensors, fresh random inputs, sets derived from those by random transforms,
        adversarial inputs, each kernel against a float64 reference with the build's tolerance; a
        row per kernel and input; exit 1 on any failure.
bench   times each kernel against the original PyTorch op on this machine.
info    what the package accelerates, where it was measured, and whether it loads here.
export  an AOTInductor .pt2 of a model file (get_model/get_inputs), with the kernels compile mode uses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from . import _PATCHER


def _device() -> str:
    if _PATCHER.backend != "cuda":
        return "cpu"
    for i, ok in sorted(_PATCHER._caps.items()):
        if ok:
            return f"cuda:{i}"
    return "cuda"


def _kernel(t: dict):
    return next(p for p in _PATCHER.targets if p.id == t["id"]).fn


def _present(t: dict, x: dict) -> list:
    return [x[n] for n, s in t["signature"]["inputs"] if s is not None]


def cmd_verify(args) -> int:
    from . import _verify

    _PATCHER.load()  # before _device(): loading finds the GPUs the kernels can run on
    return _verify.run(_device(), fresh=args.random, seed=args.seed)


def _time(fn, device: str, n: int, warmup: int) -> dict:
    cuda = device.startswith("cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    q = lambda f: times[min(int(f * (len(times) - 1) + 0.5), len(times) - 1)]  # noqa: E731
    return {"median_us": q(0.5), "iqr_us": q(0.75) - q(0.25), "n": n}


def cmd_bench(args) -> int:
    from . import _verify

    if not _PATCHER.load():
        print(f"cannot benchmark on this machine: {_PATCHER.load_error}")
        return 1
    device = _device()
    state, message = _PATCHER.integrity
    edited = state == "edited"  # the manifest's own figures are not shown as measured
    rows = []
    for t in _PATCHER.manifest["targets"]:
        x = _verify.draw(t, "fresh", 7, device)
        kernel, present, eager = _kernel(t), _present(t, x), _verify.eager(t)
        with torch.inference_mode():
            e = _time(lambda: eager(x), device, args.n, args.warmup)
            k = _time(lambda: kernel(*present), device, args.n, args.warmup)
        rows.append({"id": t["id"], "signature": t["signature"]["pretty"], "eager": e, "kernel": k,
                     "speedup": e["median_us"] / max(k["median_us"], 1e-9),
                     "measured_speedup": None if edited else t["speedup"]["vs_eager"]})
    if args.json:
        print(json.dumps({"device": device, "targets": rows,
                          "integrity": {"state": state, "message": message}}, indent=2))
        return 0
    if edited:
        print(f"WARNING: {message}; the 'at build' column is left out")
    print(f"{'target':<6} {'eager us':>10} {'kernel us':>10} {'speedup':>8} {'at build':>9}  signature")
    for r in rows:
        at_build = "edited".rjust(9) if edited else f"{r['measured_speedup']:>8.2f}x"
        print(f"{r['id']:<6} {r['eager']['median_us']:>10.2f} {r['kernel']['median_us']:>10.2f} "
              f"{r['speedup']:>7.2f}x {at_build}  {r['signature']}")
    return 0


def cmd_info(args) -> int:
    m = _PATCHER.manifest
    loaded = _PATCHER.load()
    state, message = _PATCHER.integrity
    if args.json:
        print(json.dumps({"manifest": m, "status": _PATCHER.status(),
                          "integrity": {"state": state, "message": message}}, indent=2))
        return 0
    if state == "edited":  # said first, and the edited figures are not shown as measured below
        print(f"WARNING: {message}")
    env = m["environment"]
    print(f"{m['package']['name']} {m['package']['version']} (forge-pack {m['forge_pack_version']}, {m['created_at']})")
    print(f"model: {m['model']['name']} ({m['model']['path']}), device {m['model']['device']}")
    where = env["gpu_name"] or env.get("cpu") or "cpu"
    cc = f", compute capability {env['compute_capability']}" if env["compute_capability"] else ""
    cuda = f", CUDA {env['cuda']}" if m["backend"] == "cuda" else ""  # a CPU package's torch may have CUDA too
    print(f"measured on: {where}{cc}, torch {env['torch']}{cuda}")
    here = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU"
    print(f"this machine: torch {torch.__version__}, {here}")
    print(f"extension: {'loaded' if loaded else 'NOT loaded: ' + str(_PATCHER.load_error)}")
    print(f"figures: {state}: {message}")
    edited = state == "edited"
    for t in m["targets"]:
        s = t["speedup"]
        vc = f"{s['vs_compile']:.2f}x" if s["vs_compile"] else "n/a"
        figures = ("speedups not shown (edited after the build)" if edited else
                   f"{s['vs_eager']:.2f}x vs eager, {vc} vs torch.compile, {100 * t['time_share']:.1f}% of model time")
        print(f"  {t['id']}: {t['signature']['pretty']}  {figures}, via {', '.join(t['call_paths'])}")
    r = m["model_result"]
    if r and edited:
        print("whole model: not shown (edited after the build)")
    elif r:
        print(f"whole model: {r['eager']['median_us'] / 1e3:.3f} ms -> {r['patched']['median_us'] / 1e3:.3f} ms "
              f"({r['speedup']:.2f}x), max output difference {r['max_abs_diff']}")
        acc = r.get("accuracy") or {}
        if acc.get("eager_max_error") is not None:
            print(f"  error against the model in {acc.get('reference_dtype', 'float32')}: "
                  f"eager {acc['eager_max_error']:.3g}, "
                  f"patched {acc['patched_max_error']:.3g} (tolerance basis: {acc['basis']})")
    return 0


def cmd_export(args) -> int:
    from . import _COMPILE
    from ._compile import load_model_file

    model, margs, mkwargs = load_model_file(args.model, args.device or _device().split(":")[0], args.dtype)
    done = _COMPILE.export(model, margs, mkwargs, args.out)
    used = ", ".join(f"{k} ({v} calls)" for k, v in done["nodes"].items()) or "none (plain Inductor code)"
    print(f"wrote {done['path']}; the package's kernels in it: {used}")
    print(f"load it with: {_PATCHER.package}.load_exported({done['path']!r})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {_PATCHER.package}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="re-run the build's final check: every kernel against a float64 reference")
    v.add_argument("--random", type=int, default=3, help="fresh random input sets per kernel (default 3)")
    v.add_argument("--seed", type=int, default=None,
                   help="seed of the fresh and derived inputs (default: a new one each run)")
    b = sub.add_parser("bench", help="time each kernel against the original op")
    b.add_argument("--n", type=int, default=50, help="timed calls (default 50)")
    b.add_argument("--warmup", type=int, default=10)
    b.add_argument("--json", action="store_true")
    i = sub.add_parser("info", help="what the package accelerates and whether it loads here")
    i.add_argument("--json", action="store_true")
    e = sub.add_parser("export", help="an AOTInductor .pt2 of a model file, with the kernels that win compiled")
    e.add_argument("model", help="a model file defining get_model() and get_inputs()")
    e.add_argument("--out", default="model.pt2")
    e.add_argument("--device", default=None, help="cpu or cuda (default: the package's)")
    e.add_argument("--dtype", default=None, help="cast the model and inputs, e.g. bfloat16")
    args = parser.parse_args(argv)
    return {"verify": cmd_verify, "bench": cmd_bench, "info": cmd_info, "export": cmd_export}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
