"""Monte Carlo Tree Search over kernel candidates. Pure Python: no torch import, ever.

A node is a candidate, an edge a proposer's move. The search never compiles or times anything:
it receives proposers (templates, an LLM, any ``Proposer``) and an ``evaluate`` callable, so it is
tested with fakes and the evaluator stays free to run candidates in worker processes.

One iteration: descend from the (virtual) root by UCT. At each node the arms are its evaluated
children and, while progressive widening allows another child (``ceil(widen_c * visits **
widen_alpha)``), the node itself ("expand here", scored by its own reward). The chosen node takes
the next move its proposers offer (asking one proposer, round-robin or weighted, when its queue is
empty); the child is evaluated and its reward backed up the path. Rewards are normalised: the log
of the speedup over eager (0 = as fast as eager); a failed candidate gets a fixed penalty. A node's
value blends its subtree's mean and max reward: we search for the best kernel, not the best average.
The virtual root first takes every starting point (the caller's root moves, then each proposer's).

Parallel evaluations: up to ``parallel`` children are evaluated at once (a thread pool; the
evaluator blocks per call). Each in-flight evaluation puts a virtual loss on its path, so the
next descent spreads elsewhere. The budget is exact: never more than ``budget`` evaluations in all
(restored ones included), and exactly ``budget`` unless time runs out, the caller stops the search
or the proposers run dry. With ``parallel=1`` everything runs inline and a seed fixes the result.

Resume: ``restore`` takes the nodes (and evaluations) of an earlier, interrupted search of the same
hotspot; they are rebuilt into the tree without re-evaluation, a node that was in flight when the
process died is evaluated first, and the search continues to the same total budget. Content hashes
deduplicate: a candidate already in the tree is never evaluated again. ``spent_s`` is the search time
the earlier runs already used, so a resumed search gets only what is left of ``time_limit_s``.

Time: the time limit counts active search time. Time spent paused (the control hook says 'pause'
and nothing is in flight) does not count against it.
"""

from __future__ import annotations

import math
import random
import time
import traceback
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from forge_pack.core.candidate import Candidate
from forge_pack.core.hotspot import Hotspot
from forge_pack.search.propose import Move, NodeView, ProposeRequest, Proposer
from forge_pack.core.verdict import Baseline, Evaluation, Verdict
from forge_pack.evaluate import memory_plan
from forge_pack.store.vocabulary import MoveKind, NodeStatus, StopReason

# A failure counts like a kernel 4x slower than eager: bad enough to steer away, finite so that a
# subtree with a few failures can still win on its successes.
FAILURE_REWARD = math.log(0.25)
# Caps a (probably implausible) huge speedup so one outlier cannot freeze the tree on one branch.
MAX_REWARD = math.log(1000.0)
# How often the loop polls the control hook (pause/stop, heartbeat) while evaluations are in flight.
POLL_S = 1.0


@dataclass(frozen=True)
class SearchConfig:
    budget: int = 50  # evaluations per hotspot, restored ones included
    # no new evaluation starts after this much search time (pauses excluded, earlier runs of a resumed
    # search included), once a candidate beyond the given roots (the reference kernel) was evaluated:
    # on huge shapes the reference alone can outlast a short limit
    time_limit_s: float | None = None
    parallel: int = 1  # evaluations in flight at once
    seed: int = 0
    # Defaults tuned on the synthetic landscapes of tests/test_search.py (hit rate of the global best
    # over 100 seeds at budget 50: 0.70 here, 0.06 for random search).
    exploration: float = 0.3  # UCT constant; rewards are log speedups, so 0.3 ~ a 1.35x spread
    widen_c: float = 2.0  # progressive widening: children allowed = ceil(widen_c * visits ** widen_alpha)
    widen_alpha: float = 0.5
    max_weight: float = 0.9  # node value = (1 - w) * mean + w * max reward of its subtree: we want the best
    failure_reward: float = FAILURE_REWARD
    max_moves: int = 4  # moves asked of a proposer per call
    max_root_children: int = 8  # starting points evaluated before widening rules the root
    proposer_weights: tuple[tuple[str, float], ...] = ()  # (name, weight); empty: round-robin

    def __post_init__(self):
        if self.budget < 0:
            raise ValueError("budget must be >= 0")
        if self.parallel < 1:
            raise ValueError("parallel must be >= 1")


def reward_of(evaluation: Any, failure_reward: float = FAILURE_REWARD) -> float:
    """log(speedup over eager) for a correct candidate, the failure penalty otherwise.

    A correct but very slow kernel is clipped to the failure penalty: it is no better a parent.
    """
    verdict = getattr(evaluation, "verdict", None)
    speedup = getattr(evaluation, "speedup_vs_eager", None)
    if verdict is None or not verdict.ok or speedup is None or not (speedup > 0) or not math.isfinite(speedup):
        return failure_reward
    return min(max(math.log(speedup), failure_reward), MAX_REWARD)


def replaces_best(new: "Node", best: "Node") -> bool:
    """A later candidate takes the best's place only when it is faster by more than the measurement
    noise of the two timings (core.winner.clearly_faster), so that a rerun measuring the same
    candidates in the same order keeps the same best though its timings differ a little; without
    timings, the higher speedup."""
    from forge_pack.core.winner import clearly_faster

    if (new.speedup or 0.0) <= (best.speedup or 0.0):
        return False
    a = new.evaluation.timing if new.evaluation is not None else None
    b = best.evaluation.timing if best.evaluation is not None else None
    return a is None or b is None or clearly_faster(a, b)


@dataclass(eq=False)
class Node:
    id: int
    candidate: Candidate | None  # None only for the virtual root
    parent: "Node | None"
    depth: int  # root children (starting points) have depth 0; the virtual root -1
    move: str
    move_kind: str  # root | template | llm | repair
    proposer: str = ""
    status: str = NodeStatus.PENDING  # NodeStatus: pending | evaluating | done
    evaluation: Evaluation | None = None
    reward: float | None = None
    visits: int = 0  # evaluations in this subtree, the node's own included
    value_sum: float = 0.0
    best_reward: float = -math.inf
    virtual: int = 0  # in-flight evaluations below this node (virtual loss)
    children: list["Node"] = field(default_factory=list)
    # expansion state (not persisted: rebuilt by asking the proposers again on resume)
    pending: dict = field(default_factory=dict)  # proposer name -> deque of Moves not yet children
    exhausted: set = field(default_factory=set)  # proposers that ran dry for this node
    proposing: bool = False
    min_children: int = 0
    turn: int = 0  # round-robin cursor over proposers

    @property
    def ok(self) -> bool:
        return self.evaluation is not None and bool(self.evaluation.verdict.ok)

    @property
    def speedup(self) -> float | None:
        return self.evaluation.speedup_vs_eager if self.ok else None  # type: ignore[union-attr]

    @property
    def mean(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0

    @property
    def reason(self) -> str:
        return self.evaluation.verdict.reason if self.evaluation is not None else "pending"

    def path(self) -> list["Node"]:
        """This node and its ancestors, the virtual root last."""
        out, n = [], self
        while n is not None:
            out.append(n)
            n = n.parent
        return out

    def view(self) -> NodeView:
        assert self.candidate is not None
        return NodeView(self.id, self.candidate, self.evaluation, self.depth)


@dataclass(frozen=True)
class StoredNode:
    """A node of an earlier search, as the run store gives it back for resume."""

    id: int
    parent_id: int | None
    move: str
    move_kind: str
    candidate: Candidate
    evaluation: Evaluation | None = None  # None: it was in flight when the process died
    reward: float | None = None  # recomputed from the evaluation when None


@dataclass(frozen=True)
class Progress:
    evaluations: int  # done, restored ones included
    budget: int
    failures: int
    best_speedup: float | None
    in_flight: int
    elapsed_s: float  # search time: pauses excluded, earlier runs of a resumed search included
    failed: tuple[tuple[str, int], ...] = ()  # (verdict reason, count) of the failures, most frequent first


class SearchHooks:
    """Callbacks of a search; the defaults do nothing. All are called from the search's own thread.

    The pipeline implements them on the run store: a node row when a child is created, the
    evaluation committed as soon as it returns (before anything else starts), node statistics,
    a heartbeat, and the dashboard's control file.
    """

    def node_added(self, node: Node) -> int | None:
        """Persist a new node; return its id (None: the search numbers it)."""
        return None

    def eval_started(self, node: Node) -> None: ...

    def eval_done(self, node: Node, progress: Progress) -> None: ...

    def stats_changed(self, nodes: list[Node]) -> None:
        """Visits/value of these nodes changed (the path of the last evaluation)."""

    def note(self, text: str, node: Node | None = None) -> None:
        """Something worth recording that is not an evaluation (a proposer error, the stop reason)."""

    def control(self) -> str:
        """'run', 'pause' or 'stop'; polled between evaluations."""
        return "run"


@dataclass
class SearchResult:
    root: Node
    nodes: list[Node]  # every candidate node, in id order
    best: Node | None  # the fastest correct candidate (None: nothing was correct)
    evaluations: int  # evaluated nodes in the tree, restored ones included
    new_evaluations: int  # evaluated by this call
    budget: int
    elapsed_s: float  # wall time of this call
    stop_reason: str  # budget | time_limit | exhausted | stopped | out_of_memory (store.vocabulary.StopReason)
    verdicts: dict[str, int]  # reason -> count
    search_s: float = 0.0  # search time counted against the time limit: pauses excluded, spent_s included

    @property
    def failures(self) -> int:
        return sum(c for r, c in self.verdicts.items() if r != "ok")

    @property
    def failed(self) -> tuple[tuple[str, int], ...]:
        """(verdict reason, count) of the failures, most frequent first (as ``Progress.failed``)."""
        return tuple(Counter({r: c for r, c in self.verdicts.items() if r != "ok"}).most_common())

    @property
    def best_speedup(self) -> float | None:
        return self.best.speedup if self.best is not None else None

    def summary(self) -> dict:
        return {"evaluations": self.evaluations, "new_evaluations": self.new_evaluations, "budget": self.budget,
                "elapsed_s": round(self.elapsed_s, 3), "search_s": round(self.search_s, 3),
                "stop_reason": self.stop_reason,
                "verdicts": dict(self.verdicts), "best_node_id": self.best.id if self.best else None,
                "best_speedup": self.best_speedup, "nodes": len(self.nodes)}


class _FunctionProposer:
    def __init__(self, fn: Callable[[ProposeRequest], list[Move]]):
        self.fn = fn
        self.name = getattr(fn, "__name__", "propose")

    def propose(self, request: ProposeRequest) -> list[Move]:
        return self.fn(request)


def search(proposers: Proposer | Callable | Sequence[Proposer | Callable],
           evaluate: Callable[[Candidate], Evaluation],
           config: SearchConfig = SearchConfig(), *,
           hotspot: Hotspot | None = None, backend: str = "cpu", baseline: Baseline | None = None,
           gpu: dict | None = None, root_moves: Iterable[Move] = (), hooks: SearchHooks | None = None,
           restore: Iterable[StoredNode] = (), spent_s: float = 0.0) -> SearchResult:
    """Search one hotspot. ``evaluate`` must be thread-safe when ``config.parallel > 1``.

    ``spent_s``: search time earlier runs of this hotspot already used (counts against the time limit)."""
    if callable(proposers) and not hasattr(proposers, "propose"):
        proposers = [proposers]  # type: ignore[list-item]
    elif hasattr(proposers, "propose"):
        proposers = [proposers]  # type: ignore[list-item]
    plist = [p if hasattr(p, "propose") else _FunctionProposer(p) for p in proposers]  # type: ignore[union-attr]
    names = [p.name for p in plist]
    if len(set(names)) != len(names):
        raise ValueError(f"proposer names must be unique, got {names}")
    return _Search(plist, evaluate, config, hotspot, backend, baseline, gpu or {}, list(root_moves),
                   hooks or SearchHooks(), list(restore), spent_s).run()


def restored_result(restore: Iterable[StoredNode], config: SearchConfig, stop_reason: str,
                    spent_s: float = 0.0) -> SearchResult:
    """The result of a search that already ended, rebuilt from its stored nodes: nothing is proposed
    or evaluated (a resumed run reports a finished hotspot without searching it again)."""
    s = _Search([], None, config, None, "cpu", None, {}, [], SearchHooks(), list(restore), spent_s)
    return s.result(stop_reason)


class _Search:
    def __init__(self, proposers, evaluate, config: SearchConfig, hotspot, backend, baseline, gpu, root_moves,
                 hooks: SearchHooks, restore: list[StoredNode], spent_s: float = 0.0):
        self.proposers = {p.name: p for p in proposers}
        self.order = [p.name for p in proposers]
        self.weights = dict(config.proposer_weights)
        self.evaluate_fn = evaluate
        self.cfg = config
        self.hotspot, self.backend, self.baseline, self.gpu = hotspot, backend, baseline, gpu
        self.hooks = hooks
        self.rng = random.Random(config.seed)
        self.root = Node(id=0, candidate=None, parent=None, depth=-1, move="root", move_kind=MoveKind.ROOT)
        self.nodes: list[Node] = []
        self.by_id: dict[int, Node] = {}
        self.hashes: set[str] = set()
        self.next_id = 1
        self.done = 0  # evaluated nodes in the tree
        self.new_done = 0
        self.failures = 0
        self.failed: Counter = Counter()  # verdict reason -> failures with it
        self.unfit = False  # an evaluation said the signature's own sets do not fit the device (memory_plan)
        self.best: Node | None = None
        self.evals_in_flight = 0
        self.jobs: dict[Future, tuple[str, Node, str]] = {}  # future -> (kind, node, proposer)
        self.reeval: deque[Node] = deque()  # restored nodes that never finished their evaluation
        self.t0 = time.monotonic()
        self.spent_s = max(spent_s, 0.0)  # search time of earlier runs (resume)
        self.paused_s = 0.0  # idle pauses of this call, finished ones
        self.pause_t0: float | None = None  # start of the idle pause under way
        self._restore(restore)
        self.given_roots = 0
        for m in root_moves:
            self.given_roots += self._queue(self.root, [m], "root")

    # ------------------------------------------------------------------ restore

    def _restore(self, stored: list[StoredNode]) -> None:
        for s in sorted(stored, key=lambda s: s.id):
            parent = self.by_id.get(s.parent_id) if s.parent_id is not None else self.root
            if parent is None:
                parent = self.root  # orphan (parent lost): keep it as a starting point
            node = self._attach(parent, s.candidate, s.move, s.move_kind, "", node_id=s.id)
            if s.evaluation is not None:
                reward = s.reward if s.reward is not None else reward_of(s.evaluation, self.cfg.failure_reward)
                self._finish(node, s.evaluation, reward)
            else:
                self.reeval.append(node)

    # ------------------------------------------------------------------ tree bookkeeping

    def _attach(self, parent: Node, cand: Candidate, move: str, kind: str, proposer: str,
                node_id: int | None = None) -> Node:
        node = Node(id=-1, candidate=cand, parent=parent, depth=parent.depth + 1, move=move, move_kind=kind,
                    proposer=proposer)
        if node_id is None:
            node_id = self.hooks.node_added(node)
            if node_id is None:
                node_id = self.next_id
        node.id = int(node_id)
        self.next_id = max(self.next_id, node.id + 1)
        parent.children.append(node)
        self.nodes.append(node)
        self.by_id[node.id] = node
        self.hashes.add(cand.content_hash)
        return node

    def _queue(self, node: Node, moves: list[Move], proposer: str) -> int:
        """Add novel moves to a node's queue; returns how many were novel."""
        queued = {m.candidate.content_hash for q in node.pending.values() for m in q}
        queue = node.pending.setdefault(proposer, deque())
        added = 0
        for m in moves:
            h = m.candidate.content_hash
            if h in self.hashes or h in queued:
                continue
            queued.add(h)
            queue.append(m)
            added += 1
        return added

    def _finish(self, node: Node, evaluation: Evaluation, reward: float) -> None:
        node.evaluation, node.reward, node.status = evaluation, reward, NodeStatus.DONE
        self.done += 1
        if not evaluation.verdict.ok:
            self.failures += 1
            self.failed[evaluation.verdict.reason] += 1
        elif node.speedup is not None and (self.best is None or replaces_best(node, self.best)):
            self.best = node
        for n in node.path():
            n.visits += 1
            n.value_sum += reward
            n.best_reward = max(n.best_reward, reward)

    # ------------------------------------------------------------------ selection

    def _allowed_children(self, node: Node) -> int:
        widen = math.ceil(self.cfg.widen_c * max(node.visits, 1) ** self.cfg.widen_alpha)
        return max(node.min_children, widen, 1)

    def _offers(self, node: Node) -> list[str]:
        """Sources that may give this node another child now: queued moves, or a proposer left to ask."""
        if node.proposing:
            return []
        return [n for n in ("root", *self.order)
                if node.pending.get(n) or (n in self.proposers and n not in node.exhausted)]

    def _can_offer(self, node: Node) -> bool:
        return bool(self._offers(node))

    def _queued(self, node: Node) -> int:
        return sum(len(q) for q in node.pending.values())

    def _value(self, node: Node) -> float:
        n = node.visits + node.virtual
        mean = (node.value_sum + node.virtual * self.cfg.failure_reward) / n
        w = self.cfg.max_weight
        return (1 - w) * mean + w * node.best_reward

    def _uct(self, parent: Node, child: Node) -> float:
        n = child.visits + child.virtual
        total = parent.visits + parent.virtual
        return self._value(child) + self.cfg.exploration * math.sqrt(math.log(total + 1) / n)

    def _self_score(self, node: Node) -> float:
        """The value of expanding this node itself rather than descending: its own reward, plus a
        bonus that shrinks with the children it already has (the 'stay here' arm of the bandit)."""
        total = node.visits + node.virtual
        assert node.reward is not None
        return node.reward + self.cfg.exploration * math.sqrt(math.log(total + 1) / (len(node.children) + 1))

    def _select(self, node: Node) -> Node | None:
        """The node to expand next: the UCT descent, backtracking past busy or dry subtrees.

        At each node the arms are its evaluated children (UCT) and, while progressive widening
        allows another child, the node itself; the virtual root always seeds its starting points first.
        """
        can_widen = self._can_offer(node) and len(node.children) < self._allowed_children(node)
        if can_widen and node is self.root:
            return node
        arms = [(self._uct(node, c), self.rng.random(), c) for c in node.children if c.status == NodeStatus.DONE]
        if can_widen and node.status == NodeStatus.DONE:
            arms.append((self._self_score(node), self.rng.random(), node))
        for _, _, arm in sorted(arms, key=lambda t: (t[0], t[1]), reverse=True):
            if arm is node:
                return node
            target = self._select(arm)
            if target is not None:
                return target
        return None

    def _select_uncapped(self) -> Node | None:
        """The node to expand when the UCT descent found none and nothing is in flight: the best node
        that can still offer a move, widening cap ignored.

        Without it the search could stall: a node at its cap ceil(widen_c * visits ** widen_alpha)
        whose children are all dry offers nothing, no evaluation is in flight to raise its visits, and
        the search would end as 'exhausted' with moves left. Starting points come first, then the
        node with the best own reward."""
        if self._can_offer(self.root):
            return self.root
        open_nodes = [n for n in self.nodes if n.status == NodeStatus.DONE and self._can_offer(n)]
        if not open_nodes:
            return None
        return max(open_nodes, key=lambda n: (n.reward, self.rng.random()))

    def _choose_source(self, node: Node) -> str:
        """Which source gives the next child: the caller's root moves first, then the proposers in
        turn (round-robin, or weighted at random), each from its queue or by a fresh call."""
        left = self._offers(node)
        if "root" in left:
            return "root"
        if self.weights:
            return self.rng.choices(left, weights=[self.weights.get(n, 1.0) for n in left])[0]
        name = left[node.turn % len(left)]
        node.turn += 1
        return name

    # ------------------------------------------------------------------ jobs

    def _request(self, node: Node) -> ProposeRequest:
        parent = None if node is self.root else node.view()
        siblings = tuple(c.view() for c in node.children)
        return ProposeRequest(hotspot=self.hotspot, backend=self.backend, parent=parent,  # type: ignore[arg-type]
                              baseline=self.baseline, siblings=siblings, tried_hashes=frozenset(self.hashes),
                              max_moves=self.cfg.max_root_children if node is self.root else self.cfg.max_moves,
                              gpu=self.gpu)

    def _propose_job(self, proposer: Proposer, request: ProposeRequest) -> list[Move]:
        return list(proposer.propose(request) or [])

    def _evaluate_job(self, cand: Candidate) -> Evaluation:
        t = time.monotonic()
        try:
            return self.evaluate_fn(cand)
        except Exception:  # the evaluator should return verdicts; anything else is our fault, recorded
            return Evaluation(Verdict(False, "internal_error", traceback.format_exc()[-4000:]),
                              eval_s=time.monotonic() - t)

    def _submit(self, fn, *args) -> Future:
        return self.pool.submit(fn, *args)

    def _start_eval(self, node: Node) -> None:
        node.status = NodeStatus.EVALUATING
        for n in node.path()[1:]:
            n.virtual += 1
        self.evals_in_flight += 1
        self.hooks.eval_started(node)
        fut = self._submit(self._evaluate_job, node.candidate)
        self.jobs[fut] = ("eval", node, node.proposer)

    def _start_propose(self, node: Node, name: str) -> None:
        node.proposing = True
        fut = self._submit(self._propose_job, self.proposers[name], self._request(node))
        self.jobs[fut] = ("propose", node, name)

    def _complete(self, fut: Future) -> None:
        kind, node, name = self.jobs.pop(fut)
        if kind == "propose":
            node.proposing = False
            try:
                moves = fut.result()
            except Exception as e:  # a broken proposer is dry for this node, not fatal
                self.hooks.note(f"proposer {name} failed: {type(e).__name__}: {e}", node if node.id else None)
                moves = []
            if self._queue(node, moves, name) == 0:
                node.exhausted.add(name)
            return
        self.evals_in_flight -= 1
        for n in node.path()[1:]:
            n.virtual -= 1
        evaluation = fut.result()  # _evaluate_job never raises
        self._finish(node, evaluation, reward_of(evaluation, self.cfg.failure_reward))
        if not self.unfit and evaluation.verdict is not None and memory_plan.sets_do_not_fit(evaluation.verdict):
            self.unfit = True  # every further candidate would be refused the same way
            self.hooks.note(f"search ended: {evaluation.verdict.detail}", node)
        self.new_done += 1
        self.hooks.eval_done(node, self.progress())
        self.hooks.stats_changed(node.path()[:-1])

    def progress(self) -> Progress:
        return Progress(self.done, self.cfg.budget, self.failures, self.best.speedup if self.best else None,
                        self.evals_in_flight, self.search_time(), tuple(self.failed.most_common()))

    # ------------------------------------------------------------------ time

    def search_time(self) -> float:
        """Search time so far: earlier runs' plus this call's wall time, idle pauses excluded."""
        now = time.monotonic()
        paused = self.paused_s + (now - self.pause_t0 if self.pause_t0 is not None else 0.0)
        return self.spent_s + now - self.t0 - paused

    def _track_pause(self, idle_paused: bool) -> None:
        """Open or close an idle pause. Only a pause with nothing in flight is taken off the clock:
        evaluations that finish during a pause are search work."""
        now = time.monotonic()
        if idle_paused and self.pause_t0 is None:
            self.pause_t0 = now
        elif not idle_paused and self.pause_t0 is not None:
            self.paused_s += now - self.pause_t0
            self.pause_t0 = None

    # ------------------------------------------------------------------ main loop

    def _stop_reason(self) -> str | None:
        if self.unfit:
            return StopReason.OUT_OF_MEMORY
        if self.done + self.evals_in_flight >= self.cfg.budget:
            return "budget"
        if self.cfg.time_limit_s is not None and self.search_time() >= self.cfg.time_limit_s \
                and self.done > self.given_roots:
            return "time_limit"
        return None

    def _fill(self) -> bool:
        """Start jobs until the slots are full or nothing can start; False when the search must stop."""
        proposes_in_flight = sum(1 for k, _, _ in self.jobs.values() if k == "propose")
        # parallel=1 runs one job at a time (a proposal or an evaluation), so a seed fixes the search
        serial = self.cfg.parallel == 1
        while self.evals_in_flight < self.cfg.parallel and not (serial and self.jobs):
            if self._stop_reason():
                return False
            if self.reeval:
                self._start_eval(self.reeval.popleft())
                continue
            target = self._select(self.root)
            if target is None and not self.jobs:
                target = self._select_uncapped()  # widening must not end a search that still has moves
            if target is None:
                return True
            name = self._choose_source(target)
            queue = target.pending.get(name)
            if queue:
                move = queue.popleft()
                if move.candidate.content_hash in self.hashes:
                    continue
                child = self._attach(target, move.candidate, move.label, move.kind, name)
                self._start_eval(child)
                continue
            if proposes_in_flight >= self.cfg.parallel:
                return True
            self._start_propose(target, name)
            proposes_in_flight += 1
        return True

    def _seed_root(self) -> None:
        """Ask every proposer for starting points; they (and the caller's root moves) are all tried first."""
        if self._stop_reason():
            return
        for name in self.order:
            try:
                moves = self._propose_job(self.proposers[name], self._request(self.root))
            except Exception as e:  # noqa: BLE001 - a broken proposer just offers nothing
                self.hooks.note(f"proposer {name} failed: {type(e).__name__}: {e}")
                moves = []
            self._queue(self.root, moves, name)
        self.root.exhausted.update(self.order)  # asked once; later root children come only from moves
        self.root.min_children = min(len(self.root.children) + self._queued(self.root),
                                     max(self.cfg.max_root_children, len(self.root.children)))

    def run(self) -> SearchResult:
        # Jobs run in threads even when serial, so the loop keeps polling control() (pause/stop and
        # the run's heartbeat) while a long evaluation is in flight.
        self.pool = ThreadPoolExecutor(max_workers=2 * self.cfg.parallel, thread_name_prefix="forge-search")
        stop_reason = None
        try:
            self._seed_root()
            while True:
                control = self.hooks.control()
                if control == "stop" and stop_reason is None:
                    stop_reason = "stopped"
                    self.hooks.note("stopped by the control file")
                if stop_reason is None and control == "run":
                    reason = self._stop_reason()
                    if reason:
                        stop_reason = reason
                    elif not self._fill():
                        stop_reason = self._stop_reason() or "budget"
                if not self.jobs:
                    if stop_reason is None and control == "run":
                        stop_reason = "exhausted"  # nothing in flight and nothing to start: proposers ran dry
                    if stop_reason is not None:
                        break
                    self._track_pause(True)
                    time.sleep(0.2)  # paused with nothing in flight
                    continue
                self._track_pause(False)
                done, _ = wait(list(self.jobs), timeout=POLL_S, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: self.jobs[f][1].id):
                    self._complete(fut)
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self._track_pause(False)
        return self.result(stop_reason)

    def result(self, stop_reason: str) -> SearchResult:
        return SearchResult(root=self.root, nodes=sorted(self.nodes, key=lambda n: n.id), best=self.best,
                            evaluations=self.done, new_evaluations=self.new_done, budget=self.cfg.budget,
                            elapsed_s=time.monotonic() - self.t0, stop_reason=stop_reason,
                            verdicts=dict(Counter(n.reason for n in self.nodes if n.status == NodeStatus.DONE)),
                            search_s=self.search_time())

