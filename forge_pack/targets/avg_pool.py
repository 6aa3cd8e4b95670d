"""adaptive_avg_pool2d to (1, 1): the global average pool closing CNN backbones."""

from __future__ import annotations

from . import layouts
from .call_args import bind, is_tensor
from .inputs import block_rows, permute_channels
from .lazy_torch import F
from .spec import TargetSpec, Tolerance, function_paths


def _binder(style: str, args: tuple, kwargs: dict):
    b = bind(("input", "output_size"), {}, args, kwargs)
    if b is None or not is_tensor(b["input"]) or b["input"].dim() < 2:
        return None
    x, size = b["input"], b["output_size"]
    if isinstance(size, int):
        size = (size, size)
    if not isinstance(size, (list, tuple)) or len(size) != 2:
        return None
    out = []
    for i, s in enumerate(size):
        if s is None:
            out.append(int(x.shape[-2 + i]))
        elif isinstance(s, int):
            out.append(int(s))
        else:
            return None
    return {"x": x}, {"output_size": out}


def _supports(sig) -> str | None:
    why = layouts.nchw_support(sig, "adaptive_avg_pool2d")
    if why is None and tuple(sig.param("output_size") or ()) != (1, 1):
        return "only output size (1, 1) is targeted"
    return why


def _reference(params, t, lookup):
    return lookup("torch.nn.functional", "adaptive_avg_pool2d")(t["x"], tuple(params["output_size"]))


def _eager(params, out_dtype, lookup):
    fn = lookup("torch.nn.functional", "adaptive_avg_pool2d")
    size = tuple(params["output_size"])
    return lambda t: fn(t["x"], size)


def _magnitude(tensors: dict):
    """A mean of large values of both signs cancels: its fp32 rounding error scales with mean |x|,
    not with the small result, so eager's error on other outputs of the same mean |x| is the fair
    allowance (bucketed by |reference| instead, a near-zero mean of a large-value row met only the
    allowance of the rare near-zero outputs, and an honest kernel summing in another order failed
    about one random set in ten)."""
    return F.adaptive_avg_pool2d(tensors["x"].double().abs(), 1)


def _rows(params: dict, xf):
    return block_rows(xf, xf.shape[0] * xf.shape[1])  # one row per pooled plane


def _permute(params: dict, xf, others: dict, gen):
    return permute_channels(xf, others, gen, spatial=False)  # pooling keeps its spatial layout


def _complete(kwargs: dict):
    if kwargs.get("output_size") is None:
        kwargs["output_size"] = [1, 1]
    return None


AVG_POOL = TargetSpec(
    name="adaptive_avg_pool2d", tensors=("x",), scalars=(), params=("output_size",), own_params=(),
    doc="output size (1, 1): out[n, c] = mean over H*W of x[n, c]; x [N, C, H, W] contiguous "
        "or channels_last (`channels_last` = 1); out is [N, C, 1, 1] (contiguous memory "
        "order n*C + c in both cases).",
    size_vars=layouts.nchw_size_vars, supports=_supports, float64_reference=_reference, eager_call=_eager,
    tolerances={
        # means of unit-scale values are ~N(0, 1/HW): small values with full relative precision.
        "float32": Tolerance(1e-6, 1e-4, "a mean of HW fp32 values: sum order only"),
    },
    draws={}, adversarial=("large",), rows=_rows, permute=_permute, odd_shapes=layouts.nchw_odd_shapes,
    call_paths=function_paths("adaptive_avg_pool2d", None, False, ("AdaptiveAvgPool2d",)), bind=_binder,
    magnitude=_magnitude, complete=_complete)

SPECS = (AVG_POOL,)
