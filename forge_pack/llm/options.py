"""``--llm MODEL``, ``--llm-budget-usd``, ``--llm-budget-tokens`` and forge.toml's ``[llm]`` table,
turned into an LLMProposer (or None). Shared by ``search`` and ``build``. No torch import.

Precedence: LLMConfig defaults < forge.toml ``[llm]`` < environment (``FORGE_LLM_BASE_URL``) < flags.
The key comes only from ``FORGE_LLM_API_KEY`` or ``OPENAI_API_KEY``; forge.toml may not hold one.

Wiring: ``cmd_search`` declares the three options with LLM_OPTION, LLM_BUDGET_USD_OPTION and
LLM_BUDGET_TOKENS_OPTION; ``pipeline._default_proposers`` calls ``build_llm_proposer`` with the run
store and appends the proposer (if any) to the template proposer; ``cmd_search.format_summary``
prints ``llm.run_summary_text(run_dir)`` at the end. ``build`` does the same through the pipeline.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Callable

import typer

from forge_pack.core.errors import ForgeError
from forge_pack.llm.client import (OPENAI_BASE_URL, LLMClient, LLMConfig, _import_openai, api_key_from_env, redact,
                            safe_url)
from forge_pack.llm.proposer import LLMProposer

LLM_OPTION = typer.Option(None, "--llm", metavar="MODEL",
                          help="Let an LLM (OpenAI-compatible endpoint: FORGE_LLM_BASE_URL, key in FORGE_LLM_API_KEY "
                               "or OPENAI_API_KEY) propose kernels too. See docs/llm.md.")
LLM_BUDGET_USD_OPTION = typer.Option(None, "--llm-budget-usd", min=0.0,
                                     help="Stop LLM moves (not the search) after this many dollars [default: 5].")
LLM_BUDGET_TOKENS_OPTION = typer.Option(None, "--llm-budget-tokens", min=0,
                                        help="Stop LLM moves (not the search) after this many tokens.")

TOML_KEYS = {f.name for f in dataclasses.fields(LLMConfig)} - {"key_env"}
SECRET_KEYS = ("api_key", "key", "token", "openai_api_key", "secret")


def read_toml_llm(toml: str | Path | dict | None = None) -> dict:
    """forge.toml's [llm] table: from a parsed document, a path, or ./forge.toml if it exists."""
    if isinstance(toml, dict):
        doc = toml
        where = "forge.toml"
    else:
        path = Path(toml) if toml else Path("forge.toml")
        if not path.is_file():
            if toml:
                raise ForgeError(f"config file not found: {path}", "pass the path of a forge.toml")
            return {}
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ImportError:
                raise ForgeError("reading forge.toml needs Python 3.11 or the 'tomli' package", "pip install tomli")
        try:
            doc = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ForgeError(f"{path} is not valid TOML: {e}", "fix the file or remove it")
        where = str(path)
    table = doc.get("llm", {})
    if not isinstance(table, dict):
        raise ForgeError(f"{where}: [llm] must be a table", '[llm]\nmodel = "gpt-4.1-mini"')
    for k in table:
        if k.lower() in SECRET_KEYS:
            raise ForgeError(f"{where} holds an API key under [llm] {k}; keys are read only from the environment",
                             "remove it from the file and set FORGE_LLM_API_KEY (or OPENAI_API_KEY)")
    unknown = set(table) - TOML_KEYS
    if unknown:
        raise ForgeError(f"{where}: unknown keys in [llm]: {', '.join(sorted(unknown))}",
                         f"known keys: {', '.join(sorted(TOML_KEYS))}")
    return dict(table)


def llm_config(model: str | None, budget_usd: float | None = None, budget_tokens: int | None = None,
               toml: str | Path | dict | None = None) -> LLMConfig | None:
    """The effective LLM configuration, or None when no model is asked for (flag or forge.toml)."""
    values = read_toml_llm(toml)
    if model:
        values["model"] = model
    if not values.get("model"):
        return None
    env_url = os.environ.get("FORGE_LLM_BASE_URL", "").strip()
    if env_url:
        values["base_url"] = env_url
    if budget_usd is not None:
        values["budget_usd"] = budget_usd
    if budget_tokens is not None:
        values["budget_tokens"] = budget_tokens
    values["base_url"] = str(values.get("base_url") or OPENAI_BASE_URL).rstrip("/")
    if not values["base_url"].startswith(("http://", "https://")):
        raise ForgeError(f"LLM base URL {safe_url(values['base_url'])!r} is not an http(s) URL",
                         "e.g. FORGE_LLM_BASE_URL=http://localhost:8000/v1 for a vLLM server")
    for k in ("budget_usd", "budget_tokens", "timeout_s", "max_retries", "backoff_s", "max_concurrency", "max_tokens",
              "price_in_usd_per_mtok", "price_out_usd_per_mtok", "repair_attempts", "rewrites_per_node",
              "reply_fix_turns"):
        v = values.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise ForgeError(f"LLM setting {k} must be a number >= 0, got {v!r}", "see docs/llm.md")
    values["key_env"] = api_key_from_env()[1]
    try:
        return LLMConfig(**values)
    except TypeError as e:
        raise ForgeError(f"bad [llm] settings: {e}", "see docs/llm.md")


def build_llm_proposer(model: str | None, budget_usd: float | None = None, budget_tokens: int | None = None, *,
                       toml: str | Path | dict | None = None, store: Any = None,
                       echo: Callable[[str], None] | None = None, client: LLMClient | None = None
                       ) -> LLMProposer | None:
    """An LLMProposer from the flags and forge.toml, or None when no LLM is asked for.

    Raises ForgeError for what the user must fix first (no openai package, no key for OpenAI's own
    endpoint, a bad forge.toml). An endpoint that does not answer or does not serve the model gives
    a proposer that makes no moves and says why, here and in its summary: the search runs on templates.
    """
    config = llm_config(model, budget_usd, budget_tokens, toml)
    if config is None:
        return None
    say = echo or (lambda text: print(text, file=sys.stderr))
    _import_openai()
    key, key_env = api_key_from_env()
    if key is None and config.base_url == OPENAI_BASE_URL:
        raise ForgeError(f"--llm {config.model} talks to OpenAI's API, but no API key is set",
                         "export FORGE_LLM_API_KEY=... (or OPENAI_API_KEY), or point FORGE_LLM_BASE_URL at a local "
                         "vLLM/Ollama server (docs/llm.md)")
    client = client or LLMClient(config, key)
    reason = ""
    if config.budget_usd == 0 or config.budget_tokens == 0:
        reason = "the LLM budget is 0"
    elif config.probe:
        ok, message = client.probe()
        if not ok:
            reason = message
    proposer = LLMProposer(config, client=client, store=store, disabled_reason=reason)
    if reason:
        say(f"warning: LLM moves are off for this run: {redact(reason)}; searching with templates only")
    else:
        price_in, price_out, source = config.price()
        budget = f"${config.budget_usd:.2f}" if config.budget_usd is not None else "no dollar limit"
        if config.budget_tokens is not None:
            budget += f", {config.budget_tokens:,} tokens"
        say(f"LLM {config.model} at {safe_url(config.base_url)} (key from {key_env or 'nowhere: none set'}); "
            f"budget {budget}; price ${price_in:g}/${price_out:g} per M tokens in/out ({source})")
    return proposer
