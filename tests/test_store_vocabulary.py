"""One vocabulary for the run store's status and kind columns: what the code writes, compares and
filters on are the same words, and the store refuses any other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from forge_pack.core.verdict import REASONS
from forge_pack.llm.client import summary_from_store
from forge_pack.store import dashboard_queries
from forge_pack.store.run_store import Store, open_readonly
from forge_pack.store.vocabulary import HOTSPOT_EVENT, EventKind, HotspotStatus, LLMOutcome, NodeStatus
from forge_pack.ui import data as ui_data

PACKAGE = Path(__file__).resolve().parent.parent / "forge_pack"
# Exceptions whose first argument is the outcome a failed call is recorded with.
OUTCOME_ERRORS = {"LLMCallError", "ReplyError"}


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def outcome_words(source: str) -> set[str]:
    """Every string the code compares an LLM call's outcome with, stores as one, or raises one with."""
    words: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and "outcome" in ast.unparse(node.left):
            for c in node.comparators:
                words |= _strings(c)
        elif isinstance(node, ast.keyword) and node.arg == "outcome":
            words |= _strings(node.value)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", getattr(t, "attr", None)) == "outcome"
                                                  for t in node.targets):
            words |= _strings(node.value)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in OUTCOME_ERRORS and node.args:
            words |= _strings(node.args[0])
    return words


def test_every_llm_outcome_the_code_names_is_one_the_store_records():
    named = {str(p.relative_to(PACKAGE)): outcome_words(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    known = set(LLMOutcome.ALL)
    unknown = {path: sorted(words - known) for path, words in named.items() if words - known}
    assert unknown == {}
    assert {"timeout", "connection", "unparseable", "refused"} <= set().union(*named.values())  # the scan sees them


def test_the_outcome_scan_catches_a_filter_on_a_word_nobody_writes():
    old = 'sent = [r for r in rows if r["outcome"] not in ("budget", "duplicate_skip")]\n'
    assert outcome_words(old) - set(LLMOutcome.ALL) == {"duplicate_skip"}


def _llm_rows(store: Store) -> None:
    base = dict(hotspot_id="h", node_id=None, model="m", purpose="rewrite", prompt="p", reply="r",
                latency_s=1.0, error="")
    store.record_llm_call(**base, outcome=LLMOutcome.OK, prompt_tokens=100, completion_tokens=50, cost_usd=0.01)
    store.record_llm_call(**base, outcome=LLMOutcome.DUPLICATE, prompt_tokens=100, completion_tokens=50,
                          cost_usd=0.01)
    store.record_llm_call(**base, outcome=LLMOutcome.TIMEOUT, prompt_tokens=0, completion_tokens=0, cost_usd=0.0)
    store.record_llm_call(**base, outcome=LLMOutcome.BUDGET, prompt_tokens=0, completion_tokens=0, cost_usd=0.0)


def test_the_dashboard_and_the_search_summary_count_llm_calls_alike(tmp_path):
    """A budget row records a request never sent: neither a call nor a failed one, on both readers.
    A duplicate was sent and paid for: a call, and not an ok one."""
    with Store(tmp_path) as store:
        _llm_rows(store)
    conn = open_readonly(tmp_path)
    try:
        dashboard = ui_data.summary(conn)["llm"]
        search = summary_from_store(conn)
    finally:
        conn.close()
    assert dashboard == {"calls": 3, "prompt_tokens": 200, "completion_tokens": 100, "cost_usd": 0.02,
                         "failed": 2}
    assert search["calls"] == dashboard["calls"] == 3
    assert search["outcomes"] == {"budget": 1, "duplicate": 1, "ok": 1, "timeout": 1}


def test_the_store_refuses_words_outside_its_vocabulary(tmp_path):
    with Store(tmp_path) as store:
        with pytest.raises(ValueError, match="unknown LLM call outcome 'duplicate_skip'"):
            store.record_llm_call(hotspot_id="h", outcome="duplicate_skip")
        with pytest.raises(ValueError, match="unknown event kind 'heartbeat'"):
            store.event("heartbeat")
        with pytest.raises(ValueError, match="unknown run status 'done'"):
            store.finish_run(1, "done")
        with pytest.raises(ValueError, match="cannot be set to 'pending'"):
            store.set_hotspot_status("h", HotspotStatus.PENDING)


def test_each_hotspot_status_change_writes_an_event_of_the_vocabulary():
    assert set(HOTSPOT_EVENT) == set(HotspotStatus.ALL) - {HotspotStatus.PENDING}
    assert set(HOTSPOT_EVENT.values()) <= set(EventKind.ALL)


def test_the_dashboards_candidate_filters_do_not_shadow_a_verdict_reason():
    """'failed' and the node statuses share the verdict filter with the reasons: none may be a reason."""
    pseudo = {dashboard_queries.VERDICT_FAILED, NodeStatus.PENDING, NodeStatus.EVALUATING}
    assert pseudo & set(REASONS) == set()
    assert dashboard_queries.VERDICT_OK in REASONS
