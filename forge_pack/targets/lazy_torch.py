"""torch, imported on first use.

The target modules serve two kinds of callers: the search and the LLM prompt read names, size
variables and docs and must not import torch (they run without a GPU stack, and the search's
process stays light); the profiler, the verification and the shipped package run the binders,
references and input generators, which need it. Importing torch at first attribute access lets
one module serve both.
"""

from __future__ import annotations

import importlib
from typing import Any


class OnDemand:
    """A module imported on the first attribute read. Classes, submodules and plain values are kept
    once read; functions are looked up anew every time, so a patched ``torch.softmax`` (a package
    applied after the first read) is never served from a stale copy."""

    def __init__(self, module: str):
        self._module = module

    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(self._module), attr)
        if isinstance(value, type) or not callable(value):
            setattr(self, attr, value)
        return value


torch: Any = OnDemand("torch")
F: Any = OnDemand("torch.nn.functional")


def resolve(owner: str, attr: str) -> Any:
    """The object at ``owner.attr`` now: owner is "torch", "torch.nn", "torch.nn.functional" or
    "torch.Tensor"."""
    if owner == "torch.Tensor":
        return getattr(importlib.import_module("torch").Tensor, attr)
    return getattr(importlib.import_module(owner), attr)
