"""`forge-pack search MODEL.py`: profile, then search faster kernels for each hotspot (MCTS).

Progress goes to stderr (one carriage-return bar per hotspot), the result table to stdout, or
with --json exactly one JSON document. Exit 0 also when nothing faster was found, said plainly.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional, TextIO

import typer

from forge_pack.core.errors import ForgeError
from forge_pack.core.winner import WIN_MARGIN
from forge_pack.search.pipeline import HotspotOutcome, RunConfig, RunSummary, Toolkit, load_config, run, \
    with_overrides
from forge_pack.search.mcts import Progress

DEVICE_HELP = "cpu or cuda (default: cuda when a GPU is present)."
DTYPE_HELP = "Cast the model's floating parameters and inputs: float32, bfloat16 or float16."
DEFAULT_BUDGET = 50


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search whose run directory exists: the CLI's exit hint names the directory to
    --resume (a KeyboardInterrupt still, so nothing that catches one changes)."""

    def __init__(self, run_dir: str):
        super().__init__()
        self.run_dir = run_dir
        self.hint = f"continue the search with: forge-pack search --resume {run_dir}"


def fmt_us(us: float | None) -> str:
    if us is None:
        return "-"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} µs"


def fmt_x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


# How a search that ended short of its budget says so on its last progress line.
ENDED_EARLY = {"exhausted": "the proposers ran dry", "time_limit": "time limit reached",
               "out_of_memory": "the input sets do not fit the device's memory"}


def failed_reasons(failed: tuple[tuple[str, int], ...], shown: int = 2) -> str:
    """The failures' most frequent verdict reasons, for the progress line: " (out_of_memory 5, mismatch 1)"."""
    if not failed:
        return ""
    more = len(failed) - shown
    return " (" + ", ".join(f"{r} {c}" for r, c in failed[:shown]) + (f", {more} more" if more > 0 else "") + ")"


class ProgressBar:
    """One plain carriage-return bar per hotspot on stderr; a line every tenth of the budget when
    stderr is not a terminal (CI logs)."""

    def __init__(self, stream: TextIO | None = None, width: int = 24):
        # sys.stderr as it is now, not as it was at import (tests and wrappers swap it)
        self.stream, self.width = stream or sys.stderr, width
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.open = False
        self.last_line = 0

    def say(self, text: str) -> None:
        self._close()
        print(text, file=self.stream, flush=True)

    def hotspot(self, out: HotspotOutcome, i: int, n: int) -> None:
        self.say(f"[{i}/{n}] {out.hotspot.signature.pretty()}  ({out.hotspot.time_share * 100:.1f}% of the forward)")
        self.last_line = 0

    def update(self, out: HotspotOutcome, p: Progress) -> None:
        frac = min(p.evaluations / p.budget, 1.0) if p.budget else 1.0
        filled = int(round(frac * self.width))
        best = f"{p.best_speedup:.2f}x" if p.best_speedup is not None else "-"
        line = (f"  [{'#' * filled}{'.' * (self.width - filled)}] {p.evaluations}/{p.budget}  best {best}  "
                f"failures {p.failures}{failed_reasons(p.failed)}  {p.elapsed_s:.0f}s")
        ended = out.result.stop_reason if out.result is not None else None
        if ended in ENDED_EARLY and p.evaluations >= p.budget:  # the pipeline's last update: the total that ran
            line += f"  ({ENDED_EARLY[ended]}: {p.evaluations} of a budget of {out.result.budget})"
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
            self.stream.flush()
            self.open = True
        elif p.evaluations >= p.budget or p.evaluations - self.last_line >= max(1, p.budget // 10):
            print(line, file=self.stream, flush=True)
            self.last_line = p.evaluations

    def _close(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False

    def done(self) -> None:
        self._close()


def format_summary(s: RunSummary) -> str:
    lines = [f"forge-pack search: {s.config.model} on {s.device}" + (f" ({s.config.dtype})" if s.config.dtype else "")
             + f", budget {s.config.budget} per hotspot, {s.elapsed_s:.0f}s"]
    if not s.outcomes:
        lines.append("No targeted op is called by this model: nothing for forge-pack to accelerate.")
        return "\n".join(lines)
    head = ("#", "hotspot", "share", "eager", "compile", "best kernel", "kernel", "vs eager", "vs compile",
            "% copy BW", "model")
    rows = []
    for o in s.outcomes:
        if o.skipped:
            continue
        b, best = o.baseline, o.best
        ev = best.evaluation if best else None
        comp = fmt_us(b.compiled.median_us) if b and b.compiled else ("failed" if b else "-")
        bw = ev.bandwidth_fraction if ev is not None else None
        rows.append((str(o.rank), o.hotspot.signature.pretty(), f"{o.hotspot.time_share * 100:.1f}%",
                     fmt_us(b.eager.median_us) if b else "-", comp, _best_cell(o),
                     fmt_us(ev.timing.median_us) if ev is not None and ev.timing else "-",
                     fmt_x(ev.speedup_vs_eager if ev else None), fmt_x(ev.speedup_vs_compile if ev else None),
                     f"{bw * 100:.0f}%" if bw else "-", f"{o.projected:.3f}x"))
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    lines.append("")
    for o in s.outcomes:
        if not o.skipped:
            lines.append(f"#{o.rank} {o.hotspot.op}: {o.verdict_line()}")
    for o in s.outcomes:  # a region: what it fuses
        reg = (o.hotspot.extra or {}).get("region")
        if reg and not o.skipped:
            lines.append(f"#{o.rank} {reg['name']} ({reg['kind']}, x{reg['instances']}): "
                         + " ".join(x.split(".")[1] if x.count(".") == 2 else x for x in reg["ops"]))
    skipped = [o for o in s.outcomes if o.skipped]
    if skipped:
        lines.append(f"Not searched: " + "; ".join(f"#{o.rank} {o.hotspot.signature.pretty()}: {o.skipped}"
                                                  for o in skipped[:6])
                     + (f"; and {len(skipped) - 6} more" if len(skipped) > 6 else ""))
    if s.winners:
        share = sum(o.hotspot.time_share for o in s.winners)
        lines.append(f"Projected whole-model speedup (Amdahl, from {len(s.winners)} winning kernel"
                     f"{'s' if len(s.winners) != 1 else ''} covering {share * 100:.1f}% of the forward): "
                     f"{s.projected:.3f}x")
    elif s.evaluated:  # only hotspots with evaluations can have had "no candidate beat eager"
        margin = int(round((WIN_MARGIN - 1) * 100))
        n = len(s.evaluated)
        lines.append(f"No faster kernel found: no candidate beat eager PyTorch by {margin}% on the {n} searched "
                     f"hotspot{'s' if n != 1 else ''}, so the model stays as it is. A larger --budget, --llm, or a "
                     f"GPU may help.")
    elif s.searched:
        lines.append("No hotspot could be searched (see why above), so the model stays as it is.")
    else:
        lines.append("No hotspot was searched (see why above); --top and --min-share choose which are.")
    if s.status == "interrupted":
        lines.append(f"The search was stopped; continue it with: forge-pack search --resume {s.run_dir}")
    from forge_pack.llm.client import run_summary_text

    llm_text = run_summary_text(s.run_dir)  # LLM calls, tokens, cost, outcomes, why LLM moves stopped ("" if none)
    if llm_text:
        lines.append(llm_text)
    lines.append(f"Run directory: {s.run_dir}  (dashboard: forge-pack ui {s.run_dir})")
    return "\n".join(lines)


def _best_cell(o: HotspotOutcome) -> str:
    """The table's 'best kernel' cell: only a hotspot with evaluations can have 'none correct'."""
    if o.result is None:
        return "not searched"  # the baseline failed, or the run stopped before it
    if o.result.evaluations == 0:
        return "no candidates"
    return o.best.candidate.label if o.best else "none correct"


def check_seconds(flag: str, value: float | None, example: str) -> None:
    # `not value > 0` also catches NaN, which compares false with everything
    if value is not None and not value > 0:
        raise ForgeError(f"{flag} must be a positive number of seconds, got {value}", f"e.g. {flag} {example}")


def device_overrides(gpus: Optional[str], ray: Optional[str], device: Optional[str], workers: Optional[int],
                     parallel: Optional[int]) -> dict:
    """The RunConfig fields --gpus and --ray set: the GPU ids the flag resolves to (config.json keeps
    them, so --resume and the confirmation before packing use the same GPUs) and, without
    --parallel, one evaluation in flight per device."""
    if gpus is None and ray is None:
        return {}
    from forge_pack.search.devices import check_flags, parse_gpus, visible_gpus

    check_flags(gpus, ray, device, workers)
    out: dict = {"parallel_auto": parallel is None and workers is None}
    if ray is not None:
        from forge_pack.evaluate.ray_pool import import_ray

        import_ray()  # missing Ray is an error now, before the model is profiled
        out["ray"] = ray.strip()
        out["gpus"] = gpus
    else:
        out["gpus"] = ",".join(parse_gpus(gpus or "", visible_gpus()))
    return out


def default_run_dir(model_path: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"search-{Path(model_path).stem}-{stamp}"


def search_command(model: Optional[str], *, device: Optional[str] = None, dtype: Optional[str] = None,
                   budget: Optional[int] = None, time_limit: Optional[float] = None, top: Optional[int] = None,
                   min_share: Optional[float] = None, run_dir: Optional[Path] = None, resume: Optional[Path] = None,
                   seed: Optional[int] = None, workers: Optional[int] = None, parallel: Optional[int] = None,
                   timeout: Optional[float] = None, as_json: bool = False, llm: Optional[str] = None,
                   llm_budget_usd: Optional[float] = None, llm_budget_tokens: Optional[int] = None,
                   toolkit: Toolkit | None = None, stdout: Callable[[str], None] = typer.echo,
                   ui: dict | None = None, gpus: Optional[str] = None, ray: Optional[str] = None,
                   regions: bool = False) -> RunSummary:
    """The command's body, callable with a fake toolkit (tests)."""
    overrides = dict(budget=budget, time_limit_s=time_limit, top=top, min_share=min_share, seed=seed,
                     workers=workers, parallel=parallel, timeout_s=timeout, llm_model=llm,
                     llm_budget_usd=llm_budget_usd, llm_budget_tokens=llm_budget_tokens)
    if workers is not None and parallel is None:
        overrides["parallel"] = workers  # one evaluation per worker unless told otherwise (fresh or --resume)
    overrides.update(device_overrides(gpus, ray, device, workers, parallel))
    if parallel is not None:  # given again on --resume: it replaces the one-per-device default
        overrides["parallel_auto"] = False
    if resume is not None:
        if model is not None or run_dir is not None:
            raise ForgeError("--resume continues a run with its saved model and run directory",
                             "drop MODEL and --run-dir, e.g. forge-pack search --resume runs/search-x")
        if device is not None or dtype is not None or top is not None or min_share is not None:
            raise ForgeError("--device, --dtype, --top and --min-share cannot change on --resume",
                             "the hotspots were chosen when the run started; start a new search to change them")
        config = with_overrides(load_config(resume), **overrides)
        config = with_overrides(config, run_dir=str(resume))
    else:
        if model is None:
            raise ForgeError("no model file given", "forge-pack search MODEL.py, or --resume RUN_DIR")
        config = with_overrides(RunConfig(model=model, device=device, dtype=dtype, budget=DEFAULT_BUDGET,
                                          run_dir=str(run_dir or default_run_dir(model)), regions=regions),
                                **overrides)
    if config.budget < 1:
        raise ForgeError(f"--budget must be at least 1, got {config.budget}", "e.g. --budget 50")
    if config.parallel < 1 or config.workers < 1:
        raise ForgeError("--workers and --parallel must be at least 1", "e.g. --workers 2 --parallel 2")
    if not 0.0 <= config.min_share <= 1.0:
        raise ForgeError(f"--min-share is a fraction of the forward, got {config.min_share}", "e.g. --min-share 0.02")
    check_seconds("--time-limit", config.time_limit_s, "600")
    check_seconds("--timeout", config.timeout_s, "60")
    bar = ProgressBar()
    try:
        summary = run(config, resume=resume is not None, toolkit=toolkit, say=bar.say, on_progress=bar.update,
                      on_hotspot=bar.hotspot, ui=ui)
    except KeyboardInterrupt as e:
        if (Path(config.run_dir) / "run.db").exists() and not isinstance(e, SearchInterrupted):
            raise SearchInterrupted(config.run_dir) from e
        raise
    finally:
        bar.done()
    if as_json:
        from forge_pack.store.run_store import finite

        stdout(json.dumps(finite(summary.to_json())))
    else:
        stdout(format_summary(summary))
    return summary


UI_OPTION = typer.Option(False, "--ui", help="Serve the live dashboard beside the search (127.0.0.1).")
UI_PORT_OPTION = typer.Option(None, "--ui-port", help="Dashboard port (default: the first free one from 8765).")
ALLOW_CONTROL_OPTION = typer.Option(False, "--allow-control", help="Let the dashboard pause, resume and stop.")
GPUS_OPTION = typer.Option(None, "--gpus", metavar="all|0,1,...",
                           help="Evaluate on these GPUs of this host, one worker each (cuda).")
RAY_OPTION = typer.Option(None, "--ray", metavar="ADDRESS|auto",
                          help="Evaluate on a Ray cluster, one actor per GPU (needs Ray: the ray extra).")


def ui_options(with_ui: bool, port: Optional[int], allow_control: bool) -> dict | None:
    """The keyword arguments of start_ui_in_background for --ui, or None without it."""
    if not with_ui:
        if port is not None or allow_control:
            raise ForgeError("--ui-port and --allow-control need --ui", "add --ui to open the dashboard")
        return None
    return {"port": port, "allow_control": allow_control}


def register(app: typer.Typer) -> None:
    from forge_pack.llm.options import LLM_BUDGET_TOKENS_OPTION, LLM_BUDGET_USD_OPTION, LLM_OPTION

    @app.command("search")
    def search_cmd(
        model: Optional[str] = typer.Argument(None, help="Model file: get_model()/get_inputs(), or KernelBench's "
                                                         "Model. Omit it with --resume."),
        device: Optional[str] = typer.Option(None, "--device", help=DEVICE_HELP),
        dtype: Optional[str] = typer.Option(None, "--dtype", help=DTYPE_HELP),
        budget: Optional[int] = typer.Option(None, "--budget",
                                             help=f"Evaluations per hotspot (default: {DEFAULT_BUDGET})."),
        time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Seconds of search per hotspot."),
        top: Optional[int] = typer.Option(None, "--top", min=1, help="Search the K largest hotspots (default: 3)."),
        min_share: Optional[float] = typer.Option(
            None, "--min-share", help="Skip hotspots under this fraction of the forward (default: 0.01)."),
        run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Where the run store goes (default: runs/...)."),
        resume: Optional[Path] = typer.Option(None, "--resume", metavar="RUN_DIR",
                                              help="Continue an interrupted search to the same total budget."),
        seed: Optional[int] = typer.Option(None, "--seed",
                                           help="Seed of the search and the random inputs (default: 0)."),
        workers: Optional[int] = typer.Option(None, "--workers", help="Evaluator worker processes (default: 1)."),
        parallel: Optional[int] = typer.Option(None, "--parallel", help="Evaluations in flight (default: --workers)."),
        timeout: Optional[float] = typer.Option(None, "--timeout",
                                                help="Seconds per candidate evaluation (default: 60), plus 10 s per GB of the op's data."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
        llm: Optional[str] = LLM_OPTION,
        llm_budget_usd: Optional[float] = LLM_BUDGET_USD_OPTION,
        llm_budget_tokens: Optional[int] = LLM_BUDGET_TOKENS_OPTION,
        with_ui: bool = UI_OPTION,
        ui_port: Optional[int] = UI_PORT_OPTION,
        allow_control: bool = ALLOW_CONTROL_OPTION,
        gpus: Optional[str] = GPUS_OPTION,
        ray: Optional[str] = RAY_OPTION,
        regions: bool = typer.Option(False, "--regions", help="Search the model's regions (fused chains of "
                                                              "memory-bound ops from its ATen graph), not single ops."),
    ) -> None:
        """Profile MODEL, then search faster kernels for its hottest ops (MCTS over kernel templates)."""
        try:
            search_command(model, device=device, dtype=dtype, budget=budget, time_limit=time_limit, top=top,
                           min_share=min_share, run_dir=run_dir, resume=resume, seed=seed, workers=workers,
                           parallel=parallel, timeout=timeout, as_json=as_json, llm=llm,
                           llm_budget_usd=llm_budget_usd, llm_budget_tokens=llm_budget_tokens,
                           ui=ui_options(with_ui, ui_port, allow_control), gpus=gpus, ray=ray, regions=regions)
        except KeyboardInterrupt as e:
            # typer turns Ctrl-C into a silent exit 130: name the run directory to --resume first
            typer.echo("error: interrupted", err=True)
            typer.echo(f"hint: {getattr(e, 'hint', None) or 'no run directory was written yet'}", err=True)
            raise typer.Exit(130) from None
