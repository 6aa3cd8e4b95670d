"""Search throughput over devices: evaluations per minute of search time, one GPU against several.

    python bench/scale_out.py [OUT_BASE] [--model tests/models/llm_block.py] [--budget 32] [--top 1]
                              [--device cuda] [--configs default,gpus:0,gpus:all]

Each configuration is one `forge-pack search` of the same model, seed and budget in a fresh run
directory and a fresh build cache (so every configuration compiles its candidates itself):

- ``default``: the plain path (one worker, one evaluation in flight);
- ``gpus:SPEC``: ``--gpus SPEC`` (one worker per GPU, one evaluation in flight per GPU);
- ``workers:N``: ``--workers N`` (on the cpu: the local form of N devices);
- ``ray:N``: ``--ray local --workers N`` (a Ray cluster started inside the search; needs Ray).

Evaluations per minute = evaluations / the hotspots' search time (profiling and the baselines are
not search time) * 60. ``gpus:all`` is skipped when one GPU is visible. The ratio column is
against the first configuration. Writes OUT_BASE.md and .json (default bench/results/scale_out).
On the single H200 (defaults: two searches of 32 evaluations, each with its profile and baseline):
about 3-4 minutes. With 8 GPUs, give each GPU work beyond its first evaluation (which loads the
hotspot's inputs into that worker): --budget 128 or more.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, environment, out_path, write


def visible_gpus() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from forge_pack.search.devices import visible_gpus as vg

    return vg()


def flags_of(config: str) -> list[str] | None:
    """The search flags of a configuration; None when this machine cannot run it."""
    if config == "default":
        return []
    kind, _, arg = config.partition(":")
    if kind == "gpus":
        if arg == "all" and len(visible_gpus()) < 2:
            return None
        return ["--gpus", arg]
    if kind == "workers":
        return ["--workers", arg]
    if kind == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            return None
        return ["--ray", "local", "--workers", arg]
    raise SystemExit(f"unknown configuration {config!r}")


def measure(config: str, flags: list[str], a, work: Path) -> dict:
    run_dir = work / config.replace(":", "_").replace(",", "-")
    env = dict(os.environ, FORGE_PACK_CACHE=str(work / f"cache-{run_dir.name}"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "forge_pack", "search", a.model, "--device", a.device, "--budget", str(a.budget),
           "--top", str(a.top), "--seed", "0", "--run-dir", str(run_dir), "--json", *flags]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        return {"config": config, "flags": flags, "error": r.stderr[-2000:], "wall_s": wall}
    conn = sqlite3.connect(run_dir / "run.db")
    try:
        n = conn.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
        search_s = conn.execute("SELECT COALESCE(SUM(search_s), 0) FROM hotspots").fetchone()[0]
        per_device = dict(conn.execute("SELECT COALESCE(device, '(one)'), COUNT(*) FROM evaluations GROUP BY 1"))
        reasons = dict(conn.execute("SELECT reason, COUNT(*) FROM evaluations GROUP BY 1"))
        best = conn.execute("SELECT h.pretty, MAX(e.speedup_vs_eager) FROM evaluations e JOIN hotspots h"
                            " ON h.id = e.hotspot_id WHERE e.ok = 1 GROUP BY h.id ORDER BY h.rank").fetchall()
    finally:
        conn.close()
    return {"config": config, "flags": flags, "evaluations": n, "search_s": round(search_s, 2),
            "per_minute": round(60.0 * n / search_s, 1) if search_s else None, "wall_s": round(wall, 1),
            "per_device": per_device, "verdicts": reasons,
            "best_speedup": {p: round(s, 3) for p, s in best if s is not None}}


def main() -> int:
    base = out_path("scale_out")
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--model", default=str(ROOT / "tests" / "models" / "llm_block.py"))
    ap.add_argument("--budget", type=int, default=int(os.environ.get("BENCH_BUDGET", "32")))
    ap.add_argument("--top", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--configs", default="default,gpus:0,gpus:all")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        for config in a.configs.split(","):
            flags = flags_of(config)
            if flags is None:
                rows.append({"config": config, "skipped": "not possible on this machine (GPUs visible: "
                                                          f"{len(visible_gpus())}, or Ray missing)"})
                continue
            print(f"{config}: forge-pack search {' '.join(flags)} ...", file=sys.stderr, flush=True)
            rows.append(measure(config, flags, a, Path(tmp)))
    ref = next((r for r in rows if r.get("per_minute")), None)
    lines = [f"# Search throughput over devices ({a.device})", "",
             f"`forge-pack search {Path(a.model).relative_to(ROOT) if Path(a.model).is_relative_to(ROOT) else a.model}"
             f" --device {a.device} --budget {a.budget} --top {a.top} --seed 0` per configuration, a fresh build "
             "cache each. Evaluations per minute of search time (profiling and baselines excluded); ratio "
             f"against `{ref['config'] if ref else '-'}`.", "",
             "| configuration | flags | evaluations | search s | per minute | ratio | per device | wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "skipped" in r or "error" in r:
            lines.append(f"| {r['config']} | - | - | - | - | - | {r.get('skipped') or 'failed: see json'} | - |")
            continue
        ratio = f"{r['per_minute'] / ref['per_minute']:.2f}x" if ref and r.get("per_minute") else "-"
        lines.append(f"| {r['config']} | `{' '.join(r['flags'])}` | {r['evaluations']} | {r['search_s']} | "
                     f"**{r['per_minute']}** | {ratio} | {r['per_device']} | {r['wall_s']} |")
    lines += ["", "Best speedup per hotspot (each configuration searched the same budget):", ""]
    for r in rows:
        if r.get("best_speedup") is not None:
            lines.append(f"- {r['config']}: {r['best_speedup']}")
    env = environment()
    lines += ["", f"Environment: {env}", ""]
    write(base, {"rows": rows, "environment": env, "model": a.model, "budget": a.budget, "top": a.top,
                 "device": a.device}, "\n".join(lines))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
