"""One hotspot's MCTS on the run store: every node, evaluation, statistic and control action is
written as it happens, and a stored tree is read back to continue it. No torch import."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from forge_pack.core.candidate import Candidate
from forge_pack.core.hotspot import Hotspot
from forge_pack.core.verdict import Baseline, Evaluation
from forge_pack.search.control import read_control
from forge_pack.search.heartbeat import HEARTBEAT_S
from forge_pack.search.mcts import Node, Progress, SearchConfig, SearchHooks, SearchResult, StoredNode, \
    restored_result, search
from forge_pack.search.propose import Move
from forge_pack.store.run_store import Store
from forge_pack.store.vocabulary import EventKind, HotspotStatus, MoveKind, StopReason


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
        self.store.event(EventKind.NOTE, hotspot_id=self.hid, node_id=node.id if node else None,
                         payload={"text": text})

    def control(self) -> str:
        self._beat()
        if self.run_dir is None:
            return "run"
        doc = read_control(self.run_dir, since=self.started_at)
        action = {"pause": "pause", "stop": "stop"}.get(doc["action"], "run") if doc else "run"
        if action != self.last_action:
            self.store.event(EventKind.CONTROL, hotspot_id=self.hid, payload={"action": action})
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
    store.set_hotspot_status(hid, HotspotStatus.SEARCHING)
    store.set_hotspot_search(hid, spent_s)  # under way: no stop reason until it ends
    roots = [Move(c, "reference kernel" if c.origin == "reference" else f"start {c.label}", MoveKind.ROOT)
             for c in root_candidates]
    hooks = StoreHooks(store, run_id, hid, run_dir, on_progress, started_at)
    result = search(proposers, evaluate, config, hotspot=hotspot, backend=backend, baseline=baseline, gpu=gpu,
                    root_moves=roots, hooks=hooks, restore=restored, spent_s=spent_s)
    store.set_hotspot_search(hid, result.search_s, result.stop_reason)
    best_id = result.best.id if result.best else None
    stopped = result.stop_reason == StopReason.STOPPED  # searching again on --resume
    store.set_hotspot_status(hid, HotspotStatus.SEARCHING if stopped else HotspotStatus.DONE, best_id)
    store.event(EventKind.NOTE, hotspot_id=hid, payload={"text": f"search ended: {result.stop_reason}",
                                                 **result.summary()})
    return result


def kept_result(store: Store, row, config: SearchConfig) -> SearchResult:
    """The stored result of a hotspot whose search ended, for the summary; nothing is evaluated."""
    search_cfg = replace(config, budget=row["budget"] or config.budget)
    return restored_result(restore_nodes(store, row["id"]), search_cfg, row["stop_reason"],
                           float(row["search_s"] or 0.0))
