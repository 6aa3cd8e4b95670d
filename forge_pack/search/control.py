"""Pause, resume and stop a running search from outside it (the dashboard's --allow-control).

The dashboard never writes the run store (it holds a read-only connection). It writes
``RUN_DIR/control.json`` = ``{"action": "pause"|"resume"|"stop", "at": <unix time>, "by": "ui"}``
atomically (temporary file + rename). The search reads it between evaluations with
``read_control``: ``pause`` -> finish the evaluations in flight, then wait (keep heartbeating)
until the action changes; ``resume`` -> carry on; ``stop`` -> end the run as ``interrupted`` so
``--resume`` can continue it. A file older than the search's start is stale and ignored.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ACTIONS = ("pause", "resume", "stop")
CONTROL_FILE = "control.json"


def write_control(run_dir: str | Path, action: str, by: str = "ui") -> dict:
    if action not in ACTIONS:
        raise ValueError(f"unknown control action {action!r}")
    doc = {"action": action, "at": time.time(), "by": by}
    path = Path(run_dir) / CONTROL_FILE
    tmp = path.with_name(f".{CONTROL_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return doc


def read_control(run_dir: str | Path, since: float | None = None) -> dict | None:
    """The latest control request, or None (no file, unreadable, unknown action, or older than `since`)."""
    try:
        doc = json.loads((Path(run_dir) / CONTROL_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("action") not in ACTIONS:
        return None
    if since is not None and not (isinstance(doc.get("at"), (int, float)) and doc["at"] >= since):
        return None
    return doc
