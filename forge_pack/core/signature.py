"""Call signatures: what exactly a target op was called with. Pure Python, no torch import.

A signature names the op, every tensor argument (dtype, shape, strides) in the op's ABI order
(see ``forge_pack.targets.ops``), the non-tensor arguments, and the output. Its ``key`` is stable across
processes and machines, so it can name run-store rows, fixtures and manifest entries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Short dtype names used in pretty signatures, e.g. bf16[1,8,2048,2048].
SHORT_DTYPE = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float64": "f64",
    "int64": "i64",
    "int32": "i32",
    "bool": "bool",
}
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "bool": 1}


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ELEMENT_BYTES[self.dtype]

    @property
    def is_contiguous(self) -> bool:
        return _same_layout(self.shape, self.strides, contiguous_strides(self.shape))

    @property
    def is_channels_last(self) -> bool:
        return len(self.shape) == 4 and _same_layout(self.shape, self.strides, channels_last_strides(self.shape))

    @property
    def layout(self) -> str:
        if self.is_contiguous:
            return "contiguous"
        if self.is_channels_last:
            return "channels_last"
        return "strided"

    def pretty(self) -> str:
        dims = ",".join(str(s) for s in self.shape)
        text = f"{SHORT_DTYPE.get(self.dtype, self.dtype)}[{dims}]"
        if self.layout == "channels_last" and not self.is_contiguous:
            text += "{channels_last}"
        elif self.layout == "strided":
            text += "{strides=" + ",".join(str(s) for s in self.strides) + "}"
        return text

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "strides": list(self.strides)}

    @staticmethod
    def from_json(d: dict) -> "TensorSpec":
        return TensorSpec(d["dtype"], tuple(int(s) for s in d["shape"]), tuple(int(s) for s in d["strides"]))


def _same_layout(shape, strides, expected) -> bool:
    # Strides of size-1 dims do not matter: torch itself ignores them for contiguity.
    return all(size == 1 or s == e for size, s, e in zip(shape, strides, expected))


@dataclass(frozen=True)
class Signature:
    op: str
    inputs: tuple[tuple[str, TensorSpec | None], ...]  # (ABI name, spec) in the op's ABI order
    params: tuple[tuple[str, Any], ...] = ()  # non-tensor arguments, sorted by name, JSON values
    output: TensorSpec | None = field(default=None, compare=False)

    def input(self, name: str) -> TensorSpec | None:
        for n, spec in self.inputs:
            if n == name:
                return spec
        raise KeyError(name)

    @property
    def x(self) -> TensorSpec:
        spec = self.inputs[0][1]
        assert spec is not None
        return spec

    def param(self, name: str, default: Any = None) -> Any:
        for n, v in self.params:
            if n == name:
                return v
        return default

    def key(self) -> str:
        """Stable text identity (op, inputs, params); the output follows from these."""
        body = {
            "op": self.op,
            "inputs": [[n, s.to_json() if s else None] for n, s in self.inputs],
            "params": [[n, v] for n, v in self.params],
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    def slug(self) -> str:
        """A short file-name-safe id: op plus a hash of the key (a region: its name, which is
        its pattern plus a hash of its canonical form)."""
        import hashlib

        if self.op == "region" and self.param("name"):
            return str(self.param("name"))
        return f"{self.op}_{hashlib.sha256(self.key().encode()).hexdigest()[:10]}"

    def pretty(self) -> str:
        parts = []
        for n, s in self.inputs:
            if s is not None:
                parts.append(f"{n}: {s.pretty()}")
        region = self.op == "region"  # its parameters are its form: the name stands for them
        for n, v in self.params:
            if not region:
                parts.append(f"{n}={v}")
        text = f"{self.param('name') if region else self.op}({', '.join(parts)})"
        if self.output is not None and self.output.dtype != self.x.dtype:
            text += f" -> {SHORT_DTYPE.get(self.output.dtype, self.output.dtype)}"
        return text

    def to_json(self) -> dict:
        return {
            "op": self.op,
            "inputs": [[n, s.to_json() if s else None] for n, s in self.inputs],
            "params": [[n, v] for n, v in self.params],
            "output": self.output.to_json() if self.output else None,
            "pretty": self.pretty(),
            "key": self.key(),
        }

    @staticmethod
    def from_json(d: dict) -> "Signature":
        return Signature(
            op=d["op"],
            inputs=tuple((n, TensorSpec.from_json(s) if s else None) for n, s in d["inputs"]),
            params=tuple((n, v) for n, v in d["params"]),
            output=TensorSpec.from_json(d["output"]) if d.get("output") else None,
        )
