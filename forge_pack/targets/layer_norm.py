"""layer_norm over a trailing normalized_shape (targeted: contiguous tensors, and an x whose rows are each
contiguous at up to two strides, norm_common.row_layout)."""

from __future__ import annotations

from . import norm_common
from .call_args import bind, is_number, shape_list
from .spec import Draw, TargetSpec, Tolerance, function_paths


def _binder(style: str, args: tuple, kwargs: dict):
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    if style == "torch":
        names = names + ("cudnn_enable",)  # torch.layer_norm's extra flag: no effect on the result
    b = bind(names, {"weight": None, "bias": None, "eps": 1e-5, "cudnn_enable": True}, args, kwargs)
    if b is None or not is_number(b["eps"]) or shape_list(b["normalized_shape"]) is None:
        return None
    return ({"x": b["input"], "weight": b["weight"], "bias": b["bias"]},
            {"normalized_shape": shape_list(b["normalized_shape"]), "eps": float(b["eps"])})


def _reference(params, t, lookup):
    x, shape = t["x"], tuple(params["normalized_shape"])
    if norm_common.normalized_size(params, tuple(x.shape)) < norm_common.LONG_ROW:
        return lookup("torch.nn.functional", "layer_norm")(x, shape, t.get("weight"), t.get("bias"), params["eps"])
    y = norm_common.normalize_rows64(x, tuple(range(-len(shape), 0)), params["eps"])
    return norm_common.affine_(y, t.get("weight"), t.get("bias"))


def _eager(params, out_dtype, lookup):
    fn = lookup("torch.nn.functional", "layer_norm")
    shape, eps = tuple(params["normalized_shape"]), params["eps"]
    return lambda t: fn(t["x"], shape, t.get("weight"), t.get("bias"), eps)


LAYER_NORM = TargetSpec(
    name="layer_norm", tensors=("x", "weight", "bias"), scalars=("eps",), params=("normalized_shape", "eps"),
    own_params=(),
    doc="out[r, c] = (x[r, c] - mean_r) * rsqrt(var_r + eps) * weight[c] + bias[c]; biased variance "
        "over the last `cols` elements; x [rows, cols], each row contiguous, row r starting at element "
        "(r / x_inner) * x_so + (r % x_inner) * x_si (contiguous x: x_si = cols); out contiguous; "
        "weight/bias may be absent.",
    size_vars=norm_common.row_size_vars, supports=norm_common.row_inputs, float64_reference=_reference,
    eager_call=_eager,
    tolerances={"bfloat16": Tolerance(1.6e-2, 1.6e-2, "unit-scale outputs rounded to bf16")},
    draws={"weight": Draw(0.2, 1.0), "bias": Draw(0.2)}, adversarial=("large", "offset", "constant"),
    rows=norm_common.rows, permute=norm_common.permute, odd_shapes=norm_common.row_odd_shapes,
    call_paths=function_paths("layer_norm", "layer_norm", False, ("LayerNorm",)), bind=_binder,
    complete=norm_common.default_normalized_shape)

SPECS = (LAYER_NORM,)
