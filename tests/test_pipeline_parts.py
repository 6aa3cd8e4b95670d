"""The pieces split out of the search pipeline, each on its own: heartbeat, redaction, run plan."""

from __future__ import annotations

import time

from forge_pack.search.heartbeat import HeartbeatThread
from forge_pack.search.redaction import REDACTED, redact
from forge_pack.search.run_plan import resume_state
from forge_pack.search.config import RunConfig
from forge_pack.store.run_store import Store
from forge_pack.store.vocabulary import RunStatus, StopReason


def _beat_of(store: Store) -> float:
    return store.latest_run()["heartbeat_at"]


def test_the_heartbeat_thread_beats_a_running_run_and_stops_once_it_ended(tmp_path):
    with Store(tmp_path) as store:
        run_id = store.start_run("m.py", "h", "cpu", "", {}, {})
        first = _beat_of(store)
        beat = HeartbeatThread(store, every_s=0.01)
        beat.start()
        deadline = time.monotonic() + 5
        while _beat_of(store) == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _beat_of(store) > first
        store.finish_run(run_id, RunStatus.INTERRUPTED)
        assert store.running_run_id() is None
        time.sleep(0.05)  # a beat already past its running check may still land
        ended = _beat_of(store)
        time.sleep(0.1)
        beat.close()
        assert _beat_of(store) == ended  # a finished run keeps the time it ended at


def test_redaction_hides_secret_words_only():
    d = redact({"llm": {"api_key": "sk-1", "model": "m"}, "llm_budget_tokens": 5, "token": "", "password": "p"})
    assert d == {"llm": {"api_key": REDACTED, "model": "m"}, "llm_budget_tokens": 5, "token": "", "password": REDACTED}


def test_a_budget_stop_resumes_only_with_a_larger_budget():
    row = {"search_s": 12.5, "stop_reason": StopReason.BUDGET, "budget": 10}
    assert resume_state(row, RunConfig(model="m", budget=10)) == (False, 12.5)
    assert resume_state(row, RunConfig(model="m", budget=20)) == (True, 0.0)  # a new stint: the time limit counts afresh
    assert resume_state({**row, "stop_reason": None}, RunConfig(model="m", budget=10)) == (True, 12.5)
