"""Which hotspots a run searches, and with how much of its time limit left. No torch import.

A fresh run profiles the model and stores every hotspot (the chosen ones and, with why, the
skipped ones); a resumed run reads them back, never profiling again. A hotspot whose search
already ended is searched again only when the flags give it more to do (``resume_state``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from forge_pack.core.hotspot import Hotspot
from forge_pack.search.config import RunConfig
from forge_pack.search.toolkit import Toolkit
from forge_pack.store.run_store import Store
from forge_pack.store.vocabulary import HotspotStatus, MetaKey, StopReason

# (rank, hotspot, why it is skipped; "" when it is searched), largest hotspot first
Plan = list[tuple[int, Hotspot, str]]


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


def plan_fresh(config: RunConfig, tk: Toolkit, store: Store, target, run_dir: Path,
               quiet: bool) -> tuple[int, dict, float, Plan]:
    """Start the run, profile the model, store its hotspots: (run id, env, forward us, plan)."""
    env = tk.env(target.device)
    run_id = store.start_run(str(Path(config.model).resolve()), target.model_hash, target.device,
                             config.dtype or "", env, config.to_json())
    prof = tk.profile(target, run_dir, quiet)
    store.set_meta(MetaKey.FORWARD_US, float(prof.forward_us))
    plan = []
    for rank, (h, why) in enumerate(choose_hotspots(prof.hotspots, config.top, config.min_share), 1):
        hj = h.to_json()
        if why:
            hj["skip_reason"] = why
        store.add_hotspot(run_id, rank, hj, 0 if why else config.budget)
        if why:
            store.set_hotspot_status(h.id, HotspotStatus.SKIPPED)
        plan.append((rank, h, why))
    store.set_meta(MetaKey.PROFILED, "1")
    return run_id, env, float(prof.forward_us), plan


def plan_resumed(config: RunConfig, tk: Toolkit, store: Store, run_row) -> tuple[int, dict, float, Plan]:
    """Restart the stored run and read its hotspots back: (run id, env, forward us, plan)."""
    env = tk.env(run_row["device"])
    run_id = store.start_run(run_row["model_path"], run_row["model_hash"], run_row["device"], run_row["dtype"] or "",
                             env, config.to_json())
    plan = []
    for r in store.hotspots():
        hj = json.loads(r["hotspot_json"])
        why = hj.get("skip_reason", "") if r["status"] == HotspotStatus.SKIPPED else ""
        plan.append((r["rank"], Hotspot.from_json(hj), why))
    return run_id, env, float(store.get_meta(MetaKey.FORWARD_US) or 0.0), plan


def resume_state(row, config: RunConfig, new_moves: bool = False) -> tuple[bool, float]:
    """(search it?, search time already spent) for a stored hotspot row.

    A search that never ended (a fresh run; killed, Ctrl-C, stopped from the dashboard) continues with
    the time it has left. One that ended (budget, time limit, proposers dry) is kept as it is unless
    the flags give it more to do: a larger --budget (a new stint: the time limit counts afresh, or
    the extra evaluations could never run), after a time-limit stop a larger --time-limit, or after
    the proposers ran dry other proposers (``new_moves``: an --llm model added or changed)."""
    spent = float(row["search_s"] or 0.0)
    reason = row["stop_reason"]
    if reason not in StopReason.ENDED:
        return True, spent
    if config.budget > (row["budget"] or 0):
        return True, 0.0
    if reason == StopReason.TIME_LIMIT and (config.time_limit_s is None or config.time_limit_s > spent):
        return True, spent
    if reason == StopReason.EXHAUSTED and new_moves:
        return True, spent
    return False, spent
