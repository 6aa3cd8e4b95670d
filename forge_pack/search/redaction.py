"""Secrets out of a configuration before it is written anywhere (config.json, the run store). No torch import."""

from __future__ import annotations

from typing import Any

REDACTED = "<redacted>"
# Whole words of a key that mark its value as a secret ("api_key", "token"; not "llm_budget_tokens").
SECRET_WORDS = ("key", "token", "secret", "password")


def redact(obj: Any) -> Any:
    """``obj`` with the non-empty value of every secret-named key replaced, recursively."""
    if isinstance(obj, dict):
        # whole words of the key only: "api_key" and "token" are secrets, "llm_budget_tokens" is not
        return {k: (REDACTED if any(w in str(k).lower().split("_") for w in SECRET_WORDS) and v else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj
