"""End to end per model: eager, eager + package (apply), torch.compile (default, max-autotune), the
package's compile mode (same modes), and the package's AOTInductor export (.pt2); compile and export
times, the ratios against eager and against torch.compile of the same mode, and the max difference
from eager. Each package is pip-installed into a fresh --target dir, each model timed in its own process.

    python bench/compile_e2e.py [OUT_BASE] --pair MODEL.py=PACKAGE [--pair ...] [--device cuda] [--dtype D]
        [--modes default,max-autotune] [--n 50] [--budget-s 360] [--no-pt2] [--small] [--previous E2E.json ...]

PACKAGE is what `forge-pack build --out` wrote, or a .tar.gz of it (bench/real_models.py leaves
<model>_pkg.tar.gz). Writes OUT_BASE.json and OUT_BASE.md ($OUT/e2e.* by default, else bench/results/e2e.*).
Timing: CUDA-synchronised wall time per forward, 5 warm-up calls, then n timed calls interleaved over the
variants (drift hits all alike); medians and IQRs. --budget-s bounds one model's worker: a variant whose
compile would not end within it (estimated from the compiles done: see expected_s) is skipped and listed
as skipped, so one model fits in one device call. --previous puts the rows of earlier calls' e2e.json
first, so the modes of one model measured in two calls, or several models, make one report.

One model in one device call (H200, at most 10 min): pip install (nvcc, ~1-2 min) + the worker's
--budget-s (360 s by default) + the timed calls. The package comes from an earlier call, e.g.
    python -m forge_pack build bench/models/resnet50.py --device cuda --out $OUT/resnet50_pkg \
        --name resnet50_forge --budget 8 --time-limit 5 --allow-no-gain && tar czf $OUT/resnet50_pkg.tar.gz -C $OUT resnet50_pkg
then   python bench/compile_e2e.py $OUT/e2e --pair bench/models/resnet50.py=resnet50_pkg.tar.gz --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _common import ROOT, commit, environment, out_path, write


STAGE = "e2e-stage: "  # the worker's progress on stderr: a worker that dies says where


def stage(label: str) -> None:
    print(STAGE + label, file=sys.stderr, flush=True)


def worker(model: str, package: str, device: str, dtype: str | None, modes: list[str], n: int, budget_s: float,
           pt2_dir: str | None) -> dict:
    import importlib

    import torch

    from forge_pack.evaluate.model_accuracy import compare_outputs, seeded_forward
    from forge_pack.evaluate.timing import summarize
    from forge_pack.profile.load import load

    start = time.perf_counter()
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

    row: dict = {"compile_s": {}, "max_abs_diff": {}, "used": None, "skipped": [], "errors": {}}
    from forge_pack.evaluate.compile_gate import _raise_recompile_limit

    _raise_recompile_limit(4 * len(modes) + 4)  # each variant is another Dynamo cache entry
    variants: dict = {}

    def first(label: str, fn) -> None:
        """The first call compiles: its time is the compile time; its output is compared with eager's."""
        stage(label)
        sync()
        t0 = time.perf_counter()
        out = seeded_forward(fn, args, kwargs, device)
        sync()
        row["compile_s"][label] = time.perf_counter() - t0
        row["max_abs_diff"][label] = compare_outputs(ref, out).get("max_abs_diff")
        variants[label] = fn

    def expected_s(label: str) -> float:
        """How long the variant's compile will take, from the ones done (a compile must also end within the
        budget): compile+package ~1.5x plain compile of its mode, max-autotune ~4x default, the .pt2 ~1.5x
        default (a whole AOTInductor build)."""
        done = row["compile_s"]
        default = done.get("compile[default]", 0.0)
        if label.startswith("compile+package["):
            return 1.5 * done.get(label.replace("compile+package", "compile"), 4 * default)
        if label.startswith("compile[") and label != "compile[default]":
            return 4 * default
        return 1.5 * default if label == ".pt2" else 0.0

    with torch.no_grad():
        ref = seeded_forward(module, args, kwargs, device)
        variants["eager"] = module
        for mode in modes:
            kw = {} if mode == "default" else {"mode": mode}
            for label, make in ((f"compile[{mode}]", lambda m: torch.compile(m, **kw)),
                                (f"compile+package[{mode}]", lambda m: pkg.compile(m, **kw))):
                if time.perf_counter() - start + expected_s(label) > budget_s:
                    row["skipped"].append(label)
                    continue
                try:
                    first(label, make(module))  # each variant its own Dynamo cache entry (another backend)
                except Exception as e:  # noqa: BLE001 - one variant failing leaves the others' figures
                    row["errors"][label] = f"{type(e).__name__}: {str(e)[:1500]}"
        row["used"] = pkg._COMPILE.report()
        if pt2_dir is not None:
            label = ".pt2"
            if time.perf_counter() - start + expected_s(label) > budget_s:
                row["skipped"].append(label)
            else:
                try:
                    stage(".pt2 export")
                    t0 = time.perf_counter()
                    done = pkg.export(module, args, kwargs, str(Path(pt2_dir) / f"{package}.pt2"))
                    row["export_s"] = time.perf_counter() - t0
                    row["pt2"] = {"used": done.get("used"), "nodes": done.get("nodes"), "regions": done.get("regions"),
                                  "bytes": Path(done["path"]).stat().st_size}
                    first(label, pkg.load_exported(done["path"]))
                except Exception as e:  # noqa: BLE001
                    row["errors"][label] = f"{type(e).__name__}: {str(e)[:1500]}"
        # eager + package last: apply() patches globally, so nothing compiled after it sees the patches
        stage("eager+package")
        pkg.apply(module)
        out = seeded_forward(module, args, kwargs, device)
        row["max_abs_diff"]["eager+package"] = compare_outputs(ref, out).get("max_abs_diff")
        pkg.revert()
        stage("timing")
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
    row["worker_s"] = time.perf_counter() - start
    return row


def _package_dir(package: Path, work: Path) -> Path:
    """A package directory: PACKAGE itself, or the one a .tar.gz of it unpacks to."""
    if package.is_dir():
        return package
    dest = work / package.name.replace(".tar.gz", "")
    with tarfile.open(package) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # a Python without extraction filters: the tarballs are our own
            tar.extractall(dest)
    return next(p.parent.parent for p in dest.glob("**/*/_patch.py"))


def one(model: Path, package: Path, device: str, dtype: str | None, modes: list[str], n: int, work: Path,
        budget_s: float, pt2: bool, env_extra: dict) -> dict:
    row: dict = {"model": model.stem, "package": package.name}
    try:
        package_dir = _package_dir(package, work)
    except (OSError, tarfile.TarError, StopIteration) as e:
        return {**row, "error": f"no package in {package}: {e}"}
    name = next(p.parent.name for p in package_dir.glob("*/_patch.py"))
    row["package"] = name
    site = work / f"{name}-site"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q",
                        "--target", str(site), str(package_dir)], capture_output=True, text=True, timeout=3600)
    row["install_s"] = time.perf_counter() - t0
    if r.returncode != 0:
        return {**row, "error": (r.stdout + r.stderr)[-3000:]}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), **env_extra)
    out = work / f"{name}.json"
    cmd = [sys.executable, __file__, "--worker", str(model), name, device, dtype or "", ",".join(modes), str(n),
           str(out), str(budget_s), str(work) if pt2 else ""]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=5400, cwd=ROOT)
    if (r.returncode != 0 or not out.is_file()) and pt2 and _last_stage(r.stderr) in (".pt2 export", ".pt2"):
        # the AOTInductor export or its load took the worker down (no Python exception to catch): the
        # other variants measured again without it, the crash recorded as the .pt2's error
        crash = _died(r)
        r = subprocess.run(cmd[:-1] + [""], capture_output=True, text=True, env=env, timeout=5400, cwd=ROOT)
        if r.returncode == 0 and out.is_file():
            done = {**row, **json.loads(out.read_text())}
            done.setdefault("errors", {})[".pt2"] = crash
            return done
    if r.returncode != 0 or not out.is_file():
        return {**row, "error": _died(r)}
    return {**row, **json.loads(out.read_text())}


def _last_stage(stderr: str) -> str | None:
    marks = [line[len(STAGE):] for line in stderr.splitlines() if line.startswith(STAGE)]
    return marks[-1] if marks else None


def _died(r: subprocess.CompletedProcess) -> str:
    """What a failed worker said: its exit status (a signal where it was killed), the stage it was in, and the
    end of its output."""
    code = r.returncode
    how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    where = _last_stage(r.stderr)
    tail = "\n".join(line for line in (r.stdout + r.stderr).splitlines() if not line.startswith(STAGE))[-2500:]
    return f"the worker ended ({how}){f' during {where}' if where else ''}:\n{tail}"


def ratios(r: dict) -> dict:
    """Per variant: eager / variant, and torch.compile of the same mode / variant (compile+package, .pt2)."""
    t = {k: v["median_us"] for k, v in r["timing"].items()}
    out = {}
    for k, v in t.items():
        mode = k[k.index("[") + 1:-1] if "[" in k else ("default" if k == ".pt2" else None)
        plain = t.get(f"compile[{mode}]") if mode and not k.startswith("compile[") else None
        out[k] = {"vs_eager": t["eager"] / v, "vs_compile": plain / v if plain else None}
    return out


def markdown(rows: list[dict], cmd: str, env: dict) -> str:
    lines = ["# End to end: eager, eager + package, torch.compile, compile + package, .pt2", "",
             f"Command: `{cmd}`", "", f"Environment: {json.dumps(env)}", "",
             "`vs compile`: torch.compile of the same mode (`default` for the .pt2) over the variant's median.", ""]
    for r in rows:
        lines += [f"## {r['model']} ({r['package']})", "", f"Command: `{r.get('command', cmd)}`", ""]
        if r.get("error"):
            lines += ["```", r["error"], "```", ""]
            continue
        t, rat = r["timing"], r["ratios"]
        lines += ["| variant | median ms | IQR ms | vs eager | vs compile | compile s | max abs diff |",
                  "|---|---|---|---|---|---|---|"]
        for k, v in t.items():
            cs = r["export_s"] if k == ".pt2" else r["compile_s"].get(k)
            d = r["max_abs_diff"].get(k)
            vs_c = rat[k]["vs_compile"]
            lines.append(f"| {k} | {v['median_us'] / 1e3:.3f} | {v['iqr_us'] / 1e3:.3f} | {rat[k]['vs_eager']:.2f}x "
                         f"| {f'{vs_c:.2f}x' if vs_c else ''} | {f'{cs:.1f}' if cs else ''} "
                         f"| {f'{d:.3g}' if d is not None else ''} |")
        lines += ["", f"Swapped in by compile mode: {json.dumps(r['used'])}; in the .pt2: {json.dumps(r.get('pt2'))}; "
                      f"the build's compile gate: {json.dumps(r.get('manifest_compile'))}"]
        if r.get("skipped"):
            lines.append(f"Skipped (past --budget-s): {', '.join(r['skipped'])}")
        for k, e in (r.get("errors") or {}).items():
            lines.append(f"Failed: {k}: `{e.splitlines()[0][:300] if e else ''}`")
        lines.append(f"Install {r.get('install_s', 0):.0f} s, worker {r.get('worker_s', 0):.0f} s.")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        model, package, device, dtype, modes, n, out, budget_s, pt2_dir = sys.argv[2:11]
        row = worker(model, package, device, dtype or None, modes.split(","), int(n), float(budget_s),
                     pt2_dir or None)
        Path(out).write_text(json.dumps(row))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--pair", action="append", default=[], help="MODEL.py=PACKAGE_DIR or MODEL.py=PACKAGE.tar.gz")
    p.add_argument("--previous", nargs="*", default=[],
                   help="e2e.json files of earlier calls: their rows come first (one report over several calls)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None)
    p.add_argument("--modes", default="default,max-autotune")
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--budget-s", type=float, default=360.0,
                   help="per model worker: no compile starts after this (one device call is at most 10 min)")
    p.add_argument("--no-pt2", action="store_true", help="skip the AOTInductor export")
    p.add_argument("--small", action="store_true", help="FORGE_BENCH_SMALL=1 for the models (CPU smoke test)")
    a = p.parse_args()
    if not a.pair and not a.previous:
        p.error("give --pair MODEL.py=PACKAGE (or --previous E2E.json to rewrite a report)")
    base = out_path("e2e")
    rows = [row for f in a.previous for row in json.loads(Path(f).read_text())["models"]]
    cmd = "python bench/compile_e2e.py " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        for pair in a.pair:
            model, _, pkg = pair.partition("=")
            row = one(Path(model).resolve(), Path(pkg).resolve(), a.device, a.dtype, a.modes.split(","), a.n,
                      Path(tmp), a.budget_s, not a.no_pt2, {"FORGE_BENCH_SMALL": "1"} if a.small else {})
            if not row.get("error"):
                row["ratios"] = ratios(row)
            row["command"] = cmd
            rows.append(row)
    env = environment()
    env["forge_pack_commit"] = commit()
    write(base, {"command": cmd, "environment": env, "models": rows}, markdown(rows, cmd, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
