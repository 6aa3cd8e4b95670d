"""The kernel ABI of each target kind: tensor argument names, size variables, scalars, byte counts.

A torch-free view of ``forge_pack.targets.registry`` over ``Signature``s, for the launcher, the
template proposer, the LLM prompt, the package generator and the search. A candidate's launch
spec may name, as arguments and in expressions, exactly what ``env(sig)`` and
``tensor_names(sig)`` return for its signature.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge_pack.core.signature import ELEMENT_BYTES, Signature
from forge_pack.targets import registry

TARGET_OPS = registry.NAMES
# dtypes the kernels are written for (the main input's)
KERNEL_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class OpABI:
    op: str
    tensor_inputs: tuple[str, ...]  # in order; optional ones may be absent (None) in a signature
    scalars: tuple[str, ...]  # float scalars passed as f32 by default
    doc: str  # one paragraph for docs and LLM prompts


ABIS: dict[str, OpABI] = {s.name: OpABI(s.name, s.tensors, s.scalars, s.doc) for s in registry.SPECS.values()}


def abi(op: str) -> OpABI:
    return ABIS[op]


def tensor_inputs(sig: Signature) -> tuple[str, ...]:
    """The ABI tensor names of this signature's kind (a region's: in0..inK)."""
    return ABIS[sig.op].tensor_inputs if sig.op in ABIS else registry.spec_for(sig).tensors


def supports(sig: Signature) -> str | None:
    """None if forge-pack's kernels can target this exact signature, else why not."""
    spec = registry.spec_for(sig)
    if getattr(spec, "region", False):  # a region's inputs may be masks or indices: its spec decides
        return spec.supports(sig)
    x = sig.x
    if x.dtype not in KERNEL_DTYPES:
        return f"dtype {x.dtype} is not targeted"
    if x.numel == 0:
        return "empty tensor"
    return registry.get(sig.op).supports(sig)


def env(sig: Signature) -> dict[str, int]:
    """Integer size variables usable in launch expressions and as kernel arguments."""
    e: dict[str, int] = {"numel": sig.output.numel if sig.op == "region" and sig.output else sig.x.numel}
    e.update(registry.spec_for(sig).size_vars(sig))
    for name, spec in sig.inputs:
        e[f"has_{name}"] = int(spec is not None)
    return e


def scalars(sig: Signature) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in registry.spec_for(sig).scalars:
        value = sig.param(name)
        out[name] = float(value if value is not None else 0.0)
    return out


def tensor_names(sig: Signature) -> list[str]:
    """Tensor argument names a launch may use: present inputs, then `out`."""
    return [n for n, s in sig.inputs if s is not None] + ["out"]


def bytes_moved(sig: Signature) -> int:
    """The fewest bytes the op must move: every input read once, the output written once."""
    total = sum(s.nbytes for _, s in sig.inputs if s is not None)
    if sig.output is not None:
        total += sig.output.nbytes
    return total


def floor_us(sig: Signature, copy_bandwidth_gbs: float) -> float:
    """Bandwidth floor in microseconds at the measured copy bandwidth (GB/s = bytes/ns)."""
    return bytes_moved(sig) / (copy_bandwidth_gbs * 1e3)


def element_bytes(dtype: str) -> int:
    return ELEMENT_BYTES[dtype]
