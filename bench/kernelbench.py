"""KernelBench-style problems (bench/kernelbench/*.py) searched with forge-pack, one at a time.

    python bench/kernelbench.py [OUT_DIR] [--only NAME ...] [--budget 50] [--time-limit S]
        [--deadline S] [--device cuda] [--work DIR] [--small]

Per problem: ``python -m forge_pack search bench/kernelbench/<name>.py --device D --budget B --top 1
--min-share 0 --run-dir WORK/<name> --json [--time-limit S]``, timed from start to end (the search's
wall time, profiling and baselines included). Its JSON gives the hottest targeted op: eager and
torch.compile medians, the best verified kernel's median, its fraction of the copy bandwidth. A problem
whose hot op no op target covers (activations, max/avg pooling with a window, instance norm, an RMS
norm over channels) is searched again as regions (``--regions``: the generated kernels of its fused
memory-bound chain, a region of one op included); ``--regions always`` searches every problem so,
``never`` records such a problem as not targeted. The row says which (``mode``).

Results merge into OUT_DIR/kernelbench.json (rows keyed by problem; a later run replaces a problem's
row) and OUT_DIR/kernelbench.md is rewritten from all rows, after every problem, so a device call cut
off by its time limit keeps what finished. ``--deadline`` (seconds, default 500) starts no problem
after that much of this call has passed and gives the running search only what is left (its
subprocess is stopped at the deadline and the row says so, with the baseline, the best verified kernel and the
failures' reasons read from its run store): one device call stays under 9 minutes.
Chunks: ``--only l1_23_softmax l1_24_log_softmax``; ``--list`` prints the names in order.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "bench" / "kernelbench"
DEFAULT_DEADLINE_S = 500.0  # a device call may run 10 minutes: leave room for the start and the copy back


def problems() -> list[str]:
    return sorted(p.stem for p in PROBLEMS.glob("l*.py"))


def _cmd(name: str, args, run_dir: Path, regions: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "forge_pack", "search", f"bench/kernelbench/{name}.py", "--device", args.device,
           "--budget", str(args.budget), "--top", "1", "--min-share", "0", "--run-dir", str(run_dir), "--json"]
    if regions:
        cmd.append("--regions")
    if args.time_limit:
        cmd += ["--time-limit", str(args.time_limit)]
    return cmd


def store_doc(run_dir: Path) -> dict | None:
    """What a search stopped before its summary left in its run store, in the summary's form: the hottest
    hotspot's baseline, its best verified evaluation and why the others failed (None: no store, or no hotspot)."""
    from collections import Counter

    from forge_pack.store.run_store import STORE_FILE, open_readonly

    if not (run_dir / STORE_FILE).exists():
        return None
    conn = open_readonly(run_dir)
    try:
        hot = conn.execute("SELECT id, pretty, baseline_json FROM hotspots ORDER BY rank LIMIT 1").fetchone()
        if hot is None:
            return None
        evals = conn.execute("SELECT ok, reason, median_us, speedup_vs_eager, speedup_vs_compile, bandwidth_fraction "
                             "FROM evaluations WHERE hotspot_id = ?", (hot[0],)).fetchall()
    finally:
        conn.close()
    base = json.loads(hot[2]) if hot[2] else {}
    ok = [e for e in evals if e[0] and e[2] is not None]
    best = min(ok, key=lambda e: e[2]) if ok else None
    failed = Counter(e[1] for e in evals if not e[0]).most_common()
    why = ", ".join(f"{r} {c}" for r, c in failed)
    return {"hotspots": [{
        "signature": hot[1], "skipped": None,
        "eager_us": (base.get("eager") or {}).get("median_us"),
        "compile_us": (base.get("compiled") or {}).get("median_us"),
        "verdict": f"stopped before its summary: {len(evals)} evaluations" + (f", failed: {why}" if why else ""),
        "best": {"median_us": best[2], "speedup_vs_eager": best[3], "speedup_vs_compile": best[4],
                 "bandwidth_fraction": best[5], "family": None} if best else None,
        "search": {"evaluations": len(evals), "verdicts": dict(Counter(e[1] for e in evals))}}]}


def row_of(name: str, doc: dict | None, wall_s: float, status: str, cmd: list[str], tail: str) -> dict:
    """One table row from the search's JSON (None when it produced none)."""
    row = {"problem": name, "status": status, "search_wall_s": round(wall_s, 1),
           "command": " ".join(["python"] + [shlex.quote(c) for c in cmd[1:]]), "signature": None, "eager_us": None,
           "compile_us": None, "ours_us": None, "vs_eager": None, "vs_compile": None, "bandwidth_fraction": None,
           "family": None, "evaluations": None, "search_s": None, "note": None}
    if doc is None:
        row["note"] = tail[-600:]
        return row
    hot = [h for h in doc.get("hotspots", []) if not h.get("skipped")]
    if not hot:
        row["status"] = "not targeted" if status == "ok" else status
        skipped = [f"{h['signature']}: {h['skipped']}" for h in doc.get("hotspots", [])]
        row["note"] = "; ".join(skipped)[:600] or "no targeted op in the forward"
        return row
    h = hot[0]
    best = h.get("best") or {}
    search = h.get("search") or {}
    row.update(signature=h["signature"], eager_us=h.get("eager_us"), compile_us=h.get("compile_us"),
               ours_us=best.get("median_us"), vs_eager=best.get("speedup_vs_eager"),
               vs_compile=best.get("speedup_vs_compile"), bandwidth_fraction=best.get("bandwidth_fraction"),
               family=best.get("family"), evaluations=search.get("evaluations"),
               search_s=search.get("search_s", search.get("elapsed_s")), note=h.get("verdict"))
    return row


def run_one(name: str, args, deadline_at: float) -> dict:
    """The problem's row: searched as ops, then as regions where no op target covers it (``--regions``)."""
    regions = getattr(args, "regions", "auto")
    row = _search(name, args, deadline_at, regions == "always")
    if regions == "auto" and row["status"] == "not targeted" and time.monotonic() < deadline_at:
        first = row
        row = _search(name, args, deadline_at, True)
        row["search_wall_s"] = round(row["search_wall_s"] + first["search_wall_s"], 1)
        row["ops_note"] = first["note"]
    return row


def _search(name: str, args, deadline_at: float, regions: bool) -> dict:
    run_dir = Path(args.work) / (name + ("_regions" if regions else ""))
    shutil.rmtree(run_dir, ignore_errors=True)  # the bench's scratch: a search refuses a run dir that exists
    cmd = _cmd(name, args, run_dir, regions)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.small:
        env["FORGE_BENCH_SMALL"] = "1"
    t0 = time.perf_counter()
    left = max(deadline_at - time.monotonic(), 1.0)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env, cwd=ROOT)
        status, out, err = ("ok" if res.returncode == 0 else f"exit {res.returncode}"), res.stdout, res.stderr
    except subprocess.TimeoutExpired as e:
        status = f"stopped at the deadline ({left:.0f} s)"
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    wall = time.perf_counter() - t0
    doc = None
    for line in reversed(out.strip().splitlines()):
        try:
            doc = json.loads(line)
            break
        except ValueError:
            continue
    if doc is None and status.startswith("stopped"):  # cut off: the run store's summary, when the search wrote one
        summary = run_dir / "search.json"
        doc = json.loads(summary.read_text()) if summary.exists() else store_doc(run_dir)
    row = row_of(name, doc, wall, status, cmd, err or out)
    row["mode"] = "regions" if regions else "ops"
    if args.small:
        row["command"] = "FORGE_BENCH_SMALL=1 " + row["command"]
    return row


def _fmt(v, unit="", scale=1.0, digits=1) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}{unit}"


def _evals(r: dict) -> str:
    n, secs = r.get("evaluations"), r.get("search_s")
    if not n:
        return "-" if n is None else "0"
    return f"{n} ({secs / n:.1f} s)" if secs else str(n)


def markdown(rows: list[dict], env: dict) -> str:
    lines = ["# KernelBench-style problems, searched by forge-pack", "",
             f"Device: {env.get('gpu', env.get('device', '?'))}; torch {env.get('torch', '?')}, CUDA "
             f"{env.get('cuda', '?')}, python {env.get('python', '?')}; commit {env.get('commit') or '?'} (the last call's; "
             "each row's own is after its command). One search per "
             "problem, budget as in its command; eager and compile are torch's medians under the same timing "
             "protocol, ours the best verified kernel's; % BW is the kernel's fraction of the copy bandwidth "
             "(bytes read + written at the measured device-to-device copy rate); wall is the whole search "
             "(profile, baselines, evaluations); evals: the evaluations made, and the search's seconds per "
             "evaluation (the issue's goal: 50 in 10 minutes, 12 s each, for a 7.5 GB signature).", "",
             "| problem | hot op (searched as) | eager µs | compile µs | ours µs | vs eager | vs compile | % BW | "
             "evals (s each) | wall s | status |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        mode = f" ({r['mode']})" if r.get("mode") == "regions" else ""
        lines.append(f"| {r['problem']} | {r['signature'] or '-'}{mode} | {_fmt(r['eager_us'])} | "
                     f"{_fmt(r['compile_us'])} | "
                     f"{_fmt(r['ours_us'])} | {_fmt(r['vs_eager'], 'x', digits=2)} | "
                     f"{_fmt(r['vs_compile'], 'x', digits=2)} | {_fmt(r['bandwidth_fraction'], '%', 100, 0)} | "
                     f"{_evals(r)} | {r['search_wall_s']:.0f} | {r['status']} |")
    lines += ["", "Commands (from the repository root):", ""]
    lines += [f"- `{r['problem']}`: `{r['command']}`" + (f" (commit {r['commit']})" if r.get("commit") else "")
              for r in rows]
    notes = [r for r in rows if r.get("note") and r["status"] != "ok" or r["status"] == "not targeted"]
    if notes:
        # one line per note: a run's output tail (its last lines) would otherwise end the list item
        lines += ["", "Notes:", ""] + [f"- `{r['problem']}`: {' / '.join(ln.strip() for ln in str(r['note']).splitlines() if ln.strip())}"
                                       for r in notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--only", nargs="*", default=None, help="problem names (file stems)")
    ap.add_argument("--budget", type=int, default=50)
    ap.add_argument("--time-limit", type=float, default=None, help="seconds of search per hotspot")
    ap.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds for this whole call")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", default=os.environ.get("OUT", "/tmp") + "/kernelbench_runs")
    ap.add_argument("--small", action="store_true", help="FORGE_BENCH_SMALL=1 (CPU smoke test)")
    ap.add_argument("--regions", choices=("auto", "always", "never"), default="auto",
                    help="search as regions: where no op target covers the problem (auto), always, or never")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    names = problems()
    if args.list:
        print("\n".join(names))
        return 0
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            ap.error(f"unknown problems {unknown}; --list shows them")
        names = [n for n in names if n in args.only]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = out / "kernelbench"
    doc = json.loads(base.with_suffix(".json").read_text()) if base.with_suffix(".json").exists() else {"rows": []}
    from _common import commit, environment

    env = {**environment(), "device": args.device, "commit": commit()}
    deadline_at = time.monotonic() + args.deadline
    for name in names:
        if time.monotonic() >= deadline_at:
            print(f"deadline reached: {name} and later problems not started", flush=True)
            break
        row = {**run_one(name, args, deadline_at), "commit": env["commit"]}  # rows of several calls merge
        rows = [r for r in doc["rows"] if r["problem"] != name] + [row]
        doc = {"rows": sorted(rows, key=lambda r: r["problem"]), "env": env}
        base.with_suffix(".json").write_text(json.dumps(doc, indent=2))
        base.with_suffix(".md").write_text(markdown(doc["rows"], env))
        print(f"{name}: {row['status']}  ours {_fmt(row['ours_us'])} us  vs compile "
              f"{_fmt(row['vs_compile'], 'x', digits=2)}  {row['search_wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
