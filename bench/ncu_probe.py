"""Hardware counters of chosen template kernels on the issue-4 shapes, through Nsight Compute: DRAM
bytes read and written, L2 hit rate, duration. It answers what timing alone cannot, e.g. whether a
kernel that means to re-read its input from L2 really does (DRAM bytes read ~ the input once) or
reads it twice from DRAM.

    python bench/ncu_probe.py OUT_DIR [--only group_norm,adaptive_avg_pool2d]

Runs itself under `ncu` (caches flushed before each profiled launch, clocks left alone) and writes
OUT_DIR/ncu_probe.md and .json. Needs a GPU whose runtime lets ncu read the counters.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GN_BIG = "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]"
POOL = "x: bf16[256,2048,7,7], output_size=(1,1)"
PROBES = [
    ("group_norm", GN_BIG, [
        ("split", {}), ("split_flow", {"unroll": 2, "l2": 1, "lag": 3}),
        ("split_flow", {"unroll": 4, "lag": 2, "minb": 4}),
        ("resident", {}), ("resident", {"stagger": 0}), ("resident", {"bps": 2, "threads": 512}),
    ]),
    ("adaptive_avg_pool2d", POOL, [
        ("nchw_tile", {"planes": 64, "threads": 128, "unroll": 4, "load_hint": 2}),
        ("nchw_tile", {"planes": 128, "threads": 256, "unroll": 4, "load_hint": 2}),
        ("nchw_tile", {"planes": 64, "threads": 64, "unroll": 8}),
    ]),
]
METRICS = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "lts__t_sector_hit_rate.pct", "sm__warps_active.avg.pct_of_peak_sustained_active"]


def run_kernels(only: set[str]) -> None:
    """Child under ncu: launch each probe twice (ncu profiles every launch; the second is kept)."""
    import torch

    from forge_pack.targets import ops
    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.launch import load_module, plan
    from forge_pack.targets.sigparse import parse_signature
    from forge_pack.search.templates_proposer import instantiate

    for op, text, variants in PROBES:
        if only and op not in only:
            continue
        sig = ops.with_output(parse_signature(op, text))
        tensors = ops.get_op(op).make_inputs(sig, "fresh", torch.Generator().manual_seed(0), "cuda")
        out = torch.empty(sig.output.shape, dtype=getattr(torch, sig.output.dtype), device="cuda")
        for family, params in variants:
            cand = instantiate(op, "cuda", family, params or None, sig)
            build = compile_candidate(cand)
            if not build.ok:
                print(f"PROBE {cand.label}: did not compile", flush=True)
                continue
            module = load_module("cuda", build.path, [k.name for k in cand.spec.kernels])
            p = plan(cand.spec, sig)
            ws = {name: torch.zeros(nbytes, dtype=torch.uint8, device="cuda") for name, nbytes, _ in p.workspaces}
            call = module.bind(p, {**tensors, "out": out, **ws})
            print(f"PROBE {len(p.launches)} {cand.label}", flush=True)
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            module.close()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        run_kernels({s for s in argv[1].split(",") if s})
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ncu = shutil.which("ncu") or next(iter(sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))), None)
    if not ncu:
        print("error: ncu not found\nhint: run this where Nsight Compute is installed", file=sys.stderr)
        return 1
    cmd = [str(ncu), "--clock-control", "none", "--cache-control", "all", "--csv", "--metrics", ",".join(METRICS),
           "--kernel-name", "regex:^(group_norm|adaptive_avg_pool2d)", sys.executable, __file__, "--child", args.only]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    (out / "ncu_probe.log").write_text(r.stdout + "\n" + r.stderr)
    probes = [l.split(" ", 2)[1:] for l in r.stdout.splitlines() if l.startswith("PROBE ") and "did not" not in l]
    body = "\n".join(l for l in r.stdout.splitlines() if l.startswith('"'))
    launches: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO(body)):
        launches.setdefault(row["ID"], {"kernels": row["Kernel Name"]})[row["Metric Name"]] = \
            (row["Metric Unit"], float(row["Metric Value"].replace(",", "")))
    ordered = [launches[k] for k in sorted(launches, key=int)]
    records, i = [], 0
    for nk, label in probes:  # each probe launched its nk kernels twice: keep the second call, summed
        second = ordered[i + int(nk):i + 2 * int(nk)]
        i += 2 * int(nk)
        rec = {"label": label, "kernels": " + ".join(m["kernels"] for m in second)}
        for m in METRICS:
            vals = [s[m] for s in second if m in s]
            if vals:
                unit = vals[0][0]
                total = sum(v for _, v in vals) if m.endswith(".sum") else max(v for _, v in vals)
                rec[m] = (unit, total)
        records.append(rec)
    (out / "ncu_probe.json").write_text(json.dumps(records, indent=1))
    lines = ["# Nsight Compute counters of chosen kernels (second launch, caches flushed)", "",
             f"`python bench/ncu_probe.py OUT {'--only ' + args.only if args.only else ''}`, rc {r.returncode}", "",
             "| kernel (sum over its launches; max for rates) | " + " | ".join(METRICS) + " |",
             "|---" * (len(METRICS) + 1) + "|"]
    for rec in records:
        lines.append(f"| {rec['label']} | " + " | ".join(f"{rec[m][1]:,.2f} {rec[m][0]}" if m in rec else "-"
                                                        for m in METRICS) + " |")
    (out / "ncu_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if r.returncode:
        print(r.stderr[-3000:], file=sys.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
