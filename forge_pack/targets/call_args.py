"""Binding one call's arguments: the rules every target's binder follows.

The profiler (what a call is) and the shipped package (whether a call is one it verified) bind
with these same functions, so the two can never decide differently. A binder returns None for
anything it does not recognise exactly; the caller then leaves the call to PyTorch.
"""

from __future__ import annotations

from typing import Any

from .lazy_torch import torch


def bind(names: tuple[str, ...], defaults: dict, args: tuple, kwargs: dict) -> dict | None:
    """Python's binding rules, minus errors: None for extra positionals, an unknown keyword (e.g.
    ``out=``), a duplicate, or a missing required argument (the original then decides)."""
    if len(args) > len(names):
        return None
    bound = dict(defaults)
    for name, value in zip(names, args):
        bound[name] = value
    for key, value in kwargs.items():
        if key not in names or names.index(key) < len(args):
            return None
        bound[key] = value
    for name in names:
        if name not in bound:
            return None
    return bound


def shape_list(s: Any) -> list | None:
    """A normalized_shape-like argument as a list of ints, else None."""
    if isinstance(s, int) and not isinstance(s, bool):
        return [s]
    if isinstance(s, (list, tuple, torch.Size)) and all(isinstance(v, int) and not isinstance(v, bool) for v in s):
        return [int(v) for v in s]
    return None


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def implicit_dim(ndim: int) -> int:
    """PyTorch's implicit-dim rule for softmax (deprecated, still honoured): 0 for 0-, 1- and 3-d
    inputs, else 1."""
    return 0 if ndim in (0, 1, 3) else 1
