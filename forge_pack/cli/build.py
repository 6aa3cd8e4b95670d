"""`forge-pack build MODEL.py --out DIR` (profile, search, confirm, gate, pack), `forge-pack build MODEL.py
--from-run RUN_DIR --out DIR` (the same after an earlier `forge-pack search`, continued first if it did not
finish) and `forge-pack pack RUN_DIR --out DIR`.

Results go to stdout (the search table, then what was packed), progress to stderr, or with
--json exactly one JSON document. No package (nothing beat eager, every kernel dropped at
confirmation or by the whole-model check, or the patched model not faster end to end by more than
the noise: "no whole-model gain", forge_pack.evaluate.model_gain): said plainly with the measured
figures, exit 0; --allow-no-gain writes the package anyway and says so. A whole-model failure no
kernel can be blamed for is an error (exit 1), see forge_pack.evaluate.model_gate.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, Optional

import typer

from forge_pack.core.errors import ForgeError
from forge_pack.evaluate.model_accuracy import describe
from forge_pack.evaluate.compile_gate import summary_line
from forge_pack.pack.packager import (PackResult, check_cpu_isa, check_name, check_out_dir, default_cpu_isa,
                                     default_name, pack)

DEFAULT_BUDGET = 50


def format_result(r: PackResult, allow_no_gain: bool = False) -> str:
    from forge_pack.evaluate.model_gain import judge_compile_gain, judge_gain

    if not r.written:
        lines = [r.message]  # the gate's figures are in the message when it measured the model
        if r.model_result and r.model_result.get("eager"):
            lines += [f"  not packed: {d['pretty']}: {d['reason']}" for d in r.dropped]
            lines.append("  --allow-no-gain writes the package anyway")
        return "\n".join(lines)
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
        if m.get("eager"):
            verdict = judge_gain(m)
            lines.append(f"  gate: {'whole-model gain' if verdict.gain else 'no whole-model gain'}: {verdict.reason}")
            compiled = judge_compile_gain(r.compile_result)
            if not verdict.gain and compiled.gain:
                lines.append(f"  written for compile mode: {compiled.reason}; eager `apply()` gains nothing "
                             f"measurable here, use `{r.package}.compile(model)`")
            elif not verdict.gain:
                why = ("written because --allow-no-gain was given" if allow_no_gain else
                       "written without the gain gate")
                lines.append(f"  note: {why}; the kernels' gains do not survive the whole forward here (Python "
                             "dispatch per call, timing noise): measure on the target machine "
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
        lines.append(f"Wheel: {r.wheel}   (for another machine: see Deploy in {r.out_dir}/README.md)")
    lines.append(f"Install: pip install --no-build-isolation {r.out_dir}")
    lines.append(f"Use:     import {r.package}; {r.package}.apply(model)   (check: python -m {r.package} verify)")
    lines.append(f"     or: compiled = {r.package}.compile(model)   (torch.compile with the kernels that win compiled)")
    return "\n".join(lines)


def default_run_dir(model_path: str) -> Path:
    return Path("runs") / f"build-{Path(model_path).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_run_model(run_dir: Path, model: str) -> None:
    """--from-run reuses a search only for the model file it searched: the same bytes (the run stores
    the file's sha256), wherever the file now lies."""
    from forge_pack.pack.packager import read_run

    info = read_run(run_dir)
    given = Path(model)
    if not given.is_file():
        raise ForgeError(f"model file {model} not found", "pass the path of the model file the run searched, "
                         f"e.g. forge-pack build {info.model_path} --from-run {run_dir} --out ...")
    if info.model_hash:
        same = hashlib.sha256(given.read_bytes()).hexdigest() == info.model_hash
    else:  # a run store without the hash: the path is all there is to go by
        same = given.resolve() == Path(info.model_path).resolve()
    if same:
        return
    if given.resolve() == Path(info.model_path).resolve():
        raise ForgeError(f"{model} changed since the run in {run_dir} profiled it, so its kernels were found and "
                         "checked for another model",
                         f"restore the model file the run profiled, or build {model} without --from-run to search it")
    raise ForgeError(f"the run in {run_dir} searched another model file ({info.model_path}), not {model}",
                     f"pass that model (forge-pack build {info.model_path} --from-run {run_dir} --out ...), "
                     f"or build {model} without --from-run to search it")


def _run_status(run_dir: Path) -> str | None:
    from forge_pack.store import run_queries
    from forge_pack.store.run_store import open_readonly

    conn = open_readonly(run_dir)
    try:
        row = run_queries.latest_run(conn)
    finally:
        conn.close()
    return row["status"] if row is not None else None


def _stored_summary(run_dir: Path) -> dict | None:
    from forge_pack.search.report import SUMMARY_FILE

    try:
        return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None


def build_command(model: str, out: Path, *, name: Optional[str] = None, device: Optional[str] = None,
                  dtype: Optional[str] = None, budget: Optional[int] = None, wheel: bool = False, force: bool = False,
                  run_dir: Optional[Path] = None, from_run: Optional[Path] = None, top: Optional[int] = None,
                  min_share: Optional[float] = None, seed: Optional[int] = None, workers: Optional[int] = None,
                  timeout: Optional[float] = None, llm: Optional[str] = None, llm_budget_usd: Optional[float] = None,
                  llm_budget_tokens: Optional[int] = None, time_limit: Optional[float] = None,
                  allow_no_gain: bool = False, as_json: bool = False, toolkit=None, ui: dict | None = None,
                  cpu_isa: Optional[str] = None, stdout: Callable[[str], None] = typer.echo,
                  gpus: Optional[str] = None, ray: Optional[str] = None, regions: bool = False,
                  compile_modes: Optional[str] = None) -> PackResult:
    from forge_pack.cli.search import ProgressBar, device_overrides, format_summary
    from forge_pack.search.pipeline import RunConfig, load_config, run, with_overrides
    from forge_pack.store.vocabulary import RunStatus

    pkg = check_name(name or default_name(model))  # user errors first, before minutes of search
    check_cpu_isa(cpu_isa)
    modes = _modes(compile_modes)
    if budget is not None and budget < 1:
        raise ForgeError(f"--budget must be at least 1, got {budget}", "e.g. --budget 50")
    overrides = dict(budget=budget, seed=seed, workers=workers, parallel=workers, timeout_s=timeout, llm_model=llm,
                     llm_budget_usd=llm_budget_usd, llm_budget_tokens=llm_budget_tokens, time_limit_s=time_limit)
    overrides.update(device_overrides(gpus, ray, device, workers, None))  # --gpus / --ray
    search = True
    if from_run is not None:
        if run_dir is not None:
            raise ForgeError("--from-run reuses the run in its own directory; --run-dir names a new one",
                             f"drop --run-dir, e.g. forge-pack build {model} --from-run {from_run} --out {out}")
        if device is not None or dtype is not None or top is not None or min_share is not None or regions:
            raise ForgeError("--device, --dtype, --top, --min-share and --regions cannot change with --from-run",
                             "the hotspots were chosen when the run started; build without --from-run to change them")
        run_dir = Path(from_run)
        config = with_overrides(with_overrides(load_config(run_dir), **overrides), run_dir=str(run_dir))
        check_run_model(run_dir, model)
        # a finished run is packed as it is; one that stopped early (or is given more to do) is continued first
        extend = budget is not None or time_limit is not None or llm is not None
        search = extend or _run_status(run_dir) != RunStatus.FINISHED
    else:
        run_dir = run_dir or default_run_dir(model)
        config = with_overrides(RunConfig(model=model, device=device, dtype=dtype, budget=DEFAULT_BUDGET,
                                          run_dir=str(run_dir), regions=regions),
                                top=top, min_share=min_share, **overrides)
    check_out_dir(Path(out).resolve(), force, run_dir)
    bar = ProgressBar()
    if search:
        try:
            summary = run(config, resume=from_run is not None, toolkit=toolkit, say=bar.say, on_progress=bar.update,
                          on_hotspot=bar.hotspot, ui=ui)
        finally:
            bar.done()
        if not as_json:
            stdout(format_summary(summary))
        if summary.status == "interrupted":
            raise ForgeError("the search was stopped before it finished, so nothing was packed",
                             f"continue it with `forge-pack build {model} --from-run {config.run_dir} --out {out}`")
        search_doc = summary.to_json()
    else:
        bar.say(f"reusing the finished search in {run_dir} (no new search)")
        search_doc = _stored_summary(run_dir)
    result = pack(config.run_dir, out, pkg, force=force, wheel=wheel, require_gain=not allow_no_gain, say=bar.say,
                  cpu_isa=cpu_isa, compile_modes=modes)
    _report(result, allow_no_gain, as_json, stdout, {"run_dir": config.run_dir, "search": search_doc})
    return result


def _modes(text: Optional[str]) -> tuple[str, ...] | None:
    if text is None:
        return None
    from forge_pack.evaluate.compile_gate import parse_modes

    return parse_modes(text)


def _report(result: PackResult, allow_no_gain: bool, as_json: bool, stdout: Callable[[str], None],
            extra: dict | None = None) -> None:
    if as_json:
        from forge_pack.store.run_store import finite

        doc = result.to_json()
        stdout(json.dumps(finite({**extra, "pack": doc} if extra is not None else doc)))
    else:
        stdout(format_result(result, allow_no_gain))


def pack_command(run_dir: Path, out: Path, *, name: Optional[str] = None, force: bool = False, wheel: bool = False,
                 confirm: bool = True, allow_no_gain: bool = False, as_json: bool = False,
                 cpu_isa: Optional[str] = None, stdout: Callable[[str], None] = typer.echo,
                 compile_modes: Optional[str] = None) -> PackResult:
    modes = _modes(compile_modes)
    result = pack(run_dir, out, name, force=force, wheel=wheel, confirm=confirm, require_gain=not allow_no_gain,
                  cpu_isa=cpu_isa, compile_modes=modes)
    _report(result, allow_no_gain, as_json, stdout)
    return result


WHEEL_HELP = ("Also build a wheel into OUT/dist for other machines: it pins the exact torch it was compiled "
              "against, and is tagged abi3 (any CPython from torch's minimum on) where torch allows it.")
CPU_ISA_HELP = (f"CPU instruction set the package's C++ code is compiled for (default {default_cpu_isa()}; "
                "'native': this CPU only, checked before loading). Recorded in the manifest.")
COMPILE_MODES_HELP = ("torch.compile modes the compile-mode check measures, comma-separated, default among them "
                      "(default: default, and reduce-overhead on CUDA). Each mode is compiled once plainly and "
                      "once or more with the kernels; a mode not measured follows the default's decisions.")
COMPILE_MODES_OPTION = typer.Option(None, "--compile-modes", metavar="MODE,...", help=COMPILE_MODES_HELP)
ALLOW_NO_GAIN_HELP = ("Write the package even when the whole-model check measures no end-to-end gain "
                      "(default: no package then, exit 0).")


def register(app: typer.Typer) -> None:
    from forge_pack.cli.search import (ALLOW_CONTROL_OPTION, DEVICE_HELP, DTYPE_HELP, GPUS_OPTION, RAY_OPTION,
                                       UI_OPTION, UI_PORT_OPTION, ui_options)
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
        wheel: bool = typer.Option(False, "--wheel", help=WHEEL_HELP),
        cpu_isa: Optional[str] = typer.Option(None, "--cpu-isa", help=CPU_ISA_HELP),
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
        from_run: Optional[Path] = typer.Option(None, "--from-run", metavar="RUN_DIR",
                                                help="Reuse the search in RUN_DIR (`forge-pack search` wrote it) "
                                                     "instead of searching again; an unfinished one is continued."),
        allow_no_gain: bool = typer.Option(False, "--allow-no-gain", help=ALLOW_NO_GAIN_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
        gpus: Optional[str] = GPUS_OPTION,
        ray: Optional[str] = RAY_OPTION,
        regions: bool = typer.Option(False, "--regions", help="Search the model's regions (fused chains of "
                                                              "memory-bound ops) instead of single ops; their "
                                                              "kernels are used by compile mode."),
        compile_modes: Optional[str] = COMPILE_MODES_OPTION,
    ) -> None:
        """Profile MODEL, search faster kernels, confirm them, and write a pip-installable package."""
        build_command(model, out, name=name, device=device, dtype=dtype, budget=budget, wheel=wheel, force=force,
                      run_dir=run_dir, from_run=from_run, top=top, min_share=min_share, seed=seed, workers=workers,
                      timeout=timeout, llm=llm, llm_budget_usd=llm_budget_usd, llm_budget_tokens=llm_budget_tokens,
                      time_limit=time_limit, allow_no_gain=allow_no_gain, as_json=as_json,
                      ui=ui_options(with_ui, ui_port, allow_control), cpu_isa=cpu_isa, gpus=gpus, ray=ray,
                      regions=regions, compile_modes=compile_modes)

    @app.command("pack")
    def pack_cmd(
        run_dir: Path = typer.Argument(..., help="A run directory written by `forge-pack search` or `build`."),
        out: Path = typer.Option(..., "--out", help="Directory to write the package into (must not exist)."),
        name: Optional[str] = typer.Option(None, "--name", help="Python name of the package (default: <model>_forge)."),
        force: bool = typer.Option(False, "--force", help="Replace OUT if forge-pack wrote it (or it is empty)."),
        wheel: bool = typer.Option(False, "--wheel", help=WHEEL_HELP),
        cpu_isa: Optional[str] = typer.Option(None, "--cpu-isa", help=CPU_ISA_HELP),
        no_confirm: bool = typer.Option(False, "--no-confirm",
                                        help="Skip re-verification in a fresh process and the whole-model check."),
        allow_no_gain: bool = typer.Option(False, "--allow-no-gain", help=ALLOW_NO_GAIN_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
        compile_modes: Optional[str] = COMPILE_MODES_OPTION,
    ) -> None:
        """Package the winning kernels of an existing run."""
        pack_command(run_dir, out, name=name, force=force, wheel=wheel, confirm=not no_confirm,
                     allow_no_gain=allow_no_gain, as_json=as_json, cpu_isa=cpu_isa, compile_modes=compile_modes)

