"""batch_norm in inference (running statistics), on [N, C, H, W] contiguous or channels_last."""

from __future__ import annotations

from . import layouts
from .call_args import bind, is_number
from .inputs import channel_rows, permute_channels
from .spec import Draw, TargetSpec, function_paths


def _binder(style: str, args: tuple, kwargs: dict):
    if style == "torch":
        b = bind(("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
                  "cudnn_enabled"), {}, args, kwargs)
    else:
        b = bind(("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
                 {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}, args, kwargs)
    if b is None or b["training"] or b["running_mean"] is None or b["running_var"] is None or not is_number(b["eps"]):
        return None  # training mode updates running statistics: never targeted
    return ({"x": b["input"], "running_mean": b["running_mean"], "running_var": b["running_var"],
             "weight": b["weight"], "bias": b["bias"]}, {"eps": float(b["eps"]), "training": False})


def _supports(sig) -> str | None:
    why = layouts.nchw_support(sig, "batch_norm")
    if why is None and sig.param("training"):
        return "batch_norm in training mode is not targeted"
    return why


def _reference(params, t, lookup):
    return lookup("torch.nn.functional", "batch_norm")(t["x"], t["running_mean"], t["running_var"], t.get("weight"),
                                                       t.get("bias"), False, 0.0, params["eps"])


def _eager(params, out_dtype, lookup):
    fn = lookup("torch.nn.functional", "batch_norm")
    eps = params["eps"]
    return lambda t: fn(t["x"], t["running_mean"], t["running_var"], t.get("weight"), t.get("bias"), False, 0.0, eps)


def _rows(params: dict, xf):
    return channel_rows(xf)


def _permute(params: dict, xf, others: dict, gen):
    return permute_channels(xf, others, gen)


def _complete(kwargs: dict):
    if kwargs.get("running_mean") is None or kwargs.get("running_var") is None:
        return ("batch_norm needs running_mean and running_var tensors",
                "e.g. 'x: f32[32,64,56,56], running_mean: f32[64], running_var: f32[64]'")
    return None


BATCH_NORM = TargetSpec(
    name="batch_norm", tensors=("x", "running_mean", "running_var", "weight", "bias"), scalars=("eps",),
    params=("eps", "training", "momentum"), own_params=(),
    doc="inference: out[n, c, hw] = (x - running_mean[c]) * rsqrt(running_var[c] + eps) * weight[c] "
        "+ bias[c]; x is [N, C, H, W] either contiguous (NCHW) or channels_last (NHWC in memory, "
        "the size variable `channels_last` is 1); out has x's layout.",
    size_vars=layouts.nchw_size_vars, supports=_supports, float64_reference=_reference, eager_call=_eager,
    tolerances={},
    draws={"running_mean": Draw(0.2), "running_var": Draw(0.2, 1.0, positive_floor=0.05),  # a variance is positive
           "weight": Draw(0.2, 1.0), "bias": Draw(0.2)},
    adversarial=("large",), rows=_rows, permute=_permute, odd_shapes=layouts.nchw_odd_shapes,
    call_paths=function_paths("batch_norm", "batch_norm", False, ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d")),
    bind=_binder, complete=_complete)

SPECS = (BATCH_NORM,)
