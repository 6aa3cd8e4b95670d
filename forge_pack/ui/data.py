"""The dashboard's answers: small JSON-ready dicts built from a run store's rows. No torch import.

Every function takes a read-only sqlite3 connection (``store.run_store.open_readonly``) and returns
plain data; the rows come from ``store.dashboard_queries`` and the HTTP layer (``ui.server``)
serialises the result. Summary endpoints stay small at any run size (aggregates, one row per
hotspot); per-candidate detail is read only for the node asked for.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from typing import Any

from forge_pack.search.mcts import SearchConfig
from forge_pack.store import dashboard_queries as q
from forge_pack.store import run_queries
from forge_pack.store.vocabulary import NodeStatus, RunStatus, StopReason

# A running run whose heartbeat is older than this is shown as stalled (crashed or hung).
# The search heartbeats every few seconds; two minutes leaves room for a slow compile.
STALE_AFTER_S = 120.0
# UCT constants for the tooltip when the run's config does not record them: the search's defaults.
DEFAULT_EXPLORATION = SearchConfig.exploration
DEFAULT_MAX_WEIGHT = SearchConfig.max_weight
MAX_PAGE = q.MAX_PAGE


def _loads(text: str | None, default: Any = None) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default


def _num(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _round(v: Any, digits: int = 4) -> float | None:
    v = _num(v)
    return None if v is None else round(v, digits)


def _find_key(obj: Any, names: tuple[str, ...]) -> Any:
    """First value under any of `names` anywhere in a nested config dict."""
    if isinstance(obj, dict):
        for n in names:
            if n in obj and _num(obj[n]) is not None:
                return obj[n]
        for v in obj.values():
            found = _find_key(v, names)
            if found is not None:
                return found
    return None


cursor = q.cursor
_run_row = run_queries.latest_run


def uct_constants(conn: sqlite3.Connection) -> tuple[float, float]:
    """(exploration, max_weight) of the run's search config."""
    run = _run_row(conn)
    cfg = _loads(run["config_json"], {}) if run else {}
    c = _find_key(cfg, ("exploration", "c_uct", "uct_c"))
    w = _find_key(cfg, ("max_weight",))
    return (float(c) if c is not None else DEFAULT_EXPLORATION, float(w) if w is not None else DEFAULT_MAX_WEIGHT)


def uct_scores(conn: sqlite3.Connection, hotspot_id: str) -> dict[int, tuple[int, float | None, float | None]]:
    """node id -> (visits, mean value, UCT score) as the search computes them (search.MCTS._uct, without
    the virtual loss of evaluations in flight): value = (1 - w) * mean + w * best reward in the subtree,
    UCT = value + c * sqrt(ln(parent visits + 1) / visits)."""
    c, w = uct_constants(conn)
    rows = q.tree_stats(conn, hotspot_id)
    parent = {r[0]: r[1] for r in rows}
    best: dict[int, float] = {}
    for r in rows:  # propagate each reward up its path
        if r[4] is None:
            continue
        cur, seen = r[0], 0
        while cur is not None and seen < 100000:
            if best.get(cur, -math.inf) >= r[4]:
                break
            best[cur] = r[4]
            cur, seen = parent.get(cur), seen + 1
    visits = {r[0]: r[2] or 0 for r in rows}
    out = {}
    for r in rows:
        n = r[2] or 0
        mean = r[3] / n if n and r[3] is not None else None
        uct = None
        if mean is not None and r[1] is not None and r[1] in visits:
            value = (1 - w) * mean + w * best.get(r[0], mean)
            uct = value + c * math.sqrt(math.log(visits[r[1]] + 1) / n)
        out[r[0]] = (n, mean, uct)
    return out


_best_nodes = q.best_nodes


def projected_speedup(parts: list[tuple[float, float | None]]) -> float:
    """Amdahl over (time share, best speedup) pairs; a kernel slower than eager is not shipped (1.0)."""
    new_time = 1.0
    for share, s in parts:
        if share and s and s > 1.0:
            new_time -= share * (1.0 - 1.0 / s)
    return 1.0 / new_time if new_time > 0 else 1.0


ENDED_SHORT = (StopReason.EXHAUSTED, StopReason.TIME_LIMIT, StopReason.OUT_OF_MEMORY)


def summary(conn: sqlite3.Connection, now: float | None = None) -> dict:
    """Run header, verdict counts, LLM totals and the hotspot leaderboard."""
    now = time.time() if now is None else now
    seq = cursor(conn)  # read first: events after it may repeat rows below, never miss any
    run = _run_row(conn)
    header: dict[str, Any] = {}
    if run is not None:
        status = run["status"]
        beat = run["heartbeat_at"] or run["created_at"]
        age = now - beat
        state = status
        if status == RunStatus.RUNNING and age > STALE_AFTER_S:
            state = "stalled"
        end = now if state == RunStatus.RUNNING else beat
        header = {"model_path": run["model_path"], "model_hash": run["model_hash"], "device": run["device"],
                  "dtype": run["dtype"], "status": status, "state": state, "created_at": run["created_at"],
                  "heartbeat_at": beat, "heartbeat_age_s": age, "elapsed_s": max(0.0, end - run["created_at"]),
                  "env": _loads(run["env_json"], {}), "stale_after_s": STALE_AFTER_S}
    counts = q.verdict_counts(conn)
    n_nodes = q.node_status_counts(conn)
    best = _best_nodes(conn)
    spent = q.evaluations_per_hotspot(conn)
    evaluating = q.evaluating_per_hotspot(conn)
    rows = []
    for h in run_queries.hotspots(conn):
        base = _loads(h["baseline_json"], {}) or {}
        eager = _num(((base.get("eager") or {}).get("median_us")))
        compiled = _num(((base.get("compiled") or {}).get("median_us")))
        b = None
        if h["id"] in best:
            b = q.best_timing(conn, best[h["id"]])
        hs = _loads(h["hotspot_json"], {}) or {}
        n_eval, n_fail = spent.get(h["id"], (0, 0))
        s_eager = _num(b["speedup_vs_eager"]) if b else None
        rows.append({
            "id": h["id"], "rank": h["rank"], "op": h["op"], "pretty": h["pretty"], "time_share": _num(h["time_share"]),
            "calls_per_forward": hs.get("calls_per_forward"), "call_paths": hs.get("call_paths", []),
            # a search that ended short of its budget (proposers dry, time limit) counts what ran, so the
            # header's bar reaches its end instead of stopping at 5/8
            "status": h["status"], "budget": n_eval if h["stop_reason"] in ENDED_SHORT else h["budget"],
            "planned_budget": h["budget"], "stop_reason": h["stop_reason"],
            "evaluations": n_eval, "failures": n_fail or 0,
            "evaluating": evaluating.get(h["id"], 0),
            "eager_us": eager, "compile_us": compiled, "floor_us": _num(base.get("floor_us")),
            "best_node_id": b["node_id"] if b else None, "best_us": _num(b["median_us"]) if b else None,
            "speedup_vs_eager": s_eager, "speedup_vs_compile": _num(b["speedup_vs_compile"]) if b else None,
            "projected_model_speedup": projected_speedup([(h["time_share"] or 0.0, s_eager)]),
            # a region: its ops, kind, instances and the subgraph's code (profile_regions writes them)
            "region": (hs.get("extra") or {}).get("region"),
        })
    return {
        "cursor": seq, "server_time": now, "run": header,
        "evaluations": sum(counts.values()), "budget": sum(r["budget"] or 0 for r in rows),
        "nodes": sum(n_nodes.values()), "pending": n_nodes.get(NodeStatus.PENDING, 0),
        "evaluating": n_nodes.get(NodeStatus.EVALUATING, 0), "verdicts": counts,
        "llm": run_queries.llm_totals(conn),
        "hotspots": rows,
        "projected_model_speedup": projected_speedup([(r["time_share"] or 0.0, r["speedup_vs_eager"]) for r in rows]),
    }


def progress(conn: sqlite3.Connection) -> dict:
    """Every evaluation as a compact row, in completion order (for the progress chart)."""
    seq = cursor(conn)
    run = _run_row(conn)
    start = run["created_at"] if run else 0.0
    hotspots: list[str] = q.hotspot_ids(conn)
    index = {h: i for i, h in enumerate(hotspots)}
    rows = []
    for r in q.evaluations_in_order(conn):
        if r[1] not in index:
            index[r[1]] = len(hotspots)
            hotspots.append(r[1])
        rows.append([r[0], index[r[1]], round(r[2] - start, 2), r[3], r[4], _round(r[5])])
    return {"cursor": seq, "start": start, "hotspots": hotspots,
            "cols": ["node_id", "hotspot", "t_s", "ok", "reason", "speedup"], "rows": rows}


def tree(conn: sqlite3.Connection, hotspot_id: str) -> dict:
    """All nodes of one hotspot, compact, with visit statistics and UCT scores."""
    seq = cursor(conn)
    c, w = uct_constants(conn)
    scores = uct_scores(conn, hotspot_id)
    best = _best_nodes(conn).get(hotspot_id)
    out = []
    for r in q.tree_nodes(conn, hotspot_id):
        n, mean, uct = scores.get(r["id"], (0, None, None))
        verdict = None if r["ok"] is None else (q.VERDICT_OK if r["ok"] else r["reason"])
        out.append([r["id"], r["parent_id"], r["depth"], r["move"], r["move_kind"], r["status"], verdict,
                    _round(r["speedup_vs_eager"]), n, _round(mean), _round(uct), r["family"], _round(r["median_us"], 2)])
    return {"cursor": seq, "hotspot_id": hotspot_id, "best_node_id": best, "exploration": c, "max_weight": w,
            "cols": ["id", "parent_id", "depth", "move", "move_kind", "status", "verdict", "speedup", "visits",
                     "mean", "uct", "family", "median_us"], "nodes": out}


def record_setters(conn: sqlite3.Connection) -> set[int]:
    """Nodes that raised their hotspot's best speedup when they finished (the 'best only' filter)."""
    out: set[int] = set()
    best: dict[str, float] = {}
    for r in q.correct_speedups_in_order(conn):
        if r[2] > best.get(r[1], 0.0):
            best[r[1]] = r[2]
            out.add(r[0])
    return out | set(_best_nodes(conn).values())


def candidates(conn: sqlite3.Connection, hotspot: str | None = None, verdict: str | None = None,
               depth: int | None = None, best_only: bool = False, sort: str = "id", desc: bool = False,
               offset: int = 0, limit: int = 100) -> dict:
    seq = cursor(conn)
    limit = max(1, min(int(limit), MAX_PAGE))
    total, rows = q.candidate_page(conn, hotspot=hotspot, verdict=verdict, depth=depth,
                                   node_ids=sorted(record_setters(conn)) if best_only else None, sort=sort,
                                   desc=desc, offset=max(0, int(offset)), limit=limit)
    best = set(_best_nodes(conn).values())
    items = [{"id": r["id"], "hotspot_id": r["hotspot_id"], "parent_id": r["parent_id"], "depth": r["depth"],
              "move": r["move"], "move_kind": r["move_kind"], "family": r["family"], "status": r["status"],
              "verdict": r["verdict"], "speedup_vs_eager": _num(r["speedup_vs_eager"]),
              "speedup_vs_compile": _num(r["speedup_vs_compile"]), "median_us": _num(r["median_us"]),
              "iqr_us": _num(r["iqr_us"]), "max_abs_err": _num(r["max_abs_err"]),
              "max_rel_err": _num(r["max_rel_err"]), "visits": r["visits"] or 0,
              "detail": (r["detail"] or "").split("\n", 1)[0], "best": r["id"] in best} for r in rows]
    return {"cursor": seq, "total": total, "offset": offset, "limit": limit, "items": items,
            "depths": q.depths(conn), "reasons": q.failure_reasons(conn)}


_PTXAS_ENTRY = re.compile(r"(?:Compiling entry function|Function properties for) '?([A-Za-z_]\w*)'?")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame")


def resources(evaluation: dict) -> list[dict]:
    """Registers, spills and shared memory per kernel: from evaluation.extra if the evaluator recorded
    them, else parsed from a ``ptxas -v`` style compile log."""
    extra = evaluation.get("extra") or {}
    if isinstance(extra.get("kernels"), list):
        return [k for k in extra["kernels"] if isinstance(k, dict)]
    out: dict[str, dict] = {}
    current = None
    for line in (evaluation.get("compile_log") or "").splitlines():
        m = _PTXAS_ENTRY.search(line)
        if m:
            current = out.setdefault(m.group(1), {"name": m.group(1)})
            continue
        if current is None:
            continue
        if m := _PTXAS_REGS.search(line):
            current["registers"] = int(m.group(1))
        if m := _PTXAS_SMEM.search(line):
            current["smem_bytes"] = int(m.group(1))
        if m := _PTXAS_SPILL.search(line):
            current["spill_stores"], current["spill_loads"] = int(m.group(1)), int(m.group(2))
        if m := _PTXAS_STACK.search(line):
            current["stack_bytes"] = int(m.group(1))
    return list(out.values())


def node_detail(conn: sqlite3.Connection, node_id: int) -> dict | None:
    n = q.node(conn, node_id)
    if n is None:
        return None
    e = q.evaluation(conn, node_id)
    s = q.node_stats(conn, node_id)
    h = q.hotspot_header(conn, n["hotspot_id"])
    path = q.ancestors(conn, node_id, n["parent_id"])
    evaluation = None
    if e is not None:
        evaluation = _loads(e["evaluation_json"], {}) or {}
        evaluation.update({"reward": e["reward"], "finished_at": e["finished_at"],
                           "resources": resources(evaluation)})
    stats = None
    if s is not None:
        visits, mean, uct = uct_scores(conn, n["hotspot_id"]).get(node_id, (0, None, None))
        stats = {"visits": visits, "value_sum": s["value_sum"], "mean": mean, "uct": uct}
    # LLM calls: the one whose reply became this candidate (llm_calls.cand_hash), and those made while
    # expanding this node (llm_calls.node_id is the parent being expanded).
    produced, expanding = q.llm_calls_of_node(conn, node_id, n["hotspot_id"], n["cand_hash"])
    llm = [dict(r, relation="produced this candidate") for r in produced]
    seen_ids = {c["id"] for c in llm}
    llm += [dict(r, relation="made while expanding this node") for r in expanding if r["id"] not in seen_ids]
    children = q.child_ids(conn, node_id)
    return {"id": n["id"], "hotspot_id": n["hotspot_id"], "hotspot_pretty": h["pretty"] if h else "",
            "parent_id": n["parent_id"], "depth": n["depth"], "move": n["move"], "move_kind": n["move_kind"],
            "family": n["family"], "params": _loads(n["params_json"], {}), "origin": n["origin"],
            "status": n["status"], "cand_hash": n["cand_hash"], "created_at": n["created_at"],
            "candidate": _loads(n["candidate_json"], {}), "evaluation": evaluation, "stats": stats,
            "baseline": _loads(h["baseline_json"], None) if h else None, "path": path, "children": children,
            "llm_calls": llm, "best": _best_nodes(conn).get(n["hotspot_id"]) == n["id"]}


def source(conn: sqlite3.Connection, node_id: int) -> dict | None:
    n = q.node_source(conn, node_id)
    if n is None:
        return None
    cand = _loads(n["candidate_json"], {}) or {}
    return {"id": n["id"], "move": n["move"], "source": cand.get("source", ""), "spec": cand.get("spec")}


_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def failure_message(detail: str | None) -> str:
    """The grouping key of a failure: its first meaningful line with numbers blanked, so that
    'index (2, 17): got 0.51' and 'index (5, 3): got 0.7' fall into one group."""
    for line in (detail or "").splitlines():
        line = line.strip()
        if line:
            return _NUMBERS.sub("#", line)[:200]
    return ""


def failures(conn: sqlite3.Connection, hotspot: str | None = None, examples: int = 8) -> dict:
    seq = cursor(conn)
    groups: dict[tuple[str, str], dict] = {}
    for r in q.rejected_evaluations(conn, hotspot):
        key = (r["reason"], failure_message(r["detail"]))
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"reason": key[0], "message": key[1], "count": 0, "node_ids": [], "hotspots": set(),
                               "example": (r["detail"] or "")[:2000]}
        g["count"] += 1
        g["hotspots"].add(r["hotspot_id"])
        if len(g["node_ids"]) < examples:
            g["node_ids"].append(r["node_id"])
    by_reason: dict[str, int] = {}
    for g in groups.values():
        g["hotspots"] = sorted(g["hotspots"])
        by_reason[g["reason"]] = by_reason.get(g["reason"], 0) + g["count"]
    ordered = sorted(groups.values(), key=lambda g: (-by_reason[g["reason"]], g["reason"], -g["count"]))
    return {"cursor": seq, "by_reason": by_reason, "groups": ordered}


def events(conn: sqlite3.Connection, after: int, limit: int = 1000) -> dict:
    limit = max(1, min(int(limit), q.MAX_EVENTS))
    rows = q.events_after(conn, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    out = [[r[0], r[1], r[2], r[3], r[4], _loads(r[5], {})] for r in rows]
    last = rows[-1][0] if rows else int(after)
    return {"cursor": last, "more": more, "cols": ["seq", "at", "kind", "hotspot_id", "node_id", "payload"],
            "events": out}
