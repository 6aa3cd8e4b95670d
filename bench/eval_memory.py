"""Peak GPU memory and wall time of one evaluation at GB scale, per signature (issue 23).

    python bench/eval_memory.py [OUT_BASE] [--only NAME ...] [--reps 30]

For each case: compile the family's candidate, then judge it in this process exactly as a worker
does (``judge.Session`` + ``judge.JudgeCandidate``: the static sets loaded, verification, timing),
twice: the first evaluation loads the hotspot's sets (and the worker's one-time copy-bandwidth
probe runs before it, not counted), the second is a search's steady state. Recorded per evaluation:
``torch.cuda.max_memory_allocated()`` above what was allocated before it (reset in between), as a
multiple of the signature's inputs + outputs, the verdict, the kernel's median and the wall time.
Writes OUT_BASE.{md,json} (default bench/results/eval_memory). About 4 minutes on an H200.
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import environment, out_path, write

CASES = {
    # name: (op, signature, family)
    "layer_norm_16_rows": ("layer_norm", "x: f32[16,64,256,256], normalized_shape=(64,256,256), "
                           "weight: f32[64,256,256], bias: f32[64,256,256]", "split_row"),
    "layer_norm_16_rows_online": ("layer_norm", "x: f32[16,64,256,256], normalized_shape=(64,256,256), "
                                  "weight: f32[64,256,256], bias: f32[64,256,256]", "online"),
    "softmax_1024x393216": ("softmax", "x: f32[1024,393216], dim=-1", "split_row"),
    "group_norm_28x64x512x512": ("group_norm", "x: f32[28,64,512,512], num_groups=8, weight: f32[64], "
                                 "bias: f32[64]", "split"),
    "vit_encoder_norm": ("layer_norm", "x: f32[64,197,768]{strides=768,49152,1}, normalized_shape=(768,), "
                         "weight: f32[768], bias: f32[768]", "strided_row"),
}


def run_case(name: str, reps: int) -> dict:
    import torch

    from forge_pack.evaluate import judge
    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.timing import TimingConfig
    from forge_pack.search.templates_proposer import instantiate
    from forge_pack.targets import abi
    from forge_pack.targets.ops import with_output
    from forge_pack.targets.sigparse import parse_signature

    op, text, family = CASES[name]
    sig = with_output(parse_signature(op, text))
    cand = instantiate(op, "cuda", family, None, sig)
    build = compile_candidate(cand)
    row = {"case": name, "signature": sig.pretty(), "family": family, "data_bytes": abi.bytes_moved(sig),
           "evaluations": []}
    if not build.ok:
        row["error"] = build.log[-2000:]
        return row
    session = judge.Session("cuda")
    cfg = TimingConfig(reps=reps, compile_baseline=False)
    session.bandwidth(cfg)  # once per worker, a fixed size: not part of an evaluation
    job = judge.JudgeCandidate(judge.LoadInputs(name, sig), cand, build.path, cfg)
    for i in range(2):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        got = judge.judge(session, job)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - before
        row["evaluations"].append({"first": i == 0, "reason": got.verdict.reason, "detail": got.verdict.detail[:300],
                                   "median_us": got.timing.median_us if got.timing else None,
                                   "floor_us": got.floor_us, "peak_bytes": peak,
                                   "peak_x_data": peak / row["data_bytes"], "wall_s": wall})
        print(f"{name} #{i}: {got.verdict.reason} peak {peak / row['data_bytes']:.2f}x data, {wall:.1f} s, "
              f"median {row['evaluations'][-1]['median_us']}", flush=True)
    session.sets.clear()
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[dict], env: dict) -> str:
    lines = ["# Peak GPU memory and wall time of one evaluation", "",
             f"{env.get('gpu', '?')}, torch {env.get('torch')}. `python bench/eval_memory.py`. Peak: "
             "`torch.cuda.max_memory_allocated()` above the allocation before the evaluation, over the "
             "signature's inputs + outputs. First: the evaluation that loads the hotspot's sets.", "",
             "| case | family | data GB | eval | verdict | kernel µs | % BW | peak / data | wall s |",
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        for e in r.get("evaluations", []):
            bw = f"{e['floor_us'] / e['median_us'] * 100:.0f}%" if e["median_us"] and e["floor_us"] else "-"
            med = f"{e['median_us']:.1f}" if e["median_us"] else "-"
            lines.append(f"| {r['case']} | {r['family']} | {r['data_bytes'] / 1e9:.2f} | "
                         f"{'first' if e['first'] else 'next'} | {e['reason']} | {med} | {bw} | "
                         f"{e['peak_x_data']:.2f}x | {e['wall_s']:.1f} |")
        if r.get("error"):
            lines.append(f"| {r['case']} | {r['family']} | - | - | compile error | - | - | - | - |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    base = out_path("eval_memory")
    rows = [run_case(name, args.reps) for name in CASES if not args.only or name in args.only]
    env = environment()
    write(base, {"rows": rows, "env": env}, markdown(rows, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
