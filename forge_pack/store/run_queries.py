"""A run read back: the run row, its hotspots, the winners' records and the LLM accounting. No torch import.

Every function takes a read-only connection (``run_store.open_readonly``; ``Store.conn`` works too)
and is used once a search has written the store: by ``pack`` (which kernels to ship), by the LLM
summary at the end of ``forge-pack search``, by ``forge-pack check --run`` and by the dashboard's
start-up check.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from forge_pack.store.vocabulary import EventKind, LLMOutcome, MetaKey, MoveKind


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


def check_readable(conn: sqlite3.Connection) -> None:
    """Raises sqlite3.Error when the file opens but is no readable run store (no runs table)."""
    conn.execute("SELECT 1 FROM runs LIMIT 1").fetchall()


def latest_run(conn: sqlite3.Connection) -> sqlite3.Row | None:
    """The run row (one per run directory; a resume reuses it)."""
    return conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()


def meta(conn: sqlite3.Connection) -> dict[str, str]:
    """Every key/value fact of the run (forward_us, profiled, llm_config, schema_version)."""
    return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def meta_value(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return row[0] if row else None


def hotspots(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """Every hotspot row, largest (rank 1) first."""
    return conn.execute("SELECT * FROM hotspots ORDER BY rank").fetchall()


def verdict_reasons(conn: sqlite3.Connection, hotspot_id: str) -> list[str]:
    """The verdict reason of each finished evaluation of a hotspot ('ok' for a correct kernel)."""
    return [r[0] for r in conn.execute("SELECT reason FROM evaluations WHERE hotspot_id=? ORDER BY node_id",
                                       (hotspot_id,))]


def ok_evaluations(conn: sqlite3.Connection, hotspot_id: str) -> list[tuple[int, dict]]:
    """(node id, Evaluation.to_json()) of every correct candidate of a hotspot, in node order."""
    rows = conn.execute("SELECT node_id, evaluation_json FROM evaluations WHERE hotspot_id=? AND ok=1 "
                        "ORDER BY node_id", (hotspot_id,)).fetchall()
    return [(int(r[0]), _loads(r[1])) for r in rows]


def candidate_json(conn: sqlite3.Connection, node_id: int) -> dict | None:
    """A node's Candidate.to_json(); None for no such node."""
    row = conn.execute("SELECT candidate_json FROM nodes WHERE id=?", (node_id,)).fetchone()
    return _loads(row[0]) if row else None


def evaluation_json(conn: sqlite3.Connection, node_id: int) -> dict | None:
    """A node's Evaluation.to_json(); None while it was never evaluated."""
    row = conn.execute("SELECT evaluation_json FROM evaluations WHERE node_id=?", (node_id,)).fetchone()
    return _loads(row[0]) if row else None


# ---------------------------------------------------------------- LLM accounting


def llm_config(conn: sqlite3.Connection) -> dict:
    """The LLM configuration the run was last started with ({} when it had none)."""
    return _loads(meta_value(conn, MetaKey.LLM_CONFIG)) or {}


def has_llm_calls(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM llm_calls LIMIT 1").fetchone() is not None


def llm_call_rows(conn: sqlite3.Connection) -> list[dict]:
    """Each recorded LLM call (sent or not), without its prompt and reply."""
    return [dict(r) for r in conn.execute("SELECT model, outcome, prompt_tokens, completion_tokens, cost_usd,"
                                          " latency_s FROM llm_calls ORDER BY id")]


def llm_kernel_results(conn: sqlite3.Connection) -> tuple[int, int, float | None]:
    """(evaluated, passed, best speedup vs eager) of the kernels LLM moves wrote (rewrites and repairs)."""
    kinds = MoveKind.BY_LLM
    row = conn.execute("SELECT COUNT(*), COALESCE(SUM(e.ok), 0), MAX(CASE WHEN e.ok THEN e.speedup_vs_eager END)"
                       " FROM nodes n JOIN evaluations e ON e.node_id = n.id"
                       f" WHERE n.move_kind IN ({','.join('?' * len(kinds))})", kinds).fetchone()
    return int(row[0] or 0), int(row[1] or 0), row[2]


def llm_disabled_reason(conn: sqlite3.Connection) -> str:
    """Why LLM moves stopped, from the latest note the LLM proposer wrote ("" when none)."""
    row = conn.execute("SELECT payload_json FROM events WHERE kind=? AND payload_json LIKE '%\"llm\"%'"
                       " ORDER BY seq DESC LIMIT 1", (EventKind.NOTE,)).fetchone()
    return (_loads(row[0]) or {}).get("reason", "") if row else ""


def llm_totals(conn: sqlite3.Connection) -> dict:
    """Calls sent, tokens, cost and failed calls over the whole run. A row for a request never sent
    (the budget was spent) is neither a call nor a failure."""
    not_sent = LLMOutcome.NOT_SENT
    marks = ",".join("?" * len(not_sent))
    row = conn.execute(
        f"SELECT COALESCE(SUM(outcome NOT IN ({marks})), 0), COALESCE(SUM(prompt_tokens), 0),"
        f" COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_usd), 0),"
        f" COALESCE(SUM(outcome NOT IN ({marks}) AND outcome != ?), 0) FROM llm_calls",
        (*not_sent, *not_sent, LLMOutcome.OK)).fetchone()
    return {"calls": row[0], "prompt_tokens": row[1], "completion_tokens": row[2], "cost_usd": row[3],
            "failed": row[4]}
