"""rms_norm: F.rms_norm / nn.RMSNorm, and an RMSNorm module written as eager ops ("composite":
Llama, Gemma and Qwen write x * rsqrt(mean(x^2) + eps) * (weight + offset) in their forward)."""

from __future__ import annotations

from . import norm_common
from .call_args import bind, is_number, is_tensor, shape_list
from .dtypes import torch_dtype
from .lazy_torch import torch
from .spec import Draw, TargetSpec, Tolerance, function_paths


def default_eps(dtype) -> float:
    """F.rms_norm's eps=None: the machine epsilon of the dtype it computes in (float32 for half and
    bfloat16 inputs, float64 for float64), as PyTorch does; not the input dtype's own."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def _binder(style: str, args: tuple, kwargs: dict):
    b = bind(("input", "normalized_shape", "weight", "eps"), {"weight": None, "eps": None}, args, kwargs)
    if b is None or not is_tensor(b["input"]) or shape_list(b["normalized_shape"]) is None:
        return None
    eps = b["eps"]
    if eps is None:
        if not b["input"].is_floating_point():
            return None
        eps = default_eps(b["input"].dtype)
    if not is_number(eps):
        return None
    return ({"x": b["input"], "weight": b["weight"]},
            {"normalized_shape": shape_list(b["normalized_shape"]), "eps": float(eps), "weight_offset": 0.0,
             "composite": False})


# Attribute names model code gives an RMSNorm module's epsilon (Llama: variance_epsilon).
EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


def module_eps(module) -> float | None:
    """The epsilon of an RMSNorm module written as eager ops, else None."""
    for name in EPS_ATTRS:
        v = getattr(module, name, None)
        if is_number(v):
            return float(v)
    return None


def _module_binder(module, args: tuple, kwargs: dict):
    """A composite module's call ``module(x)``: (tensors, the params it is matched on), or None."""
    if len(args) != 1 or kwargs or not is_tensor(args[0]):
        return None
    eps = module_eps(module)
    if eps is None:
        return None
    return {"x": args[0], "weight": getattr(module, "weight", None)}, {"eps": eps}


def composite_rms_norm(x, weight, eps: float, offset: float, out_dtype=None):
    """An RMSNorm written as eager ops, the way model code (Llama, Gemma, Qwen) writes it."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        out = y
    elif offset:
        out = y * (offset + weight.float())  # Gemma-style: scale by (1 + w) in fp32
    else:
        out = weight * y.to(x.dtype)  # Llama-style: cast back, then scale
    return out.to(out_dtype or x.dtype)


def _reference(params, t, lookup):
    x = t["x"]
    dims = tuple(range(-len(params["normalized_shape"]), 0))
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + params["eps"])
    w = t.get("weight")
    return y if w is None else y * (w + params.get("weight_offset", 0.0))


def _eager(params, out_dtype, lookup):
    shape, eps, off = tuple(params["normalized_shape"]), params["eps"], params.get("weight_offset", 0.0)
    if not params.get("composite"):
        fn = lookup("torch.nn.functional", "rms_norm")
        return lambda t: fn(t["x"], shape, t.get("weight"), eps)
    dt = torch_dtype(out_dtype) if out_dtype else None
    return lambda t: composite_rms_norm(t["x"], t.get("weight"), eps, off, dt)


RMS_NORM = TargetSpec(
    name="rms_norm", tensors=("x", "weight"), scalars=("eps", "weight_offset"),
    params=("normalized_shape", "eps", "weight_offset", "composite"), own_params=("weight_offset", "composite"),
    doc="out[r, c] = x[r, c] * rsqrt(mean_c x[r, :]^2 + eps) * (weight[c] + weight_offset); x "
        "contiguous [rows, cols]; fp32 math; weight may be absent (then the factor is 1).",
    size_vars=norm_common.row_size_vars, supports=norm_common.contiguous_inputs, float64_reference=_reference,
    eager_call=_eager,
    tolerances={"bfloat16": Tolerance(1.6e-2, 1.6e-2, "unit-scale outputs rounded to bf16")},
    draws={"weight": Draw(0.2, 1.0)}, adversarial=("large", "offset", "constant"),
    rows=norm_common.rows, permute=norm_common.permute, odd_shapes=norm_common.row_odd_shapes,
    call_paths=function_paths("rms_norm", "rms_norm", False, ("RMSNorm",)), bind=_binder,
    bind_module=_module_binder, complete=norm_common.default_normalized_shape)

SPECS = (RMS_NORM,)
