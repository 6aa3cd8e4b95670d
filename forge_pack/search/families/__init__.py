"""The kernel families and reference kernels of every target kind, one module per kind.

Each kind module (softmax.py, layer_norm.py, rms_norm.py, group_norm.py, batch_norm.py,
avg_pool.py, attention.py: the kind names of forge_pack/targets/) declares `OPS` (the ops it serves), `CUDA` and
`CPU` (its families, in root-order tie-break order) and `REFERENCES` (its reference kernels).
This registry is how everything else finds them. Pure Python, no torch import.
"""

from __future__ import annotations

from types import ModuleType

from forge_pack.core.candidate import Candidate
from forge_pack.core.signature import Signature
from forge_pack.search.families import attention, avg_pool, batch_norm, group_norm, layer_norm, region, rms_norm, softmax
from forge_pack.search.template_kit import Family

KINDS: dict[str, ModuleType] = {"softmax": softmax, "group_norm": group_norm, "batch_norm": batch_norm,
                                "avg_pool": avg_pool, "layer_norm": layer_norm, "rms_norm": rms_norm,
                                "attention": attention,
                                "region": region}  # region: a fused chain, its code generated per signature
BACKENDS = ("cuda", "cpu")


def kind_of(op: str) -> str | None:
    """The kind whose module serves this op, or None."""
    return next((name for name, mod in KINDS.items() if op in mod.OPS), None)


def families(kind_or_op: str, backend: str) -> tuple[Family, ...]:
    """The families for (kind, backend); an op name is accepted for its kind's families that serve it."""
    if backend not in BACKENDS:
        return ()
    mod = KINDS.get(kind_or_op)
    if mod is not None:
        return getattr(mod, backend.upper())
    kind = kind_of(kind_or_op)
    if kind is None:
        return ()
    return tuple(f for f in getattr(KINDS[kind], backend.upper()) if kind_or_op in f.ops)


def backend_families(backend: str) -> tuple[Family, ...]:
    """Every family of one backend, kind after kind."""
    return tuple(f for kind in KINDS for f in families(kind, backend))


def family(op: str, backend: str, name: str) -> Family:
    """The family `name` serving `op` on `backend`; KeyError when there is none."""
    for f in families(op, backend):
        if f.name == name:
            return f
    raise KeyError(f"no {backend} family {name!r} for op {op!r}")


def is_co_resident(op: str, backend: str, name: str) -> bool:
    """Whether the family's whole grid waits on itself, sized to every SM of the GPU it was searched on
    (a GPU with fewer SMs stalls it until its barrier timeouts)."""
    try:
        return family(op, backend, name).co_resident
    except KeyError:
        return False


def reference_ops() -> tuple[str, ...]:
    """The ops that have a reference kernel."""
    return tuple(r.op for mod in KINDS.values() for r in mod.REFERENCES)


def reference_candidate(sig: Signature, backend: str) -> Candidate | None:
    """The reference kernel for this signature and backend, or None when there is none."""
    kind = kind_of(sig.op)
    if kind is None:
        return None
    ref = next((r for r in KINDS[kind].REFERENCES if r.op == sig.op), None)
    return None if ref is None else ref.candidate(sig, backend)
