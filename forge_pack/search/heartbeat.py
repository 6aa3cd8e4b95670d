"""The run's heartbeat: ``runs.heartbeat_at`` kept fresh while the search process lives. No torch import.

The dashboard shows a running run as stalled once its heartbeat is older than two minutes
(``ui.data.STALE_AFTER_S``), so the beat must come far more often than that, also through long
phases with no evaluation (profiling, a torch.compile baseline).
"""

from __future__ import annotations

import threading

from forge_pack.store.run_store import Store

# Seconds between beats: well inside the dashboard's two minutes, rare enough to cost nothing.
HEARTBEAT_S = 2.0


class HeartbeatThread:
    """Beats the running run's heartbeat every ``every_s`` seconds from a daemon thread."""

    def __init__(self, store: Store, every_s: float = HEARTBEAT_S):
        self.store, self.every_s = store, every_s
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="forge-heartbeat", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            run_id = self.store.running_run_id()
            if run_id is not None:
                self.store.heartbeat(run_id)

    def close(self) -> None:
        self.stop.set()

