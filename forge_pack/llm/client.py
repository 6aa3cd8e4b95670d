"""The LLM client: OpenAI-compatible chat completions with timeouts, retries, a concurrency limit,
a token and cost budget, and redaction of the API key everywhere. No torch import.

The ``openai`` package is imported lazily (the GPU box may not have it). Any server speaking the
chat-completions protocol works: OpenAI, vLLM (``vllm serve``), Ollama (``/v1``), llama.cpp.
Configuration: ``LLMConfig`` defaults, then ``[llm]`` in forge.toml, then the environment
(``FORGE_LLM_BASE_URL``), then CLI flags. The key comes only from ``FORGE_LLM_API_KEY`` or
``OPENAI_API_KEY`` and is never stored in the config, the run store or any message.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from forge_pack.core.errors import ForgeError
from forge_pack.store import run_queries
from forge_pack.store.run_store import STORE_FILE, open_readonly
from forge_pack.store.vocabulary import LLMOutcome

OPENAI_BASE_URL = "https://api.openai.com/v1"

# USD per million tokens (input, output), list prices when this table was written. Longest prefix
# wins, so dated snapshots ("gpt-4o-mini-2024-07-18") find their family. Override per model in
# forge.toml ([llm] price_in_usd_per_mtok / price_out_usd_per_mtok) when prices change.
PRICES_USD_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-5": (1.25, 10.0), "gpt-5-mini": (0.25, 2.0), "gpt-5-nano": (0.05, 0.40),
    "gpt-4.1": (2.0, 8.0), "gpt-4.1-mini": (0.40, 1.60), "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4o": (2.50, 10.0), "gpt-4o-mini": (0.15, 0.60),
    "o1": (15.0, 60.0), "o3": (2.0, 8.0), "o3-mini": (1.10, 4.40), "o4-mini": (1.10, 4.40),
}
# Unknown models (a vLLM or Ollama model name, a new release): priced high on purpose, so that a
# budget set in dollars errs towards stopping early; set the price to 0 for a local server.
DEFAULT_PRICE_USD_PER_MTOK = (15.0, 60.0)

# Outcomes recorded per call in the run store's llm_calls table.
OUTCOMES = LLMOutcome.ALL


@dataclass(frozen=True)
class LLMConfig:
    model: str
    base_url: str = OPENAI_BASE_URL
    budget_usd: float | None = 5.0  # stops LLM moves, never the search
    budget_tokens: int | None = None
    # One request, from sending it to its last byte: a deadline, not a per-read limit (a server
    # trickling bytes cannot stretch it). A kernel reply from a reasoning model can take minutes.
    timeout_s: float = 180.0
    max_retries: int = 3  # on 429 (not insufficient_quota) and 5xx only; a timeout is recorded, not retried
    backoff_s: float = 2.0  # first retry waits this long, then doubles (jittered), capped at 30 s
    max_concurrency: int = 4
    max_tokens: int = 8192  # completion cap; reasoning models spend part of it thinking
    temperature: float | None = None  # None: the server's default (reasoning models accept no other)
    price_in_usd_per_mtok: float | None = None
    price_out_usd_per_mtok: float | None = None
    repair_attempts: int = 3  # longest chain of LLM repairs of repairs from one failed kernel
    rewrites_per_node: int = 2  # LLM rewrites of one working node
    reply_fix_turns: int = 1  # follow-up turns for a reply rejected before compiling (format, rules)
    new_family: bool = True  # the first LLM move on a hotspot writes a kernel from scratch
    probe: bool = True  # check at start that the endpoint answers and serves the model
    key_env: str = field(default="", compare=False)  # which variable held the key ("" = none); never the key

    def price(self) -> tuple[float, float, str]:
        """(input, output) USD per million tokens and where the price came from."""
        if self.price_in_usd_per_mtok is not None or self.price_out_usd_per_mtok is not None:
            return (float(self.price_in_usd_per_mtok or 0.0), float(self.price_out_usd_per_mtok or 0.0), "config")
        name = self.model.lower().split("/")[-1]
        for prefix in sorted(PRICES_USD_PER_MTOK, key=len, reverse=True):
            if name == prefix or name.startswith(prefix + "-"):
                return (*PRICES_USD_PER_MTOK[prefix], "table")
        return (*DEFAULT_PRICE_USD_PER_MTOK, "default")

    def to_json(self) -> dict:
        """The effective config for the run dir: the key itself is never part of it."""
        d = asdict(self)
        d["base_url"] = safe_url(self.base_url)
        d["price_usd_per_mtok"] = list(self.price()[:2])
        d["price_source"] = self.price()[2]
        return d


# ---------------------------------------------------------------- redaction

_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()
_PATTERNS = (
    (re.compile(r"(?i)(bearer\s+)[^\s\"',;]+"), r"\1[REDACTED]"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-*.]{6,}"), "sk-[REDACTED]"),
    (re.compile(r"(?i)((?:api[_-]?key|authorization)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+"), r"\1[REDACTED]"),
    # credentials in a URL: https://user:pass@host/..., ...?api-key=...&token=...
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@\"'<>]+@"), r"\1[REDACTED]@"),
    (re.compile(r"(?i)([?&](?:[a-z0-9_\-]*(?:key|token|secret|password|passwd|pwd|sig|signature|auth|credential)"
                r"[a-z0-9_\-]*)=)[^&#\s\"']+"), r"\1[REDACTED]"),
)


def register_secret(secret: str | None) -> None:
    """Remember a secret so that ``redact`` removes it from any text."""
    if secret and len(secret) >= 4:
        with _SECRETS_LOCK:
            _SECRETS.add(secret)


def redact(text: Any) -> str:
    """The text with every registered secret and anything shaped like a key or auth header removed."""
    s = "" if text is None else str(text)
    with _SECRETS_LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for secret in secrets:
        s = s.replace(secret, "[REDACTED]")
    for pattern, repl in _PATTERNS:
        s = pattern.sub(repl, s)
    return s


def safe_url(url: str) -> str:
    """The URL as it may be printed or stored: no user:password@ and no secret-looking query values
    (some proxies take the key in the URL). The client itself still connects with the full URL."""
    return redact(url)


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = ()
        return True


def _install_log_redaction() -> None:
    # openai and httpx log requests at debug level (OPENAI_LOG=debug); scrub whatever they print.
    for name in ("openai", "httpx", "httpx2", "httpcore"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactFilter) for f in logger.filters):
            logger.addFilter(_RedactFilter())


def api_key_from_env() -> tuple[str | None, str]:
    """(key, the variable it came from); both variables are registered for redaction."""
    found: tuple[str | None, str] = (None, "")
    for var in ("FORGE_LLM_API_KEY", "OPENAI_API_KEY"):
        value = os.environ.get(var, "").strip()
        if value:
            register_secret(value)
            if found[0] is None:
                found = (value, var)
    return found


# ---------------------------------------------------------------- budget


class Budget:
    """Dollars and tokens for LLM calls. A call reserves its worst case before it is sent, so the
    totals never pass the budget even with several calls in flight."""

    def __init__(self, usd: float | None, tokens: int | None, price: tuple[float, float]):
        self.usd, self.tokens = usd, tokens
        self.price_in, self.price_out = price
        self.spent_usd = 0.0
        self.spent_tokens = 0
        self._reserved_usd = 0.0
        self._reserved_tokens = 0
        self._lock = threading.Lock()

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_in + completion_tokens * self.price_out) / 1e6

    def reserve(self, prompt_tokens: int, completion_tokens: int) -> tuple[float, int] | str:
        """A reservation, or why there is no room for this call."""
        usd, tokens = self.cost(prompt_tokens, completion_tokens), prompt_tokens + completion_tokens
        with self._lock:
            if self.usd is not None and self.spent_usd + self._reserved_usd + usd > self.usd:
                return (f"LLM budget of ${self.usd:.2f} reached (spent ${self.spent_usd:.4f}, next call may cost "
                        f"up to ${usd:.4f})")
            if self.tokens is not None and self.spent_tokens + self._reserved_tokens + tokens > self.tokens:
                return (f"LLM token budget of {self.tokens:,} reached (spent {self.spent_tokens:,}, next call may "
                        f"use up to {tokens:,})")
            self._reserved_usd += usd
            self._reserved_tokens += tokens
            return usd, tokens

    def settle(self, reservation: tuple[float, int], prompt_tokens: int, completion_tokens: int) -> float:
        usd = self.cost(prompt_tokens, completion_tokens)
        with self._lock:
            self._reserved_usd -= reservation[0]
            self._reserved_tokens -= reservation[1]
            self.spent_usd += usd
            self.spent_tokens += prompt_tokens + completion_tokens
        return usd


def estimate_tokens(text: str) -> int:
    # ~3 characters per token for code-heavy text errs high (English prose is ~4).
    return len(text) // 3 + 16


# ---------------------------------------------------------------- client


@dataclass(frozen=True)
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str = ""
    usage_estimated: bool = False  # the server sent no usage; tokens estimated from text length


class LLMCallError(Exception):
    """A call that produced no reply. ``outcome`` is one of OUTCOMES; the message is redacted.
    ``permanent``: no later call can succeed either (no quota left, no such model), so LLM moves
    should stop for the run instead of paying for the same error on every move."""

    def __init__(self, outcome: str, message: str, latency_s: float = 0.0, retryable: bool = False,
                 permanent: bool = False):
        self.outcome, self.message, self.latency_s, self.retryable = outcome, redact(message), latency_s, retryable
        self.permanent = permanent
        super().__init__(self.message)


def _import_openai():
    try:
        import openai
    except ImportError:
        raise ForgeError("the LLM proposer needs the 'openai' package, which is not installed",
                         "pip install openai  (or run without --llm: templates need no LLM)")
    return openai


class LLMClient:
    """Chat completions against one endpoint and model; thread-safe."""

    def __init__(self, config: LLMConfig, api_key: str | None = None, sleep=time.sleep):
        self.config = config
        self._api_key = api_key
        register_secret(api_key)
        _install_log_redaction()
        self._client = None
        self._client_lock = threading.Lock()
        self._semaphore = threading.BoundedSemaphore(max(1, config.max_concurrency))
        self._sleep = sleep
        self._url = safe_url(config.base_url)  # for messages: no credentials a URL may carry
        # Official OpenAI wants max_completion_tokens (reasoning models reject max_tokens); other
        # servers know max_tokens. A 400 naming the parameter flips it once.
        self._token_param = "max_completion_tokens" if "api.openai.com" in config.base_url else "max_tokens"

    def _openai(self):
        with self._client_lock:
            if self._client is None:
                openai = _import_openai()
                # The client's own retries are off: we retry ourselves, with accounting and backoff.
                self._client = openai.OpenAI(api_key=self._api_key or "no-key", base_url=self.config.base_url,
                                             timeout=self.config.timeout_s, max_retries=0)
            return self._client

    def chat(self, messages: list[dict], max_tokens: int | None = None) -> ChatResult:
        """One completion, retried on 429/5xx with backoff. Raises LLMCallError."""
        max_tokens = max_tokens or self.config.max_tokens
        attempt = 0
        start = time.monotonic()
        while True:
            try:
                with self._semaphore:
                    return self._once(messages, max_tokens, start)
            except LLMCallError as err:
                err.latency_s = time.monotonic() - start
                if not err.retryable or attempt >= self.config.max_retries:
                    raise
                delay = getattr(err, "retry_after", None)
                if delay is None:
                    delay = self.config.backoff_s * (2 ** attempt) * (0.75 + 0.5 * random.random())
                self._sleep(min(max(delay, 0.0), 30.0))
                attempt += 1

    def _once(self, messages: list[dict], max_tokens: int, start: float) -> ChatResult:
        openai = _import_openai()
        client = self._openai()
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": messages, self._token_param: max_tokens}
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        t0 = time.monotonic()
        try:
            body = self._post(client, kwargs, t0 + self.config.timeout_s)
        except openai.APITimeoutError:
            raise LLMCallError("timeout", f"no reply within {self.config.timeout_s:g} s")
        except openai.APIConnectionError as e:
            raise LLMCallError("connection", f"cannot reach {self._url}: {_cause(e)}")
        except openai.APIStatusError as e:
            raise self._status_error(e)
        except openai.OpenAIError as e:
            raise LLMCallError("error", f"{type(e).__name__}: {e}")
        latency = time.monotonic() - t0
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as e:  # a proxy's error page, a broken server
            raise LLMCallError("unparseable", f"the endpoint's answer is not a chat completion: {e}")
        return _chat_result(data, messages, latency)

    def _post(self, client: Any, kwargs: dict, deadline: float) -> bytes:
        """The response body of one request. httpx's timeout is per read: a server (or proxy)
        trickling keep-alive bytes would hold a plain call forever, so the body is read in chunks
        and a watchdog closes the response at ``deadline`` (one request's ``timeout_s``) however
        the bytes come. The headers themselves come under the per-read timeout."""
        with client.chat.completions.with_streaming_response.create(**kwargs) as resp:
            chunks = []
            late = threading.Event()

            def cut() -> None:
                late.set()
                resp.close()

            watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0), cut)
            watchdog.daemon = True
            watchdog.start()
            try:
                for chunk in resp.iter_bytes():
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        late.set()
                        break
            except Exception as e:  # the transport's own errors: the SDK does not wrap them while streaming
                if not late.is_set():
                    outcome = "timeout" if "timeout" in type(e).__name__.lower() else "connection"
                    raise LLMCallError(outcome, f"the reply from {self._url} broke off: {type(e).__name__}: {e}")
            finally:
                watchdog.cancel()
            if late.is_set():
                raise LLMCallError("timeout", f"no complete reply within {self.config.timeout_s:g} s "
                                              f"(the server kept the connection open with a trickle of bytes)")
        return b"".join(chunks)

    def _status_error(self, e: Any) -> LLMCallError:
        """An HTTP error status as an LLMCallError: retryable (429, 5xx) or permanent (no quota, no model)."""
        status = int(getattr(e, "status_code", 0) or 0)
        text = _status_text(e)
        if status == 400 and self._token_param in text and "unsupported" in text.lower():
            self._token_param = "max_tokens" if self._token_param != "max_tokens" else "max_completion_tokens"
            err = LLMCallError("http_error", f"HTTP 400: {text}", retryable=True)
            err.retry_after = 0.0  # type: ignore[attr-defined]
            return err
        if status in (401, 403):
            return LLMCallError("auth", f"HTTP {status} from {self._url}: {text}")
        if "insufficient_quota" in _error_code(e):  # a 429 that waiting does not fix: the account is out of credit
            return LLMCallError("http_error", f"the account has no quota left (HTTP {status} insufficient_quota): "
                                              f"{text}", permanent=True)
        if status == 404:  # no such model (or no chat endpoint at this URL): every later call gets the same
            what = f"model {self.config.model!r} is not served" if "model" in text.lower() else "no chat endpoint"
            return LLMCallError("http_error", f"{what} at {self._url} (HTTP 404: {text})", permanent=True)
        err = LLMCallError("http_error", f"HTTP {status}: {text}", retryable=status == 429 or status >= 500)
        err.retry_after = _retry_after(e)  # type: ignore[attr-defined]
        return err

    def probe(self, timeout_s: float = 15.0) -> tuple[bool, str]:
        """Does the endpoint answer and serve the model? (ok, one-line explanation)."""
        openai = _import_openai()
        client = self._openai().with_options(timeout=min(timeout_s, self.config.timeout_s), max_retries=0)
        model = self.config.model
        try:
            ids = [m.id for m in client.models.list()]
        except openai.APIConnectionError as e:  # includes timeouts
            return False, f"endpoint {self._url} does not answer: {redact(_cause(e))}"
        except openai.APIStatusError as e:
            status = int(getattr(e, "status_code", 0) or 0)
            if status in (401, 403):
                return False, (f"endpoint {self._url} refused the API key (HTTP {status}); "
                               f"set FORGE_LLM_API_KEY or OPENAI_API_KEY")
            ids = None  # some servers do not list models: ask for one token instead
        except openai.OpenAIError as e:
            return False, f"endpoint {self._url}: {redact(e)}"
        if ids is not None and _model_listed(model, ids):
            return True, f"endpoint {self._url} answers and serves {model}"
        try:
            kwargs = {"model": model, "messages": [{"role": "user", "content": "Say OK."}], self._token_param: 1}
            client.chat.completions.create(**kwargs)
        except openai.APIConnectionError as e:
            return False, f"endpoint {self._url} does not answer: {redact(_cause(e))}"
        except openai.APIStatusError as e:
            status = int(getattr(e, "status_code", 0) or 0)
            listed = f" (it lists: {', '.join(sorted(ids)[:8])})" if ids else ""
            if status == 400 and "max" in _status_text(e).lower():
                return True, f"endpoint {self._url} answers and serves {model}"
            return False, f"model {model!r} is not served by {self._url}: HTTP {status}{listed}"
        except openai.OpenAIError as e:
            return False, f"endpoint {self._url}: {redact(e)}"
        return True, f"endpoint {self._url} answers and serves {model}"


def _model_listed(model: str, ids: list[str]) -> bool:
    # Ollama lists "llama3:latest" and accepts "llama3".
    return model in ids or f"{model}:latest" in ids


def _cause(e: BaseException) -> str:
    inner = e.__cause__ or e.__context__
    return redact(f"{e}" + (f" ({type(inner).__name__}: {inner})" if inner else ""))


def _status_text(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        text = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    else:
        text = str(getattr(e, "message", "") or e)
    return redact(text)[:500]


def _retry_after(e: Any) -> float | None:
    try:
        value = e.response.headers.get("retry-after")
        delay = float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
    return delay if delay is None or math.isfinite(delay) else None  # "nan" would make sleep() raise


def _error_code(e: Any) -> str:
    """The error's code and type (OpenAI: "insufficient_quota"), from the exception or its JSON body."""
    parts = [getattr(e, "code", None), getattr(e, "type", None)]
    body = getattr(e, "body", None)
    err = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(err, dict):
        parts += [err.get("code"), err.get("type")]
    return " ".join(str(p) for p in parts if p)


def _chat_result(data: Any, messages: list[dict], latency: float) -> ChatResult:
    """The reply text and token counts of a chat completion's JSON, whatever shape a server gives it."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        err = data.get("error") if isinstance(data, dict) else None
        detail = f" (error: {err.get('message', err) if isinstance(err, dict) else err})" if err else ""
        raise LLMCallError("unparseable", f"the reply has no choices{detail}")
    msg = choices[0].get("message")
    msg = msg if isinstance(msg, dict) else {}
    text = message_text(msg.get("content"))
    refusal = msg.get("refusal")
    if refusal and not text:
        text = f"[refusal] {message_text(refusal) or refusal}"
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    pt, ct = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    est = pt is None or ct is None  # a missing or non-numeric count is estimated, so the budget still sees it
    if pt is None:
        pt = estimate_tokens("".join(message_text(m.get("content")) for m in messages))
    if ct is None:
        ct = estimate_tokens(text)
    return ChatResult(text, pt, ct, latency, str(choices[0].get("finish_reason") or ""), est)


def message_text(content: Any) -> str:
    """A message's text. Some OpenAI-compatible servers send ``content`` as a list of parts
    ({"type": "text", "text": ...}) rather than a string: the text parts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p if isinstance(p, str) else p.get("text") if isinstance(p, dict) else None for p in content)
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def _count(v: Any) -> int | None:
    """A token count as sent by a server (int, "12", 12.0), or None when it is not a count."""
    try:
        n = float(v)
    except (TypeError, ValueError):
        return None
    return int(n) if math.isfinite(n) and n >= 0 and not isinstance(v, bool) else None


# ---------------------------------------------------------------- accounting


def summary_from_rows(rows: list[dict]) -> dict:
    """Calls, tokens, cost and outcomes from llm_calls rows (or the proposer's in-memory list)."""
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    sent = [r for r in rows if r["outcome"] not in LLMOutcome.NOT_SENT]
    return {
        "calls": len(sent),
        "prompt_tokens": sum(int(r.get("prompt_tokens") or 0) for r in rows),
        "completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in rows),
        "cost_usd": round(sum(float(r.get("cost_usd") or 0.0) for r in rows), 6),
        "latency_s": round(sum(float(r.get("latency_s") or 0.0) for r in rows), 3),
        "outcomes": dict(sorted(outcomes.items())),
        "models": sorted({r.get("model") or "" for r in rows} - {""}),
    }


def summary_from_store(conn) -> dict:
    """The same summary from a run store connection (``Store.conn`` or ``store.open_readonly``), plus
    how the LLM's kernels fared in evaluation."""
    s = summary_from_rows(run_queries.llm_call_rows(conn))
    evaluated, passed, best = run_queries.llm_kernel_results(conn)
    s.update(kernels_evaluated=evaluated, kernels_passed=passed, best_speedup_vs_eager=best)
    return s


def run_summary_text(run_dir) -> str:
    """The LLM accounting of a run directory as printed at the end of ``forge-pack search``
    ("" when the run made no LLM calls and had no LLM configured)."""
    if not (Path(run_dir) / STORE_FILE).is_file():
        return ""
    conn = open_readonly(run_dir)
    try:
        config = run_queries.llm_config(conn)
        if not config and not run_queries.has_llm_calls(conn):
            return ""
        s = summary_from_store(conn)
        disabled = run_queries.llm_disabled_reason(conn)
    finally:
        conn.close()
    if not s["models"] and config.get("model"):
        s["models"] = [config["model"]]
    return format_summary(s, config.get("budget_usd"), disabled)


def format_summary(s: dict, budget_usd: float | None = None, disabled: str = "") -> str:
    """One or two lines for the end of ``forge-pack search``."""
    model = ", ".join(s.get("models") or []) or "llm"
    outcomes = ", ".join(f"{k} {v}" for k, v in s.get("outcomes", {}).items()) or "none"
    tokens = s["prompt_tokens"] + s["completion_tokens"]
    text = (f"LLM {model}: {s['calls']} calls ({outcomes}); {tokens:,} tokens "
            f"({s['prompt_tokens']:,} in, {s['completion_tokens']:,} out); ${s['cost_usd']:.4f}")
    if budget_usd is not None:
        text += f" of ${budget_usd:.2f} budget"
    if "kernels_evaluated" in s:
        text += f"; {s['kernels_passed']}/{s['kernels_evaluated']} LLM kernels passed verification"
        if s.get("best_speedup_vs_eager"):
            text += f", best {s['best_speedup_vs_eager']:.2f}x vs eager"
    if disabled:
        text += f"\nLLM moves stopped: {redact(disabled)}"
    return text
