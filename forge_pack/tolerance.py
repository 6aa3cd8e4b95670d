"""The one tolerance table and the one comparison helper.

Shared by the evaluator's verification, the tests and the emitted package's ``verify`` command,
so it imports nothing beyond torch and the verdict types. Tolerances are keyed by the OUTPUT
dtype (what the kernel rounds to), with per-op overrides where an op's output range makes the
generic entry too loose or too strict. Every entry carries its one-line reason.

A candidate's element passes when ``|out - ref| <= atol + rtol * |ref|`` against a float64
reference, and NaN / +-Inf appear exactly where the reference has them (same sign for Inf).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge_pack.verdict import Check


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    reason: str


# By output dtype. rtol covers rounding to the output dtype plus fp32 math in a different order
# than the reference; atol only covers values so close to zero that relative error is meaningless.
TABLE: dict[str, Tolerance] = {
    "float32": Tolerance(1e-5, 1e-4, "fp32 math reduced in another order than float64: ~1e-7 per op, "
                                     "growing ~sqrt(n) over long rows/groups"),
    "float16": Tolerance(1e-4, 2e-3, "two fp16 ulps (2^-10): an fp32 result rounded once may land one step "
                                     "away; atol covers fp16 subnormal spacing near zero"),
    "bfloat16": Tolerance(1e-3, 1.6e-2, "two bf16 ulps (2^-7 relative): an fp32 result rounded once may land "
                                        "one step away"),
    "float64": Tolerance(1e-10, 1e-9, "float64 outputs are compared to float64 math: only order of "
                                      "summation differs"),
}

# (op, output dtype) overrides.
OP_TABLE: dict[tuple[str, str], Tolerance] = {
    # softmax outputs are probabilities in [0, 1] that are often ~1/cols (tiny for long rows): a
    # generic atol would let an all-zero output pass, so atol only forgives values below 1e-8.
    ("softmax", "float32"): Tolerance(1e-8, 1e-4, "probabilities ~1/cols can be tiny: only values below "
                                                  "1e-8 may be absolutely off; fp32 sum order ~1e-7 relative"),
    ("softmax", "bfloat16"): Tolerance(1e-8, 1.6e-2, "probabilities ~1/cols can be tiny; bf16 keeps 8 "
                                                     "significant bits down to 1e-38, so relative error rules"),
    ("softmax", "float16"): Tolerance(6e-8, 2e-3, "probabilities below 6e-5 are fp16 subnormals spaced "
                                                  "6e-8 apart: one step absolute, else two ulps relative"),
    # log-probabilities are large negative numbers: relative error rules, atol for values near 0.
    ("log_softmax", "float32"): Tolerance(1e-5, 1e-5, "x - max - log(sum): one fp32 rounding of the "
                                                      "log-sum-exp, relative to |out|"),
    # group-norm outputs are ~N(0,1)*weight+bias: values near zero are common, so atol matters.
    ("group_norm", "float32"): Tolerance(1e-4, 1e-4, "mean/var over up to millions of elements in fp32: "
                                                     "~1e-5 absolute on unit-scale outputs"),
    ("group_norm", "bfloat16"): Tolerance(1.6e-2, 1.6e-2, "unit-scale outputs rounded to bf16: half an ulp "
                                                          "of 1.0 is 4e-3, plus statistics error"),
    ("group_norm", "float16"): Tolerance(2e-3, 2e-3, "unit-scale outputs rounded to fp16: two ulps of 1.0"),
    ("layer_norm", "bfloat16"): Tolerance(1.6e-2, 1.6e-2, "unit-scale outputs rounded to bf16"),
    ("rms_norm", "bfloat16"): Tolerance(1.6e-2, 1.6e-2, "unit-scale outputs rounded to bf16"),
    # means of unit-scale values are ~N(0, 1/HW): small values with full relative precision.
    ("adaptive_avg_pool2d", "float32"): Tolerance(1e-6, 1e-4, "a mean of HW fp32 values: sum order only"),
}

# Verification allows up to this multiple of eager PyTorch's own error on the same input: a
# kernel exactly as accurate as PyTorch must pass even on adversarial inputs (large offsets).
# The allowance is by magnitude: an element may be off by EAGER_SLACK x the largest error eager
# makes on elements no larger than it (power-of-two buckets of |reference|). One global figure
# would let eager's rounding of the largest values excuse anything on the smallest: zeroing every
# softmax probability below 1e-4 passed that way.
EAGER_SLACK = 2.0
_BUCKETS = 2048  # the biased exponent field of a float64 (11 bits): one bucket per power of two

_CHUNK = 1 << 24  # elements per comparison chunk: bounds the float64 temporaries (~128 MB each)


def tolerance(op: str | None, dtype: str) -> Tolerance:
    if op is not None and (op, dtype) in OP_TABLE:
        return OP_TABLE[(op, dtype)]
    if dtype not in TABLE:
        raise KeyError(f"no tolerance for dtype {dtype!r}")
    return TABLE[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _bucket(r_abs: torch.Tensor) -> torch.Tensor:
    """Power-of-two magnitude bucket of each non-negative float64 value: its biased exponent bits
    (0 for zeros and subnormals), read straight from the bits (no frexp, no masks: fast on CPU)."""
    return r_abs.contiguous().view(torch.int64) >> 52


def eager_allowance(eager_out: torch.Tensor, ref64: torch.Tensor, slack: float = EAGER_SLACK) -> torch.Tensor:
    """Per magnitude bucket: slack x the largest |eager - ref| over finite elements whose |ref| is
    in that bucket or a smaller one (a float64 table for ``compare``'s ``atol_floor``)."""
    table = torch.zeros(_BUCKETS, dtype=torch.float64, device=ref64.device)
    o = eager_out.reshape(-1)
    r = ref64.reshape(-1)
    for start in range(0, r.numel(), _CHUNK):
        oc = o[start:start + _CHUNK].to(torch.float64)
        rc = r[start:start + _CHUNK].to(torch.float64)
        fin = torch.isfinite(oc) & torch.isfinite(rc)
        zero = torch.zeros_like(rc)
        # non-finite positions add 0 to bucket 0: no mask indexing (a host sync per chunk on CUDA)
        table.scatter_reduce_(0, _bucket(torch.where(fin, rc.abs(), zero)), torch.where(fin, (oc - rc).abs(), zero),
                              reduce="amax")
    return slack * torch.cummax(table, 0).values


def compare(out: torch.Tensor, ref64: torch.Tensor, dtype: str | None = None, op: str | None = None, *,
            atol: float | None = None, rtol: float | None = None, atol_floor: "float | torch.Tensor" = 0.0,
            input_kind: str = "") -> Check:
    """Compare every element of ``out`` with the float64 reference; never raises on a mismatch.

    ``dtype`` (the output dtype the tolerance is looked up for) defaults to ``out``'s dtype;
    ``atol``/``rtol`` override the table; ``atol_floor`` raises atol: a number for every element,
    or an ``eager_allowance`` table, looked up by each element's |reference| (eager's own error).
    """
    tol = tolerance(op, dtype or dtype_name(out.dtype))
    table = atol_floor if isinstance(atol_floor, torch.Tensor) else None
    atol = max(tol.atol if atol is None else atol, 0.0 if table is not None else atol_floor)
    rtol = tol.rtol if rtol is None else rtol
    if table is not None:
        table = table.to(ref64.device)
    if tuple(out.shape) != tuple(ref64.shape):
        return Check(input_kind, float("inf"), float("inf"), out.numel() or 1, atol, rtol,
                     f"shape {tuple(out.shape)} != expected {tuple(ref64.shape)}", passed=False)
    flat_out = out.reshape(-1)
    flat_ref = ref64.reshape(-1)
    n = flat_out.numel()
    max_abs = max_rel = 0.0
    mismatches = nonfinite_bad = nan_count = inf_count = 0
    first = ""
    for start in range(0, n, _CHUNK):
        o = flat_out[start:start + _CHUNK].to(torch.float64)
        r = flat_ref[start:start + _CHUNK].to(torch.float64)
        o_nan, r_nan = torch.isnan(o), torch.isnan(r)
        o_inf, r_inf = torch.isinf(o), torch.isinf(r)
        nan_count += int(o_nan.sum())
        inf_count += int(o_inf.sum())
        r_fin = ~(r_nan | r_inf)
        # NaN/Inf parity, position by position: no wildcard NaN, no Inf where the reference is finite.
        special_bad = (r_nan != o_nan) | (r_inf & (o != r)) | (r_fin & o_inf)
        both_fin = r_fin & ~(o_nan | o_inf)
        err = torch.where(both_fin, (o - r).abs(), torch.zeros_like(o))
        a = atol if table is None else table[_bucket(torch.where(r_fin, r.abs(), torch.zeros_like(r)))].clamp_min(atol)
        bad = both_fin & (err > a + rtol * r.abs())
        if both_fin.any():
            max_abs = max(max_abs, float(err.max()))
            max_rel = max(max_rel, float((err / r.abs().clamp_min(max(atol, 1e-300))).max()))
        n_special, n_bad = int(special_bad.sum()), int(bad.sum())
        nonfinite_bad += n_special
        mismatches += n_special + n_bad
        if not first and (n_special or n_bad):
            where = special_bad | bad
            i = int(torch.nonzero(where)[0, 0])
            first = _describe(start + i, out.shape, float(o[i]), float(r[i]))
            if n_special and bool(special_bad[i]):
                first = "NaN/Inf parity at " + first
    return Check(input_kind, max_abs, max_rel, mismatches, atol, rtol, first, nan_count, inf_count,
                 passed=mismatches == 0, nonfinite_mismatches=nonfinite_bad)


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
    for start in range(0, o.numel(), _CHUNK):
        oc = o[start:start + _CHUNK].float()
        rc = r[start:start + _CHUNK].float()
        if not bool(torch.isfinite(oc).all()) or not bool(torch.isfinite(rc).all()):
            return False
        if not bool(((oc - rc).abs_() <= rc.abs().mul_(0.9 * tol.rtol).add_(0.9 * tol.atol)).all()):
            return False
    return True


def max_abs_error(out: torch.Tensor, ref64: torch.Tensor) -> float:
    """Largest |out - ref| over positions where both are finite (eager's own error, for atol_floor)."""
    o = out.reshape(-1).to(torch.float64)
    r = ref64.reshape(-1).to(torch.float64)
    fin = torch.isfinite(o) & torch.isfinite(r)
    if not fin.any():
        return 0.0
    return float((o[fin] - r[fin]).abs().max())


def _describe(flat_index: int, shape, got: float, expected: float) -> str:
    idx = []
    for size in reversed(tuple(shape)):
        idx.append(flat_index % max(size, 1))
        flat_index //= max(size, 1)
    return f"index {tuple(reversed(idx))}: got {got:.6g}, expected {expected:.6g}"
