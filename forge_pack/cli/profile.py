"""`forge-pack profile MODEL.py`: where the forward's time goes, per target call signature."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from forge_pack.profile.profiler import Profile, ProfileConfig

DEVICE_HELP = "cpu or cuda (default: cuda when a GPU is present)."
DTYPE_HELP = "Cast the model's floating parameters and inputs: float32, bfloat16 or float16."


def default_run_dir(model_path: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{Path(model_path).stem}-{stamp}"


def fmt_us(us: float) -> str:
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} µs"


def format_profile(p: Profile, top: int) -> str:
    lines = [f"forge-pack profile: {p.model_path} on {p.device}" + (f" ({p.dtype})" if p.dtype else "")
             + f", {p.iterations} forwards, {fmt_us(p.forward_us)} {'GPU' if p.device == 'cuda' else 'CPU'} time "
             f"per forward ({fmt_us(p.wall_us)} wall)"]
    if not p.hotspots:
        lines.append("No targeted op is called by this model: nothing for forge-pack to accelerate.")
        lines.append("Targeted ops: softmax, log_softmax, layer_norm, rms_norm, group_norm, batch_norm (inference), "
                     "adaptive_avg_pool2d.")
    else:
        header = f"{'#':>2}  {'share':>6}  {'per fwd':>9}  {'calls':>5}  {'per call':>9}  signature  [call paths]"
        lines.append(header)
        for i, h in enumerate(p.hotspots[:top], 1):
            note = f"  (not targeted: {h.unsupported})" if h.unsupported else ""
            calls = f"{h.calls_per_forward:g}"
            lines.append(f"{i:>2}  {h.time_share * 100:5.1f}%  {fmt_us(h.total_us):>9}  {calls:>5}  "
                         f"{fmt_us(h.per_call_us):>9}  {h.signature.pretty()}  [{', '.join(h.call_paths)}]{note}")
        if len(p.hotspots) > top:
            rest = sum(h.time_share for h in p.hotspots[top:])
            lines.append(f"    ... {len(p.hotspots) - top} more signatures, {rest * 100:.1f}% together (--top)")
    largest = ", ".join(f"{o.name} {o.share * 100:.1f}%" for o in p.other_ops[:3])
    lines.append(f"Ops forge-pack does not target: {p.other_share * 100:.1f}% of the forward"
                 + (f" (largest: {largest})" if largest else ""))
    lines.append(f"Captured {p.captured_calls} real calls ({p.capture_bytes / 1e6:.1f} MB) in {p.run_dir}/inputs")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        model: str = typer.Argument(..., help="Model file: get_model()/get_inputs(), or KernelBench's Model."),
        device: Optional[str] = typer.Option(None, "--device", help=DEVICE_HELP),
        dtype: Optional[str] = typer.Option(None, "--dtype", help=DTYPE_HELP),
        top: int = typer.Option(10, "--top", min=1, help="Show the K largest signatures."),
        run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Where captures and profile.json go."),
        iterations: int = typer.Option(3, "--iterations", min=1, help="Profiled forward passes."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
        regions: bool = typer.Option(False, "--regions", help="Also capture the ATen graph and list its fusable "
                                     "regions (share, ops, what no region covers)."),
    ) -> None:
        """Profile MODEL on its own inputs: time per target call signature, with real tensors captured."""
        from forge_pack.profile.load import load
        from forge_pack.profile.profiler import profile

        target = load(model, device, dtype)
        out_dir = run_dir or default_run_dir(model)
        result = profile(target, out_dir, ProfileConfig(iterations=iterations))
        if not as_json:
            typer.echo(format_profile(result, top))  # before the graph capture, which may fail
        doc = result.to_json()
        if regions:
            from forge_pack.graph.capture import capture
            from forge_pack.graph.report import format_regions, regions_json

            graph = capture(target.module, target.args, target.kwargs, iterations=iterations)
            if as_json:
                doc["regions"] = regions_json(graph)
            else:
                typer.echo(format_regions(graph, top=top))
        if as_json:
            typer.echo(json.dumps(doc))
