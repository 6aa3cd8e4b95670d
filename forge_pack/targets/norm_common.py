"""What the row norms (layer_norm, rms_norm) and the channel norms (group_norm, batch_norm) share:
applicability on contiguous tensors, size variables over a trailing normalized_shape, odd sizes."""

from __future__ import annotations

from .inputs import permute_rows_and_columns, trailing_rows


def contiguous_inputs(sig) -> str | None:
    if not sig.x.is_contiguous:
        return "non-contiguous input"
    for name, spec in sig.inputs[1:]:
        if spec is not None and not spec.is_contiguous:
            return f"non-contiguous {name}"
    return None


def row_layout(sig) -> tuple[int, int, int] | None:
    """Where a row norm's rows of x start, for an x whose normalized (trailing) dims are contiguous:
    (inner, s_outer, s_inner) with row r at element (r // inner) * s_outer + (r % inner) * s_inner,
    i.e. the leading dims merged into at most two strided dims whose rows do not overlap. A
    contiguous x is (rows, rows * cols, cols). None when the rows need more than two strides (or
    overlap, or a row itself is strided)."""
    x = sig.x
    ncols = len(sig.param("normalized_shape") or [0])
    lead_shape, lead_strides = x.shape[:len(x.shape) - ncols], x.strides[:len(x.shape) - ncols]
    tail_shape, tail_strides = x.shape[len(x.shape) - ncols:], x.strides[len(x.shape) - ncols:]
    want = 1  # the normalized dims packed: each stride the product of the sizes after it
    for size, stride in reversed(list(zip(tail_shape, tail_strides))):
        if size != 1 and stride != want:
            return None
        want *= size
    cols = normalized_size(dict(sig.params), x.shape)
    dims: list[list[int]] = []
    for size, stride in zip(lead_shape, lead_strides):
        if size == 1:
            continue
        if dims and dims[-1][1] == size * stride:  # merges with the dim before it
            dims[-1] = [dims[-1][0] * size, stride]
        else:
            dims.append([size, stride])
    if not dims:
        return 1, cols, cols
    if len(dims) == 1:
        (n, s), = dims
        return (n, n * s, s) if s >= cols else None
    if len(dims) > 2:
        return None
    (a, sa), (b, sb) = dims
    inner_fits = sb >= cols and sa >= b * sb  # inner rows inside each outer step
    outer_fits = sa >= cols and sb >= a * sa  # outer rows interleaved inside each inner step (a transposed view)
    return (b, sa, sb) if inner_fits or outer_fits else None


def row_inputs(sig) -> str | None:
    """A row norm's x may be strided (e.g. a transposed view whose rows are each contiguous, as
    torchvision's ViT hands its encoder norm): the strided_row families read it in place."""
    if not sig.x.is_contiguous and row_layout(sig) is None:
        return "non-contiguous input whose rows need more than two strides"
    for name, spec in sig.inputs[1:]:
        if spec is not None and not spec.is_contiguous:
            return f"non-contiguous {name}"
    return None


def normalized_size(params: dict, shape: tuple) -> int:
    n = 1
    for s in params.get("normalized_shape") or shape[-1:]:
        n *= int(s)
    return n


def row_size_vars(sig) -> dict:
    cols = normalized_size(dict(sig.params), sig.x.shape)
    rows = sig.x.numel // max(cols, 1)
    inner, s_outer, s_inner = row_layout(sig) or (rows, rows * cols, cols)
    # x_inner / x_so / x_si: where row r starts (row_layout); only the strided_row families read them
    return {"rows": rows, "cols": cols, "x_inner": inner, "x_so": s_outer, "x_si": s_inner}


# A float64 reference whose normalised rows (layer_norm's rows, group_norm's groups) are at least this
# long is computed from torch's reductions (``var_mean``), not from the op's fused kernel: that kernel
# gives each row one thread block, so a few huge rows (KernelBench's layer_norm: 16 rows of 4M; a
# reference computed in slices of two rows) took ~90 ms per 0.3 GB on an H100, where a reduction
# splits each row over many blocks. Shorter rows keep the fused kernel (many rows fill the GPU).
LONG_ROW = 1 << 15


def normalize_rows64(x, dims: tuple, eps: float):
    """(x - mean) * rsqrt(var + eps) over ``dims`` (the biased variance), x float64: the normalisation
    the fused kernels compute, as two reductions and two passes."""
    from .lazy_torch import torch

    var, mean = torch.var_mean(x, dim=dims, correction=0, keepdim=True)
    return (x - mean).mul_(torch.rsqrt(var.add_(eps)))


def affine_(y, weight, bias, shape: tuple | None = None):
    """y * weight + bias in place, each absent one skipped, both viewed as ``shape`` when given (one value per
    channel for group_norm; layer_norm's broadcast over the trailing dims as they are)."""
    if weight is not None:
        y.mul_(weight if shape is None else weight.view(shape))
    return y if bias is None else y.add_(bias if shape is None else bias.view(shape))


def rows(params: dict, xf):
    return trailing_rows(xf, normalized_size(params, tuple(xf.shape)))


def permute(params: dict, xf, others: dict, gen):
    return permute_rows_and_columns(lambda v: rows(params, v), xf, others, gen, per_column=("weight", "bias"))


def row_odd_shapes(sig) -> list:
    ncols = len(sig.param("normalized_shape") or [0])
    return [((37,) + sig.x.shape[len(sig.x.shape) - ncols:], False)]


def default_normalized_shape(kwargs: dict):
    if kwargs.get("normalized_shape") is None:
        kwargs["normalized_shape"] = [kwargs["input"].shape[-1]]
    return None
