"""`forge-pack build MODEL.py --out DIR` (profile, search, confirm, pack) and `forge-pack pack RUN_DIR --out DIR`.

Results go to stdout (the search table, then what was packed), progress to stderr, or with
--json exactly one JSON document. No winner (nothing beat eager, every kernel dropped at
confirmation or by the whole-model check): said plainly, no package written, exit 0. A whole-model
failure no kernel can be blamed for is an error (exit 1), see forge_pack.evaluate.model_gate.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional

import typer

from forge_pack.core.errors import ForgeError
from forge_pack.evaluate.model_accuracy import describe
from forge_pack.evaluate.compile_gate import summary_line
from forge_pack.pack.packager import PackResult, check_name, check_out_dir, default_name, pack

DEFAULT_BUDGET = 50


def format_result(r: PackResult) -> str:
    if not r.written:
        return r.message
    lines = [r.message]
    for t in r.targets:
        s = t["speedup"]
        vc = f", {s['vs_compile']:.2f}x vs torch.compile" if s["vs_compile"] else ""
        lines.append(f"  {t['id']}: {t['signature']['pretty']}: {s['vs_eager']:.2f}x vs eager{vc}, "
                     f"{100 * t['time_share']:.1f}% of the forward")
    for d in r.dropped:
        lines.append(f"  not packed: {d['pretty']}: {d['reason']}")
    m = r.model_result
    if m:
        a = m.get("argmax_agreement")
        agree = f", argmax agreement {100 * a:.2f}%" if a is not None else ""
        d = m.get("max_abs_diff")  # None: the outputs' structures differ, no difference to report
        diff = f"{d:.3g}" if d is not None else "n/a"
        lines.append(f"Whole model: {m['eager']['median_us'] / 1e3:.3f} ms eager -> "
                     f"{m['patched']['median_us'] / 1e3:.3f} ms patched ({m['speedup']:.2f}x), "
                     f"max output difference {diff}{agree}")
        if m.get("note"):
            lines.append(f"  note: {m['note']}")
        if m["speedup"] < 1.0:
            lines.append("  note: the patched model is slower end to end here: the kernels' gains do not survive the "
                         "whole forward (Python dispatch per call, timing noise); measure on the target machine "
                         "(`python -m forge_pack.cli.demo show`) before deploying it")
        acc = m.get("accuracy") or {}
        if describe(acc):
            lines.append(f"  {describe(acc)}")
        if acc.get("basis", "").startswith("against"):  # (a written package passed the check: model_gate)
            wide = acc.get("reference_dtype", "float32")
            lines.append(f"  accepted against the model in {wide}: the outputs differ from eager's by more than "
                         f"rounding, but are no further from the {wide} model than eager's (see model_result)")
        if acc.get("note"):
            lines.append(f"  note: {acc['note']}")
    compiled = summary_line(r.model_result, r.compile_result)  # forge_pack.evaluate.compile_gate
    if compiled:
        lines.append(compiled)
    for n in r.notes:
        lines.append(f"note: {n}")
    if r.wheel:
        lines.append(f"Wheel: {r.wheel}")
    lines.append(f"Install: pip install --no-build-isolation {r.out_dir}")
    lines.append(f"Use:     import {r.package}; {r.package}.apply(model)   (check: python -m {r.package} verify)")
    lines.append(f"     or: compiled = {r.package}.compile(model)   (torch.compile with the kernels that win compiled)")
    return "\n".join(lines)


def default_run_dir(model_path: str) -> Path:
    return Path("runs") / f"build-{Path(model_path).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def build_command(model: str, out: Path, *, name: Optional[str] = None, device: Optional[str] = None,
                  dtype: Optional[str] = None, budget: Optional[int] = None, wheel: bool = False, force: bool = False,
                  run_dir: Optional[Path] = None, top: Optional[int] = None, min_share: Optional[float] = None,
                  seed: Optional[int] = None, workers: Optional[int] = None, timeout: Optional[float] = None,
                  llm: Optional[str] = None, llm_budget_usd: Optional[float] = None,
                  llm_budget_tokens: Optional[int] = None, time_limit: Optional[float] = None,
                  as_json: bool = False, toolkit=None, ui: dict | None = None,
                  stdout: Callable[[str], None] = typer.echo) -> PackResult:
    from forge_pack.cli.search import ProgressBar, format_summary
    from forge_pack.search.pipeline import RunConfig, run, with_overrides

    pkg = check_name(name or default_name(model))  # user errors first, before minutes of search
    run_dir = run_dir or default_run_dir(model)
    check_out_dir(Path(out).resolve(), force, run_dir)
    if budget is not None and budget < 1:
        raise ForgeError(f"--budget must be at least 1, got {budget}", "e.g. --budget 50")
    config = with_overrides(RunConfig(model=model, device=device, dtype=dtype, budget=DEFAULT_BUDGET,
                                      run_dir=str(run_dir)),
                            budget=budget, top=top, min_share=min_share, seed=seed, workers=workers,
                            parallel=workers, timeout_s=timeout, llm_model=llm, llm_budget_usd=llm_budget_usd,
                            llm_budget_tokens=llm_budget_tokens, time_limit_s=time_limit)
    bar = ProgressBar()
    try:
        summary = run(config, toolkit=toolkit, say=bar.say, on_progress=bar.update, on_hotspot=bar.hotspot, ui=ui)
    finally:
        bar.done()
    if not as_json:
        stdout(format_summary(summary))
    if summary.status == "interrupted":
        raise ForgeError("the search was stopped before it finished, so nothing was packed",
                         f"continue it with `forge-pack search --resume {config.run_dir}`, then "
                         f"`forge-pack pack {config.run_dir} --out {out}`")
    result = pack(config.run_dir, out, pkg, force=force, wheel=wheel, say=bar.say)
    if as_json:
        from forge_pack.store.run_store import finite

        stdout(json.dumps(finite({"run_dir": config.run_dir, "search": summary.to_json(), "pack": result.to_json()})))
    else:
        stdout(format_result(result))
    return result


def pack_command(run_dir: Path, out: Path, *, name: Optional[str] = None, force: bool = False, wheel: bool = False,
                 confirm: bool = True, as_json: bool = False, stdout: Callable[[str], None] = typer.echo) -> PackResult:
    result = pack(run_dir, out, name, force=force, wheel=wheel, confirm=confirm)
    if as_json:
        from forge_pack.store.run_store import finite

        stdout(json.dumps(finite(result.to_json())))
    else:
        stdout(format_result(result))
    return result


def register(app: typer.Typer) -> None:
    from forge_pack.cli.search import (ALLOW_CONTROL_OPTION, DEVICE_HELP, DTYPE_HELP, UI_OPTION, UI_PORT_OPTION,
                                       ui_options)
    from forge_pack.llm.options import LLM_BUDGET_TOKENS_OPTION, LLM_BUDGET_USD_OPTION, LLM_OPTION

    @app.command("build")
    def build_cmd(
        model: str = typer.Argument(..., help="Model file: get_model()/get_inputs(), or KernelBench's Model."),
        out: Path = typer.Option(..., "--out", help="Directory to write the package into (must not exist)."),
        name: Optional[str] = typer.Option(None, "--name", help="Python name of the package (default: <model>_forge)."),
        device: Optional[str] = typer.Option(None, "--device", help=DEVICE_HELP),
        dtype: Optional[str] = typer.Option(None, "--dtype", help=DTYPE_HELP),
        budget: Optional[int] = typer.Option(None, "--budget",
                                             help=f"Evaluations per hotspot (default: {DEFAULT_BUDGET})."),
        wheel: bool = typer.Option(False, "--wheel", help="Also build a wheel into OUT/dist."),
        force: bool = typer.Option(False, "--force", help="Replace OUT if forge-pack wrote it (or it is empty)."),
        run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Where the run store goes (default: runs/...)."),
        top: Optional[int] = typer.Option(None, "--top", min=1, help="Search the K largest hotspots (default: 3)."),
        min_share: Optional[float] = typer.Option(None, "--min-share", help="Skip hotspots under this fraction."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the search and its random inputs."),
        workers: Optional[int] = typer.Option(None, "--workers", help="Evaluator worker processes (default: 1)."),
        timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds per candidate evaluation."),
        time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Seconds of search per hotspot."),
        llm: Optional[str] = LLM_OPTION,
        llm_budget_usd: Optional[float] = LLM_BUDGET_USD_OPTION,
        llm_budget_tokens: Optional[int] = LLM_BUDGET_TOKENS_OPTION,
        with_ui: bool = UI_OPTION,
        ui_port: Optional[int] = UI_PORT_OPTION,
        allow_control: bool = ALLOW_CONTROL_OPTION,
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Profile MODEL, search faster kernels, confirm them, and write a pip-installable package."""
        build_command(model, out, name=name, device=device, dtype=dtype, budget=budget, wheel=wheel, force=force,
                      run_dir=run_dir, top=top, min_share=min_share, seed=seed, workers=workers, timeout=timeout,
                      llm=llm, llm_budget_usd=llm_budget_usd, llm_budget_tokens=llm_budget_tokens,
                      time_limit=time_limit, as_json=as_json, ui=ui_options(with_ui, ui_port, allow_control))

    @app.command("pack")
    def pack_cmd(
        run_dir: Path = typer.Argument(..., help="A run directory written by `forge-pack search` or `build`."),
        out: Path = typer.Option(..., "--out", help="Directory to write the package into (must not exist)."),
        name: Optional[str] = typer.Option(None, "--name", help="Python name of the package (default: <model>_forge)."),
        force: bool = typer.Option(False, "--force", help="Replace OUT if forge-pack wrote it (or it is empty)."),
        wheel: bool = typer.Option(False, "--wheel", help="Also build a wheel into OUT/dist."),
        no_confirm: bool = typer.Option(False, "--no-confirm",
                                        help="Skip re-verification in a fresh process and the whole-model check."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Package the winning kernels of an existing run."""
        pack_command(run_dir, out, name=name, force=force, wheel=wheel, confirm=not no_confirm, as_json=as_json)

