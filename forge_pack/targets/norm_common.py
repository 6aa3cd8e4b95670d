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


def normalized_size(params: dict, shape: tuple) -> int:
    n = 1
    for s in params.get("normalized_shape") or shape[-1:]:
        n *= int(s)
    return n


def row_size_vars(sig) -> dict:
    cols = normalized_size(dict(sig.params), sig.x.shape)
    return {"rows": sig.x.numel // max(cols, 1), "cols": cols}


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
