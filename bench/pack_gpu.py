"""The emitted package on a GPU, per example model: forge-pack build --device cuda, pip install the
package into a fresh --target dir, `python -m <pkg> verify`, then apply it in a fresh process and
compare with the original (outputs, argmax agreement, revert bitwise) and time both end to end.

    python bench/pack_gpu.py [OUT_BASE] [--budget N] [--dtype bfloat16] [--models a.py b.py]

Writes OUT_BASE.json and OUT_BASE.md ($OUT/pack_gpu.* by default, else bench/results/pack_gpu.*).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, environment, out_path, write


def run(cmd: list[str], env: dict | None = None, timeout: int = 5400) -> subprocess.CompletedProcess:
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def one(model: Path, budget: int, dtype: str | None, work: Path) -> dict:
    import os

    name = f"{model.stem}_gpu"
    out, run_dir, site = work / name, work / f"{name}-run", work / f"{name}-site"
    cmd = [sys.executable, "-m", "forge_pack", "build", str(model), "--device", "cuda", "--budget", str(budget),
           "--out", str(out), "--name", name, "--run-dir", str(run_dir), "--json"]
    if dtype:
        cmd += ["--dtype", dtype]
    t0 = time.time()
    r = run(cmd)
    row: dict = {"model": model.stem, "build_s": round(time.time() - t0, 1), "build_rc": r.returncode}
    if r.returncode != 0:
        return {**row, "error": r.stderr[-3000:]}
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    row["search"] = [{k: h.get(k) for k in ("signature", "time_share", "eager_us", "compile_us", "verdict")}
                     for h in doc["search"]["hotspots"] if not h.get("skipped")]
    row["pack"] = doc["pack"]
    if not doc["pack"]["written"]:
        return row
    manifest = json.loads((out / name / "manifest.json").read_text())
    row["targets"] = [{"signature": t["signature"]["pretty"], "eager_us": t["timing"]["eager"]["median_us"],
                       "compile_us": (t["timing"]["compiled"] or {}).get("median_us"),
                       "kernel_us": t["timing"]["kernel"]["median_us"], "speedup_vs_eager": t["speedup"]["vs_eager"],
                       "speedup_vs_compile": t["speedup"]["vs_compile"], "time_share": t["time_share"]}
                      for t in manifest["targets"]]
    row["model_result"] = manifest["model_result"]
    r = run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q", "--target", str(site),
             str(out)])
    row["install_rc"] = r.returncode
    if r.returncode != 0:
        return {**row, "error": (r.stdout + r.stderr)[-3000:]}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    r = run([sys.executable, "-m", name, "verify"], env=env)
    row["verify_rc"], row["verify"] = r.returncode, r.stdout[-4000:]
    cmd = [sys.executable, "-m", "forge_pack.cli.demo", "show", name, str(model), "--device", "cuda", "--json"]
    if dtype:
        cmd += ["--dtype", dtype]
    r = run(cmd, env=env)
    row["show"] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-3000:]}
    return row


def markdown(doc: dict) -> str:
    lines = [f"# The emitted package on {doc['env'].get('gpu', 'no GPU')}", "",
             f"torch {doc['env']['torch']}, CUDA {doc['env']['cuda']}, budget {doc['budget']} per hotspot"
             + (f", dtype {doc['dtype']}" if doc["dtype"] else ""), "",
             "| model | kernels | verify | eager ms | patched ms | end to end | max abs diff | argmax agreement "
             "| revert bitwise |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        s = r.get("show") or {}
        n = len(r.get("targets", []))
        verify = "-" if "verify_rc" not in r else ("PASS" if r["verify_rc"] == 0 else "FAIL")
        if "error" in r or not s or "error" in s:
            why = r.get("error") or s.get("error") or r.get("pack", {}).get("message", "")
            lines.append(f"| {r['model']} | {n} | {verify} | | | | | | {why[:200]!r} |")
            continue
        agree = f"{100 * s['argmax_agreement']:.2f}%" if s.get("argmax_agreement") is not None else "-"
        lines.append(f"| {r['model']} | {n} | {verify} | {s['eager_ms']:.3f} | {s['patched_ms']:.3f} | "
                     f"{s['speedup']:.2f}x | {s['max_abs_diff']:.3g} | {agree} | {s['bitwise_after_revert']} |")
    lines += ["", "Per kernel (from each package's manifest, confirmed in a fresh process):", "",
              "| model | signature | eager µs | torch.compile µs | kernel µs | vs eager | vs compile | share |",
              "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        for t in r.get("targets", []):
            comp = f"{t['compile_us']:.1f}" if t["compile_us"] else "-"
            vc = f"{t['speedup_vs_compile']:.2f}x" if t["speedup_vs_compile"] else "-"
            lines.append(f"| {r['model']} | `{t['signature']}` | {t['eager_us']:.1f} | {comp} | {t['kernel_us']:.1f} | "
                         f"{t['speedup_vs_eager']:.2f}x | {vc} | {100 * t['time_share']:.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--budget", type=int, default=24)
    p.add_argument("--dtype", default=None)
    p.add_argument("--models", nargs="*", default=None)
    a = p.parse_args()
    base = out_path("pack_gpu")
    models = [Path(m) for m in a.models] if a.models else sorted((ROOT / "tests" / "models").glob("*.py"))
    with tempfile.TemporaryDirectory(prefix="pack_gpu-") as tmp:
        rows = [one(m.resolve(), a.budget, a.dtype, Path(tmp)) for m in models]
    doc = {"env": environment(), "budget": a.budget, "dtype": a.dtype, "rows": rows}
    write(base, doc, markdown(doc))


if __name__ == "__main__":
    main()
