"""Candidates fully evaluated per minute on one GPU (target: >= 20).

    python bench/eval_throughput.py [OUT_BASE] [--cpu] [--no-compile]   # writes OUT_BASE.md and .json

A realistic hotspot (softmax bf16 -> fp32 (1,8,2048,2048) with a captured real input, and
group_norm bf16 (1,512,128,128)); N distinct candidates per hotspot (the reference kernel with
different block sizes and a unique comment each, so every one compiles), evaluated end to end
(static checks, NVRTC compile, load, verification on fresh + odd + adversarial + captured inputs,
timing with >= 30 calls) from 2 threads as the search does. The baseline (eager +
torch.compile) is timed once per hotspot and reported separately. Works on CPU too (--cpu).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from _common import environment, out_path, stats, write

N = int(os.environ.get("BENCH_N", "30"))  # candidates per hotspot
HOTSPOTS = [("softmax", "x: bf16[1,8,2048,2048], dim=-1, dtype=float32", "min(1024, round_up(cols, 32))",
             ["128", "256", "512", "1024"]),
            ("group_norm", "x: bf16[1,512,128,128], num_groups=32, weight: bf16[512], bias: bf16[512]", "256",
             ["128", "256", "512", "1024"])]


def variants(ref, blocks: list[str], n: int):
    from forge_pack.core.candidate import Candidate, parse_spec

    out = []
    for i in range(n):
        spec = ref.spec.to_json()
        spec["kernels"][0]["block"] = [blocks[i % len(blocks)], "1", "1"]
        out.append(Candidate(ref.op, ref.backend, ref.source + f"\n// variant {i} {time.time()}\n", parse_spec(spec),
                             "bench", {"i": i}))
    return out


def main() -> None:
    import torch

    from forge_pack.profile.capture import save_capture
    from forge_pack.evaluate.evaluator import Evaluator
    from forge_pack.core.hotspot import Hotspot
    from forge_pack.targets.ops import eager, make_inputs
    from forge_pack.search.families import reference_candidate
    from forge_pack.targets.sigparse import parse_signature
    from forge_pack.evaluate.timing import TimingConfig

    backend = "cpu" if "--cpu" in sys.argv or not torch.cuda.is_available() else "cuda"
    n = N if backend == "cuda" else 6
    base_path = out_path("eval_throughput")
    doc = {"environment": environment(), "backend": backend, "hotspots": []}
    rows = []
    with tempfile.TemporaryDirectory() as run_dir, tempfile.TemporaryDirectory() as cache:
        with Evaluator(backend, workers=1, timeout_s=60, run_dir=run_dir, cache_dir=cache,
                       timing=TimingConfig(compile_baseline="--no-compile" not in sys.argv)) as ev:
            for op, text, _, blocks in HOTSPOTS:
                if backend == "cpu":
                    text = text.replace("[1,8,2048,2048]", "[8,512]").replace("[1,512,128,128]", "[1,64,16,16]") \
                        .replace("[512]", "[64]")
                sig = parse_signature(op, text)
                inputs = make_inputs(sig, "fresh", torch.Generator().manual_seed(1), "cpu")
                rel = f"inputs/{sig.slug()}_0.safetensors"
                save_capture(f"{run_dir}/{rel}", sig, inputs, eager(sig)(inputs))
                h = Hotspot(sig, ("bench",), 1.0, 0.0, 0.0, 0.0, (rel,), backend)
                t0 = time.perf_counter()
                base = ev.baseline(h)
                baseline_s = time.perf_counter() - t0
                cands = variants(reference_candidate(sig, backend), blocks, n)
                t0 = time.perf_counter()
                first = ev.evaluate(cands[0], h, base)  # loads the hotspot's input sets into the worker
                first_s = time.perf_counter() - t0
                lock = threading.Lock()
                done: list = []

                def one(c):
                    e = ev.evaluate(c, h, base)
                    with lock:
                        done.append(e)

                t0 = time.perf_counter()
                with ThreadPoolExecutor(2) as pool:
                    list(pool.map(one, cands[1:]))
                wall = time.perf_counter() - t0
                per_min = len(done) / wall * 60
                reasons = {}
                for e in done:
                    reasons[e.verdict.reason] = reasons.get(e.verdict.reason, 0) + 1
                r = {"op": op, "signature": sig.pretty(), "candidates": len(done), "wall_s": wall,
                     "per_minute": per_min, "baseline_s": baseline_s, "first_eval_s": first_s,
                     "first_verdict": first.verdict.reason, "verdicts": reasons,
                     "compile_s": stats([e.compile_s for e in done]), "eval_s": stats([e.eval_s for e in done]),
                     "kernel_median_us": statistics.median([e.timing.median_us for e in done if e.timing] or [0]),
                     "eager_us": base.eager.median_us,
                     "compile_us": base.compiled.median_us if base.compiled else None}
                doc["hotspots"].append(r)
                rows.append(f"| {sig.pretty()} | {len(done)} | {wall:.1f} | **{per_min:.1f}** | "
                            f"{r['compile_s']['median']:.2f} | {r['eval_s']['median']:.2f} | {first_s:.1f} | "
                            f"{baseline_s:.1f} | {reasons} |")
    worst = min(h["per_minute"] for h in doc["hotspots"])
    doc["target_per_minute"] = 20
    doc["pass"] = worst >= 20
    md = [f"# Candidates evaluated per minute ({doc['environment'].get('gpu', backend)})", "",
          "End to end per candidate: static checks, compile (new source each), load, verification on fresh, odd, "
          "adversarial and captured inputs (two runs each), timing (>= 30 calls, L2 flushed). Two search threads, "
          "one worker per GPU. Baseline and the first evaluation (loads the hotspot's inputs) are listed apart.", "",
          "| hotspot | candidates | wall s | per minute | compile s (median) | eval s (median) | first eval s | "
          "baseline s | verdicts |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows, "",
          f"**{'PASS' if doc['pass'] else 'FAIL'}**: worst {worst:.1f} candidates/minute (target 20).", "",
          f"Environment: {doc['environment']}"]
    write(base_path, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
