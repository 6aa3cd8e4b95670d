"""What "verified" means, in one file: shared by the build's verification and the shipped package.

The search's workers (``forge_pack.evaluate.verify``) and every emitted package's ``python -m <pkg> verify``
run this very code: ``forge_pack.pack.packager`` copies it byte for byte into the package as
``_verdict_rules.py`` and records its sha256 in the manifest. So it imports nothing but torch and
the standard library, and takes plain values (target specs, parameter dicts, dtype names,
tensors), never other forge-pack objects. What is particular to one target kind (its tolerance
rows, the magnitude its allowance is looked up by, how its inputs reduce and permute) comes from
the kind's ``TargetSpec`` (``forge_pack/targets``, shipped as ``<pkg>/_targets/``), passed in as
``spec``; ``spec=None`` means the generic rules only.

It holds:
- the tolerance table (keyed by output dtype; a kind's own rows override it, each with its
  reason), the element comparison against a float64 reference with NaN/Inf parity, and the eager
  allowance (a kernel may be off by ``EAGER_SLACK`` x eager PyTorch's own error on values of the
  same magnitude);
- the per-call checks: the NaN sentinel an unwritten output element keeps, inputs unchanged
  bitwise, a second call bitwise equal to the first, and the order in which they decide a verdict;
- the transforms that derive new input sets from captured or fresh ones (DERIVED_KINDS).

A candidate's element passes when ``|out - ref| <= max(atol, allowance(m)) + rtol * |ref|``
(m = |ref|, or the kind's ``magnitude``, e.g. for a mean the mean of |x|)
against the float64 reference, and NaN / +-Inf appear exactly where the reference has them (same
sign for Inf). A kind with a second key (``spec.sensitivity``: a region rounded in 16-bit floats, keyed by
how far the roundings inside it can move each element) judges an output that fails under the first
once more under the second (``rejudge``), its allowance rebuilt with that key: an output passes under
either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


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

# Verification allows up to this multiple of eager PyTorch's own error on the same input: a
# kernel exactly as accurate as PyTorch must pass even on adversarial inputs (large offsets).
# The allowance is by magnitude: an element may be off by EAGER_SLACK x the largest error eager
# makes on elements no larger than it (power-of-two buckets of |reference|). One global figure
# would let eager's rounding of the largest values excuse anything on the smallest: zeroing every
# softmax probability below 1e-4 passed that way.
EAGER_SLACK = 2.0
_BUCKETS = 2048  # the biased exponent field of a float64 (11 bits): one bucket per power of two

# Elements per comparison chunk: bounds the float64 temporaries (32 MiB each). A chunk's comparison
# holds about CHUNK_BYTES_PER_ELEMENT bytes per element at its peak (measured on the CPU: 49 without an
# allowance table, 56 with one; tests/test_eval_memory.py); at 1 << 24 that was 0.9 GiB, 1.7x the data of
# the 568 MB layer_norm whose GPU evaluation peaked at 4.35x. The results are read back once per
# comparison, so smaller chunks cost only launches (about 30 per chunk, each still ~20 us of GPU work).
_CHUNK = 1 << 22
CHUNK_BYTES_PER_ELEMENT = 64


def tolerance(spec: Any, dtype: str) -> Tolerance:
    """The kind's own row for this output dtype where it has one, else the table's."""
    row = spec.tolerance(dtype) if spec is not None else None
    if row is not None:
        return Tolerance(row.atol, row.rtol, row.reason)
    if dtype not in TABLE:
        raise KeyError(f"no tolerance for dtype {dtype!r}")
    return TABLE[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _bucket(r_abs: torch.Tensor) -> torch.Tensor:
    """Power-of-two magnitude bucket of each non-negative float64 value: its biased exponent bits
    (0 for zeros and subnormals), read straight from the bits (no frexp, no masks: fast on CPU)."""
    return r_abs.contiguous().view(torch.int64) >> 52


def magnitude(spec: Any, inputs: dict[str, Any]) -> torch.Tensor | None:
    """Per output element, the size of the terms it is computed from, where a correct result can be
    far smaller than they are (a mean of large values of both signs): the kind's ``magnitude``.
    None where |reference| itself is the right scale."""
    if spec is None or spec.magnitude is None:
        return None
    return spec.magnitude(inputs)


def _key(ref_chunk: torch.Tensor, mag: torch.Tensor | None, start: int) -> torch.Tensor:
    """The bucketing key of a float64 chunk: the magnitude where the kind has one, else |ref|."""
    if mag is None:
        return ref_chunk.abs()
    return mag.reshape(-1)[start:start + ref_chunk.numel()].to(device=ref_chunk.device, dtype=torch.float64)


# CUDA: copies of the allowance table that a chunk's elements are spread over by position. Most
# elements of an input fall in a few magnitude buckets, and a scatter's atomic maximum into one
# address serialises: one table took ~10 ms per 16M-element chunk on an H100 (a 3.2 GB softmax set:
# ~240 ms); neighbouring elements go to different copies, reduced to one table at the end.
SCATTER_SPREAD = {"cuda": 1024}


def eager_allowance(eager_out: torch.Tensor, ref64: torch.Tensor, slack: float = EAGER_SLACK,
                    magnitude: torch.Tensor | None = None, spread: int | None = None) -> torch.Tensor:
    """Per magnitude bucket: slack x the largest |eager - ref| over finite elements whose magnitude
    (|ref|, or ``magnitude`` where given) is in that bucket or a smaller one (a float64 table for
    ``compare``'s ``atol_floor``, looked up with the same magnitude). ``spread``: table copies the
    elements are scattered over (default ``SCATTER_SPREAD`` for the device; the result is the same)."""
    device = ref64.device
    spread = max(1, SCATTER_SPREAD.get(device.type, 1) if spread is None else spread)
    table = torch.zeros(spread * _BUCKETS, dtype=torch.float64, device=device)
    o = eager_out.reshape(-1)
    r = ref64.reshape(-1)
    lanes = None
    for start in range(0, r.numel(), _CHUNK):
        oc = o[start:start + _CHUNK].to(torch.float64)
        rc = r[start:start + _CHUNK].to(torch.float64)
        fin = torch.isfinite(oc) & torch.isfinite(rc)
        zero = torch.zeros_like(rc)
        # non-finite positions add 0 to bucket 0: no mask indexing (a host sync per chunk on CUDA)
        idx = _bucket(torch.where(fin, _key(rc, magnitude, start), zero))
        if spread > 1:
            if lanes is None or lanes.numel() != idx.numel():
                lanes = (torch.arange(idx.numel(), device=device) % spread) * _BUCKETS
            idx = idx + lanes
        table.scatter_reduce_(0, idx, torch.where(fin, (oc - rc).abs(), zero), reduce="amax")
    if spread > 1:
        table = table.view(spread, _BUCKETS).amax(0)
    return slack * torch.cummax(table, 0).values


@dataclass(frozen=True)
class Comparison:
    """How one output compared with its float64 reference (the fields of ``forge_pack.core.verdict.Check``)."""

    input_kind: str
    max_abs_err: float
    max_rel_err: float
    mismatches: int
    atol: float
    rtol: float
    first_mismatch: str = ""
    nan_count: int = 0
    inf_count: int = 0
    passed: bool = True
    nonfinite_mismatches: int = 0


def compare(out: torch.Tensor, ref64: torch.Tensor, dtype: str | None = None, spec: Any = None, *,
            atol: float | None = None, rtol: float | None = None, atol_floor: "float | torch.Tensor" = 0.0,
            input_kind: str = "", magnitude: torch.Tensor | None = None) -> Comparison:
    """Compare every element of ``out`` with the float64 reference; never raises on a mismatch.

    ``dtype`` (the output dtype the tolerance is looked up for) defaults to ``out``'s dtype;
    ``atol``/``rtol`` override the table; ``atol_floor`` raises atol: a number for every element,
    or an ``eager_allowance`` table, looked up by each element's |reference| (eager's own error),
    or by its ``magnitude`` where the kind has one (the same tensor the table was built with).
    """
    tol = tolerance(spec, dtype or dtype_name(out.dtype))
    table = atol_floor if isinstance(atol_floor, torch.Tensor) else None
    atol = max(tol.atol if atol is None else atol, 0.0 if table is not None else atol_floor)
    rtol = tol.rtol if rtol is None else rtol
    if table is not None:
        table = table.to(ref64.device)
    if tuple(out.shape) != tuple(ref64.shape):
        return Comparison(input_kind, float("inf"), float("inf"), out.numel() or 1, atol, rtol,
                          f"shape {tuple(out.shape)} != expected {tuple(ref64.shape)}", passed=False)
    flat_out = out.reshape(-1)
    flat_ref = ref64.reshape(-1)
    n = flat_out.numel()
    # per chunk, on the device: [NaNs in out, Infs in out, parity failures, values out of tolerance] and the
    # largest absolute and relative errors over finite pairs (0 where there are none), read back once at
    # the end: a read per chunk waited for the GPU, idle while the next chunk was queued (~90 ms for 1.9 GB)
    # Both tables are allocated before the first chunk: a small result kept per chunk between the chunks'
    # temporaries pinned the allocator's freed blocks (the CPU's resident peak grew from 4.4x to 5.9x the data).
    chunks = -(-n // _CHUNK)
    counts = torch.zeros(chunks, 4, dtype=torch.int64, device=flat_out.device)
    peaks = torch.zeros(chunks, 2, dtype=torch.float64, device=flat_out.device)
    for j, start in enumerate(range(0, n, _CHUNK)):
        c = _compare_chunk(flat_out, flat_ref, start, atol, rtol, table, magnitude)
        torch.stack([c["o_nan"].sum(), c["o_inf"].sum(), c["special"].sum(), c["bad"].sum()], out=counts[j])
        torch.stack([c["err"].max(), c["rel"].max()], out=peaks[j])
        del c  # this chunk's temporaries go before the next chunk's are made
    per_chunk = counts.tolist()
    max_abs, max_rel = peaks.amax(dim=0).tolist() if chunks else (0.0, 0.0)
    nan_count = sum(k[0] for k in per_chunk)
    inf_count = sum(k[1] for k in per_chunk)
    nonfinite_bad = sum(k[2] for k in per_chunk)
    mismatches = nonfinite_bad + sum(k[3] for k in per_chunk)
    first = ""
    failing = next((j for j, k in enumerate(per_chunk) if k[2] or k[3]), None)
    if failing is not None:  # the first failing element, from its chunk computed again
        start = failing * _CHUNK
        c = _compare_chunk(flat_out, flat_ref, start, atol, rtol, table, magnitude)
        i = int(torch.nonzero(c["special"] | c["bad"])[0, 0])
        first = _describe(start + i, out.shape, float(c["o"][i]), float(c["r"][i]))
        if bool(c["special"][i]):
            first = "NaN/Inf parity at " + first
    return Comparison(input_kind, max_abs, max_rel, mismatches, atol, rtol, first, nan_count, inf_count,
                      passed=mismatches == 0, nonfinite_mismatches=nonfinite_bad)


def _compare_chunk(flat_out: torch.Tensor, flat_ref: torch.Tensor, start: int, atol: float, rtol: float,
                   table: torch.Tensor | None, magnitude: torch.Tensor | None) -> dict:
    """``compare``'s element tests on the chunk at ``start``, in float64: ``special`` (NaN/Inf parity broken) and
    ``bad`` (both finite, out of tolerance) per element, ``err`` and ``rel`` (0 where not both finite)."""
    o = flat_out[start:start + _CHUNK].to(torch.float64)
    r = flat_ref[start:start + _CHUNK].to(torch.float64)
    o_nan, r_nan = torch.isnan(o), torch.isnan(r)
    o_inf, r_inf = torch.isinf(o), torch.isinf(r)
    r_fin = ~(r_nan | r_inf)
    # NaN/Inf parity, position by position: no wildcard NaN, no Inf where the reference is finite.
    special = (r_nan != o_nan) | (r_inf & (o != r)) | (r_fin & o_inf)
    both_fin = r_fin & ~(o_nan | o_inf)
    err = torch.where(both_fin, (o - r).abs(), torch.zeros_like(o))
    a = atol if table is None else table[_bucket(torch.where(r_fin, _key(r, magnitude, start),
                                                             torch.zeros_like(r)))].clamp_min(atol)
    bad = both_fin & (err > a + rtol * r.abs())
    # over finite pairs only: a NaN reference elsewhere in the chunk must not hide the maximum
    rel = torch.where(both_fin, err / r.abs().clamp_min(max(atol, 1e-300)), torch.zeros_like(err))
    return {"o": o, "r": r, "o_nan": o_nan, "o_inf": o_inf, "special": special, "bad": bad, "err": err, "rel": rel}


def max_abs_error(out: torch.Tensor, ref64: torch.Tensor) -> float:
    """Largest |out - ref| over positions where both are finite (eager's own error, for atol_floor)."""
    o = out.reshape(-1).to(torch.float64)
    r = ref64.reshape(-1).to(torch.float64)
    fin = torch.isfinite(o) & torch.isfinite(r)
    if not fin.any():
        return 0.0
    return float((o[fin] - r[fin]).abs().max())


def allowance(eager_out: torch.Tensor, ref64: torch.Tensor, dtype: str | None, spec: Any,
              magnitude: torch.Tensor | None = None) -> torch.Tensor | None:
    """The eager allowance for one input set, or None when eager PyTorch itself puts NaN/Inf
    elsewhere than the float64 reference there: a kernel is not held to a standard PyTorch does
    not meet, so such a set is skipped (the same on both sides)."""
    if compare(eager_out, ref64, dtype, spec).nonfinite_mismatches:
        return None
    return eager_allowance(eager_out, ref64, magnitude=magnitude)


def _describe(flat_index: int, shape, got: float, expected: float) -> str:
    idx = []
    for size in reversed(tuple(shape)):
        idx.append(flat_index % max(size, 1))
        flat_index //= max(size, 1)
    return f"index {tuple(reversed(idx))}: got {got:.6g}, expected {expected:.6g}"


# ---------------------------------------------------------------- the per-call checks

# Quiet NaNs with a payload no arithmetic produces (CUDA's canonical NaN is 0x7fffffff, x86's
# 0x7fc00000): an element still holding it after the call was never written.
SENTINEL = {"float32": (torch.int32, 0x7FD5A5A5), "bfloat16": (torch.int16, 0x7FD5),
            "float16": (torch.int16, 0x7E55), "float64": (torch.int64, 0x7FFA5A5A5A5A5A5A)}
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fill_sentinel(out: torch.Tensor) -> None:
    int_dtype, bits = SENTINEL[dtype_name(out.dtype)]
    out.view(int_dtype).fill_(bits)


def count_sentinel(out: torch.Tensor) -> tuple[int, str]:
    int_dtype, bits = SENTINEL[dtype_name(out.dtype)]
    hit = out.view(int_dtype) == bits
    n = int(hit.sum())
    if not n:
        return 0, ""
    idx = tuple(int(i) for i in torch.nonzero(hit)[0])
    return n, f"first at index {idx}"


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    int_dtype = _INT_OF_SIZE[a.element_size()]
    return bool(torch.equal(a.view(int_dtype), b.view(int_dtype)))


def first_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    int_dtype = _INT_OF_SIZE[a.element_size()]
    ne = a.view(int_dtype) != b.view(int_dtype)
    n = int(ne.sum())
    if not n:
        return "no difference"
    idx = tuple(int(i) for i in torch.nonzero(ne)[0])
    return f"{n} elements, first at {idx}: {float(a[idx]):.6g} vs {float(b[idx]):.6g}"


def judge_output(out: torch.Tensor, ref64: torch.Tensor, dtype: str, spec: Any, atol_floor: "float | torch.Tensor",
                 kind: str, magnitude: torch.Tensor | None = None) -> tuple[Comparison, str | None, str]:
    """The first call's output, judged: (comparison, failing reason or None, detail). Order: an
    element still holding the sentinel (unwritten_output), then values out of tolerance
    (mismatch), then NaN/Inf where the reference has none or the reverse (nan)."""
    unwritten, where = count_sentinel(out)
    check = compare(out, ref64, dtype, spec, atol_floor=atol_floor, input_kind=kind, magnitude=magnitude)
    if unwritten:
        return check, "unwritten_output", (f"{kind}: {unwritten} of {out.numel()} output elements never written "
                                           f"({where})")
    value_bad = check.mismatches - check.nonfinite_mismatches
    if value_bad:
        also = f" (and {check.nonfinite_mismatches} NaN/Inf positions)" if check.nonfinite_mismatches else ""
        return check, "mismatch", (f"{kind}: {value_bad} of {out.numel()} elements out of tolerance{also} "
                                   f"(atol {check.atol:.3g}, rtol {check.rtol:.3g}); {check.first_mismatch}")
    if check.nonfinite_mismatches:
        return check, "nan", (f"{kind}: {check.nonfinite_mismatches} positions where NaN/Inf differ from the "
                              f"reference; {check.first_mismatch}")
    return check, None, ""


def rejudge(out: torch.Tensor, ref64: torch.Tensor, dtype: str, spec: Any, kind: str, inputs: dict,
            eager: Callable[[], torch.Tensor]) -> tuple[Comparison, str | None, str, Any, Any] | None:
    """An output that failed as a ``mismatch`` judged again under the kind's second key (``spec.sensitivity``):
    the eager allowance rebuilt from ``eager()`` (eager's output on ``inputs``) bucketed by that key, and the
    output compared with it. An output passes when it passes under either key: each allowance is eager's own
    error on comparable elements. (comparison, reason or None, detail, allowance, key); None where the kind has
    no second key, or it gives none for these inputs, or eager breaks NaN/Inf parity."""
    fn = getattr(spec, "sensitivity", None)
    key = fn(inputs) if fn is not None else None
    if key is None:
        return None
    allow = allowance(eager(), ref64, dtype, spec, key)
    if allow is None:
        return None
    cmp, reason, detail = judge_output(out, ref64, dtype, spec, allow, kind, key)
    return cmp, reason, detail, allow, key


def input_change(name: str, current: torch.Tensor, saved: torch.Tensor, kind: str, run: str
                 ) -> tuple[str, str] | None:
    """("input_mutated", detail) when an input differs bitwise from its copy saved before the call."""
    if bitwise_equal(current, saved):
        return None
    return "input_mutated", f"{kind}: input `{name}` changed during the {run} call ({first_diff(current, saved)})"


def repeat_change(second: torch.Tensor, first: torch.Tensor, kind: str) -> tuple[str, str] | None:
    """("nondeterministic", detail) when a second call on the same inputs differs bitwise."""
    if bitwise_equal(second, first):
        return None
    return "nondeterministic", (f"{kind}: two runs on the same input differ bitwise ({first_diff(second, first)}): "
                                f"a race or uninitialised memory")


# ---------------------------------------------------------------- derived inputs

# Derived verification sets: random transforms of real (captured) or fresh inputs, drawn anew for
# every run, so that no kernel can key its behaviour on what the generated sets look like.
DERIVED_KINDS = ("scale", "shift", "permute", "mixed", "flip")


def _uniform(gen: torch.Generator, lo: float, hi: float, n: int | None = None):
    u = torch.rand(n if n is not None else 1, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    return u if n is not None else float(u)


def _finite_absmax(t: torch.Tensor) -> float:
    """Largest finite |t|, 0 when there is none; in chunks (views of t: a strided t is not copied whole)."""
    best = 0.0
    for c in _views(t):
        if c.numel():
            best = max(best, float(torch.where(torch.isfinite(c), c.abs(), torch.zeros_like(c)).max()))
    return best


def derived_source(count: int, gen: torch.Generator) -> int:
    """Which of ``count`` source sets (captured, else fresh) a derived set starts from: the first
    draw of that set's generator, before ``derive_inputs`` draws the transform."""
    return int(torch.randint(count, (1,), generator=gen))


def _views(t: torch.Tensor, limit: int | None = None):
    """Views of ``t`` that together cover each of its elements once, each at most ``limit`` elements
    where a dimension allows (slices along dim 0, or the sub-tensors of a dim-0 index larger than
    that): in-place work on them needs float64 temporaries of a chunk (``_CHUNK``), not of the tensor."""
    limit = _CHUNK if limit is None else limit
    if t.dim() == 0 or t.numel() <= limit:
        yield t
        return
    per = t.numel() // t.shape[0]
    if per > limit:
        for i in range(t.shape[0]):
            yield from _views(t[i], limit)
        return
    step = max(1, limit // per)
    for a in range(0, t.shape[0], step):
        yield t[a:a + step]


def _map_in_place(t: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """t = fn(t computed in float64), rounded once to t's dtype, a chunk at a time."""
    for v in _views(t):
        v.copy_(fn(v.to(torch.float64)))


def _finite_std(t: torch.Tensor) -> tuple[float, int]:
    """(unbiased standard deviation, count) of t's finite elements, in float64, two passes in chunks."""
    n, total = 0, 0.0
    for v in _views(t):
        fin = torch.isfinite(v)
        n += int(fin.sum())
        total += float(torch.where(fin, v.to(torch.float64), 0.0).sum())
    if n < 2:
        return 0.0, n
    mean = total / n
    sq = 0.0
    for v in _views(t):
        d = v.to(torch.float64) - mean
        sq += float(torch.where(torch.isfinite(d), d * d, 0.0).sum())
    return (sq / (n - 1)) ** 0.5, n


def _row_blocks(rows: torch.Tensor):
    """(first row, view) of consecutive blocks of whole rows, each about ``_CHUNK`` elements (one row at least)."""
    step = max(1, _CHUNK // max(rows.shape[1], 1))
    for a in range(0, rows.shape[0], step):
        yield a, rows[a:a + step]


def _rows_apply(rows: torch.Tensor, per_row: torch.Tensor) -> None:
    """rows *= per_row[:, None] in place, in float64 a block of rows at a time, rounded once."""
    for a, r in _row_blocks(rows):
        r.copy_(r.to(torch.float64) * per_row[a:a + r.shape[0], None])


def derive_inputs(spec: Any, params: dict, kind: str, source: dict, gen: torch.Generator) -> dict:
    """New inputs from ``source`` (captured or fresh tensors by name, left untouched) by one random
    transform (DERIVED_KINDS): a scale over several decades, a shift of several spreads, a
    permutation, per-row magnitudes from 1e-3 to 1e3, per-row sign flips. Values stay well inside
    the input dtype's range; the reference is computed from the result, as for any set. The
    result keeps each tensor's dtype, shape, strides and device. The transformed tensor is the spec's
    main input: ``x`` for an op kind, a region's largest plain floating input (``spec.main``).

    The arithmetic is float64, rounded once to the input's dtype, chunk by chunk in place (a
    permutation moves elements in their own dtype): a derived set of a GB input costs its copy and
    chunk-sized temporaries. Measured on an H100 before this was so: a 1.6 GB softmax input's
    derived sets took 2-4x the input in float64 copies, the largest part of an evaluation's peak
    (5.1x its inputs + outputs; bench/results/eval_memory.md)."""
    main = getattr(spec, "main", "x")
    # a copy with the source's own strides (clone() would make a non-dense view, a slice of a fused
    # qkv, dense: a kernel specialised to the verified strides must see them in every set)
    t = {n: (torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device).copy_(v)
             if v is not None else None) for n, v in source.items()}
    x = t[main]
    assert x is not None
    limit = torch.finfo(x.dtype).max / 64  # headroom: sums of squares and exps stay finite in fp32 math
    peak = max(_finite_absmax(x), 1e-30)
    others = {n: v for n, v in t.items() if n != main}
    if kind == "scale":
        decades = _uniform(gen, 0.5, 2.5) * (1 if float(torch.rand(1, generator=gen)) < 0.5 else -1)
        factor = min(10.0 ** decades, limit / peak)
        _map_in_place(x, lambda v: v * factor)
    elif kind == "shift":
        spread, n = _finite_std(x)
        spread = spread if n > 1 else 1.0
        offset = _uniform(gen, 2.0, 8.0) * max(spread, 1e-3) * (1 if float(torch.rand(1, generator=gen)) < 0.5 else -1)
        offset = max(min(offset, limit - peak), -(limit - peak))
        _map_in_place(x, lambda v: v + offset)
    elif kind == "permute":
        # what the kind treats as interchangeable: rows, reduced elements, samples, channels ...
        x.copy_(spec.permute(params, x, others, gen))
    elif kind in ("mixed", "flip"):
        rows, back = spec.rows(params, x)  # the groups of elements the kind reduces together (a view where it can be)
        blocks = [b for _, b in _row_blocks(rows)]
        if kind == "mixed":
            row_peak = torch.cat([torch.where(torch.isfinite(b), b.abs(), 0.0).amax(dim=1) for b in blocks])
            row_peak = row_peak.to(torch.float64).clamp_min(1e-30)
            factor = 10.0 ** _uniform(gen, -3.0, 3.0, rows.shape[0]).to(x.device)
            factor = torch.minimum(factor, limit / row_peak)
        else:  # only all-finite rows: a flipped -inf would be +inf, a different kind of input
            sign = torch.where(torch.rand(rows.shape[0], generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
            finite = torch.cat([torch.isfinite(b).all(dim=1) for b in blocks])
            factor = torch.where(finite, sign.to(x.device), 1.0)
        _rows_apply(rows, factor)
        if rows.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
            x.copy_(back(rows))  # the rows were a copy (x's layout does not reshape to them as a view)
    else:
        raise KeyError(kind)
    t.update(others)
    return t
