"""Render `forge-pack search --json` output (plus the run store) as bench/results/search.md.

    python bench/search_report.py SEARCH.json RUN.db OUT.md [--command "..."] [--env ENV.txt]

Per hotspot: eager, torch.compile, bandwidth floor, best kernel, speedups against both, % of the
measured copy bandwidth, evaluations, verdicts by reason and the hotspot's search wall time (from
the run store's events), so every number in the table comes from the one run.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import Counter


def fmt(v, spec=".1f", unit=""):
    return "—" if v is None else f"{v:{spec}}{unit}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("summary")
    ap.add_argument("db")
    ap.add_argument("out")
    ap.add_argument("--command", default="")
    ap.add_argument("--env", default="")
    args = ap.parse_args()
    summary = json.load(open(args.summary))
    db = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    lines = ["# MCTS search on one H200: the issue-4 shapes", ""]
    if args.command:
        lines += ["Command (on the H200, from the repository root):", "", "```", args.command, "```", ""]
    if args.env:
        lines += ["Environment: " + open(args.env).read().strip().replace("\n", "; "), ""]
    lines += ["| hotspot | eager µs | compile µs | floor µs | best kernel | kernel µs | vs eager | vs compile "
              "| % copy BW | evals | failures | search s |", "|" + " --- |" * 12]
    for h in summary["hotspots"]:
        if h.get("skipped"):
            continue
        best = h.get("best") or {}
        evals = db.execute("SELECT reason, finished_at FROM evaluations WHERE hotspot_id=?", (h["id"],)).fetchall()
        reasons = Counter(r["reason"] for r in evals)
        times = db.execute("SELECT MIN(at) a, MAX(at) b FROM events WHERE hotspot_id=?", (h["id"],)).fetchone()
        wall = (times["b"] - times["a"]) if times and times["a"] else None
        fails = ", ".join(f"{k} {v}" for k, v in reasons.items() if k != "ok") or "0"
        label = best.get("label", "no winner") if h.get("winner") else f"no winner ({best.get('label', '—')})"
        lines.append(
            f"| {h['signature']} | {fmt(h.get('eager_us'))} | {fmt(h.get('compile_us'))} | {fmt(h.get('floor_us'))} "
            f"| {label} | {fmt(best.get('median_us'))} | {fmt(best.get('speedup_vs_eager'), '.2f', 'x')} "
            f"| {fmt(best.get('speedup_vs_compile'), '.2f', 'x')} "
            f"| {fmt((best.get('bandwidth_fraction') or 0) * 100 if best.get('bandwidth_fraction') else None, '.0f', '%')} "
            f"| {len(evals)} | {fails} | {fmt(wall, '.0f')} |")
    lines += ["", f"Run wall time {summary.get('elapsed_s', 0):.0f} s; "
              f"budget {summary.get('budget')} evaluations per hotspot; status {summary.get('status')}.", ""]
    open(args.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
