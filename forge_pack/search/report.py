"""What a search run found: per-hotspot outcomes, the run's summary and its search.json. No torch import.

``HotspotOutcome.verdict_line`` is the one line ``forge-pack search`` prints per hotspot; a winner
is a correct kernel that beats eager by ``core.winner.WIN_MARGIN``, the same rule the package uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from forge_pack.core.hotspot import Hotspot
from forge_pack.core.verdict import Baseline
from forge_pack.core.winner import WIN_MARGIN, is_winner
from forge_pack.search.config import RunConfig
from forge_pack.search.mcts import Node, SearchResult
from forge_pack.store.run_store import finite
from forge_pack.store.vocabulary import StopReason

SUMMARY_FILE = "search.json"


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
        return b if b is not None and is_winner(b.speedup) else None

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
        ended = {StopReason.EXHAUSTED: f" (the proposers ran dry after {r.evaluations} of {r.budget} evaluations)",
                 StopReason.TIME_LIMIT: f" (the time limit ended it after {r.evaluations} of {r.budget} evaluations)",
                 StopReason.STOPPED: f" (stopped after {r.evaluations} of {r.budget} evaluations)",
                 StopReason.OUT_OF_MEMORY: f" (stopped after {r.evaluations} of {r.budget} evaluations: the "
                                           f"signature's input sets do not fit the device's memory)",
                 }.get(r.stop_reason, "")
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
    status: str  # RunStatus.FINISHED | RunStatus.INTERRUPTED
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


def write_summary(run_dir: Path, summary: RunSummary) -> None:
    """RUN_DIR/search.json: the summary as JSON (NaN and Inf as null)."""
    (run_dir / SUMMARY_FILE).write_text(json.dumps(finite(summary.to_json()), indent=2))
