"""The same kernel timed twice in one run must agree within 3% in median (and eager vs the reference table).

    python bench/timing_repeatability.py [OUT_BASE] [--compile]   # writes OUT_BASE.md and OUT_BASE.json

For each shape of the reference table (SHAPES below: eager and torch.compile times measured on an
H200 with torch 2.11, without an L2 flush): the eager op and torch.compile (baseline)
timed twice (torch.compile only with --compile: max-autotune takes minutes per shape), the
reference kernel evaluated twice (same source, so the same kernel; each
evaluation is a full verify + time in the worker). Reports both medians, their difference, and
eager against the reference measurement (which was taken without an L2 flush, so small shapes may
legitimately read faster there).
"""

from __future__ import annotations

import sys
import tempfile

from _common import environment, out_path, write

# (op, signature, eager us, compile us): the reference table (H200, torch 2.11, no L2 flush)
SHAPES = [
    ("adaptive_avg_pool2d", "x: f32[32,2048,7,7], output_size=(1,1)", 25.4, 96.4),
    ("adaptive_avg_pool2d", "x: f32[256,2048,7,7], output_size=(1,1)", 141.9, 126.0),
    ("adaptive_avg_pool2d", "x: f32[256,2048,7,7]{channels_last}, output_size=(1,1)", 46.6, 137.4),
    ("adaptive_avg_pool2d", "x: bf16[256,2048,7,7], output_size=(1,1)", 128.8, 88.4),
    ("adaptive_avg_pool2d", "x: bf16[256,2048,7,7]{channels_last}, output_size=(1,1)", 27.1, 97.3),
    ("group_norm", "x: f32[1,512,128,128], num_groups=32, weight: f32[512], bias: f32[512]", 268.8, 83.4),
    ("group_norm", "x: bf16[1,512,128,128], num_groups=32, weight: bf16[512], bias: bf16[512]", 204.0, 150.4),
    ("group_norm", "x: bf16[1,256,512,512], num_groups=32, weight: bf16[256], bias: bf16[256]", 1861.4, 739.8),
    ("softmax", "x: bf16[1,8,2048,2048], dim=-1, dtype=float32", 181.0, 111.0),
    ("softmax", "x: bf16[1,8,2048,2048], dim=-1", 82.7, 129.7),
    ("softmax", "x: f32[8,262144], dim=-1", 71.7, 99.9),
    ("softmax", "x: bf16[4096,256], dim=-1, dtype=float32", 21.9, 57.2),
]
TARGET = 0.03


def main() -> None:
    import torch

    from forge_pack.evaluate.evaluator import Evaluator
    from forge_pack.core.hotspot import Hotspot
    from forge_pack.search.families import reference_candidate
    from forge_pack.targets.sigparse import parse_signature
    from forge_pack.evaluate.timing import TimingConfig

    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    base_path = out_path("timing_repeatability")
    compile_baseline = "--compile" in sys.argv  # max-autotune compiles take minutes per shape
    doc = {"environment": environment(), "target": TARGET, "rows": []}
    rows = []
    with tempfile.TemporaryDirectory() as cache, \
            Evaluator("cuda", workers=1, timeout_s=120, cache_dir=cache,
                      timing=TimingConfig(compile_baseline=compile_baseline)) as ev:
        for op, text, ref_eager, ref_compile in SHAPES:
            sig = parse_signature(op, text)
            h = Hotspot(sig, ("bench",), 1.0, 0.0, 0.0, 0.0, (), "cuda")
            b1 = ev.baseline(h)
            ev._baselines.clear()  # time eager (and torch.compile) a second time
            b2 = ev.baseline(h)
            cand = reference_candidate(sig, "cuda")
            k1, k2 = ev.evaluate(cand, h, b1), ev.evaluate(cand, h, b1)
            def diff(a, b):
                return abs(a - b) / min(a, b) if a and b else None

            kd = diff(k1.timing.median_us, k2.timing.median_us) if k1.timing and k2.timing else None
            ed = diff(b1.eager.median_us, b2.eager.median_us)
            cd = diff(b1.compiled.median_us, b2.compiled.median_us) if b1.compiled and b2.compiled else None
            r = {"signature": sig.pretty(), "kernel_us": [k1.timing.median_us if k1.timing else None,
                                                          k2.timing.median_us if k2.timing else None],
                 "kernel_verdicts": [k1.verdict.reason, k2.verdict.reason], "kernel_diff": kd,
                 "kernel_iqr_us": [k1.timing.iqr_us if k1.timing else None, k2.timing.iqr_us if k2.timing else None],
                 "eager_us": [b1.eager.median_us, b2.eager.median_us], "eager_diff": ed,
                 "compile_us": [b1.compiled.median_us if b1.compiled else None,
                                b2.compiled.median_us if b2.compiled else None], "compile_diff": cd,
                 "compile_error": b1.compile_error, "floor_us": b1.floor_us,
                 "reference_eager_us": ref_eager, "reference_compile_us": ref_compile,
                 "eager_vs_reference": b1.eager.median_us / ref_eager}
            doc["rows"].append(r)

            def pct(x):
                return f"{x * 100:.1f}%" if x is not None else "-"

            def us(x):
                return f"{x:.1f}" if x is not None else "-"

            rows.append(f"| {sig.pretty()} | {us(r['kernel_us'][0])} / {us(r['kernel_us'][1])} | {pct(kd)} | "
                        f"{us(r['eager_us'][0])} / {us(r['eager_us'][1])} | {pct(ed)} | "
                        f"{us(r['compile_us'][0])} / {us(r['compile_us'][1])} | {pct(cd)} | "
                        f"{ref_eager} / {ref_compile} | {r['eager_vs_reference']:.2f} | {b1.floor_us:.1f} |")
    diffs = [d for r in doc["rows"] for d in (r["kernel_diff"], r["eager_diff"], r["compile_diff"]) if d is not None]
    worst = max(diffs) if diffs else float("inf")
    doc["worst_diff"] = worst
    doc["pass"] = worst <= TARGET
    md = [f"# Timing repeatability ({doc['environment'].get('gpu')})", "",
          "Same kernel (and eager, torch.compile) timed twice in one run: CUDA events, L2 flushed before every "
          "call, rotating inputs, >= 30 calls (default 50), median. Target: medians differ by <= 3%. "
          "The reference times (SHAPES in bench/timing_repeatability.py) were taken without an L2 flush.", "",
          "| signature | kernel µs (1 / 2) | diff | eager µs (1 / 2) | diff | compile µs (1 / 2) | diff | "
          "REFERENCE eager / compile | eager / REFERENCE | floor µs |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows, "",
          f"**{'PASS' if doc['pass'] else 'FAIL'}**: worst difference {worst * 100:.2f}% (target 3%).", "",
          f"Environment: {doc['environment']}"]
    write(base_path, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
