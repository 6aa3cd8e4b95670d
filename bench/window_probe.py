"""The window region skeleton on ResNet-50's stem: batch_norm + relu + max_pool2d(3, 2, 1).

    python bench/window_probe.py [--batch 256] [--dtype bfloat16] [--out BASE] [--quick]

The region is captured on CUDA from conv 7x7/2 + BatchNorm + ReLU + MaxPool(3, 2, 1) with 64
channels at 224x224 (the pool reads 112x112, writes 56x56), NCHW and channels_last, and the
generated `window` kernel is verified and timed by the evaluator (its timing protocol, L2
flushed) at a few knob settings, against eager and torch.compile of the region (Inductor's fused
kernel); {} is the defaults (channels_last: vec 8 along C for 16-bit, 4 for fp32; NCHW: vec 1);
NCHW also at wrun 2 and 4 (runs along W: the overlapping windows' input cells read once).
Writes BASE.{md,json} (default bench/results/window), rewritten after every evaluation so that a
run a device call's limit cuts short keeps what it measured. About 2-4 minutes on an H200 (two
compile baselines, eleven evaluations); ``--quick``: the defaults and wrun 4 for NCHW, the defaults
for channels_last (three evaluations).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "models" / "regions"))
sys.path.insert(0, str(ROOT / "bench"))
from _common import commit  # noqa: E402

KNOBS = {False: [{}, {"ilp": 2}, {"threads": 128, "ilp": 4}, {"wrun": 2}, {"wrun": 4}, {"wrun": 4, "ilp": 2}],
         True: [{}, {"vec": 8, "ilp": 2}, {"vec": 4, "ilp": 2}, {"vec": 2, "ilp": 4}, {"vec": 1, "ilp": 1}]}
QUICK = {False: [{}, {"wrun": 4}], True: [{}]}


def _region(batch: int, dtype, channels_last: bool):
    import torch

    import resnet_stem
    from forge_pack.graph.capture import capture
    from forge_pack.graph.regions import find_regions
    from forge_pack.targets.region_target import signature

    torch.manual_seed(0)
    model = resnet_stem.Stem(64)
    with torch.no_grad():
        model.bn1.running_mean.normal_(0.0, 0.2)
        model.bn1.running_var.uniform_(0.5, 1.5)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.eval().to(dtype).to(memory_format=fmt).cuda()
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(dtype).contiguous(memory_format=fmt)
    (region,) = find_regions(capture(model, (x,), profile=False))
    return signature(region)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "window"))
    ap.add_argument("--quick", action="store_true", help="three evaluations (see the module's docstring)")
    args = ap.parse_args()

    import torch

    from forge_pack.core.hotspot import Hotspot
    from forge_pack.evaluate.evaluator import Evaluator
    from forge_pack.evaluate.timing import TimingConfig
    from forge_pack.search.templates_proposer import instantiate

    dtype = getattr(torch, args.dtype)
    ev = Evaluator("cuda", workers=1, timeout_s=300, timing=TimingConfig())
    rows = []
    t0 = time.time()
    try:
        for cl in (False, True):
            sig = _region(args.batch, dtype, cl)
            h = Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda")
            # eager and torch.compile of the region, timed once in the worker and kept for the
            # evaluations below (evaluate() alone computes no speedups)
            ev.baseline(h)
            for knobs in (QUICK if args.quick else KNOBS)[cl]:
                cand = instantiate("region", "cuda", "window", knobs, sig)
                e = ev.evaluate(cand, h)
                us = e.timing.median_us if e.timing else None
                comp = us * e.speedup_vs_compile if us and e.speedup_vs_compile else None
                rows.append({"layout": "channels_last" if cl else "NCHW", "params": cand.params,
                             "verdict": e.verdict.reason, "detail": e.verdict.detail[:200] if not e.verdict.ok else "",
                             "ours_us": us, "compile_us": comp, "vs_eager": e.speedup_vs_eager,
                             "vs_compile": e.speedup_vs_compile, "copy_bw_fraction": e.bandwidth_fraction})
                print(json.dumps(rows[-1]), file=sys.stderr)
                write(args, rows, t0, done=False)
    finally:
        ev.close()
    write(args, rows, t0, done=True)


def write(args, rows: list[dict], t0: float, done: bool) -> None:
    import torch

    cmd = "python bench/window_probe.py " + " ".join(sys.argv[1:])
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "commit": commit(), "wall_s": round(time.time() - t0, 1), "complete": done}
    Path(args.out + ".json").write_text(json.dumps({"command": cmd, "env": env, "rows": rows}, indent=1))
    lines = ["# Window region: ResNet-50 stem batch_norm + relu + max_pool2d(3, 2, 1)", "", f"`{cmd}`", "",
             f"{env['gpu']}, torch {env['torch']}, cuda {env['cuda']}, commit {env['commit']}; "
             f"{args.batch}x64x112x112 -> 56x56, {args.dtype}"
             + ("" if done else f"; partial: {len(rows)} rows after {env['wall_s']} s"),
             "", "| layout | knobs | verdict | ours | Inductor | vs Inductor | vs eager | % copy BW |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def f(x, fmt):
        return fmt.format(x) if x is not None else "-"

    for r in rows:
        knobs = ",".join(f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"| {r['layout']} | {knobs} | {r['verdict']} | {f(r['ours_us'], '{:.1f} us')} | "
                     f"{f(r['compile_us'], '{:.1f} us')} | {f(r['vs_compile'], '{:.2f}x')} | {f(r['vs_eager'], '{:.2f}x')} | "
                     f"{f(r['copy_bw_fraction'] * 100 if r['copy_bw_fraction'] is not None else None, '{:.0f}%')} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    if done:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
