"""The one tolerance table and the one comparison helper, as the build uses them.

The table, the comparison and the eager allowance live in ``forge_pack.verdict_rules`` (torch
only, so every emitted package ships the very same file for its ``verify`` command); this module
re-exports them and turns a comparison into the verdict's ``Check`` record.

A candidate's element passes when ``|out - ref| <= atol + rtol * |ref|`` against a float64
reference, and NaN / +-Inf appear exactly where the reference has them (same sign for Inf).
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from forge_pack import verdict_rules
from forge_pack.verdict import Check
from forge_pack.verdict_rules import (EAGER_SLACK, OP_TABLE, TABLE, Tolerance, dtype_name, eager_allowance,
                                      max_abs_error, tolerance)

__all__ = ["EAGER_SLACK", "OP_TABLE", "TABLE", "Tolerance", "as_check", "compare", "dtype_name", "eager_allowance",
           "max_abs_error", "tolerance"]


def as_check(c: verdict_rules.Comparison) -> Check:
    return Check(**asdict(c))


def compare(out: torch.Tensor, ref64: torch.Tensor, dtype: str | None = None, op: str | None = None, *,
            atol: float | None = None, rtol: float | None = None, atol_floor: "float | torch.Tensor" = 0.0,
            input_kind: str = "") -> Check:
    """``verdict_rules.compare`` (every element against the float64 reference), as a ``Check``."""
    return as_check(verdict_rules.compare(out, ref64, dtype, op, atol=atol, rtol=rtol, atol_floor=atol_floor,
                                          input_kind=input_kind))
