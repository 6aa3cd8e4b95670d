"""python -m <package> verify | bench | info

verify  re-runs the build's final check on this machine (the same rules file, shipped verbatim):
        the model's own tensors, fresh random inputs, sets derived from those by random transforms,
        adversarial inputs, each kernel against a float64 reference with the build's tolerance; a
        row per kernel and input; exit 1 on any failure.
bench   times each kernel against the original PyTorch op on this machine, with the build's protocol
        (_bench.py: cache flush before every call, rotating input copies, warm-up, median with IQR
        and n), beside the build's figure; warns when the machine is busy.
info    what the package accelerates, where it was measured, and whether it loads here.
export  an AOTInductor .pt2 of a model file (get_model/get_inputs), with the kernels compile mode uses.
"""

from __future__ import annotations

import argparse
import json
import sys

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


def cmd_bench(args) -> int:
    import subprocess

    from . import _bench, _verify

    env = _bench.passive_rerun_env("cuda" if _PATCHER.backend == "cuda" else "cpu")
    if env is not None:  # the build's OpenMP wait policy, which only a fresh process can take
        argv = ["bench", "--n", str(args.n), "--warmup", str(args.warmup)] + (["--json"] if args.json else [])
        return subprocess.run([sys.executable, "-m", _PATCHER.package, *argv], env=env).returncode
    if not _PATCHER.load():
        print(f"cannot benchmark on this machine: {_PATCHER.load_error}")
        return 1
    device = _device()
    state, message = _PATCHER.integrity
    edited = state == "edited"  # the manifest's own figures are not shown as measured
    rows = []
    for t in _PATCHER.manifest["targets"]:
        x = _verify.draw(t, "fresh", 7, device)
        kernel, eager = _kernel(t), _verify.eager(t)
        pair = _bench.bench_pair(eager, lambda xs, t=t, kernel=kernel: kernel(*_present(t, xs)), x, device,
                                 args.n, args.warmup)
        rows.append({"id": t["id"], "signature": t["signature"]["pretty"], **pair,
                     "measured_speedup": None if edited else t["speedup"]["vs_eager"]})
    warnings = _bench.busy_warnings(rows, _bench.load_average(), _bench.core_count())
    if args.json:
        print(json.dumps({"device": device, "targets": rows, "warnings": warnings,
                          "load_average": _bench.load_average(), "cores": _bench.core_count(),
                          "integrity": {"state": state, "message": message}}, indent=2))
        return 0
    print(_bench.format_report(rows, device, warnings, message if edited else None, args.warmup))
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
    for line in build_lines(m, _PATCHER.build_info):
        print(line)
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


def build_lines(m: dict, built: dict) -> list[str]:
    """What the installed extension was compiled for: torch, Python ABI, CPU instruction set, GPU
    architectures (from _build_info.json, written by setup.py, and the manifest's build record)."""
    b = m["build"]
    if not built:
        return ["built for: unknown (no _build_info.json: the extension was not built by this package's setup.py)"]
    cuda = f" (CUDA {built['cuda']})" if built.get("cuda") and m["backend"] == "cuda" else ""
    abi = built.get("python_abi") or "unknown"
    abi_text = (f"{abi} (CPython {abi[2]}.{abi[3:].split('-')[0]} and later)" if abi.endswith("-abi3")
                else f"{abi} (this CPython only)")
    isa = built.get("cpu_isa") or b.get("cpu_isa") or "compiler default"
    lines = [f"built for: torch {built.get('torch')}{cuda}, Python ABI {abi_text}, CPU ISA {isa}"]
    if m["backend"] == "cuda":
        archs = built.get("cuda_arch_list") or b.get("cuda_arch_list") or ""
        lines.append("GPU architectures: " + ", ".join(f"sm_{a.replace('.', '')}" for a in archs.split())
                     + f" (compute capability {archs})")
    return lines


def cmd_export(args) -> int:
    from . import _COMPILE
    from ._compile import load_model_file

    model, margs, mkwargs = load_model_file(args.model, args.device or _device().split(":")[0], args.dtype)
    done = _COMPILE.export(model, margs, mkwargs, args.out)
    used = ", ".join([*(f"{k} ({v} calls)" for k, v in done["nodes"].items()),
                      *(f"{k} ({v} regions)" for k, v in (done.get("regions") or {}).items())]) \
        or "none (plain Inductor code)"
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
    b.add_argument("--n", type=int, default=50, help="timed calls (default 50; on CUDA at least 30)")
    b.add_argument("--warmup", type=int, default=10, help="untimed calls first (default 10)")
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
