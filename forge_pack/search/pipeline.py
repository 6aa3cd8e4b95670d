"""The search pipeline: load -> profile -> choose hotspots -> baseline + MCTS per hotspot -> summary.

Used by ``forge-pack search`` (and ``build``). Everything lands in the run store as it happens: the
hotspots, each baseline, every node before its evaluation starts and every evaluation the moment
it returns (so ``kill -9`` loses at most the evaluations in flight), node statistics, a heartbeat,
events. ``--resume RUN_DIR`` reads the saved config and the stored hotspots back (no
re-profiling, stored baselines reused) and continues each search to the same total budget without
re-evaluating anything (``run_plan.resume_state`` says which). Between evaluations the dashboard's
``control.json`` is honoured. One process at a time: ``run_lock`` holds RUN_DIR/lock for the run.

The pieces, one job each: ``config`` (RunConfig, config.json), ``redaction``, ``run_lock``,
``heartbeat``, ``toolkit`` (the injectable stages: tests run the whole pipeline with fakes),
``run_plan`` (which hotspots, how much time left), ``store_hooks`` (one hotspot's MCTS on the store),
``report`` (outcomes, summary, search.json). This module runs them in order; it imports no torch.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from forge_pack.core.candidate import Candidate
from forge_pack.core.errors import ForgeError
from forge_pack.core.progress_line import step
from forge_pack.core.verdict import Baseline, Evaluation
from forge_pack.search.config import RunConfig, load_config, save_config, stored_llm_model, with_overrides
from forge_pack.search.devices import slots_of
from forge_pack.search.heartbeat import HeartbeatThread
from forge_pack.search.mcts import Progress
from forge_pack.search.redaction import redact
from forge_pack.search.report import HotspotOutcome, RunSummary, amdahl, write_summary
from forge_pack.search.run_lock import RunLock
from forge_pack.search.run_plan import Plan, choose_hotspots, plan_fresh, plan_resumed, resume_state
from forge_pack.search.store_hooks import StoreHooks, kept_result, restore_nodes, search_hotspot
from forge_pack.search.toolkit import LazyEvaluator, Toolkit, _default_proposers, gpu_info, region_profile
from forge_pack.store.run_store import STORE_FILE, Store, check_store
from forge_pack.store.vocabulary import EventKind, HotspotStatus, MetaKey, RunStatus, StopReason

# The names callers import from here; each lives in the module named above.
__all__ = ["run", "RunConfig", "load_config", "with_overrides", "redact", "Toolkit", "HotspotOutcome",
           "RunSummary", "amdahl", "choose_hotspots", "search_hotspot", "restore_nodes", "StoreHooks",
           "_default_proposers"]

OnProgress = Callable[[HotspotOutcome, Progress], None]
OnHotspot = Callable[[HotspotOutcome, int, int], None]


def run(config: RunConfig, *, resume: bool = False, toolkit: Toolkit | None = None,
        say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
        on_progress: OnProgress | None = None, on_hotspot: OnHotspot | None = None, quiet: bool = False,
        ui: dict | None = None) -> RunSummary:
    """Profile (or, resuming, read back) the hotspots and search each chosen one; returns the summary."""
    run_dir = Path(config.run_dir)
    _check_run_dir(run_dir)
    lock = RunLock(run_dir)
    try:
        return _run(config, lock, resume=resume, toolkit=toolkit, say=say, on_progress=on_progress,
                    on_hotspot=on_hotspot, quiet=quiet, ui=ui)
    finally:
        lock.release()


@dataclass
class _Run:
    """What one run carries from step to step."""

    config: RunConfig
    tk: Toolkit
    run_dir: Path
    store: Store
    say: Callable[[str], None]
    started_at: float  # wall clock: a control.json older than this is from an earlier run
    run_id: int | None = None  # set once the run row exists: only then is its end recorded
    device: str = ""
    backend: str = "cpu"
    env: dict = field(default_factory=dict)
    forward_us: float = 0.0
    evaluator: LazyEvaluator | None = None
    proposers: list | None = None  # built at the first search: a run whose hotspots all ended needs none
    status: str = RunStatus.FAILED


def _run(config: RunConfig, lock: RunLock, *, resume: bool, toolkit: Toolkit | None, say: Callable[[str], None],
         on_progress: OnProgress | None, on_hotspot: OnHotspot | None, quiet: bool, ui: dict | None) -> RunSummary:
    tk = toolkit or (Toolkit(profile=region_profile) if config.regions else Toolkit())
    t0, started_at = time.monotonic(), time.time()
    run_dir = Path(config.run_dir)
    run_row = _stored_run(run_dir, lock) if resume else _refuse_taken(run_dir)
    # the model loads before any file is written, so that its user errors leave nothing behind
    target = tk.load(config.model, config.device, config.dtype) if run_row is None else None
    _claim_run_dir(run_dir, lock, fresh=not resume, say=say)
    r = _Run(config, tk, run_dir, Store(run_dir), say, started_at)
    beat = HeartbeatThread(r.store)
    beat.start()
    try:
        # the proposers of the run being continued: new ones reopen hotspots whose proposers ran dry
        before = stored_llm_model(run_dir) if run_row is not None else None
        save_config(run_dir, config)
        if ui is not None:  # --ui: the dashboard beside the search, reading the same run store
            from forge_pack.ui.server import start_ui_in_background

            start_ui_in_background(run_dir, echo=say, **ui)
        plan = _start(r, run_row, target, quiet)
        target = None  # the model is not needed any more: its captured tensors are on disk
        _release_profile(r.device)
        rows, todo = _what_to_search(r, plan, run_row, before)
        r.evaluator = LazyEvaluator(lambda: tk.evaluator(config, run_dir, r.backend))
        outcomes = _search_all(r, plan, rows, todo, on_progress, on_hotspot)
        summary = RunSummary(str(run_dir), config, r.device, r.forward_us, outcomes, r.status,
                             time.monotonic() - t0)
        write_summary(run_dir, summary)
        return summary
    except KeyboardInterrupt:
        r.status = RunStatus.INTERRUPTED
        raise
    finally:
        _close(r, beat)


# ---------------------------------------------------------------- the steps, in order


def _check_run_dir(run_dir: Path) -> None:
    """A run directory that cannot be one (a file, or under a file) is a user error, not a traceback."""
    for p in (run_dir, *run_dir.parents):
        if p.exists():
            if not p.is_dir():
                what = f"{run_dir} is a file" if p == run_dir else f"{p} is a file, so {run_dir} cannot be created"
                raise ForgeError(f"the run directory {what}",
                                 "pass a directory path to --run-dir (it is created if missing)")
            return


def _already_holds_a_run(run_dir: Path) -> ForgeError:
    return ForgeError(f"{run_dir} already holds a run",
                      f"continue it with --resume {run_dir}, or choose another --run-dir")


def _refuse_taken(run_dir: Path) -> None:
    """A fresh run never writes into a directory that holds one."""
    if (run_dir / STORE_FILE).exists():
        raise _already_holds_a_run(run_dir)


def _stored_run(run_dir: Path, lock: RunLock):
    """The run row to continue; None when the run died before its profile was stored (profile again)."""
    if not (run_dir / STORE_FILE).is_file():
        raise ForgeError(f"{run_dir} has no run.db to resume", "pass the run directory of an earlier search")
    check_store(run_dir)  # a 0-byte or damaged run.db must not become a new, empty run
    lock.acquire()  # before anything reads or writes the store
    with Store(run_dir) as probe:
        row = probe.latest_run()
        profiled = probe.get_meta(MetaKey.PROFILED) == "1"
    return row if row is not None and profiled else None


def _claim_run_dir(run_dir: Path, lock: RunLock, *, fresh: bool, say: Callable[[str], None]) -> None:
    """Create and lock the run directory; a fresh run checks again that no other took it meanwhile."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ForgeError(f"cannot create the run directory {run_dir}: {e.strerror or e}",
                         "pass a writable directory path to --run-dir") from None
    lock.acquire()
    if fresh:
        _refuse_taken(run_dir)  # another search took this directory while the model loaded
        say(f"run directory: {run_dir}")  # named now, not only at the end: a killed run is resumed from it


def _start(r: _Run, run_row, target, quiet: bool) -> Plan:
    """Start (or restart) the run row and get the hotspots: profiled afresh, or read back."""
    if run_row is not None:
        r.device = run_row["device"]
        r.tk.check_device(r.device)  # no usable GPU: one error here, not a failed verdict per candidate
        r.run_id, r.env, r.forward_us, plan = plan_resumed(r.config, r.tk, r.store, run_row)
    else:
        r.run_id, r.env, r.forward_us, plan = plan_fresh(r.config, r.tk, r.store, target, r.run_dir, quiet)
        r.device = target.device
    r.backend = "cuda" if r.device == "cuda" else "cpu"
    return plan


def _release_profile(device: str) -> None:
    """Give the memory the profile held (the model, its inputs and outputs, freed but kept in torch's cache) back
    to the device: the evaluations run in worker processes, which another process's cache starves (an H100
    search of a 6 GiB softmax: another of its processes, by its size the one that had profiled, held 12.5 GiB
    while every evaluation ran out of memory)."""
    from forge_pack.evaluate import memory_plan

    memory_plan.release(device)


def _what_to_search(r: _Run, plan: Plan, run_row, before: str | None) -> tuple[dict, dict[str, tuple[bool, float]]]:
    """(stored hotspot rows by id, hotspot id -> (search it?, search time spent)) for the chosen hotspots."""
    rows = {row["id"]: row for row in r.store.hotspots()}
    new_moves = run_row is not None and (r.config.llm_model or None) != before
    todo = {h.id: resume_state(rows[h.id], r.config, new_moves) for _, h, why in plan if not why}
    if run_row is not None:
        n = sum(1 for go, _ in todo.values() if go)
        kept = len(todo) - n
        r.say(f"resuming {r.run_dir}: {n} hotspot{'s' if n != 1 else ''} to search"
              + (f", {kept} already finished" if kept else "") + f", budget {r.config.budget} each")
    return rows, todo


def _search_all(r: _Run, plan: Plan, rows: dict, todo: dict[str, tuple[bool, float]],
                on_progress: OnProgress | None, on_hotspot: OnHotspot | None) -> list[HotspotOutcome]:
    """Each hotspot of the plan in rank order: skipped, kept as an earlier run left it, or searched.
    A stop (dashboard, Ctrl-C inside the search) leaves the rest for --resume."""
    outcomes: list[HotspotOutcome] = []
    searched = [h for _, h, why in plan if not why and todo[h.id][0]]  # numbered [i/n] as they start
    r.status = RunStatus.FINISHED
    for rank, h, why in plan:
        out = HotspotOutcome(h, rank, skipped=why)
        outcomes.append(out)
        if why:
            continue
        if r.status == RunStatus.INTERRUPTED:
            out.note = "not searched: the run was stopped (continue with --resume)"
            continue
        go, spent_s = todo[h.id]
        if not go:  # its search ended in an earlier run and the flags give it nothing more to do
            out.baseline = _stored_baseline(r.store, h.id)
            out.result = kept_result(r.store, rows[h.id], r.config.search_config())
            continue
        if on_hotspot:
            on_hotspot(out, searched.index(h) + 1, len(searched))
        _search_one(r, out, spent_s, on_progress)
        if out.result is not None and out.result.stop_reason == StopReason.STOPPED:
            r.status = RunStatus.INTERRUPTED
    return outcomes


def _search_one(r: _Run, out: HotspotOutcome, spent_s: float, on_progress: OnProgress | None) -> None:
    """Baseline (measured once, then stored) and MCTS of one hotspot, into ``out``."""
    h = out.hotspot
    r.store.set_hotspot_budget(h.id, r.config.budget)
    out.baseline = _baseline(r, out)
    if out.baseline is None:
        return
    if r.proposers is None:
        r.proposers = r.tk.proposers(r.config, r.backend, r.store)
    baseline, evaluator = out.baseline, r.evaluator
    assert evaluator is not None

    def evaluate(cand: Candidate) -> Evaluation:
        return evaluator.get().evaluate(cand, h, baseline)

    progress_cb = (lambda p: on_progress(out, p)) if on_progress else None
    search_cfg = r.config.search_config()
    if r.config.parallel_auto:  # --gpus / --ray without --parallel: one evaluation in flight per device
        search_cfg = replace(search_cfg, parallel=slots_of(evaluator.get()))
    out.result = search_hotspot(r.store, r.run_id, h, baseline, r.proposers, evaluate, search_cfg,
                                backend=r.backend, root_candidates=r.tk.roots(h, r.backend),
                                gpu=gpu_info(r.env, baseline, evaluator), run_dir=r.run_dir,
                                on_progress=progress_cb, started_at=r.started_at, spent_s=spent_s)
    res = out.result
    if progress_cb and res.evaluations < res.budget and res.stop_reason != StopReason.STOPPED:
        # the search ended short of its budget (proposers ran dry, time limit): the bar's total becomes
        # what actually ran, and out.result.stop_reason says why
        progress_cb(Progress(res.evaluations, res.evaluations, res.failures,
                             res.best.speedup if res.best is not None else None, 0, res.search_s, res.failed))


def _baseline(r: _Run, out: HotspotOutcome) -> Baseline | None:
    """The hotspot's stored baseline, else measured and stored; None (noted on ``out``) when it cannot be."""
    h = out.hotspot
    stored = _stored_baseline(r.store, h.id)
    if stored is not None:
        return stored
    r.say(f"timing eager and torch.compile: {h.signature.pretty()}")
    try:
        with step("timing eager and torch.compile", r.say):
            baseline = r.evaluator.get().baseline(h)  # type: ignore[union-attr]
    except ForgeError:
        raise
    except Exception as e:  # noqa: BLE001 - one bad hotspot must not end the run
        out.note = f"not searched: its baseline could not be measured ({type(e).__name__}: {e})"
        r.store.event(EventKind.NOTE, hotspot_id=h.id, payload={"text": out.note})
        r.store.set_hotspot_status(h.id, HotspotStatus.DONE)
        return None
    r.store.set_baseline(h.id, baseline.to_json())
    return baseline


def _stored_baseline(store: Store, hotspot_id: str) -> Baseline | None:
    stored = store.baseline(hotspot_id)
    return Baseline.from_json(stored) if stored else None


def _close(r: _Run, beat: HeartbeatThread) -> None:
    """However the run ends: stop the heartbeat and the workers, record how it ended, close the store."""
    beat.close()
    if r.evaluator is not None:
        r.evaluator.close()
    if r.run_id is not None:
        r.store.finish_run(r.run_id, r.status)
    r.store.close()
