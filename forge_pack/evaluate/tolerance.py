"""The tolerance tables and the comparison helper, as the build uses them (by op name).

The generic table, the comparison and the eager allowance live in
``forge_pack.evaluate.verdict_rules`` (torch only, so every emitted package ships the very same file
for its ``verify`` command); each target kind's own rows live in its module
(``forge_pack.targets.<kind>``). This module looks kinds up by name, re-exports the rules, and
turns a comparison into the verdict's ``Check`` record.

A candidate's element passes when ``|out - ref| <= atol + rtol * |ref|`` against a float64
reference, and NaN / +-Inf appear exactly where the reference has them (same sign for Inf).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from forge_pack.core.verdict import Check
from forge_pack.evaluate import verdict_rules
from forge_pack.evaluate.verdict_rules import EAGER_SLACK, TABLE, Tolerance, dtype_name, eager_allowance, max_abs_error
from forge_pack.targets import registry

__all__ = ["EAGER_SLACK", "OP_TABLE", "TABLE", "Tolerance", "as_check", "compare", "dtype_name", "eager_allowance",
           "magnitude", "max_abs_error", "spec_for", "surely_within", "tolerance"]

# (op, output dtype) -> the kind's own row: every override of the generic TABLE, for reports.
OP_TABLE: dict[tuple[str, str], Tolerance] = {
    (s.name, dtype): Tolerance(row.atol, row.rtol, row.reason)
    for s in registry.SPECS.values() for dtype, row in s.tolerances.items()}


def spec_for(op: Any) -> Any:
    """The kind's spec for the rules (None: the generic rules only); ``op`` is a kind name or a
    ``Signature`` (a region's spec is built from its signature)."""
    return registry.spec_for(op) if op is not None else None


def tolerance(op: str | None, dtype: str) -> Tolerance:
    return verdict_rules.tolerance(spec_for(op), dtype)


def magnitude(op: str | None, inputs: dict) -> torch.Tensor | None:
    """``verdict_rules.magnitude`` for the kind named ``op``."""
    return verdict_rules.magnitude(spec_for(op), inputs)


def as_check(c: verdict_rules.Comparison) -> Check:
    return Check(**asdict(c))


def compare(out: torch.Tensor, ref64: torch.Tensor, dtype: str | None = None, op: str | None = None, *,
            atol: float | None = None, rtol: float | None = None, atol_floor: "float | torch.Tensor" = 0.0,
            input_kind: str = "", magnitude: torch.Tensor | None = None) -> Check:
    """``verdict_rules.compare`` (every element against the float64 reference), as a ``Check``."""
    return as_check(verdict_rules.compare(out, ref64, dtype, spec_for(op), atol=atol, rtol=rtol,
                                          atol_floor=atol_floor, input_kind=input_kind, magnitude=magnitude))


def surely_within(out: torch.Tensor, ref64: torch.Tensor, dtype: str | None = None, op: str | None = None) -> bool:
    """A quick sufficient test for ``compare(...).passed`` (every timed call is checked, so this
    runs per call): True only when every element is finite and within 0.9x the table tolerance,
    measured in float32 (half the memory traffic of float64). The 10% margin covers rounding the
    reference to float32 (2^-24 relative, far below every rtol here). False means "run compare"."""
    tol = tolerance(op, dtype or dtype_name(out.dtype))
    if tol.rtol < 1e-6 or tuple(out.shape) != tuple(ref64.shape):
        return False  # float64 outputs: float32 arithmetic cannot vouch for them
    o = out.reshape(-1)
    r = ref64.reshape(-1)
    ok = None  # every chunk's verdict folded on the device and read once: a read per chunk idled the GPU
    for start in range(0, o.numel(), verdict_rules._CHUNK):
        oc = o[start:start + verdict_rules._CHUNK].float()
        rc = r[start:start + verdict_rules._CHUNK].float()
        good = torch.isfinite(oc).all() & torch.isfinite(rc).all() & (
            (oc - rc).abs_() <= rc.abs().mul_(0.9 * tol.rtol).add_(0.9 * tol.atol)).all()
        ok = good if ok is None else ok & good
        del oc, rc
    return ok is None or bool(ok)
