"""Dtype names: the one table of spellings forge-pack accepts, and the torch dtype of each name.

Canonical names are torch's own (``float32``, ``bfloat16`` ...), as signatures and manifests
store them. Torch-free until ``torch_dtype`` is called.
"""

from __future__ import annotations

from typing import Any

from .lazy_torch import torch

CANONICAL = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool")
ALIASES: dict[str, str] = {
    **{name: name for name in CANONICAL},
    "f32": "float32", "fp32": "float32", "float": "float32",
    "f16": "float16", "fp16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "f64": "float64", "fp64": "float64", "double": "float64",
    "i64": "int64", "long": "int64", "i32": "int32", "int": "int32",
}
# Floating dtypes a model may be cast to (profile --dtype): the ones the kernels are built for.
CASTABLE = ("float32", "bfloat16", "float16")


def canonical(name: str) -> str | None:
    """The canonical name of a spelling (``bf16``, ``torch.half``, ``Float32`` ...), else None."""
    low = name.strip().lower()
    if low.startswith("torch."):
        low = low[len("torch."):]
    return ALIASES.get(low)


def torch_dtype(name: str) -> Any:
    """The torch dtype of a canonical name (KeyError for others)."""
    if name not in CANONICAL:
        raise KeyError(name)
    return getattr(torch, name)


def name_of(dtype: Any) -> str:
    """The canonical name of a torch dtype (torch's own name for those outside the table)."""
    return str(dtype).replace("torch.", "")
