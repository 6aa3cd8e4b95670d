"""Input sets for verification: fresh draws, adversarial transforms, and the shapes of reductions.

Every kind declares how its tensors are drawn (``TargetSpec.draws``), which adversarial kinds
apply to it, and how its main input splits into the groups of elements it reduces together
(``rows``) and what it treats as interchangeable (``permute``); the helpers here implement those
once. The derived transforms that use ``rows``/``permute`` are part of "what verified means" and
live in ``forge_pack/evaluate/verdict_rules.py``.
"""

from __future__ import annotations

from typing import Any, Callable

from .dtypes import torch_dtype
from .lazy_torch import torch


def empty(spec: tuple, device) -> Any:
    """An uninitialised tensor of (dtype name, shape, strides) on ``device``."""
    dtype, shape, strides = spec
    return torch.empty_strided(tuple(shape), tuple(strides), dtype=torch_dtype(dtype), device=device)


# A draw of at least this many elements is made in chunks of CHUNK elements, each from its own generator seeded
# from the caller's, on all the CPU threads: one generator draws ~0.6 GB/s (10 s for the 6 GiB of a KernelBench
# softmax input, per evaluation), whatever the cores. The values depend on the seed alone, not on the threads.
PARALLEL_DRAW = 1 << 26
CHUNK = 1 << 24


def standard_normal(shape: tuple, gen) -> Any:
    """float32 N(0, 1) of ``shape`` on the CPU, from ``gen`` (reproducible everywhere)."""
    n = 1
    for d in shape:
        n *= int(d)
    if n < PARALLEL_DRAW:
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
    from concurrent.futures import ThreadPoolExecutor

    values = torch.empty(n, dtype=torch.float32)
    starts = list(range(0, n, CHUNK))
    seeds = torch.randint(0, 1 << 62, (len(starts),), generator=gen, dtype=torch.int64).tolist()

    def fill(i: int) -> None:  # torch releases the GIL while it draws
        values[starts[i]:starts[i] + CHUNK].normal_(generator=torch.Generator().manual_seed(seeds[i]))

    with ThreadPoolExecutor(max_workers=max(1, min(torch.get_num_threads(), len(starts)))) as pool:
        list(pool.map(fill, range(len(starts))))
    return values.view(tuple(shape))


def randn(spec: tuple, gen, device, scale: float = 1.0, shift: float = 0.0) -> Any:
    # Draw on the CPU with the generator (reproducible everywhere), then place with the exact strides.
    values = standard_normal(tuple(spec[1]), gen)
    if scale != 1.0 or shift != 0.0:
        values = values.mul_(scale).add_(shift)
    out = empty(spec, device)
    out.copy_(values)
    return out


def _large(x) -> None:
    # Large magnitudes: overflow in exp without max-subtraction; big sums in the norms.
    x.mul_((3.0e4 if x.dtype == torch.float16 else 1.0e4) / 4)


def _offset(x) -> None:
    # Large mean, small spread: naive one-pass E[x^2]-E[x]^2 variance loses every digit here.
    x.mul_(0.5).add_(300.0 if x.dtype != torch.float32 else 2000.0)


def _neg_inf_rows(x) -> None:
    # rows in a copy (reshape of a strided x may copy too): written back into x below
    flat = x.reshape(-1, x.shape[-1]).clone()
    flat[:, ::7] = float("-inf")  # masked positions, as attention masks make them
    flat[0, :] = float("-inf")  # a fully masked row: softmax gives NaN, the kernel must too
    if flat.shape[0] > 2:
        flat[2, 2:] = float("-inf")  # a row with a single live element: column 1 (0 is masked above)
    x.copy_(flat.view(x.shape))


def _constant(x) -> None:
    x.fill_(1.5)  # zero variance / identical logits


# Adversarial kinds: in-place transforms of a fresh main input "x".
ADVERSARIAL: dict[str, Callable[[Any], None]] = {"large": _large, "offset": _offset, "neg_inf_rows": _neg_inf_rows,
                                                 "constant": _constant}


def _masked_rows(t: dict) -> None:
    """Attention: rows of the additive mask fully masked (-inf, and finfo.min as HF builds masks), a
    row with one live key, every 7th key masked elsewhere; without a mask, all-equal logits (q = 0)."""
    mask = t.get("mask")
    if mask is None:
        t["x"].zero_()
        return
    flat = mask.reshape(-1, mask.shape[-1]).clone()
    flat[:, ::7] = float("-inf")
    flat[0, :] = float("-inf")  # softmax of an all -inf row: NaN in eager softmax, 0 in SDPA
    if flat.shape[0] > 2:
        flat[2, :] = torch.finfo(mask.dtype).min  # every logit rounds to the same value: uniform weights
    if flat.shape[0] > 3 and flat.shape[1] > 1:
        flat[3, 2:] = float("-inf")  # a single live key: column 1 (0 is masked above)
    mask.copy_(flat.view(mask.shape))


# Adversarial kinds that transform the whole input set (tensors by ABI name), not only "x".
ADVERSARIAL_SETS: dict[str, Callable[[dict], None]] = {"masked_rows": _masked_rows}


def make_inputs(spec, inputs: list, kind: str, gen, device) -> dict:
    """One input set of ``spec``'s kind, in ABI order: kind "fresh" or one of ``spec.adversarial``.
    ``inputs`` is [(name, (dtype, shape, strides) or None)]."""
    t: dict[str, Any] = {}
    for name, s in inputs:
        if s is None:
            t[name] = None
            continue
        d = spec.draw(name)
        t[name] = randn(s, gen, device, d.scale, d.shift)
        if d.positive_floor is not None:
            t[name] = t[name].abs_() + d.positive_floor
    if kind in ADVERSARIAL_SETS:
        ADVERSARIAL_SETS[kind](t)
    elif kind != "fresh":
        ADVERSARIAL[kind](t["x"])
    return t


# ---------------------------------------------------------------- reduction shapes

def dim_rows(xf, d: int) -> tuple:
    """Rows along dim ``d`` (moved last), and the way back."""
    d = d % xf.dim()
    moved = xf.movedim(d, -1)
    mshape = tuple(moved.shape)
    return moved.reshape(-1, mshape[-1]), lambda r: r.reshape(mshape).movedim(-1, d)


def trailing_rows(xf, n: int) -> tuple:
    """Rows of the last ``n`` elements (a flattened normalized_shape), and the way back."""
    shape = tuple(xf.shape)
    return xf.reshape(-1, n), lambda r: r.reshape(shape)


def block_rows(xf, rows: int) -> tuple:
    """``rows`` equal contiguous blocks (groups, planes), and the way back."""
    shape = tuple(xf.shape)
    return xf.reshape(rows, -1), lambda r: r.reshape(shape)


def channel_rows(xf) -> tuple:
    """One row per channel (dim 1), across samples and positions, and the way back."""
    moved = xf.movedim(1, 0)
    mshape = tuple(moved.shape)
    return moved.reshape(mshape[0], -1), lambda r: r.reshape(mshape).movedim(0, 1)


def perm(n: int, gen, device) -> Any:
    return torch.randperm(n, generator=gen).to(device)


# A permutation of all the elements is drawn whole (randperm) up to FULL_PERM elements. Beyond, randperm is the
# evaluation's bottleneck: single-threaded on the CPU (4.9 s for 1e8 elements on a 2-core machine, minutes for the
# 1.9e9 of a 7.5 GB input) and an int64 index 2x the tensor's own fp32 bytes, on the device too. There the order is
# drawn from small permutations instead (``block_permuted``).
FULL_PERM = 1 << 24
PERM_BLOCK = 1 << 16


def flat_permuted(flat, gen) -> Any:
    """A 1-D tensor's elements in a random order from ``gen``: any order when it has at most ``FULL_PERM``
    elements, else ``block_permuted``'s."""
    n = flat.numel()
    if n <= FULL_PERM:
        return flat[perm(n, gen, flat.device)]
    return block_permuted(flat, gen)


def block_permuted(flat, gen, block: int | None = None) -> Any:
    """A copy of 1-D ``flat`` in a random order built from small permutations: its whole blocks of ``block``
    elements in a random order, the elements inside every block in one random order (an element can go to any
    position of the whole blocks), and the tail (fewer than ``block`` elements) in its own random order. Index
    tensors of n / block + block elements, and the gather made a chunk of about ``CHUNK`` elements at a time, so
    the only tensor of the input's size is the result."""
    block = block or PERM_BLOCK
    n = flat.numel()
    m = n // block
    out = torch.empty_like(flat)
    if m:
        head = flat[:m * block].view(m, block)
        rows, cols = perm(m, gen, flat.device), perm(block, gen, flat.device)
        dst = out[:m * block].view(m, block)
        step = max(1, CHUNK // block)
        for a in range(0, m, step):
            dst[a:a + step] = head[rows[a:a + step, None], cols]  # one gather, no chunk of whole rows between
    if n > m * block:
        tail = flat[m * block:]
        out[m * block:] = tail[perm(tail.numel(), gen, flat.device)]
    return out


def permute_rows_and_columns(rows_of: Callable, xf, others: dict, gen, per_column: tuple[str, ...] = ()) -> Any:
    """Rows in any order, and the reduced elements in any order (with their per-element tensors
    ``per_column``, e.g. a norm's weight and bias)."""
    dev = xf.device
    rows, back = rows_of(xf)
    cols = perm(rows.shape[1], gen, dev)
    rows = rows[perm(rows.shape[0], gen, dev)][:, cols]
    for name in per_column:
        if others.get(name) is not None:
            others[name] = others[name].reshape(-1)[cols].reshape(others[name].shape)
    return back(rows)


def permute_channels(xf, others: dict, gen, groups: int | None = None, spatial: bool = True,
                     per_channel: tuple[str, ...] = ("weight", "bias", "running_mean", "running_var")) -> Any:
    """Samples in any order; channels in any order (groups as blocks, then channels inside each
    group, where ``groups`` is given), with their per-channel tensors; spatial positions in any
    order where ``spatial``."""
    dev = xf.device
    n, c = xf.shape[:2]
    xf = xf[perm(n, gen, dev)]
    if groups is not None:
        per = c // groups
        within = torch.stack([perm(per, gen, dev) for _ in range(groups)])
        chans = (perm(groups, gen, dev)[:, None] * per + within).reshape(-1)
    else:
        chans = perm(c, gen, dev)
    xf = xf[:, chans]
    for name in per_channel:
        if others.get(name) is not None:
            others[name] = others[name][chans]
    if spatial and xf.dim() > 2:
        flat = xf.reshape(n, c, -1)
        xf = flat[:, :, perm(flat.shape[2], gen, dev)].reshape(xf.shape)
    return xf
