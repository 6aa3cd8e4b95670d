"""Regions of real models, each timed eager vs torch.compile of the region's own subgraph.

    python bench/regions_probe.py MODEL.py [MODEL.py ...] [--device cuda] [--dtype bfloat16]
        [--top 20] [--min-share 0.01] [--mode max-autotune-no-cudagraphs] [--out BASE] [--time-limit S]
    python bench/regions_probe.py --merge A.json B.json ... [--out BASE]

On the H200, one seed model per device call (each region's torch.compile takes seconds to tens
of seconds), then the merge:

    FORGE_BENCH_DEVICE=cuda python bench/regions_probe.py bench/models/resnet50.py --device cuda \
        --time-limit 420 --out $OUT/regions_resnet50
    (the same for sd35_vae_decode, gemma4_prefill, qwen35_moe_prefill)
    python bench/regions_probe.py --merge regions_*.json    # -> bench/results/regions.{md,json}

Per model: load it (forge_pack.profile.load: get_model()/get_inputs() or a KernelBench file), capture the
ATen graph with per-node eager profile times (forge_pack.graph.capture), find its regions, group
instances by signature, and for the largest groups (by share of the attributed eager time, at
least --min-share, at most --top) take the first instance and its real input tensors from the
captured graph. Each is timed with forge_pack.evaluate.timing's protocol (L2 flush before every call,
rotated input copies, CUDA events, median of >= 30): the eager subgraph (one ATen call per op)
and torch.compile(mode=--mode) of the same subgraph (Inductor's fused kernel, the bar a region
kernel must clear). Reported per region: ops, share, calls per forward, both medians, the ratio
eager/compiled, bytes moved and the compiled kernel's fraction of the measured copy bandwidth,
and the compiled output's max error against the float64 reference.

Writes BASE.json and BASE.md (default $OUT/regions, else bench/results/regions).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from _common import environment, write  # noqa: E402
from forge_pack.graph.capture import capture  # noqa: E402
from forge_pack.graph.regions import find_regions  # noqa: E402
from forge_pack.graph.report import group_regions, regions_json  # noqa: E402
from forge_pack.profile.load import load  # noqa: E402
from forge_pack.evaluate.timing import Flusher, TimingConfig, copy_bandwidth_gbs, rotation_count, time_calls  # noqa: E402


def draw_inputs(region, device: str) -> list[torch.Tensor]:
    """Random tensors of the region's input specs (the dynamo route keeps no real values)."""
    out = []
    for s in region.input_specs:
        dtype = getattr(torch, s.dtype)
        size = max((d - 1) * st for d, st in zip(s.shape, s.strides)) + 1 if s.shape else 1
        if dtype.is_floating_point:
            base = torch.randn(size, device=device).to(dtype)
        elif dtype == torch.bool:
            base = torch.rand(size, device=device) > 0.5
        else:
            base = torch.randint(0, 8, (size,), device=device, dtype=dtype)
        out.append(base.as_strided(s.shape, s.strides))
    return out


def _copies(tensors: list, n: int) -> list[list]:
    """n sets of inputs with the same strides (clone keeps a dense non-contiguous layout)."""
    sets = [tensors]
    for _ in range(n - 1):
        sets.append([t.clone(memory_format=torch.preserve_format) if isinstance(t, torch.Tensor) else t
                     for t in tensors])
    return sets


def probe_region(region, inputs: list, device: str, cfg: TimingConfig, mode: str, copy_gbs: float) -> dict:
    row = {"name": region.name, "pattern": region.pattern, "kind": region.kind, "ops": list(region.short_ops),
           "input_specs": [s.pretty() for s in region.input_specs],
           "output": region.output_spec.pretty() if region.output_spec else None,
           "bytes_moved": region.bytes_moved(), "module": region.module}
    eager = region.reference(device)
    with torch.no_grad():
        want = eager(*inputs)
        ref64 = region.reference_f64(device)(*inputs)
    sets = _copies(inputs, rotation_count(max(region.bytes_moved(), 1), cfg))
    flusher = Flusher(device, cfg)
    with torch.no_grad():
        t_eager = time_calls([lambda s=s: eager(*s) for s in sets], device, cfg, flusher)
    row["eager_us"] = t_eager.median_us if t_eager else None
    try:
        compiled = torch.compile(eager, mode=mode, dynamic=False)
        with torch.no_grad():
            got = compiled(*inputs)
            t_comp = time_calls([lambda s=s: compiled(*s) for s in sets], device, cfg, flusher)
        row["compiled_us"] = t_comp.median_us if t_comp else None
        row["compiled_max_abs_vs_eager"] = float((got.double() - want.double()).abs().max()) if got.numel() else 0.0
        row["compiled_max_abs_vs_f64"] = float((got.double() - ref64).abs().max()) if got.numel() else 0.0
        row["eager_max_abs_vs_f64"] = float((want.double() - ref64).abs().max()) if want.numel() else 0.0
    except Exception as e:  # a region Inductor cannot compile is a finding, not a crash of the probe
        row["compile_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        row["compiled_us"] = None
    if row.get("eager_us") and row.get("compiled_us"):
        row["eager_over_compiled"] = row["eager_us"] / row["compiled_us"]
        gbs = region.bytes_moved() / (row["compiled_us"] * 1e3)
        row["compiled_gbs"] = gbs
        row["compiled_copy_fraction"] = gbs / copy_gbs if copy_gbs else None
    return row


def probe_model(path: str, args) -> dict:
    t0 = time.perf_counter()
    target = load(path, args.device, args.dtype)
    graph = capture(target.module, target.args, target.kwargs, iterations=args.iterations)
    regions = find_regions(graph)
    groups = [g for g in group_regions(regions) if g.time_share >= args.min_share][: args.top]
    doc = {"model": path, "device": target.device, "dtype": target.dtype, "capture_s": time.perf_counter() - t0,
           "summary": {k: v for k, v in regions_json(graph, regions).items() if k != "regions"},
           "regions_found": len(group_regions(regions)), "rows": []}
    values = graph.run(keep={n for g in groups for n in g.first.inputs}) if graph.values is not None else None
    cfg = TimingConfig(reps=50, compile_baseline=True)
    copy_gbs = copy_bandwidth_gbs(target.device, cfg)
    doc["copy_gbs"] = copy_gbs
    deadline = t0 + args.time_limit
    for g in groups:
        if time.perf_counter() > deadline:
            doc["rows"].append({"name": g.first.name, "skipped": "time limit"})
            continue
        r = g.first
        inputs = [values[n] for n in r.inputs] if values is not None else draw_inputs(r, target.device)
        try:
            row = probe_region(r, inputs, target.device, cfg, args.mode, copy_gbs)
        except Exception as e:
            row = {"name": r.name, "pattern": r.pattern, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-2000:]}
        row.update(calls=len(g.regions), share=g.time_share, per_forward_us=g.time_us, time_source=r.time_source)
        doc["rows"].append(row)
        print(f"[regions] {Path(path).stem}: {r.pattern} {row.get('eager_us')} / {row.get('compiled_us')} us",
              file=sys.stderr, flush=True)
    return doc


def _f(x, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(models: list[dict], command: str, env: dict) -> str:
    lines = ["# Regions: eager vs torch.compile of each region's subgraph", "",
             f"Command: `{command}`", "", f"Environment: {env}", ""]
    for m in models:
        if "error" in m:
            lines += [f"## {m['model']}", "", f"failed: {m['error']}", ""]
            continue
        s = m["summary"]
        lines += [f"## {m['model']} ({m['device']}, {m['dtype'] or 'model dtype'})", "",
                  f"Graph route {s['route']}, times {s['time_source']}; {m['regions_found']} region signatures "
                  f"covering {s['region_share'] * 100:.1f}% of the attributed eager time; copy bandwidth "
                  f"{m['copy_gbs']:.0f} GB/s.", "",
                  "| region | ops | share | calls | eager µs | compiled µs | eager/compiled | MB "
                  "| compiled % copy bw | max err vs f64 (compiled / eager) |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in m["rows"]:
            if "skipped" in r or "error" in r:
                lines.append(f"| {r['name']} | {r.get('skipped') or r.get('error')} | | | | | | | | |")
                continue
            frac = r.get("compiled_copy_fraction")
            lines.append(
                f"| {r['pattern']} | {' '.join(r['ops'])} | {r['share'] * 100:.1f}% | {r['calls']} | "
                f"{_f(r['eager_us'])} | {_f(r.get('compiled_us'))} | {_f(r.get('eager_over_compiled'), '.2f')} | "
                f"{r['bytes_moved'] / 1e6:.1f} | {_f(frac * 100 if frac else None)} | "
                f"{_f(r.get('compiled_max_abs_vs_f64'), '.2e')} / {_f(r.get('eager_max_abs_vs_f64'), '.2e')} |")
            if r.get("compile_error"):
                lines.append(f"| | compile error: {r['compile_error'][:200]} | | | | | | | | |")
        uncovered = s.get("uncovered") or []
        if uncovered:
            lines += ["", "Not covered: " + "; ".join(f"{u['reason']} {u['time_share'] * 100:.1f}%" for u in uncovered)]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*")
    p.add_argument("--merge", nargs="+", default=None, help="regions JSON files to join into one result")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--min-share", type=float, default=0.01)  # the bar: every region above 1% of the time
    p.add_argument("--mode", default="max-autotune-no-cudagraphs")  # the evaluator's compile baseline mode
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--time-limit", type=float, default=480.0)  # per model: under the device's 10-minute call
    p.add_argument("--out", default=None)
    args = p.parse_args()
    base = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "regions" if os.environ.get("OUT")
                                            else ROOT / "bench" / "results" / "regions")
    base.parent.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *sys.argv[1:]])
    if args.merge:  # one result from per-model calls: each model keeps the command that measured it
        docs = [json.loads(Path(f).read_text()) for f in args.merge]
        models = [dict(m, command=d["command"]) for d in docs for m in d["models"]]
        commands = "; ".join(d["command"] for d in docs)
        write(base, {"command": commands, "environment": docs[0]["environment"], "models": models},
              markdown(models, commands, docs[0]["environment"]))
        return
    if not args.models:
        p.error("give model files, or --merge with result files")
    models = []
    for path in args.models:
        try:
            models.append(probe_model(path, args))
        except Exception as e:
            models.append({"model": path, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        env = environment()
        write(base, {"command": command, "environment": env, "models": models}, markdown(models, command, env))


if __name__ == "__main__":
    main()
