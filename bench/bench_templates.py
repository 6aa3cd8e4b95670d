"""Template kernel families on the issue's H200 shapes: a short MCTS per shape with the template
proposer only, against eager and torch.compile, timed by the evaluator (verified first).

    python bench/bench_templates.py [--budget 20] [--only group_norm,softmax] [--no-compile] [OUT_DIR]

Writes OUT_DIR/templates_bench.md and .json (OUT_DIR defaults to $OUT, else bench/results).
Each row: eager / torch.compile / best template kernel (us, median), speedups, the fraction of the
bandwidth floor (bytes moved once at the measured copy bandwidth), the winning family and its
parameters, and how many evaluations failed and why.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from forge_pack.evaluate.evaluator import Evaluator
from forge_pack.core.hotspot import Hotspot
from forge_pack.search.mcts import SearchConfig, search
from forge_pack.targets.sigparse import parse_signature
from forge_pack.search.templates_proposer import TemplateProposer
from forge_pack.evaluate.timing import TimingConfig

SHAPES = [
    ("group_norm", "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]"),
    ("group_norm", "x: bf16[1,512,128,128], num_groups=32, weight: bf16[512], bias: bf16[512]"),
    ("group_norm", "x: bf16[1,256,512,512], num_groups=32, weight: bf16[256], bias: bf16[256]"),
    ("softmax", "x: bf16[1,8,2048,2048], dim=-1, dtype=float32"),
    ("softmax", "x: bf16[2048,256], dim=-1, dtype=float32"),
    ("softmax", "x: bf16[4096,256], dim=-1, dtype=float32"),
    ("softmax", "x: f32[8,262144], dim=-1"),
    ("adaptive_avg_pool2d", "x: bf16[256,2048,7,7], output_size=(1,1)"),
    ("adaptive_avg_pool2d", "x: bf16[256,2048,7,7]{channels_last}, output_size=(1,1)"),
    # ResNet-50 batch 256: the largest and the 7x7 batch_norm shapes, NCHW and channels_last
    ("batch_norm", "x: bf16[256,64,112,112], running_mean: bf16[64], running_var: bf16[64], weight: bf16[64], "
                   "bias: bf16[64]"),
    ("batch_norm", "x: bf16[256,256,56,56], running_mean: bf16[256], running_var: bf16[256], weight: bf16[256], "
                   "bias: bf16[256]"),
    ("batch_norm", "x: bf16[256,2048,7,7], running_mean: bf16[2048], running_var: bf16[2048], weight: bf16[2048], "
                   "bias: bf16[2048]"),
    ("batch_norm", "x: bf16[256,256,56,56]{channels_last}, running_mean: bf16[256], running_var: bf16[256], "
                   "weight: bf16[256], bias: bf16[256]"),
    ("rms_norm", "x: bf16[4096,4096], normalized_shape=(4096,), weight: bf16[4096], eps=1e-6, weight_offset=1.0"),
]


def _us(t) -> str:
    return f"{t.median_us:.1f}" if t is not None else "-"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT") or str(Path(__file__).parent / "results"))
    ap.add_argument("--budget", type=int, default=20, help="evaluations per shape")
    ap.add_argument("--only", default="", help="comma-separated ops to run")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline (slow to build)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    timing = TimingConfig(compile_baseline=not args.no_compile)
    rows, records = [], []
    with Evaluator("cuda", workers=1, timeout_s=120, timing=timing, log_dir=out / "workers") as ev:
        gpu = ev.device_info()
        for op, text in SHAPES:
            if only and op not in only:
                continue
            sig = parse_signature(op, text)
            h = Hotspot(sig, ("bench",), 1.0, 0.0, 0.0, 1.0, (), "cuda")
            t0 = time.time()
            base = ev.baseline(h)
            res = search(TemplateProposer(), lambda c: ev.evaluate(c, h, base), SearchConfig(budget=args.budget),
                         hotspot=h, backend="cuda", baseline=base, gpu=gpu)
            best = res.best.evaluation if res.best is not None else None
            cand = res.best.candidate if res.best is not None else None
            fails = {k: v for k, v in res.verdicts.items() if k != "ok"}
            rec = {"op": op, "signature": sig.pretty(), "eager_us": base.eager.median_us,
                   "compile_us": base.compiled.median_us if base.compiled else None, "floor_us": base.floor_us,
                   "best_us": best.timing.median_us if best and best.timing else None,
                   "speedup_vs_eager": best.speedup_vs_eager if best else None,
                   "speedup_vs_compile": best.speedup_vs_compile if best else None,
                   "bandwidth_fraction": best.bandwidth_fraction if best else None,
                   "family": cand.family if cand else None, "params": dict(cand.params) if cand else None,
                   "evaluations": res.evaluations, "failures": fails, "wall_s": round(time.time() - t0, 1)}
            records.append(rec)
            frac = f"{100 * rec['bandwidth_fraction']:.0f}%" if rec["bandwidth_fraction"] else "-"
            sp = (f"{rec['speedup_vs_eager']:.2f}x / " + (f"{rec['speedup_vs_compile']:.2f}x"
                  if rec["speedup_vs_compile"] else "-")) if best else "no correct kernel"
            rows.append(f"| `{sig.pretty()}` | {_us(base.eager)} | {_us(base.compiled)} | {base.floor_us:.1f} | "
                        f"{rec['best_us'] and round(rec['best_us'], 1)} | {sp} | {frac} | "
                        f"{cand.label if cand else '-'} | {res.evaluations} ({sum(fails.values())} failed: "
                        f"{', '.join(f'{k} {v}' for k, v in fails.items()) or 'none'}) |")
            print(rows[-1], flush=True)
    head = ["# Template kernels on " + str(gpu.get("name", "the GPU")), "",
            f"`python bench/bench_templates.py --budget {args.budget}" + (" --no-compile" if args.no_compile else "")
            + "`: a template-only MCTS per shape; times are medians in microseconds (CUDA events, L2 flushed).", "",
            "| signature | eager | compile | floor | best | speedup vs eager / compile | of floor | kernel | "
            "evaluations |", "|---|---|---|---|---|---|---|---|---|"]
    (out / "templates_bench.md").write_text("\n".join(head + rows) + "\n")
    (out / "templates_bench.json").write_text(json.dumps({"gpu": gpu, "results": records}, indent=1))
    print(f"wrote {out / 'templates_bench.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
