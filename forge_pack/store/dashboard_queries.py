"""What the dashboard reads from a run store, one function per question. No torch import.

Every function takes a read-only connection (``run_store.open_readonly``) and returns rows or plain
values; ``ui.data`` shapes them into the JSON the dashboard shows. Aggregates stay small at any run
size; per-candidate detail is read only for the node asked for.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from forge_pack.store.vocabulary import LLMOutcome, NodeStatus

MAX_PAGE = 500  # candidates per page: a table the browser still renders at once
MAX_EVENTS = 5000  # events per poll: a client that fell far behind catches up in a few requests
# The candidate table's sort keys -> columns; anything else sorts by id.
SORTS = {"id": "n.id", "speedup": "e.speedup_vs_eager", "median": "e.median_us", "depth": "n.depth",
         "visits": "s.visits", "verdict": "verdict", "hotspot": "n.hotspot_id"}
# The candidate filter's pseudo-verdicts besides the verdict reasons: any correct, any rejected.
VERDICT_OK, VERDICT_FAILED = "ok", "failed"


def cursor(conn: sqlite3.Connection) -> int:
    """The newest event's seq (0 for none): what a client polls from."""
    row = conn.execute("SELECT MAX(seq) FROM events").fetchone()
    return int(row[0] or 0)


def tree_stats(conn: sqlite3.Connection, hotspot_id: str) -> list[sqlite3.Row]:
    """(id, parent_id, visits, value_sum, reward) of every node of a hotspot, by id."""
    return conn.execute("SELECT n.id, n.parent_id, s.visits, s.value_sum, e.reward FROM nodes n"
                        " LEFT JOIN node_stats s ON s.node_id=n.id LEFT JOIN evaluations e ON e.node_id=n.id"
                        " WHERE n.hotspot_id=? ORDER BY n.id", (hotspot_id,)).fetchall()


def best_nodes(conn: sqlite3.Connection) -> dict[str, int]:
    """hotspot id -> best node id: the search's own choice, else the fastest correct candidate."""
    # SQLite returns the bare column (node_id) of the row that holds the MAX().
    best: dict[str, int] = {r[0]: r[1] for r in conn.execute(
        "SELECT hotspot_id, node_id, MAX(speedup_vs_eager) FROM evaluations WHERE ok=1 AND speedup_vs_eager"
        " IS NOT NULL GROUP BY hotspot_id")}
    for r in conn.execute("SELECT id, best_node_id FROM hotspots WHERE best_node_id IS NOT NULL"):
        best[r["id"]] = r["best_node_id"]
    return best


def verdict_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Finished evaluations per verdict ('ok' or the rejection reason)."""
    return {r[0]: r[1] for r in conn.execute(
        "SELECT CASE WHEN ok=1 THEN ? ELSE reason END, COUNT(*) FROM evaluations GROUP BY 1", (VERDICT_OK,))}


def node_status_counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {r[0]: r[1] for r in conn.execute("SELECT status, COUNT(*) FROM nodes GROUP BY status")}


def evaluations_per_hotspot(conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    """hotspot id -> (finished evaluations, rejected ones)."""
    return {r[0]: (r[1], r[2] or 0) for r in conn.execute(
        "SELECT hotspot_id, COUNT(*), SUM(ok=0) FROM evaluations GROUP BY hotspot_id")}


def evaluating_per_hotspot(conn: sqlite3.Connection) -> dict[str, int]:
    """hotspot id -> candidates being evaluated right now."""
    return {r[0]: r[1] for r in conn.execute(
        "SELECT hotspot_id, COUNT(*) FROM nodes WHERE status=? GROUP BY hotspot_id", (NodeStatus.EVALUATING,))}


def hotspot_ids(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT id FROM hotspots ORDER BY rank")]


def hotspot_header(conn: sqlite3.Connection, hotspot_id: str) -> sqlite3.Row | None:
    """(pretty, baseline_json) of a hotspot."""
    return conn.execute("SELECT pretty, baseline_json FROM hotspots WHERE id=?", (hotspot_id,)).fetchone()


def best_timing(conn: sqlite3.Connection, node_id: int) -> sqlite3.Row | None:
    """(node_id, median_us, speedup_vs_eager, speedup_vs_compile) of one evaluation."""
    return conn.execute("SELECT node_id, median_us, speedup_vs_eager, speedup_vs_compile FROM evaluations"
                        " WHERE node_id=?", (node_id,)).fetchone()


def evaluations_in_order(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """(node_id, hotspot_id, finished_at, ok, reason, speedup_vs_eager) in completion order."""
    return conn.execute("SELECT node_id, hotspot_id, finished_at, ok, reason, speedup_vs_eager FROM evaluations"
                        " ORDER BY finished_at, node_id").fetchall()


def correct_speedups_in_order(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """(node_id, hotspot_id, speedup_vs_eager) of the correct, timed evaluations in completion order."""
    return conn.execute("SELECT node_id, hotspot_id, speedup_vs_eager FROM evaluations WHERE ok=1"
                        " AND speedup_vs_eager IS NOT NULL ORDER BY finished_at, node_id").fetchall()


def tree_nodes(conn: sqlite3.Connection, hotspot_id: str) -> list[sqlite3.Row]:
    """Every node of a hotspot with its verdict and timing, by id."""
    return conn.execute(
        "SELECT n.id, n.parent_id, n.depth, n.move, n.move_kind, n.status, n.family, e.ok, e.reason,"
        " e.speedup_vs_eager, e.median_us FROM nodes n LEFT JOIN evaluations e ON e.node_id=n.id"
        " WHERE n.hotspot_id=? ORDER BY n.id", (hotspot_id,)).fetchall()


def candidate_page(conn: sqlite3.Connection, *, hotspot: str | None = None, verdict: str | None = None,
                   depth: int | None = None, node_ids: list[int] | None = None, sort: str = "id",
                   desc: bool = False, offset: int = 0, limit: int = 100) -> tuple[int, list[sqlite3.Row]]:
    """(matching candidates, one page of them). ``verdict``: a node status (pending, evaluating),
    'ok', 'failed' or a rejection reason; ``node_ids``: only these nodes (None: any)."""
    where: list[str] = []
    args: list[Any] = []
    if hotspot:
        where.append("n.hotspot_id=?")
        args.append(hotspot)
    if verdict:
        if verdict in (NodeStatus.PENDING, NodeStatus.EVALUATING):
            where.append("e.node_id IS NULL AND n.status=?")
            args.append(verdict)
        elif verdict == VERDICT_OK:
            where.append("e.ok=1")
        elif verdict == VERDICT_FAILED:
            where.append("e.ok=0")
        else:
            where.append("e.ok=0 AND e.reason=?")
            args.append(verdict)
    if depth is not None:
        where.append("n.depth=?")
        args.append(depth)
    if node_ids is not None:
        where.append(f"n.id IN ({','.join('?' * len(node_ids))})" if node_ids else "0")
        args.extend(node_ids)
    cond = (" WHERE " + " AND ".join(where)) if where else ""
    base = " FROM nodes n LEFT JOIN evaluations e ON e.node_id=n.id LEFT JOIN node_stats s ON s.node_id=n.id" + cond
    total = conn.execute("SELECT COUNT(*)" + base, args).fetchone()[0]
    order = SORTS.get(sort, "n.id")
    # NULLs (pending, failed) always last, whichever the direction.
    order_sql = f"{order} IS NULL, {order} {'DESC' if desc else 'ASC'}, n.id"
    rows = conn.execute(
        "SELECT n.id, n.hotspot_id, n.parent_id, n.depth, n.move, n.move_kind, n.family, n.status,"
        " CASE WHEN e.node_id IS NULL THEN n.status WHEN e.ok=1 THEN ? ELSE e.reason END AS verdict,"
        " e.speedup_vs_eager, e.speedup_vs_compile, e.median_us, e.iqr_us, e.max_abs_err, e.max_rel_err,"
        " s.visits, substr(e.detail, 1, 160) AS detail" + base + f" ORDER BY {order_sql} LIMIT ? OFFSET ?",
        [VERDICT_OK, *args, limit, offset]).fetchall()
    return total, rows


def depths(conn: sqlite3.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT DISTINCT depth FROM nodes ORDER BY depth")]


def failure_reasons(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT reason FROM evaluations WHERE ok=0 ORDER BY reason")]


def node(conn: sqlite3.Connection, node_id: int) -> sqlite3.Row | None:
    return conn.execute("SELECT * FROM nodes WHERE id=?", (node_id,)).fetchone()


def evaluation(conn: sqlite3.Connection, node_id: int) -> sqlite3.Row | None:
    return conn.execute("SELECT * FROM evaluations WHERE node_id=?", (node_id,)).fetchone()


def node_stats(conn: sqlite3.Connection, node_id: int) -> sqlite3.Row | None:
    return conn.execute("SELECT * FROM node_stats WHERE node_id=?", (node_id,)).fetchone()


def ancestors(conn: sqlite3.Connection, node_id: int, parent_id: int | None) -> list[int]:
    """The ids from the root down to ``node_id``'s parent (``parent_id``); a corrupt cycle ends the walk."""
    path: list[int] = []
    cur, seen = parent_id, set()
    while cur is not None and cur not in seen and len(path) < 10000:
        seen.add(cur)
        path.append(cur)
        p = conn.execute("SELECT parent_id FROM nodes WHERE id=?", (cur,)).fetchone()
        cur = p[0] if p else None
    path.reverse()
    return path


def child_ids(conn: sqlite3.Connection, node_id: int) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM nodes WHERE parent_id=? ORDER BY id", (node_id,))]


_LLM_COLS = ("id, model, purpose, prompt, reply, prompt_tokens, completion_tokens, latency_s, cost_usd, outcome,"
             " error, created_at, node_id")


def llm_calls_of_node(conn: sqlite3.Connection, node_id: int, hotspot_id: str,
                      cand_hash: str) -> tuple[list[sqlite3.Row], list[sqlite3.Row]]:
    """(the calls whose reply became this candidate, the calls made while expanding this node)."""
    produced: list[sqlite3.Row] = []
    if any(r[1] == "cand_hash" for r in conn.execute("PRAGMA table_info(llm_calls)")):  # an older store has none
        # outcome ok only: a duplicate row also carries the hash, of the kernel it repeated
        produced = conn.execute(f"SELECT {_LLM_COLS} FROM llm_calls WHERE cand_hash=? AND hotspot_id=? AND outcome=?"
                                " ORDER BY id", (cand_hash, hotspot_id, LLMOutcome.OK)).fetchall()
    expanding = conn.execute(f"SELECT {_LLM_COLS} FROM llm_calls WHERE node_id=? ORDER BY id", (node_id,)).fetchall()
    return produced, expanding


def node_source(conn: sqlite3.Connection, node_id: int) -> sqlite3.Row | None:
    """(id, move, candidate_json) of a node."""
    return conn.execute("SELECT id, move, candidate_json FROM nodes WHERE id=?", (node_id,)).fetchone()


def rejected_evaluations(conn: sqlite3.Connection, hotspot: str | None = None) -> list[sqlite3.Row]:
    """(node_id, hotspot_id, reason, detail) of every rejected candidate (of one hotspot), by node id."""
    sql = "SELECT node_id, hotspot_id, reason, detail FROM evaluations WHERE ok=0"
    args: list[Any] = []
    if hotspot:
        sql += " AND hotspot_id=?"
        args.append(hotspot)
    return conn.execute(sql + " ORDER BY node_id", args).fetchall()


def events_after(conn: sqlite3.Connection, after: int, limit: int) -> list[sqlite3.Row]:
    """(seq, at, kind, hotspot_id, node_id, payload_json) of up to ``limit`` events after seq ``after``."""
    return conn.execute("SELECT seq, at, kind, hotspot_id, node_id, payload_json FROM events WHERE seq>?"
                        " ORDER BY seq LIMIT ?", (int(after), limit)).fetchall()
