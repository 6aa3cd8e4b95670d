"""Search generated kernels for a model's regions and compare them with Inductor's fused kernel.

    python bench/regions_search.py MODEL.py [--device cuda] [--top 5] [--budget 10] [--time-limit 30]
        [--out BASE]
    python bench/regions_search.py --merge A.json B.json ... [--out BASE]

On the H200, one seed model per device call (FORGE_BENCH_SMALL unset: the real sizes), then the merge:

    FORGE_BENCH_DEVICE=cuda python bench/regions_search.py bench/models/resnet50.py --device cuda --top 5 --budget 10 \
        --time-limit 30 --out $OUT/regions_resnet50        # capture ~2 min + 5 x (compile baseline + 30 s) < 9 min
    (the same for sd35_vae_decode, gemma4_prefill, qwen35_moe_prefill)
    python bench/regions_search.py --merge regions_*.json  # -> bench/results/regions.{md,json}

It runs ``forge-pack search MODEL --regions`` (the pipeline itself: capture, regions, captured
inputs, verification, the eager and torch.compile baselines of each region timed by the
evaluator's protocol) and writes, per region: ops, share, eager, Inductor's fused kernel
(torch.compile of the region's subgraph), ours, ours vs compile, % of copy bandwidth, and the
command. Regions the generated kernels do not cover are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _short(op: str) -> str:
    return op.split(".")[1] if op.count(".") == 2 else op


def search(model: str, args) -> dict:
    from forge_pack.cli.search import search_command

    run_dir = Path(args.run_dir or (Path(os.environ.get("OUT", "runs")) / f"regions-{Path(model).stem}-{int(time.time())}"))
    summary = search_command(model, device=args.device, dtype=args.dtype, budget=args.budget,
                             time_limit=args.time_limit, top=args.top, min_share=args.min_share, run_dir=run_dir,
                             stdout=lambda s: print(s, file=sys.stderr), regions=True)
    rows = []
    for o in summary.outcomes:
        reg = (o.hotspot.extra or {}).get("region", {})
        b, best = o.baseline, o.best
        ev = best.evaluation if best else None
        rows.append({
            "region": reg.get("name", o.hotspot.id), "kind": reg.get("kind"), "ops": [_short(x) for x in reg.get("ops", [])],
            "instances": reg.get("instances"), "share": o.hotspot.time_share, "skipped": o.skipped,
            "eager_us": b.eager.median_us if b else None,
            "compile_us": b.compiled.median_us if b and b.compiled else None,
            "ours_us": ev.timing.median_us if ev is not None and ev.timing else None,
            "ours_family": best.candidate.label if best else None,
            "vs_eager": ev.speedup_vs_eager if ev else None, "vs_compile": ev.speedup_vs_compile if ev else None,
            "copy_bw_fraction": ev.bandwidth_fraction if ev else None, "bytes_moved": reg.get("bytes_moved")})
    sys.path.insert(0, str(ROOT / "bench"))
    from _common import commit, environment

    return {"model": model, "device": summary.device, "run_dir": str(run_dir), "regions": rows,
            "environment": environment(), "commit": commit(),
            "command": "python " + " ".join(shlex.quote(a) for a in sys.argv)}


def _fmt(v, unit=""):
    if v is None:
        return "-"
    return f"{v:.1f}{unit}" if unit == " us" else (f"{v:.2f}x" if unit == "x" else f"{v * 100:.0f}%")


def write(results: list[dict], base: Path) -> None:
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps(results, indent=2))
    lines = ["# Regions: generated kernels vs Inductor's fused kernel", ""]
    for r in results:
        env = r.get("environment") or {}
        where = ", ".join(f"{k} {env[k]}" for k in ("gpu", "torch", "cuda", "python") if env.get(k))
        lines += [f"## {r['model']} ({r['device']})", "", f"`{r['command']}`", "",
                  *([f"{where}; commit {r.get('commit') or 'unknown'}", ""] if where else []),
                  "| region | ops | share | eager | compile | ours | vs compile | % copy BW |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for x in r["regions"]:
            if x["skipped"]:
                continue
            lines.append(f"| {x['region']} | {' '.join(x['ops'])} | {x['share'] * 100:.1f}% | {_fmt(x['eager_us'], ' us')} "
                         f"| {_fmt(x['compile_us'], ' us')} | {_fmt(x['ours_us'], ' us')} | {_fmt(x['vs_compile'], 'x')} "
                         f"| {_fmt(x['copy_bw_fraction'])} |")
        skipped = [x for x in r["regions"] if x["skipped"]]
        if skipped:
            lines += ["", "Not searched: " + "; ".join(f"{x['region']} ({x['share'] * 100:.1f}%): {x['skipped']}"
                                                      for x in skipped[:20])]
        lines.append("")
    base.with_suffix(".md").write_text("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*")
    p.add_argument("--merge", nargs="+", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--top", type=int, default=5)  # 5 regions x (compile baseline + time limit) fits one 9-min call
    p.add_argument("--budget", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=30.0)
    p.add_argument("--min-share", type=float, default=0.01)  # the bar: regions above 1% of the time
    p.add_argument("--run-dir", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    base = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "regions" if os.environ.get("OUT")
                                           else ROOT / "bench" / "results" / "regions")
    if args.merge:
        results = [r for f in args.merge for r in json.loads(Path(f).read_text())]
    else:
        results = [search(m, args) for m in args.models]
    write(results, base)
    print(base.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
