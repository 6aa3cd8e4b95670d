"""The pointwise region skeleton's vector path on ResNet-50's batch_norm + add + relu regions.

    python bench/region_vector_probe.py [--batch 256] [--dtype bfloat16] [--channels-last] [--out BASE]

For each ResNet-50 stage's shape (B x C x H x W: 256x56x56, 512x28x28, 1024x14x14, 2048x7x7, the
expansion widths at their resolutions), the region is captured from a conv + batch_norm + conv +
batch_norm + add + relu block on CUDA and the generated `pointwise` kernel is verified and timed by
the evaluator (its timing protocol, L2 flushed) at a few knob settings, against eager and
torch.compile of the region (Inductor's fused kernel). vec 1 / ilp 1 is the element-per-access
reference point. Writes BASE.{md,json} (default bench/results/region_vector). About 3-5 minutes
on an H200 (four compile baselines, twenty-four evaluations; {} is the defaults).
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

SHAPES = [(256, 56), (512, 28), (1024, 14), (2048, 7)]  # (channels, H = W) of the stages' block outputs
KNOBS = [{"vec": 1, "ilp": 1}, {}, {"vec": 8, "ilp": 2}, {"vec": 8, "ilp": 4}, {"vec": 8, "ilp": 2, "grid_stride": 1}, {"vec": 4, "ilp": 4}]


def _region(channels: int, size: int, batch: int, dtype, channels_last: bool):
    import torch

    import conv_bn_block
    from forge_pack.graph.capture import capture
    from forge_pack.graph.regions import find_regions
    from forge_pack.targets.region_target import signature

    torch.manual_seed(0)
    model = conv_bn_block.BasicBlock(channels)
    with torch.no_grad():
        for bn in (model.bn1, model.bn2):
            bn.running_mean.normal_(0.0, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.eval().to(dtype).to(memory_format=fmt).cuda()
    x = torch.randn(batch, channels, size, size, device="cuda").to(dtype).contiguous(memory_format=fmt)
    (region,) = [r for r in find_regions(capture(model, (x,), profile=False)) if r.pattern == "batch_norm+add+relu"]
    return signature(region)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "region_vector"))
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
        for channels, size in SHAPES:
            sig = _region(channels, size, args.batch, dtype, args.channels_last)
            h = Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda")
            # eager and torch.compile of the region, timed once in the worker and kept for the
            # evaluations below (evaluate() alone computes no speedups)
            ev.baseline(h)
            for knobs in KNOBS:
                cand = instantiate("region", "cuda", "pointwise", knobs, sig)
                e = ev.evaluate(cand, h)
                us = e.timing.median_us if e.timing else None
                comp = us * e.speedup_vs_compile if us and e.speedup_vs_compile else None
                rows.append({"shape": [args.batch, channels, size, size], "params": cand.params,
                             "verdict": e.verdict.reason, "detail": e.verdict.detail[:200] if not e.verdict.ok else "",
                             "ours_us": us, "compile_us": comp, "vs_eager": e.speedup_vs_eager,
                             "vs_compile": e.speedup_vs_compile, "copy_bw_fraction": e.bandwidth_fraction})
                print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        ev.close()
    cmd = "python bench/region_vector_probe.py " + " ".join(sys.argv[1:])
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "wall_s": round(time.time() - t0, 1)}
    Path(args.out + ".json").write_text(json.dumps({"command": cmd, "env": env, "rows": rows}, indent=1))
    lines = ["# Region pointwise vector path: ResNet-50 batch_norm + add + relu", "", f"`{cmd}`", "",
             f"{env['gpu']}, torch {env['torch']}, cuda {env['cuda']}; layout "
             f"{'channels_last' if args.channels_last else 'NCHW'}, {args.dtype}", "",
             "| shape | knobs | verdict | ours | Inductor | vs Inductor | vs eager | % copy BW |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def f(x, fmt):
        return fmt.format(x) if x is not None else "-"

    for r in rows:
        knobs = ",".join(f"{k}={v}" for k, v in r["params"].items() if k != "fast_math")
        lines.append(f"| {'x'.join(map(str, r['shape']))} | {knobs} | {r['verdict']} | {f(r['ours_us'], '{:.1f} us')} | "
                     f"{f(r['compile_us'], '{:.1f} us')} | {f(r['vs_compile'], '{:.2f}x')} | {f(r['vs_eager'], '{:.2f}x')} | "
                     f"{f(r['copy_bw_fraction'] * 100 if r['copy_bw_fraction'] is not None else None, '{:.0f}%')} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
