"""End to end per model: eager, eager + package (apply), torch.compile (default, max-autotune),
the package's compile mode (default, max-autotune), with compile times and the max difference
from eager; each package pip-installed into a fresh --target dir, each model timed in its own process.

    python bench/compile_e2e.py [OUT_BASE] --pair MODEL.py=PACKAGE_DIR [--pair ...] [--device cuda] [--dtype D]
        [--modes default,max-autotune] [--n 50]

PACKAGE_DIR is what `forge-pack build --out` wrote. Writes OUT_BASE.json and OUT_BASE.md ($OUT/e2e.*
by default, else bench/results/e2e.*). Timing: CUDA-synchronised wall time per forward, 5 warm-up
calls, then n timed calls interleaved over the variants (drift hits all alike); medians and IQRs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, environment, out_path, write


def worker(model: str, package: str, device: str, dtype: str | None, modes: list[str], n: int) -> dict:
    import importlib

    import torch

    from forge_pack.evaluate.model_accuracy import compare_outputs, seeded_forward
    from forge_pack.evaluate.timing import summarize
    from forge_pack.profile.load import load

    pkg = importlib.import_module(package)
    target = load(model, device, dtype)
    module, args, kwargs = target.module, target.args, target.kwargs
    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def once(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        sync()
        return (time.perf_counter() - t0) * 1e6

    row: dict = {"compile_s": {}, "max_abs_diff": {}, "used": None}
    from forge_pack.evaluate.compile_gate import _raise_recompile_limit

    _raise_recompile_limit(4 * len(modes) + 4)  # each variant is another Dynamo cache entry
    variants: dict = {}
    with torch.no_grad():
        ref = seeded_forward(module, args, kwargs, device)
        variants["eager"] = module
        for mode in modes:
            kw = {} if mode == "default" else {"mode": mode}
            for label, make in ((f"compile[{mode}]", lambda m: torch.compile(m, **kw)),
                                (f"compile+package[{mode}]", lambda m: pkg.compile(m, **kw))):
                fn = make(module)  # each variant its own Dynamo cache entry (another backend)
                sync()
                t0 = time.perf_counter()
                out = seeded_forward(fn, args, kwargs, device)
                sync()
                row["compile_s"][label] = time.perf_counter() - t0
                row["max_abs_diff"][label] = compare_outputs(ref, out).get("max_abs_diff")
                variants[label] = fn
        row["used"] = pkg._COMPILE.report()
        # eager + package last: apply() patches globally, so nothing compiled after it sees the patches
        pkg.apply(module)
        out = seeded_forward(module, args, kwargs, device)
        row["max_abs_diff"]["eager+package"] = compare_outputs(ref, out).get("max_abs_diff")
        pkg.revert()
        times: dict[str, list[float]] = {k: [] for k in [*variants, "eager+package"]}
        for _ in range(5):
            for fn in variants.values():
                once(fn)
        for _ in range(n):
            for label, fn in variants.items():
                times[label].append(once(fn))
            pkg.apply(module)
            try:
                times["eager+package"].append(once(module))
            finally:
                pkg.revert()
    row["timing"] = {k: summarize(v, "monotonic").to_json() for k, v in times.items()}
    row["manifest_compile"] = pkg.manifest.get("compile_result")
    return row


def one(model: Path, package_dir: Path, device: str, dtype: str | None, modes: list[str], n: int, work: Path) -> dict:
    name = next(p.parent.name for p in package_dir.glob("*/_patch.py"))
    site = work / f"{name}-site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q",
                        "--target", str(site), str(package_dir)], capture_output=True, text=True, timeout=3600)
    row: dict = {"model": model.stem, "package": name}
    if r.returncode != 0:
        return {**row, "error": (r.stdout + r.stderr)[-3000:]}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    out = work / f"{name}.json"
    cmd = [sys.executable, __file__, "--worker", str(model), name, device, dtype or "", ",".join(modes), str(n),
           str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=5400, cwd=ROOT)
    if r.returncode != 0 or not out.is_file():
        return {**row, "error": (r.stdout + r.stderr)[-3000:]}
    return {**row, **json.loads(out.read_text())}


def markdown(rows: list[dict], cmd: str, env: dict) -> str:
    lines = ["# End to end: eager, eager + package, torch.compile, compile + package", "",
             f"Command: `{cmd}`", "", f"Environment: {json.dumps(env)}", ""]
    for r in rows:
        lines += [f"## {r['model']} ({r['package']})", ""]
        if r.get("error"):
            lines += ["```", r["error"], "```", ""]
            continue
        t = r["timing"]
        base = {k: t[k]["median_us"] for k in t}
        lines += ["| variant | median ms | IQR ms | vs eager | vs compile (same mode) | compile s | max abs diff |",
                  "|---|---|---|---|---|---|---|"]
        for k, v in t.items():
            mode = k[k.index("[") + 1:-1] if "[" in k else None
            plain = base.get(f"compile[{mode}]") if mode else None
            vs_c = f"{plain / v['median_us']:.2f}x" if plain and k.startswith("compile+package") else ""
            cs = r["compile_s"].get(k)
            d = r["max_abs_diff"].get(k)
            lines.append(f"| {k} | {v['median_us'] / 1e3:.3f} | {v['iqr_us'] / 1e3:.3f} "
                         f"| {base['eager'] / v['median_us']:.2f}x | {vs_c} | {f'{cs:.1f}' if cs else ''} "
                         f"| {f'{d:.3g}' if d is not None else ''} |")
        lines += ["", f"Replaced in the compiled graphs: {json.dumps(r['used'])}; "
                      f"the build's compile gate: {json.dumps(r.get('manifest_compile'))}", ""]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        model, package, device, dtype, modes, n, out = sys.argv[2:9]
        row = worker(model, package, device, dtype or None, modes.split(","), int(n))
        Path(out).write_text(json.dumps(row))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--pair", action="append", required=True, help="MODEL.py=PACKAGE_DIR")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None)
    p.add_argument("--modes", default="default,max-autotune")
    p.add_argument("--n", type=int, default=50)
    a = p.parse_args()
    base = out_path("e2e")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in a.pair:
            model, _, pkg = pair.partition("=")
            rows.append(one(Path(model).resolve(), Path(pkg).resolve(), a.device, a.dtype, a.modes.split(","), a.n,
                            Path(tmp)))
    cmd = "python bench/compile_e2e.py " + " ".join(sys.argv[1:])
    env = environment()
    write(base, {"command": cmd, "environment": env, "models": rows}, markdown(rows, cmd, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
