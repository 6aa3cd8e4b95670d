"""Peak GPU memory and wall time of one evaluation at GB scale, per signature (issue 23).

    python bench/eval_memory.py [OUT_BASE] [--only NAME ...] [--reps 30] [--where] [--profile]

For each case: compile the family's candidate, then judge it in this process exactly as a worker
does (``judge.Session`` + ``judge.JudgeCandidate``: the static sets loaded, verification, timing),
twice: the first evaluation loads the hotspot's sets (and the worker's one-time copy-bandwidth
probe runs before it, not counted), the second is a search's steady state. Recorded per evaluation:
``torch.cuda.max_memory_allocated()`` above what was allocated before it (reset in between), as a
multiple of the signature's inputs + outputs, the verdict, the kernel's median and the wall time.
``--where``: per judge step (WHERE), the memory allocated at its entry and exit, the most allocated at any
moment inside it (``Peaks``: the step holding the evaluation's peak is named), and the seconds inside it; ``--profile``: each evaluation under cProfile, its PROFILE_TOP functions by cumulative time (at
3.3 s per GB an evaluation is far slower than its GPU work: these say where the rest goes).
Writes OUT_BASE.{md,json} (default bench/results/eval_memory). About 4 minutes on an H200.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import commit, environment, out_path, write

CASES = {
    # name: (op, signature, family)
    "layer_norm_16_rows": ("layer_norm", "x: f32[16,64,256,256], normalized_shape=(64,256,256), "
                           "weight: f32[64,256,256], bias: f32[64,256,256]", "split_row"),
    "layer_norm_16_rows_resident": ("layer_norm", "x: f32[16,64,256,256], normalized_shape=(64,256,256), "
                                    "weight: f32[64,256,256], bias: f32[64,256,256]", "resident"),
    "layer_norm_16_rows_online": ("layer_norm", "x: f32[16,64,256,256], normalized_shape=(64,256,256), "
                                  "weight: f32[64,256,256], bias: f32[64,256,256]", "online"),
    "softmax_1024x393216": ("softmax", "x: f32[1024,393216], dim=-1", "split_row"),
    "group_norm_28x64x512x512": ("group_norm", "x: f32[28,64,512,512], num_groups=8, weight: f32[64], "
                                 "bias: f32[64]", "split"),
    # the one-read persistent grids: rows of 1.5 MB, planes of 1 MB (KernelBench's softmax and InstanceNorm2d rows)
    "softmax_1024x393216_resident": ("softmax", "x: f32[1024,393216], dim=-1", "resident"),
    "instance_norm_28x64x512x512_resident": ("instance_norm", "x: f32[28,64,512,512]", "resident"),
    "vit_encoder_norm": ("layer_norm", "x: f32[64,197,768]{strides=768,49152,1}, normalized_shape=(768,), "
                         "weight: f32[768], bias: f32[768]", "strided_row"),
}

# Regions (searched with --regions, e.g. KernelBench's InstanceNorm2d and its RMS norm over channels): the model's
# region captured on the GPU at this input shape, judged with the region family's kernel.
REGION_CASES = {
    # name: (model kind, input shape, family)
    "instance_norm_region_28x64x512x512": ("instance_norm", (28, 64, 512, 512), "row"),
    "channel_rms_region_28x64x512x512": ("channel_rms", (28, 64, 512, 512), "row"),
}


def region_signature(kind: str, shape: tuple, device: str = "cuda"):
    """The signature of the one region of a small model on an input of ``shape`` (captured on ``device``)."""
    import torch
    from torch import nn

    from forge_pack.graph.capture import capture
    from forge_pack.graph.regions import find_regions
    from forge_pack.targets.region_target import signature

    sys.path.insert(0, str(Path(__file__).resolve().parent / "kernelbench"))
    from l1_36_rms_norm import Model as ChannelRms  # KernelBench's RMS norm: over the channels of NCHW

    model = nn.InstanceNorm2d(shape[1]) if kind == "instance_norm" else ChannelRms(shape[1])
    x = torch.randn(shape, device=device)
    (region,) = find_regions(capture(model.to(device), (x,), profile=False))
    del x
    if device == "cuda":
        torch.cuda.empty_cache()
    return signature(region)


# --where: the judge's steps whose entry and exit record the device memory allocated then (their own
# high-water mark while they run, measured by resetting nothing: the live set at their boundaries),
# and the seconds spent inside them (inclusive of the steps they call; the device synchronised at
# entry and exit, so a step's GPU work is its own: these evaluations' wall times include the syncs)
WHERE = ("verify.make_set", "verify.verify", "verify._run_set", "verify.derived_sets", "verify.fresh_inputs",
         "verdict_rules.derive_inputs", "memory_plan.reference64", "verdict_rules.compare",
         "verdict_rules.judge_output", "verdict_rules.eager_allowance", "verdict_rules.bitwise_equal", "ops.eager",
         "judge.time_candidate", "judge._check_batch", "judge.check_bounds", "timing.time_calls")
PROFILE_TOP = 25  # --profile: the functions with the most cumulative time per evaluation


class Peaks:
    """The allocator's high-water mark inside nested steps. One counter (``max_allocated``, cleared by ``reset`` to
    what is allocated now) serves every open step: before each reset the mark so far is folded into every open
    step and into ``total`` (the evaluation's own peak, which the resets would otherwise lose)."""

    def __init__(self, max_allocated, reset):
        self.max_allocated, self.reset = max_allocated, reset
        self.open: list[int] = []
        self.total = 0

    def start(self) -> None:
        """A new evaluation: its peak counts from now (the mark reset to what is allocated, no step open)."""
        self.reset()
        self.open, self.total = [], 0

    def fold(self) -> None:
        m = self.max_allocated()
        self.total = max(self.total, m)
        self.open = [max(v, m) for v in self.open]
        self.reset()

    def enter(self) -> None:
        self.fold()
        self.open.append(0)

    def exit(self) -> int:
        """The most allocated at any moment inside the step being left."""
        self.fold()
        return self.open.pop()


def trace_steps(peaks: Peaks | None = None) -> dict:
    """Wrap the WHERE functions: per step, the most device memory allocated at its entry and at its exit
    (bytes), so the phase of an evaluation that holds the most is named, not only the peak's size, the
    most allocated at any moment inside it (``peaks``: with it the evaluation's peak is ``peaks.total``), and
    the seconds inside it."""
    import importlib

    import torch

    seen: dict = {}
    for qual in WHERE:
        mod_name, fn_name = qual.split(".")
        pkg = "forge_pack.targets" if mod_name == "ops" else "forge_pack.evaluate"
        mod = importlib.import_module(f"{pkg}.{mod_name}")
        real = getattr(mod, fn_name)

        def wrapped(*a, _real=real, _qual=qual, **k):
            rec = seen.setdefault(_qual, {"calls": 0, "entry_max": 0, "exit_max": 0, "inside_max": 0, "seconds": 0.0})
            rec["calls"] += 1
            rec["entry_max"] = max(rec["entry_max"], torch.cuda.memory_allocated())
            torch.cuda.synchronize()
            if peaks is not None:
                peaks.enter()
            t0 = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                torch.cuda.synchronize()
                rec["seconds"] += time.perf_counter() - t0
                rec["exit_max"] = max(rec["exit_max"], torch.cuda.memory_allocated())
                if peaks is not None:
                    rec["inside_max"] = max(rec["inside_max"], peaks.exit())

        setattr(mod, fn_name, wrapped)
    return seen


def profiled(fn):
    """fn() under cProfile: (its result, the PROFILE_TOP functions by cumulative seconds)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    result = prof.runcall(fn)
    stats = pstats.Stats(prof)
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:PROFILE_TOP]
    return result, [{"function": f"{Path(f).name}:{line} {name}", "calls": nc, "cumulative_s": ct, "own_s": tt}
                    for (f, line, name), (cc, nc, tt, ct, _) in top]


def run_case(name: str, reps: int, where: bool = False, profile: bool = False) -> dict:
    import torch

    from forge_pack.evaluate import judge
    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.timing import TimingConfig
    from forge_pack.search.templates_proposer import instantiate
    from forge_pack.targets import abi
    from forge_pack.targets.ops import with_output
    from forge_pack.targets.sigparse import parse_signature

    if name in REGION_CASES:
        kind, shape, family = REGION_CASES[name]
        op, sig = "region", region_signature(kind, shape)
    else:
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
    peaks = Peaks(torch.cuda.max_memory_allocated, torch.cuda.reset_peak_memory_stats) if where else None
    steps = trace_steps(peaks) if where else None
    for i in range(2):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if peaks is not None:
            peaks.start()
        before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        if profile:
            got, top = profiled(lambda: judge.judge(session, job))
        else:
            got, top = judge.judge(session, job), None
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if peaks is not None:
            peaks.fold()
        peak = (peaks.total if peaks is not None else torch.cuda.max_memory_allocated()) - before
        row["evaluations"].append({"first": i == 0, "reason": got.verdict.reason, "detail": got.verdict.detail[:300],
                                   "median_us": got.timing.median_us if got.timing else None,
                                   "floor_us": got.floor_us, "peak_bytes": peak,
                                   "peak_x_data": peak / row["data_bytes"], "wall_s": wall, "profile": top})
        print(f"{name} #{i}: {got.verdict.reason} peak {peak / row['data_bytes']:.2f}x data, {wall:.1f} s, "
              f"median {row['evaluations'][-1]['median_us']}", flush=True)
        if steps is not None:  # the live set at each step's boundaries, over the data, for this evaluation
            row["evaluations"][-1]["steps_x_data"] = {
                q: {"calls": r["calls"], "entry": (r["entry_max"] - before) / row["data_bytes"],
                    "exit": (r["exit_max"] - before) / row["data_bytes"],
                    "inside": (r["inside_max"] - before) / row["data_bytes"], "seconds": r["seconds"]}
                for q, r in steps.items()}
            for q, r in sorted(row["evaluations"][-1]["steps_x_data"].items(), key=lambda kv: -kv[1]["entry"]):
                print(f"  {q}: {r['calls']} calls, at entry up to {r['entry']:.2f}x, at exit {r['exit']:.2f}x, "
                      f"inside {r['inside']:.2f}x, {r['seconds']:.2f} s")
            steps.clear()
    session.sets.clear()
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[dict], env: dict) -> str:
    lines = ["# Peak GPU memory and wall time of one evaluation", "",
             f"{env.get('gpu', '?')}, torch {env.get('torch')}, commit {env.get('commit') or '?'}. "
             f"`{env.get('command', 'python bench/eval_memory.py')}`. Peak: "
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
    for r in rows:  # --where: the live set at the judge's steps
        for e in r.get("evaluations", []):
            if not e.get("steps_x_data"):
                continue
            lines += ["", f"### {r['case']}, {'first' if e['first'] else 'next'} evaluation: device memory allocated at "
                      "each step's entry and exit and at any moment inside it (most over its calls), over the data; "
                      "seconds inside the step (inclusive, synchronised)", "",
                      "| step | calls | at entry | at exit | peak inside | s |",
                      "| --- | ---: | ---: | ---: | ---: | ---: |"]
            for q, v in sorted(e["steps_x_data"].items(), key=lambda kv: -kv[1]["entry"]):
                secs = f"{v['seconds']:.2f}" if "seconds" in v else "-"
                inside = f"{v['inside']:.2f}x" if "inside" in v else "-"
                lines.append(f"| `{q}` | {v['calls']} | {v['entry']:.2f}x | {v['exit']:.2f}x | {inside} | {secs} |")
    for r in rows:  # --profile: where an evaluation's host time goes
        for e in r.get("evaluations", []):
            if not e.get("profile"):
                continue
            lines += ["", f"### {r['case']}, {'first' if e['first'] else 'next'} evaluation: cProfile, the "
                      f"{PROFILE_TOP} functions with the most cumulative time", "",
                      "| function | calls | cumulative s | own s |", "| --- | ---: | ---: | ---: |"]
            lines += [f"| `{f['function']}` | {f['calls']} | {f['cumulative_s']:.2f} | {f['own_s']:.2f} |"
                      for f in e["profile"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--where", action="store_true",
                    help="name the judge's steps that hold the most, and the seconds in each (trace_steps)")
    ap.add_argument("--profile", action="store_true", help="cProfile each evaluation: where its host time goes")
    args = ap.parse_args()
    base = out_path("eval_memory")
    rows = [run_case(name, args.reps, args.where, args.profile) for name in (*CASES, *REGION_CASES)
            if not args.only or name in args.only]
    # the command without its output path (the caller's own directory); the flags say what was measured
    flags = sys.argv[2:] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else sys.argv[1:]
    env = {**environment(), "commit": commit(), "command": " ".join(["python bench/eval_memory.py", *flags])}
    write(base, {"rows": rows, "env": env}, markdown(rows, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
