"""The run store: one SQLite database (WAL) per run directory; its schema, its checks, its writer
(``Store``, used by the search) and read-only connections for everything else. No torch import.

Tables: runs, hotspots, nodes, evaluations, node_stats, events, llm_calls; the words of their
status and kind columns are in ``vocabulary``. Every write commits at once, so a process killed
between evaluations loses nothing (``kill -9`` included), and a reader (the dashboard) opens the
file read-only while the search writes. ``events.seq`` is a monotonic cursor: the dashboard polls
``events WHERE seq > ?``.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from forge_pack.core.errors import ForgeError
from forge_pack.store.vocabulary import HOTSPOT_EVENT, EventKind, LLMOutcome, MetaKey, NodeStatus, RunStatus

SCHEMA_VERSION = 1
STORE_FILE = "run.db"
# Every SQLite 3 database file starts with these 16 bytes; anything else is not a run store.
SQLITE_HEADER = b"SQLite format 3\x00"
# The tables every run store has from its first write on (Store.__init__ creates them together).
CORE_TABLES = ("meta", "runs", "hotspots", "nodes", "evaluations")

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    created_at REAL NOT NULL,
    model_path TEXT, model_hash TEXT, device TEXT, dtype TEXT,
    status TEXT NOT NULL DEFAULT 'running',      -- running | finished | failed | interrupted
    heartbeat_at REAL,
    env_json TEXT,                                -- gpu, compute capability, torch, cuda, driver, host
    config_json TEXT                              -- effective config, secrets redacted
);
CREATE TABLE IF NOT EXISTS hotspots (
    id TEXT PRIMARY KEY,                          -- Signature.slug()
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    op TEXT NOT NULL,
    pretty TEXT NOT NULL,
    hotspot_json TEXT NOT NULL,                   -- Hotspot.to_json()
    time_share REAL,
    baseline_json TEXT,                           -- Baseline.to_json(), once measured
    budget INTEGER,
    status TEXT NOT NULL DEFAULT 'pending',       -- pending | searching | done | skipped
    best_node_id INTEGER,
    stop_reason TEXT,                             -- budget | time_limit | exhausted | stopped; NULL: never ended
    search_s REAL                                 -- search time used (pauses excluded), kept up to date for resume
);
CREATE TABLE IF NOT EXISTS nodes (
    id INTEGER PRIMARY KEY,
    hotspot_id TEXT NOT NULL,
    parent_id INTEGER,
    depth INTEGER NOT NULL,
    move TEXT NOT NULL,                           -- human-readable edge label, e.g. "block_threads 256->512"
    move_kind TEXT NOT NULL,                      -- root | template | llm | repair
    family TEXT, params_json TEXT, origin TEXT,
    cand_hash TEXT NOT NULL,
    candidate_json TEXT NOT NULL,                 -- Candidate.to_json(): source and launch spec
    status TEXT NOT NULL DEFAULT 'pending',       -- pending | evaluating | done
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS nodes_hotspot ON nodes(hotspot_id);
CREATE TABLE IF NOT EXISTS evaluations (
    node_id INTEGER PRIMARY KEY,
    hotspot_id TEXT NOT NULL,
    ok INTEGER NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT,
    max_abs_err REAL, max_rel_err REAL,
    median_us REAL, iqr_us REAL, n INTEGER,
    speedup_vs_eager REAL, speedup_vs_compile REAL, bandwidth_fraction REAL,
    reward REAL NOT NULL,
    compile_s REAL, eval_s REAL,
    evaluation_json TEXT NOT NULL,                -- Evaluation.to_json()
    finished_at REAL NOT NULL,
    device TEXT                                   -- the device that measured it (cuda:3); NULL: the run's one device
);
CREATE INDEX IF NOT EXISTS evaluations_hotspot ON evaluations(hotspot_id);
CREATE TABLE IF NOT EXISTS node_stats (
    node_id INTEGER PRIMARY KEY, visits INTEGER NOT NULL, value_sum REAL NOT NULL, updated_at REAL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,                           -- vocabulary.EventKind
    hotspot_id TEXT, node_id INTEGER,
    payload_json TEXT
);
CREATE TABLE IF NOT EXISTS llm_calls (
    id INTEGER PRIMARY KEY,
    hotspot_id TEXT, node_id INTEGER,
    model TEXT, purpose TEXT,                     -- rewrite | repair | new_family
    prompt TEXT, reply TEXT,
    prompt_tokens INTEGER, completion_tokens INTEGER,
    latency_s REAL, cost_usd REAL,
    outcome TEXT,                                 -- vocabulary.LLMOutcome
    error TEXT,
    cand_hash TEXT,                               -- the candidate the reply became (outcome ok), to link the call to its node
    created_at REAL NOT NULL
);
"""


def _json(v: Any) -> str:
    """JSON with NaN/Inf turned into null (they are not JSON)."""
    return json.dumps(finite(v), sort_keys=True)


def finite(v: Any) -> Any:
    """NaN and Inf replaced by None, recursively: JSON has no spelling for them."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [finite(x) for x in v]
    return v


def _damaged(path: Path, what: str) -> ForgeError:
    return ForgeError(f"the run store {path} {what}",
                      "it cannot be read or continued: start a new run with another --run-dir (the damaged "
                      "file is left as it is; move it away to reuse this directory)")


def check_header(path: str | Path, allow_empty: bool = False) -> None:
    """Cheap checks of an existing run store, before SQLite sees it: a 0-byte file (SQLite would
    quietly treat it as a new, empty database) or one that is not SQLite at all is a ForgeError.
    ``allow_empty``: for readers polling a live run, whose writer creates the file empty and fills
    its first page a moment later."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as e:
        raise ForgeError(f"cannot read the run store {p}: {e.strerror or e}",
                         "check the file's permissions") from None
    if not head:
        if allow_empty:
            return
        raise _damaged(p, "is empty (0 bytes)")
    if head != SQLITE_HEADER:
        raise _damaged(p, "is not a SQLite database (its first bytes are not SQLite's header)")


def check_store(run_dir: str | Path) -> None:
    """An existing run store, read-only, checked through: header, SQLite's own quick_check (a
    truncated file fails here, not half way through a command), the core tables. ForgeError
    (``error:`` + ``hint:``) for anything damaged; nothing is created or written."""
    path = Path(run_dir) / STORE_FILE
    check_header(path)
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            verdict = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            conn.close()
    except sqlite3.OperationalError as e:  # locked, unreadable, a directory SQLite cannot write -shm into
        raise ForgeError(f"cannot open the run store {path}: {e}",
                         "check that the run directory is readable and writable by you (SQLite keeps "
                         "run.db-wal and run.db-shm beside run.db)") from None
    except sqlite3.DatabaseError as e:
        raise _damaged(path, f"is corrupted ({e})") from None
    if verdict != ["ok"]:
        raise _damaged(path, f"is corrupted (SQLite's check: {'; '.join(verdict[:3])})")
    missing = [t for t in CORE_TABLES if t not in tables]
    if missing:
        raise _damaged(path, f"is not a forge-pack run store (no table {', '.join(missing)})")


class Store:
    """Writer side of a run store. Thread-safe: one connection behind a lock."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / STORE_FILE
        check_header(self.path)  # never turn an emptied or foreign file into a fresh store
        self._lock = threading.RLock()
        self.conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable against process death
        self.conn.executescript(DDL)
        self._add_missing_columns()
        self.conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)",
                          (MetaKey.SCHEMA_VERSION, str(SCHEMA_VERSION)))

    def _add_missing_columns(self) -> None:
        """Columns added after a run store was first written (CREATE TABLE IF NOT EXISTS keeps the old
        table): an older run directory still resumes."""
        for table, name, kind in (("hotspots", "stop_reason", "TEXT"), ("hotspots", "search_s", "REAL"),
                                  ("evaluations", "device", "TEXT")):
            have = {r["name"] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            if name not in have:
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    # ---- generic helpers
    def execute(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self.conn.execute(sql, tuple(args))

    def query(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self.conn.execute(sql, tuple(args)).fetchall()

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- small key/value facts about the run (e.g. the profiled forward time, for resume)
    def set_meta(self, key: str, value: Any) -> None:
        self.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                     (key, str(value)))

    def get_meta(self, key: str) -> str | None:
        rows = self.query("SELECT value FROM meta WHERE key=?", (key,))
        return rows[0]["value"] if rows else None

    # ---- runs
    def start_run(self, model_path: str, model_hash: str, device: str, dtype: str, env: dict,
                  config: dict) -> int:
        now = time.time()
        row = self.query("SELECT id FROM runs ORDER BY id DESC LIMIT 1")
        if row:  # resuming: the run row stays, its status goes back to running
            run_id = row[0]["id"]
            self.execute("UPDATE runs SET status=?, heartbeat_at=?, env_json=?, config_json=? WHERE id=?",
                         (RunStatus.RUNNING, now, _json(env), _json(config), run_id))
        else:
            run_id = self.execute(
                "INSERT INTO runs(created_at, model_path, model_hash, device, dtype, status, heartbeat_at, env_json,"
                " config_json) VALUES (?,?,?,?,?,?,?,?,?)",
                (now, model_path, model_hash, device, dtype, RunStatus.RUNNING, now, _json(env),
                 _json(config))).lastrowid
        self.event(EventKind.RUN_START, payload={"run_id": run_id})
        return int(run_id)

    def latest_run(self) -> sqlite3.Row | None:
        """The run row (a run directory holds one; resume reuses it)."""
        rows = self.query("SELECT * FROM runs ORDER BY id DESC LIMIT 1")
        return rows[0] if rows else None

    def running_run_id(self) -> int | None:
        """The id of the run while its status is running (the heartbeat thread beats only that)."""
        rows = self.query("SELECT id FROM runs WHERE status=? ORDER BY id DESC LIMIT 1", (RunStatus.RUNNING,))
        return int(rows[0]["id"]) if rows else None

    def heartbeat(self, run_id: int) -> None:
        self.execute("UPDATE runs SET heartbeat_at=? WHERE id=?", (time.time(), run_id))

    def finish_run(self, run_id: int, status: str = RunStatus.FINISHED) -> None:
        if status not in RunStatus.ALL:
            raise ValueError(f"unknown run status {status!r}")
        self.execute("UPDATE runs SET status=?, heartbeat_at=? WHERE id=?", (status, time.time(), run_id))
        self.event(EventKind.RUN_END, payload={"status": status})

    # ---- hotspots
    def add_hotspot(self, run_id: int, rank: int, hotspot_json: dict, budget: int) -> str:
        hid = hotspot_json["id"]
        self.execute(
            "INSERT INTO hotspots(id, run_id, rank, op, pretty, hotspot_json, time_share, budget) VALUES"
            " (?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET rank=excluded.rank, budget=excluded.budget",
            (hid, run_id, rank, hotspot_json["op"], hotspot_json["signature"]["pretty"], _json(hotspot_json),
             hotspot_json["time_share"], budget))
        return hid

    def set_hotspot_budget(self, hotspot_id: str, budget: int) -> None:
        """The evaluation budget of the search about to run (a resume may raise it)."""
        self.execute("UPDATE hotspots SET budget=? WHERE id=?", (budget, hotspot_id))

    def set_baseline(self, hotspot_id: str, baseline_json: dict) -> None:
        self.execute("UPDATE hotspots SET baseline_json=? WHERE id=?", (_json(baseline_json), hotspot_id))

    def baseline(self, hotspot_id: str) -> dict | None:
        """The stored Baseline.to_json() of a hotspot; None until it was measured."""
        rows = self.query("SELECT baseline_json FROM hotspots WHERE id=?", (hotspot_id,))
        return json.loads(rows[0]["baseline_json"]) if rows and rows[0]["baseline_json"] else None

    def set_hotspot_status(self, hotspot_id: str, status: str, best_node_id: int | None = None) -> None:
        if status not in HOTSPOT_EVENT:  # pending is the column's default, never set
            raise ValueError(f"a hotspot's status cannot be set to {status!r}")
        self.execute("UPDATE hotspots SET status=?, best_node_id=COALESCE(?, best_node_id) WHERE id=?",
                     (status, best_node_id, hotspot_id))
        self.event(HOTSPOT_EVENT[status], hotspot_id=hotspot_id, payload={"best_node_id": best_node_id})

    def set_hotspot_search(self, hotspot_id: str, search_s: float, stop_reason: str | None = None) -> None:
        """The search time used so far and how the search ended (None while it runs: a process that
        dies leaves the hotspot as interrupted, and --resume gives it only the time it has left)."""
        self.execute("UPDATE hotspots SET search_s=?, stop_reason=? WHERE id=?", (search_s, stop_reason, hotspot_id))

    # ---- nodes and evaluations
    def add_node(self, hotspot_id: str, parent_id: int | None, depth: int, move: str, move_kind: str,
                 candidate_json: dict) -> int:
        node_id = self.execute(
            "INSERT INTO nodes(hotspot_id, parent_id, depth, move, move_kind, family, params_json, origin, cand_hash,"
            " candidate_json, status, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (hotspot_id, parent_id, depth, move, move_kind, candidate_json.get("family"),
             _json(candidate_json.get("params", {})), candidate_json.get("origin"), candidate_json["hash"],
             _json(candidate_json), NodeStatus.PENDING, time.time())).lastrowid
        self.event(EventKind.NODE_ADDED, hotspot_id=hotspot_id, node_id=node_id,
                   payload={"parent_id": parent_id, "move": move, "move_kind": move_kind})
        return int(node_id)

    def mark_evaluating(self, node_id: int, hotspot_id: str) -> None:
        self.execute("UPDATE nodes SET status=? WHERE id=?", (NodeStatus.EVALUATING, node_id))
        self.event(EventKind.EVAL_START, hotspot_id=hotspot_id, node_id=node_id)

    def record_evaluation(self, node_id: int, hotspot_id: str, evaluation_json: dict, reward: float) -> None:
        v = evaluation_json["verdict"]
        t = evaluation_json.get("timing") or {}
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                self.conn.execute(
                    "INSERT OR REPLACE INTO evaluations(node_id, hotspot_id, ok, reason, detail, max_abs_err,"
                    " max_rel_err, median_us, iqr_us, n, speedup_vs_eager, speedup_vs_compile, bandwidth_fraction,"
                    " reward, compile_s, eval_s, evaluation_json, finished_at, device) VALUES"
                    " (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (node_id, hotspot_id, int(v["ok"]), v["reason"], v.get("detail", "")[:20000],
                     finite(v.get("max_abs_err")), finite(v.get("max_rel_err")), t.get("median_us"),
                     t.get("iqr_us"), t.get("n"), finite(evaluation_json.get("speedup_vs_eager")),
                     finite(evaluation_json.get("speedup_vs_compile")),
                     finite(evaluation_json.get("bandwidth_fraction")), reward,
                     evaluation_json.get("compile_s"), evaluation_json.get("eval_s"), _json(evaluation_json),
                     time.time(), (evaluation_json.get("extra") or {}).get("device")))
                self.conn.execute("UPDATE nodes SET status=? WHERE id=?", (NodeStatus.DONE, node_id))
                self.conn.execute(
                    "INSERT INTO events(at, kind, hotspot_id, node_id, payload_json) VALUES (?,?,?,?,?)",
                    (time.time(), EventKind.EVAL_DONE, hotspot_id, node_id,
                     _json({"ok": v["ok"], "reason": v["reason"], "reward": reward,
                            "speedup_vs_eager": evaluation_json.get("speedup_vs_eager"),
                            "median_us": t.get("median_us")})))
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def set_node_stats(self, stats: Iterable[tuple[int, int, float]]) -> None:
        now = time.time()
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(
                "INSERT INTO node_stats(node_id, visits, value_sum, updated_at) VALUES (?,?,?,?)"
                " ON CONFLICT(node_id) DO UPDATE SET visits=excluded.visits, value_sum=excluded.value_sum,"
                " updated_at=excluded.updated_at", [(n, v, s, now) for n, v, s in stats])
            self.conn.execute("COMMIT")

    # ---- events and LLM calls
    def event(self, kind: str, hotspot_id: str | None = None, node_id: int | None = None,
              payload: dict | None = None) -> int:
        if kind not in EventKind.ALL:
            raise ValueError(f"unknown event kind {kind!r}")
        return int(self.execute("INSERT INTO events(at, kind, hotspot_id, node_id, payload_json) VALUES (?,?,?,?,?)",
                                (time.time(), kind, hotspot_id, node_id, _json(payload or {}))).lastrowid)

    def record_llm_call(self, **fields: Any) -> int:
        if fields.get("outcome") not in LLMOutcome.ALL:
            raise ValueError(f"unknown LLM call outcome {fields.get('outcome')!r}")
        fields.setdefault("created_at", time.time())
        cols = ",".join(fields)
        marks = ",".join("?" for _ in fields)
        call_id = int(self.execute(f"INSERT INTO llm_calls({cols}) VALUES ({marks})", fields.values()).lastrowid)
        self.event(EventKind.LLM_CALL, hotspot_id=fields.get("hotspot_id"), node_id=fields.get("node_id"),
                   payload={"id": call_id, "outcome": fields.get("outcome"), "purpose": fields.get("purpose")})
        return call_id

    def llm_spending(self) -> tuple[float, int]:
        """(USD, tokens) all recorded LLM calls cost: a resumed run's budget counts them."""
        row = self.query("SELECT COALESCE(SUM(cost_usd), 0), COALESCE(SUM(prompt_tokens + completion_tokens), 0)"
                         " FROM llm_calls")[0]
        return float(row[0]), int(row[1])

    def llm_moves(self, purposes: Iterable[str]) -> list[sqlite3.Row]:
        """(hotspot_id, node_id, purpose, n): how many calls of each purpose each node's expansion made."""
        purposes = tuple(purposes)
        return self.query("SELECT hotspot_id, node_id, purpose, COUNT(*) AS n FROM llm_calls"
                          f" WHERE purpose IN ({','.join('?' * len(purposes))}) GROUP BY 1, 2, 3", purposes)

    # ---- reads used by resume and reporting
    def nodes(self, hotspot_id: str) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM nodes WHERE hotspot_id=? ORDER BY id", (hotspot_id,))

    def evaluations(self, hotspot_id: str) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM evaluations WHERE hotspot_id=? ORDER BY node_id", (hotspot_id,))

    def hotspots(self) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM hotspots ORDER BY rank")


def open_readonly(run_dir: str | Path) -> sqlite3.Connection:
    """A read-only connection for the dashboard and reports; never creates or writes the file."""
    path = (Path(run_dir) / STORE_FILE).resolve()
    check_header(path, allow_empty=True)  # commands call check_store first; this one may race a new run
    # as_uri() percent-quotes the path: a '#', '?' or '%' in a directory name would end or garble the URI
    conn = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA query_only=1")  # a second lock beside mode=ro: no statement on it may write
    return conn
