"""The LLM proposer: rewrite, repair and new-family moves inside the MCTS. No torch import.

For a node the search wants to expand it chooses one move:
- ``new_family``: the first LLM move on a hotspot writes a kernel from scratch, unlike those tried;
- ``repair``: the node failed compilation or verification (one repair per node, chains of repairs
  of repairs bounded by ``repair_attempts``);
- ``rewrite``: the node works; make it faster (at most ``rewrites_per_node`` per node).
Each move is one chat completion. The reply is parsed, checked statically and turned into a
Candidate; the search evaluates it like any other. A reply rejected before compiling (no code
block, a rule broken) gets ``reply_fix_turns`` follow-up turns in the same conversation saying
why. Whatever goes wrong (timeout, HTTP error, garbage, a refusal, a rule broken, the budget
spent) is recorded in the run store's llm_calls with its outcome and the move yields nothing:
the search goes on with the template moves.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any, Callable

from forge_pack.llm import prompts as llm_prompts
from forge_pack.core.candidate import Candidate
from forge_pack.llm.client import (Budget, ChatResult, LLMCallError, LLMClient, LLMConfig, api_key_from_env, estimate_tokens,
                            format_summary, redact, safe_url, summary_from_rows)
from forge_pack.llm.check import ReplyError, parse_reply, static_check
from forge_pack.search.propose import Move, ProposeRequest
from forge_pack.store.vocabulary import EventKind, LLMOutcome, MetaKey, MoveKind

# Consecutive calls that got no reply (no answer at all, or an HTTP error that outlived its retries)
# before LLM moves stop for the run: one slow reply is noise, three in a row is an endpoint that is
# down, overloaded or refusing every request (a 400 for each prompt).
UNREACHABLE_LIMIT = 3
# Verdicts a repair cannot fix: the candidate is fine, the call is out of its scope (or ours).
NOT_REPAIRABLE = ("inapplicable", "internal_error", "ok")


class LLMProposer:
    """An OpenAI-compatible chat model as a proposer. Thread-safe; never raises from ``propose``."""

    name = "llm"

    def __init__(self, config: LLMConfig, client: LLMClient | None = None, store: Any = None,
                 on_call: Callable[[dict], None] | None = None, disabled_reason: str = ""):
        self.config = config
        self.client = client if client is not None else LLMClient(config, api_key_from_env()[0])
        self.store = None
        self.on_call = on_call
        self.budget = Budget(config.budget_usd, config.budget_tokens, config.price()[:2])
        self.disabled_reason = disabled_reason
        self._lock = threading.Lock()
        self._calls: list[dict] = []  # what went to the store, without prompt and reply
        self._repairs: dict[tuple[str, int], int] = {}  # (hotspot, node) -> repair generation given to it
        self._repair_gen: dict[str, int] = {}  # content hash of an LLM repair -> its generation
        self._rewrites: dict[tuple[str, int], int] = {}
        self._new_family: set[str] = set()
        self._failures: dict[tuple[str, int | None], list[str]] = {}
        self._unreachable = 0
        self._noted_disabled = False
        self.bind_store(store)

    def bind_store(self, store: Any) -> None:
        """Attach the run store (the proposer may be built before it): the effective LLM config
        (never the key) goes into its meta table, and why LLM moves are off, if they are."""
        self.store = store
        if store is None:
            return
        if hasattr(store, "set_meta"):
            store.set_meta(MetaKey.LLM_CONFIG, json.dumps(self.config.to_json(), sort_keys=True))
        try:  # a resumed run: earlier runs' spending and moves count against the same bounds
            self.budget.spent_usd, self.budget.spent_tokens = store.llm_spending()
            moves = store.llm_moves(llm_prompts.PURPOSES)
        except (AttributeError, sqlite3.Error):
            moves = []
        with self._lock:
            for r in moves:
                if r["purpose"] == "new_family":
                    self._new_family.add(r["hotspot_id"])
                elif r["node_id"] is not None:
                    counts = self._rewrites if r["purpose"] == "rewrite" else self._repairs
                    counts[(r["hotspot_id"], r["node_id"])] = max(counts.get((r["hotspot_id"], r["node_id"]), 0),
                                                                   int(r["n"]))
        if self.disabled_reason:
            self._note_disabled()

    @property
    def enabled(self) -> bool:
        return not self.disabled_reason

    # ---------------------------------------------------------------- the move

    def propose(self, request: ProposeRequest) -> list[Move]:
        if self.disabled_reason or request.backend not in ("cuda", "cpu"):
            return []
        choice = self._choose(request)
        if choice is None:
            return []
        purpose, attempt = choice
        try:
            return self._move(request, purpose, attempt)
        except Exception as e:  # a bug here must not stop the search: record it and go on with templates
            try:
                self._record(request, purpose, outcome=LLMOutcome.ERROR, error=f"{type(e).__name__}: {e}")
            except Exception:
                pass
            return []

    def _choose(self, request: ProposeRequest) -> tuple[str, int] | None:
        """Which move to make for this node, reserving its slot (calls for one node may overlap).

        The search asks a proposer again for a node only after it gave that node a move, so the
        bounds are: one new-family move per hotspot, ``rewrites_per_node`` rewrites of a working
        node, and one repair per failed node along a chain of at most ``repair_attempts`` repairs.
        """
        hid = request.hotspot.id
        parent = request.parent
        with self._lock:
            if self.config.new_family and hid not in self._new_family:
                if parent is None or parent.evaluation is not None:
                    self._new_family.add(hid)
                    return "new_family", 1
            if parent is None or parent.evaluation is None:
                return None
            key = (hid, parent.node_id)
            verdict = parent.evaluation.verdict
            if verdict.ok:
                n = self._rewrites.get(key, 0)
                if n >= self.config.rewrites_per_node:
                    return None
                self._rewrites[key] = n + 1
                return "rewrite", n + 1
            if verdict.reason in NOT_REPAIRABLE or key in self._repairs:
                return None
            generation = self._repair_gen.get(parent.candidate.content_hash, 0) + 1
            if generation > self.config.repair_attempts:
                return None
            self._repairs[key] = generation
            return "repair", generation

    def _move(self, request: ProposeRequest, purpose: str, attempt: int) -> list[Move]:
        parent = request.parent
        fkey = (request.hotspot.id, parent.node_id if parent else None)
        messages = llm_prompts.render(purpose, request, tuple(self._failures.get(fkey, ())))
        for turn in range(1 + max(0, self.config.reply_fix_turns)):
            call_purpose = purpose if turn == 0 else "fix_reply"
            got = self._call(request, call_purpose, messages)
            if got is None:
                return []
            result, base = got
            try:
                moves, problem = self._take(request, purpose, call_purpose, attempt, result, base)
            except Exception as e:  # the call was made and paid for: its row keeps tokens, cost, prompt and reply
                self._record(request, call_purpose, outcome=LLMOutcome.ERROR, error=f"{type(e).__name__}: {e}",
                             **base)
                return []
            if not problem:
                return moves
            messages = llm_prompts.fix_reply(messages, result.text, problem, request.backend)
        return []

    def _take(self, request: ProposeRequest, purpose: str, call_purpose: str, attempt: int, result: ChatResult,
              base: dict) -> tuple[list[Move], str]:
        """The reply as a move, or ([], why) when a follow-up turn may fix it, or ([], "") when not.
        Records the call (once, last, so that a failure before it is recorded by the caller)."""
        parent = request.parent
        fkey = (request.hotspot.id, parent.node_id if parent else None)
        try:
            parsed = parse_reply(result.text, request.backend)
            problems = static_check(parsed.source, parsed.spec, request.hotspot.signature, request.backend)
            if problems:
                raise ReplyError(LLMOutcome.STATIC_CHECK, "; ".join(problems))
        except ReplyError as e:
            message = e.message
            if result.finish_reason == "length" and e.outcome == LLMOutcome.UNPARSEABLE:
                message += f" (the reply hit the {self.config.max_tokens}-token limit)"
            self._remember(fkey, f"{purpose} #{attempt} rejected before compiling ({e.outcome}): {message[:300]}")
            self._record(request, call_purpose, outcome=e.outcome, error=message, **base)
            fixable = e.outcome in (LLMOutcome.UNPARSEABLE, LLMOutcome.STATIC_CHECK) and result.text.strip()
            return [], message if fixable else ""
        params = {"move": purpose}  # the model is in llm_calls; labels stay short in tables
        cand = Candidate(op=request.hotspot.op, backend=request.backend, source=parsed.source, spec=parsed.spec,
                         family="llm", params=params, origin="repair" if purpose == "repair" else "llm")
        if cand.content_hash in request.tried_hashes:
            self._remember(fkey, f"{purpose} #{attempt} repeated a kernel already tried")
            self._record(request, call_purpose, outcome=LLMOutcome.DUPLICATE, cand_hash=cand.content_hash,
                         error="the reply repeats a kernel already in the tree", **base)
            return [], ""
        if purpose == "repair":
            with self._lock:
                self._repair_gen[cand.content_hash] = attempt
        label = {"rewrite": f"llm rewrite #{attempt}", "repair": f"llm repair #{attempt}",
                 "new_family": "llm new family"}[purpose]
        self._record(request, call_purpose, outcome=LLMOutcome.OK, cand_hash=cand.content_hash, **base)
        return [Move(cand, label, MoveKind.REPAIR if purpose == "repair" else MoveKind.LLM)], ""

    def _call(self, request: ProposeRequest, purpose: str, messages: list[dict]) -> tuple[ChatResult, dict] | None:
        """One chat completion within the budget; None (recorded) when it gave no reply."""
        prompt = llm_prompts.prompt_text(messages)
        reservation = self.budget.reserve(estimate_tokens(prompt), self.config.max_tokens)
        if isinstance(reservation, str):
            self._disable(reservation, request, purpose, outcome=LLMOutcome.BUDGET)
            return None
        used = (0, 0)
        try:
            result = self.client.chat(messages, self.config.max_tokens)
            used = (result.prompt_tokens, result.completion_tokens)
        except LLMCallError as err:
            self._record(request, purpose, prompt=prompt, latency_s=err.latency_s, outcome=err.outcome,
                         error=err.message)
            self._after_failure(err, request, purpose)
            return None
        finally:  # whatever the client raised, the reservation goes back: a leak would shrink the budget for good
            cost = self.budget.settle(reservation, *used)
        with self._lock:
            self._unreachable = 0
        return result, dict(prompt=prompt, reply=result.text, prompt_tokens=result.prompt_tokens,
                            completion_tokens=result.completion_tokens, latency_s=result.latency_s, cost_usd=cost)

    # ---------------------------------------------------------------- bookkeeping

    def _after_failure(self, err: LLMCallError, request: ProposeRequest, purpose: str) -> None:
        if err.outcome == LLMOutcome.AUTH:
            self._disable(f"the endpoint refused the API key: {err.message}", request, purpose)
            return
        if err.permanent:  # no quota left, no such model: every later move would pay for the same error
            self._disable(err.message, request, purpose)
            return
        # no answer at all, or an HTTP error that outlived its retries
        if err.outcome in (LLMOutcome.CONNECTION, LLMOutcome.TIMEOUT, LLMOutcome.HTTP_ERROR):
            with self._lock:
                self._unreachable += 1
                down = self._unreachable >= UNREACHABLE_LIMIT
            if down:
                self._disable(f"{UNREACHABLE_LIMIT} calls in a row got no answer from {safe_url(self.config.base_url)} "
                              f"(last: {err.message})", request, purpose)

    def _disable(self, reason: str, request: ProposeRequest, purpose: str, outcome: str = "") -> None:
        with self._lock:
            if self.disabled_reason:
                return
            self.disabled_reason = redact(reason)
        if outcome:
            self._record(request, purpose, outcome=outcome, error=reason)
        self._note_disabled()

    def _note_disabled(self) -> None:
        if self.store is not None and not self._noted_disabled:
            self._noted_disabled = True
            self.store.event(EventKind.NOTE, payload={"llm": "disabled", "reason": self.disabled_reason})

    def _remember(self, key: tuple[str, int | None], text: str) -> None:
        with self._lock:
            self._failures.setdefault(key, []).append(text)

    def _record(self, request: ProposeRequest, purpose: str, **fields: Any) -> None:
        row = {"hotspot_id": request.hotspot.id, "node_id": request.parent.node_id if request.parent else None,
               "model": self.config.model, "purpose": purpose, "prompt": "", "reply": "", "prompt_tokens": 0,
               "completion_tokens": 0, "latency_s": 0.0, "cost_usd": 0.0, "error": "", "created_at": time.time()}
        row.update(fields)
        for k in ("prompt", "reply", "error"):  # the key must never reach the store, even echoed by a server
            row[k] = redact(row[k])
        with self._lock:
            self._calls.append({k: v for k, v in row.items() if k not in ("prompt", "reply")})
        if self.store is not None:
            try:
                self.store.record_llm_call(**row)
            except sqlite3.OperationalError:  # a run store from before llm_calls had cand_hash
                row.pop("cand_hash", None)
                self.store.record_llm_call(**row)
        if self.on_call is not None:
            self.on_call({k: v for k, v in row.items() if k not in ("prompt", "reply")})

    # ---------------------------------------------------------------- accounting

    def summary(self) -> dict:
        """Calls, tokens, cost and outcomes of this process's LLM calls, and why moves stopped."""
        with self._lock:
            rows = list(self._calls)
        s = summary_from_rows(rows)
        s.update(model=self.config.model, base_url=safe_url(self.config.base_url), budget_usd=self.config.budget_usd,
                 budget_tokens=self.config.budget_tokens, disabled=self.disabled_reason)
        return s

    def format_summary(self) -> str:
        s = self.summary()
        if not s["models"]:
            s["models"] = [self.config.model]
        return format_summary(s, self.config.budget_usd, self.disabled_reason)
