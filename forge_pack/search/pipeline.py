"""The search pipeline: load -> profile -> choose hotspots -> baseline + MCTS per hotspot -> summary.

Used by ``forge-pack search`` (and later ``build``). Everything lands in the run store as it
happens: the hotspots, each baseline, every node before its evaluation starts and every evaluation
the moment it returns (so ``kill -9`` loses at most the evaluations in flight), node statistics, a
heartbeat, events. ``--resume RUN_DIR`` reads the saved config and the stored hotspots back (no
re-profiling, stored baselines reused) and continues each search to the same total budget without
re-evaluating anything; a hotspot whose search already ended is kept as it is unless the budget (or,
after a time-limit stop, the time limit) was raised, and an interrupted one gets only the search time
it has left. Between evaluations the dashboard's ``control.json`` is honoured.

One process at a time: a run holds an exclusive ``flock`` on ``RUN_DIR/lock`` for its whole length,
so a second ``--resume`` of a run still going is refused instead of searching the same database
twice. The operating system drops the lock when the process ends, ``kill -9`` included.

The stages are injected through a ``Toolkit`` so tests run the whole pipeline with fakes; this
module itself imports no torch (the default toolkit imports the real stages lazily).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from forge_pack.core.candidate import Candidate
from forge_pack.search.control import read_control
from forge_pack.core.errors import ForgeError
from forge_pack.core.hotspot import Hotspot
from forge_pack.search.propose import Move
from forge_pack.search.mcts import Node, Progress, SearchConfig, SearchHooks, SearchResult, StoredNode, \
    restored_result, search
from forge_pack.store.run_store import Store, check_store, finite
from forge_pack.core.verdict import Baseline, Evaluation

try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]

CONFIG_FILE = "config.json"
SUMMARY_FILE = "search.json"
LOCK_FILE = "lock"
# How a search ended that needs no more work unless the flags change (see _resume_state).
ENDED = ("budget", "time_limit", "exhausted")
# A kernel must beat eager by 2% to count as a winner: below that a repeat timing could flip it.
WIN_MARGIN = 1.02
HEARTBEAT_S = 2.0  # the dashboard shows a run as stalled after two minutes without one
SECRET_WORDS = ("key", "token", "secret", "password")


@dataclass(frozen=True)
class RunConfig:
    model: str
    device: str | None = None  # None: cuda when present
    dtype: str | None = None
    budget: int = 50  # evaluations per hotspot
    time_limit_s: float | None = None  # per hotspot
    top: int = 3
    min_share: float = 0.01  # hotspots under 1% of the forward cannot move the total
    seed: int = 0
    workers: int = 1
    parallel: int = 1
    timeout_s: float = 60.0  # per candidate evaluation
    run_dir: str = ""
    llm_model: str | None = None
    llm_budget_usd: float | None = None
    llm_budget_tokens: int | None = None
    search: dict = field(default_factory=dict)  # SearchConfig overrides (exploration, widen_c, ...)

    def search_config(self) -> SearchConfig:
        return SearchConfig(budget=self.budget, time_limit_s=self.time_limit_s, parallel=self.parallel,
                            seed=self.seed, **self.search)

    def to_json(self) -> dict:
        """The effective configuration, secrets redacted, with the search's own knobs spelled out."""
        d = asdict(self)
        d["search"] = asdict(self.search_config())
        return redact(d)

    @staticmethod
    def from_json(d: dict) -> "RunConfig":
        known = {f for f in RunConfig.__dataclass_fields__}
        d = {k: v for k, v in d.items() if k in known}
        search_defaults = asdict(SearchConfig())
        own = {"budget", "time_limit_s", "parallel", "seed"}
        d["search"] = {k: (tuple(map(tuple, v)) if k == "proposer_weights" else v)
                       for k, v in (d.get("search") or {}).items()
                       if k in search_defaults and k not in own and v != search_defaults[k]}
        return RunConfig(**d)


def redact(obj: Any) -> Any:
    if isinstance(obj, dict):
        # whole words of the key only: "api_key" and "token" are secrets, "llm_budget_tokens" is not
        return {k: ("<redacted>" if any(w in str(k).lower().split("_") for w in SECRET_WORDS) and v else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj


# ---------------------------------------------------------------- the stages, injectable


def _default_load(model: str, device: str | None, dtype: str | None):
    from forge_pack.profile.load import load

    return load(model, device, dtype)


def _default_profile(target, run_dir: Path, quiet: bool):
    from forge_pack.profile.profiler import profile

    return profile(target, run_dir, quiet=quiet)


def _default_evaluator(config: RunConfig, run_dir: Path, backend: str):
    from forge_pack.evaluate.evaluator import Evaluator

    return Evaluator(backend=backend, workers=config.workers, timeout_s=config.timeout_s, seed=config.seed,
                     run_dir=run_dir)


def _default_proposers(config: RunConfig, backend: str, store: Store) -> list:
    from forge_pack.search.templates_proposer import TemplateProposer

    proposers: list = [TemplateProposer()]
    from forge_pack.llm.options import build_llm_proposer

    # --llm MODEL, or [llm] model in ./forge.toml; None when neither asks for an LLM
    llm = build_llm_proposer(config.llm_model, config.llm_budget_usd, config.llm_budget_tokens, store=store)
    if llm is not None:
        proposers.append(llm)
    return proposers


def _default_roots(hotspot: Hotspot, backend: str) -> list[Candidate]:
    try:
        from forge_pack.search.families import reference_candidate
    except ImportError:
        return []
    cand = reference_candidate(hotspot.signature, backend)
    return [cand] if cand is not None else []


def _default_env(device: str) -> dict:
    env = {"python": platform.python_version(), "host": platform.node(), "platform": platform.platform(),
           "cpu_count": os.cpu_count()}
    try:
        import torch

        env.update(torch=torch.__version__, cuda=torch.version.cuda)
        if device == "cuda" and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env.update(gpu=p.name, compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                       gpu_memory_bytes=p.total_memory)
    except Exception as e:  # noqa: BLE001 - the environment record is informative only
        env["env_error"] = str(e)
    return env


def _default_check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ForgeError(f"this run searches CUDA kernels, but {why}", "resume it on the machine with the GPU")


@dataclass
class Toolkit:
    load: Callable = _default_load  # (model, device, dtype) -> Target (.device, .path, .model_hash, .dtype)
    profile: Callable = _default_profile  # (target, run_dir, quiet) -> Profile (.hotspots, .forward_us)
    evaluator: Callable = _default_evaluator  # (config, run_dir, backend) -> .baseline(h), .evaluate(c, h, b)
    proposers: Callable = _default_proposers  # (config, backend, store) -> [Proposer]
    roots: Callable = _default_roots  # (hotspot, backend) -> [Candidate]: starting points (reference kernels)
    env: Callable = _default_env  # (device) -> dict
    check_device: Callable = _default_check_device  # (device) -> None; ForgeError when it cannot be used here


# ---------------------------------------------------------------- results


@dataclass
class HotspotOutcome:
    hotspot: Hotspot
    rank: int
    skipped: str = ""  # why it was not searched ("" when it was)
    baseline: Baseline | None = None
    result: SearchResult | None = None
    note: str = ""

    @property
    def best(self) -> Node | None:
        return self.result.best if self.result else None

    @property
    def winner(self) -> Node | None:
        b = self.best
        return b if b is not None and (b.speedup or 0) >= WIN_MARGIN else None

    @property
    def speedup(self) -> float:
        """The speedup the package would bring to this op: the winner's, else none (1.0)."""
        w = self.winner
        return float(w.speedup) if w is not None else 1.0

    @property
    def projected(self) -> float:
        return amdahl([(self.hotspot.time_share, self.speedup)])

    def verdict_line(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.result is None:
            return self.note or "not searched"
        r = self.result
        if r.evaluations == 0:
            return self.note or f"no candidates: no kernel family offers {self.hotspot.op} on this backend"
        ended = {"exhausted": f" (the proposers ran dry after {r.evaluations} of {r.budget} evaluations)",
                 "time_limit": f" (the time limit ended it after {r.evaluations} of {r.budget} evaluations)",
                 "stopped": f" (stopped after {r.evaluations} of {r.budget} evaluations)"}.get(r.stop_reason, "")
        if self.winner is None:
            best = f"; the best correct kernel ran at {self.best.speedup:.2f}x eager" if self.best else \
                "; no candidate passed verification"
            fails = "" if self.best else self._common_failure()
            margin = int(round((WIN_MARGIN - 1) * 100))
            return f"no winner: nothing beat eager by {margin}% in {r.evaluations} evaluations{best}{fails}{ended}"
        return f"winner: {self.winner.candidate.label} at {self.speedup:.2f}x eager{ended}"

    def _common_failure(self) -> str:
        """' (most common failure: reason, Nx: last line of its detail)' for a hotspot with nothing correct."""
        r = self.result
        fails = {k: v for k, v in (r.verdicts if r else {}).items() if k != "ok"}
        if not fails:
            return ""
        reason, count = max(fails.items(), key=lambda kv: kv[1])
        detail = ""
        for n in r.nodes:  # type: ignore[union-attr]
            if n.evaluation is not None and n.evaluation.verdict.reason == reason:
                lines = [ln.strip() for ln in (n.evaluation.verdict.detail or "").splitlines() if ln.strip()]
                detail = lines[-1][:160] if lines else ""
                break
        return f" (most common failure: {reason}, {count}x" + (f": {detail}" if detail else "") + ")"

    def to_json(self) -> dict:
        b, w, best = self.baseline, self.winner, self.best
        ev = best.evaluation if best else None
        return {
            "id": self.hotspot.id, "rank": self.rank, "op": self.hotspot.op,
            "signature": self.hotspot.signature.pretty(), "time_share": self.hotspot.time_share,
            "skipped": self.skipped or None, "note": self.note or None,
            "eager_us": b.eager.median_us if b else None,
            "compile_us": b.compiled.median_us if b and b.compiled else None,
            "compile_error": (b.compile_error or None) if b else None,
            "floor_us": b.floor_us if b else None,
            "best": None if best is None else {
                "node_id": best.id, "label": best.candidate.label, "family": best.candidate.family,
                "origin": best.candidate.origin, "hash": best.candidate.content_hash,
                "median_us": ev.timing.median_us if ev and ev.timing else None,
                "speedup_vs_eager": ev.speedup_vs_eager if ev else None,
                "speedup_vs_compile": ev.speedup_vs_compile if ev else None,
                "bandwidth_fraction": ev.bandwidth_fraction if ev else None},
            "winner": w is not None, "speedup": self.speedup, "projected_model_speedup": self.projected,
            "search": self.result.summary() if self.result else None, "verdict": self.verdict_line(),
        }


@dataclass
class RunSummary:
    run_dir: str
    config: RunConfig
    device: str
    forward_us: float
    outcomes: list[HotspotOutcome]
    status: str  # finished | interrupted
    elapsed_s: float

    @property
    def searched(self) -> list[HotspotOutcome]:
        return [o for o in self.outcomes if not o.skipped]

    @property
    def evaluated(self) -> list[HotspotOutcome]:
        """The chosen hotspots whose search evaluated at least one candidate (not: the baseline failed,
        the run stopped before them, no kernel family offers the op)."""
        return [o for o in self.searched if o.result is not None and o.result.evaluations > 0]

    @property
    def projected(self) -> float:
        return amdahl([(o.hotspot.time_share, o.speedup) for o in self.searched])

    @property
    def winners(self) -> list[HotspotOutcome]:
        return [o for o in self.searched if o.winner is not None]

    def to_json(self) -> dict:
        return {"run_dir": self.run_dir, "model": self.config.model, "device": self.device,
                "dtype": self.config.dtype, "status": self.status, "elapsed_s": round(self.elapsed_s, 3),
                "forward_us": self.forward_us, "budget": self.config.budget,
                "hotspots": [o.to_json() for o in self.outcomes], "winners": len(self.winners),
                "projected_model_speedup": self.projected, "config": self.config.to_json()}


def amdahl(parts: Sequence[tuple[float, float]]) -> float:
    """Whole-model speedup when each share s of the time runs `speedup` times faster."""
    rest = 1.0 - sum(s for s, _ in parts)
    return 1.0 / (max(rest, 0.0) + sum(s / max(sp, 1e-9) for s, sp in parts))


def choose_hotspots(hotspots: Sequence[Hotspot], top: int, min_share: float) -> list[tuple[Hotspot, str]]:
    """Every hotspot with why it is skipped ("" = searched): unsupported, under --min-share, past --top."""
    out, chosen = [], 0
    for h in hotspots:
        if h.unsupported:
            why = f"not targeted ({h.unsupported})"
        elif h.time_share < min_share:
            why = f"{h.time_share * 100:.2f}% of the forward, under --min-share {min_share * 100:g}%"
        elif chosen >= top:
            why = f"beyond --top {top}"
        else:
            why = ""
            chosen += 1
        out.append((h, why))
    return out


# ---------------------------------------------------------------- store wiring


class StoreHooks(SearchHooks):
    """The search's callbacks on the run store, plus progress and the dashboard's control file."""

    def __init__(self, store: Store, run_id: int, hotspot_id: str, run_dir: Path | None = None,
                 on_progress: Callable[[Progress], None] | None = None, started_at: float | None = None):
        self.store, self.run_id, self.hid = store, run_id, hotspot_id
        self.run_dir = run_dir
        self.on_progress = on_progress
        self.started_at = started_at if started_at is not None else time.time()
        self.last_beat = 0.0
        self.last_action = "run"

    def node_added(self, node: Node) -> int:
        parent_id = node.parent.id if node.parent is not None and node.parent.candidate is not None else None
        return self.store.add_node(self.hid, parent_id, node.depth, node.move, node.move_kind,
                                   node.candidate.to_json())  # type: ignore[union-attr]

    def eval_started(self, node: Node) -> None:
        self.store.mark_evaluating(node.id, self.hid)

    def eval_done(self, node: Node, progress: Progress) -> None:
        assert node.evaluation is not None and node.reward is not None
        self.store.record_evaluation(node.id, self.hid, node.evaluation.to_json(), node.reward)
        self.store.set_hotspot_search(self.hid, progress.elapsed_s)  # survives kill -9: resume knows what is left
        self._beat(force=True)
        if self.on_progress:
            self.on_progress(progress)

    def stats_changed(self, nodes: list[Node]) -> None:
        self.store.set_node_stats([(n.id, n.visits, n.value_sum) for n in nodes])

    def note(self, text: str, node: Node | None = None) -> None:
        self.store.event("note", hotspot_id=self.hid, node_id=node.id if node else None, payload={"text": text})

    def control(self) -> str:
        self._beat()
        if self.run_dir is None:
            return "run"
        doc = read_control(self.run_dir, since=self.started_at)
        action = {"pause": "pause", "stop": "stop"}.get(doc["action"], "run") if doc else "run"
        if action != self.last_action:
            self.store.event("control", hotspot_id=self.hid, payload={"action": action})
            self.last_action = action
        return action

    def _beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_beat >= HEARTBEAT_S:
            self.store.heartbeat(self.run_id)
            self.last_beat = now


def restore_nodes(store: Store, hotspot_id: str) -> list[StoredNode]:
    """The stored tree of a hotspot, for resume: nodes with their evaluations (None if never finished)."""
    evals = {r["node_id"]: r for r in store.evaluations(hotspot_id)}
    out = []
    for r in store.nodes(hotspot_id):
        e = evals.get(r["id"])
        out.append(StoredNode(
            id=r["id"], parent_id=r["parent_id"], move=r["move"], move_kind=r["move_kind"],
            candidate=Candidate.from_json(json.loads(r["candidate_json"])),
            evaluation=Evaluation.from_json(json.loads(e["evaluation_json"])) if e is not None else None,
            reward=e["reward"] if e is not None else None))
    return out


def search_hotspot(store: Store, run_id: int, hotspot: Hotspot, baseline: Baseline | None, proposers: list,
                   evaluate: Callable[[Candidate], Evaluation], config: SearchConfig, *, backend: str,
                   root_candidates: Sequence[Candidate] = (), gpu: dict | None = None, run_dir: Path | None = None,
                   on_progress: Callable[[Progress], None] | None = None,
                   started_at: float | None = None, spent_s: float = 0.0) -> SearchResult:
    """One hotspot's MCTS, continued from whatever the store already holds for it.

    ``spent_s``: search time earlier runs used, counted against the time limit."""
    hid = hotspot.id
    restored = restore_nodes(store, hid)
    store.set_hotspot_status(hid, "searching")
    store.set_hotspot_search(hid, spent_s)  # under way: no stop reason until it ends
    roots = [Move(c, "reference kernel" if c.origin == "reference" else f"start {c.label}", "root")
             for c in root_candidates]
    hooks = StoreHooks(store, run_id, hid, run_dir, on_progress, started_at)
    result = search(proposers, evaluate, config, hotspot=hotspot, backend=backend, baseline=baseline, gpu=gpu,
                    root_moves=roots, hooks=hooks, restore=restored, spent_s=spent_s)
    store.set_hotspot_search(hid, result.search_s, result.stop_reason)
    best_id = result.best.id if result.best else None
    store.set_hotspot_status(hid, "searching" if result.stop_reason == "stopped" else "done", best_id)
    store.event("note", hotspot_id=hid, payload={"text": f"search ended: {result.stop_reason}",
                                                 **result.summary()})
    return result


# ---------------------------------------------------------------- the pipeline


def _save_config(run_dir: Path, config: RunConfig) -> None:
    tmp = run_dir / f".{CONFIG_FILE}.tmp"
    tmp.write_text(json.dumps(config.to_json(), indent=2, sort_keys=True))
    os.replace(tmp, run_dir / CONFIG_FILE)


def load_config(run_dir: str | Path) -> RunConfig:
    path = Path(run_dir) / CONFIG_FILE
    if not (Path(run_dir) / "run.db").is_file() or not path.is_file():
        raise ForgeError(f"{run_dir} is not a forge-pack run directory (no run.db and config.json)",
                         "pass the directory an earlier `forge-pack search` wrote (its path is printed at the end)")
    check_store(run_dir)  # an emptied or damaged store is an error here, never a fresh start over it
    try:
        return RunConfig.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise ForgeError(f"cannot read {path}: {e}", "the run directory may be from another forge-pack version")


def _gpu_info(env: dict, baseline: Baseline | None, evaluator: "_Lazy") -> dict:
    """What proposers may know of the device: the evaluator's report (name, capability, SMs, shared
    memory, L2) when it has started, else the environment record; plus the measured copy bandwidth."""
    info = {k: env[k] for k in ("gpu", "compute_capability", "sm_count") if k in env}
    device_info = getattr(evaluator.obj, "device_info", None)
    if callable(device_info):
        try:
            info.update(device_info())
        except Exception:  # noqa: BLE001 - informative only
            pass
    if baseline is not None and baseline.copy_bandwidth_gbs:
        info["copy_bandwidth_gbs"] = baseline.copy_bandwidth_gbs
    return info


class _Lazy:
    """The evaluator starts its worker processes only when something needs evaluating."""

    def __init__(self, make: Callable[[], Any]):
        self.make, self.obj = make, None

    def get(self):
        if self.obj is None:
            self.obj = self.make()
        return self.obj

    def close(self) -> None:
        if self.obj is not None:
            for name in ("close", "shutdown"):
                fn = getattr(self.obj, name, None)
                if callable(fn):
                    fn()
                    break


def _plan_fresh(config: RunConfig, tk: Toolkit, store: Store, target, run_dir: Path, quiet: bool):
    env = tk.env(target.device)
    run_id = store.start_run(str(Path(config.model).resolve()), target.model_hash, target.device,
                             config.dtype or "", env, config.to_json())
    prof = tk.profile(target, run_dir, quiet)
    store.set_meta("forward_us", float(prof.forward_us))
    plan = []
    for rank, (h, why) in enumerate(choose_hotspots(prof.hotspots, config.top, config.min_share), 1):
        hj = h.to_json()
        if why:
            hj["skip_reason"] = why
        store.add_hotspot(run_id, rank, hj, 0 if why else config.budget)
        if why:
            store.set_hotspot_status(h.id, "skipped")
        plan.append((rank, h, why))
    store.set_meta("profiled", "1")
    return run_id, env, float(prof.forward_us), plan


def _plan_resumed(config: RunConfig, tk: Toolkit, store: Store, run_row):
    env = tk.env(run_row["device"])
    run_id = store.start_run(run_row["model_path"], run_row["model_hash"], run_row["device"], run_row["dtype"] or "",
                             env, config.to_json())
    plan = []
    for r in store.hotspots():
        hj = json.loads(r["hotspot_json"])
        plan.append((r["rank"], Hotspot.from_json(hj), hj.get("skip_reason", "") if r["status"] == "skipped" else ""))
    return run_id, env, float(store.get_meta("forward_us") or 0.0), plan


class _Heartbeat:
    """Beats the run's heartbeat every few seconds from a daemon thread, so that long phases with no
    evaluation (profiling, a torch.compile baseline) do not look like a crashed run on the dashboard."""

    def __init__(self, store: Store, every_s: float = 3.0):
        self.store, self.every_s = store, every_s
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="forge-heartbeat", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            rows = self.store.query("SELECT id FROM runs WHERE status='running' ORDER BY id DESC LIMIT 1")
            if rows:
                self.store.heartbeat(rows[0]["id"])

    def close(self) -> None:
        self.stop.set()


class RunLock:
    """An exclusive, non-blocking flock on RUN_DIR/lock, held for the whole run.

    flock, not a pid file: the kernel releases it when the process ends however it ends (kill -9
    too), so a crashed run never leaves a stale lock behind. The holder's pid is written into the
    file only to name it in the refusal."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None or self.fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if not isinstance(e, BlockingIOError):  # a filesystem without flock (ENOLCK, EOPNOTSUPP)
                os.close(fd)
                warnings.warn(f"cannot lock {self.path} ({e.strerror}): two searches of this run directory "
                              "would not be kept apart", RuntimeWarning, stacklevel=2)
                return
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise ForgeError(f"another forge-pack process{who} is searching {self.path.parent} right now",
                             "wait for it to finish, or stop it (Ctrl-C, or the dashboard's stop) and then "
                             f"continue with --resume {self.path.parent}") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def _check_run_dir(run_dir: Path) -> None:
    """A run directory that cannot be one (a file, or under a file) is a user error, not a traceback."""
    for p in (run_dir, *run_dir.parents):
        if p.exists():
            if not p.is_dir():
                what = f"{run_dir} is a file" if p == run_dir else f"{p} is a file, so {run_dir} cannot be created"
                raise ForgeError(f"the run directory {what}",
                                 "pass a directory path to --run-dir (it is created if missing)")
            return


def _resume_state(row, config: RunConfig, new_moves: bool = False) -> tuple[bool, float]:
    """(search it?, search time already spent) for a stored hotspot row.

    A search that never ended (a fresh run; killed, Ctrl-C, stopped from the dashboard) continues with
    the time it has left. One that ended (budget, time limit, proposers dry) is kept as it is unless
    the flags give it more to do: a larger --budget (a new stint: the time limit counts afresh, or
    the extra evaluations could never run), after a time-limit stop a larger --time-limit, or after
    the proposers ran dry other proposers (``new_moves``: an --llm model added or changed)."""
    spent = float(row["search_s"] or 0.0)
    reason = row["stop_reason"]
    if reason not in ENDED:
        return True, spent
    if config.budget > (row["budget"] or 0):
        return True, 0.0
    if reason == "time_limit" and (config.time_limit_s is None or config.time_limit_s > spent):
        return True, spent
    if reason == "exhausted" and new_moves:
        return True, spent
    return False, spent


def _stored_llm(run_dir: Path) -> str | None:
    """The LLM model of the configuration a run was last started with (None: templates only)."""
    try:
        return load_config(run_dir).llm_model or None
    except ForgeError:
        return None


def _kept_result(store: Store, row, config: RunConfig) -> SearchResult:
    """The stored result of a hotspot whose search ended, for the summary; nothing is evaluated."""
    search_cfg = replace(config.search_config(), budget=row["budget"] or config.budget)
    return restored_result(restore_nodes(store, row["id"]), search_cfg, row["stop_reason"],
                           float(row["search_s"] or 0.0))


def run(config: RunConfig, *, resume: bool = False, toolkit: Toolkit | None = None,
        say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
        on_progress: Callable[[HotspotOutcome, Progress], None] | None = None,
        on_hotspot: Callable[[HotspotOutcome, int, int], None] | None = None, quiet: bool = False,
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


def _run(config: RunConfig, lock: RunLock, *, resume: bool, toolkit: Toolkit | None, say: Callable[[str], None],
         on_progress: Callable[[HotspotOutcome, Progress], None] | None,
         on_hotspot: Callable[[HotspotOutcome, int, int], None] | None, quiet: bool,
         ui: dict | None) -> RunSummary:
    tk = toolkit or Toolkit()
    t0 = time.monotonic()
    started_at = time.time()
    run_dir = Path(config.run_dir)
    run_row = None
    if resume:
        if not (run_dir / "run.db").is_file():
            raise ForgeError(f"{run_dir} has no run.db to resume", "pass the run directory of an earlier search")
        check_store(run_dir)  # a 0-byte or damaged run.db must not become a new, empty run
        lock.acquire()  # before anything reads or writes the store
        with Store(run_dir) as probe:
            rows = probe.query("SELECT * FROM runs ORDER BY id DESC LIMIT 1")
            profiled = probe.get_meta("profiled") == "1"
        run_row = rows[0] if rows and profiled else None  # died before the profile finished: profile again
    elif (run_dir / "run.db").exists():
        raise ForgeError(f"{run_dir} already holds a run",
                         f"continue it with --resume {run_dir}, or choose another --run-dir")
    target = None
    if run_row is None:
        target = tk.load(config.model, config.device, config.dtype)  # user errors surface before any file is written
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ForgeError(f"cannot create the run directory {run_dir}: {e.strerror or e}",
                         "pass a writable directory path to --run-dir") from None
    lock.acquire()
    if not resume:
        if (run_dir / "run.db").exists():  # another search took this directory while the model loaded
            raise ForgeError(f"{run_dir} already holds a run",
                             f"continue it with --resume {run_dir}, or choose another --run-dir")
        say(f"run directory: {run_dir}")  # named now, not only at the end: a killed run is resumed from it
    store = Store(run_dir)
    run_id = None
    evaluator = None
    status = "failed"
    beat = _Heartbeat(store)
    beat.start()
    try:
        # the proposers of the run being continued: new ones reopen hotspots whose proposers ran dry
        before = _stored_llm(run_dir) if run_row is not None else None
        _save_config(run_dir, config)
        if ui is not None:  # --ui: the dashboard beside the search, reading the same run store
            from forge_pack.ui.server import start_ui_in_background

            start_ui_in_background(run_dir, echo=say, **ui)
        if run_row is not None:
            device = run_row["device"]
            tk.check_device(device)  # no usable GPU: one error here, not a failed verdict per candidate
            run_id, env, forward_us, plan = _plan_resumed(config, tk, store, run_row)
        else:
            run_id, env, forward_us, plan = _plan_fresh(config, tk, store, target, run_dir, quiet)
            device = target.device
            target = None  # the model is not needed any more: its captured tensors are on disk
        rows = {r["id"]: r for r in store.hotspots()}
        new_moves = run_row is not None and (config.llm_model or None) != before
        todo = {h.id: _resume_state(rows[h.id], config, new_moves) for _, h, why in plan if not why}
        if run_row is not None:
            n = sum(1 for go, _ in todo.values() if go)
            kept = len(todo) - n
            say(f"resuming {run_dir}: {n} hotspot{'s' if n != 1 else ''} to search"
                + (f", {kept} already finished" if kept else "") + f", budget {config.budget} each")
        backend = "cuda" if device == "cuda" else "cpu"
        evaluator = _Lazy(lambda: tk.evaluator(config, run_dir, backend))
        proposers = None
        outcomes: list[HotspotOutcome] = []
        searched = [h for _, h, why in plan if not why and todo[h.id][0]]  # numbered [i/n] as they start
        status = "finished"
        for rank, h, why in plan:
            out = HotspotOutcome(h, rank, skipped=why)
            outcomes.append(out)
            if why:
                continue
            if status == "interrupted":
                out.note = "not searched: the run was stopped (continue with --resume)"
                continue
            go, spent_s = todo[h.id]
            if not go:  # its search ended in an earlier run and the flags give it nothing more to do
                out.baseline = _stored_baseline(store, h.id)
                out.result = _kept_result(store, rows[h.id], config)
                continue
            if on_hotspot:
                on_hotspot(out, searched.index(h) + 1, len(searched))
            store.execute("UPDATE hotspots SET budget=? WHERE id=?", (config.budget, h.id))
            out.baseline = _stored_baseline(store, h.id)
            if out.baseline is None:
                say(f"timing eager and torch.compile: {h.signature.pretty()}")
                try:
                    out.baseline = evaluator.get().baseline(h)
                except ForgeError:
                    raise
                except Exception as e:  # noqa: BLE001 - one bad hotspot must not end the run
                    out.note = f"not searched: its baseline could not be measured ({type(e).__name__}: {e})"
                    store.event("note", hotspot_id=h.id, payload={"text": out.note})
                    store.set_hotspot_status(h.id, "done")
                    continue
                store.set_baseline(h.id, out.baseline.to_json())
            if proposers is None:
                proposers = tk.proposers(config, backend, store)
            baseline = out.baseline

            def evaluate(cand: Candidate, h=h, baseline=baseline) -> Evaluation:
                return evaluator.get().evaluate(cand, h, baseline)

            progress_cb = (lambda p, out=out: on_progress(out, p)) if on_progress else None
            out.result = search_hotspot(store, run_id, h, baseline, proposers, evaluate, config.search_config(),
                                        backend=backend, root_candidates=tk.roots(h, backend),
                                        gpu=_gpu_info(env, baseline, evaluator), run_dir=run_dir,
                                        on_progress=progress_cb, started_at=started_at, spent_s=spent_s)
            if out.result.stop_reason == "stopped":
                status = "interrupted"
        summary = RunSummary(str(run_dir), config, device, forward_us, outcomes, status, time.monotonic() - t0)
        (run_dir / SUMMARY_FILE).write_text(json.dumps(finite(summary.to_json()), indent=2))
        return summary
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        beat.close()
        if evaluator is not None:
            evaluator.close()
        if run_id is not None:
            store.finish_run(run_id, status)
        store.close()


def _stored_baseline(store: Store, hotspot_id: str) -> Baseline | None:
    stored = store.query("SELECT baseline_json FROM hotspots WHERE id=?", (hotspot_id,))[0]["baseline_json"]
    return Baseline.from_json(json.loads(stored)) if stored else None


def with_overrides(config: RunConfig, **overrides: Any) -> RunConfig:
    """The config with the given non-None values replaced (flags given again on --resume)."""
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})
