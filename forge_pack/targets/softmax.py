"""softmax and log_softmax over one dimension (targeted: the last, contiguous input)."""

from __future__ import annotations

from functools import partial

from .call_args import bind, implicit_dim, is_tensor
from .dtypes import name_of, torch_dtype
from .inputs import dim_rows, permute_rows_and_columns
from .lazy_torch import torch
from .spec import TargetSpec, Tolerance, function_paths


def _binder(style: str, args: tuple, kwargs: dict):
    # Only F.softmax has _stacklevel before dtype; torch.softmax(x, dim, dtype) and
    # Tensor.softmax(dim, dtype) take dtype third.
    names = ("input", "dim", "_stacklevel", "dtype") if style == "F" else ("input", "dim", "dtype")
    b = bind(names, {"dim": None, "dtype": None, "_stacklevel": 3}, args, kwargs)
    if b is None or not is_tensor(b["input"]):
        return None
    x, dim, dtype = b["input"], b["dim"], b["dtype"]
    if (dim is not None and not isinstance(dim, int)) or (dtype is not None and not isinstance(dtype, torch.dtype)):
        return None
    nd = x.dim()
    if dim is None:
        dim = implicit_dim(nd)
    elif dim < 0:
        dim = dim + nd
    return {"x": x}, {"dim": dim, "dtype": name_of(dtype) if dtype is not None else None}


def _supports(sig) -> str | None:
    x = sig.x
    if sig.param("dim") != len(x.shape) - 1:
        return "softmax over a dimension other than the last"
    if not x.is_contiguous:
        return "non-contiguous input"
    return None


def _size_vars(sig) -> dict:
    cols = sig.x.shape[-1] if sig.x.shape else 1
    return {"rows": sig.x.numel // max(cols, 1), "cols": cols}


def _rows(params: dict, xf):
    return dim_rows(xf, params["dim"])


def _permute(params: dict, xf, others: dict, gen):
    return permute_rows_and_columns(lambda v: _rows(params, v), xf, others, gen)


def _odd_shapes(sig) -> list:
    shape = sig.x.shape
    out = [((37,) + shape[-1:], False)]
    if shape[-1] > 2:
        out.append(((3, shape[-1] - 1), False))
    return out


def _complete(kwargs: dict):
    x, dim = kwargs["input"], kwargs.get("dim")
    if dim is not None and not -x.dim() <= int(dim) < max(x.dim(), 1):
        return f"dim={dim} is out of range for a {x.dim()}-d tensor", "dim=-1 is the last dim"
    return None


# The two kinds differ only in the PyTorch function they name: the reference and eager call take
# that name as their first argument (bound with partial below), so they are ordinary module
# functions that run when called, not closures made once while the module is imported.
def _reference(name: str, params, t, lookup):
    return lookup("torch", name)(t["x"], params["dim"])


def _eager(name: str, params, out_dtype, lookup):
    fn = lookup("torch", name)
    dim, dt = params["dim"], torch_dtype(params["dtype"]) if params.get("dtype") else None
    return lambda t: fn(t["x"], dim, dtype=dt)


# What both kinds share. Built at module level like every kind's spec (no factory function run
# once at import): the functions it names are the code, and they run when called.
_COMMON = dict(
    tensors=("x",), scalars=(), params=("dim", "dtype"), own_params=(), size_vars=_size_vars, supports=_supports,
    draws={}, adversarial=("large", "neg_inf_rows", "constant"), rows=_rows, permute=_permute,
    odd_shapes=_odd_shapes, bind=_binder, complete=_complete)

SOFTMAX = TargetSpec(
    name="softmax", float64_reference=partial(_reference, "softmax"), eager_call=partial(_eager, "softmax"),
    call_paths=function_paths("softmax", "softmax", True, ("Softmax",)), **_COMMON,
    doc="out[r, c] = exp(x[r, c] - max_c x[r, :]) / sum_c exp(x[r, :] - max), over the last dim; "
    "x is contiguous [rows, cols]; out has the output dtype (it may differ from x's, e.g. bf16 in, "
    "fp32 out); the math is done in fp32.",
    tolerances={
        # Probabilities are in [0, 1] and often ~1/cols (tiny for long rows): a generic atol would
        # let an all-zero output pass, so atol only forgives values below 1e-8.
        "float32": Tolerance(1e-8, 1e-4, "probabilities ~1/cols can be tiny: only values below "
                                         "1e-8 may be absolutely off; fp32 sum order ~1e-7 relative"),
        "bfloat16": Tolerance(1e-8, 1.6e-2, "probabilities ~1/cols can be tiny; bf16 keeps 8 "
                                            "significant bits down to 1e-38, so relative error rules"),
        "float16": Tolerance(6e-8, 2e-3, "probabilities below 6e-5 are fp16 subnormals spaced "
                                         "6e-8 apart: one step absolute, else two ulps relative"),
    })

LOG_SOFTMAX = TargetSpec(
    name="log_softmax", float64_reference=partial(_reference, "log_softmax"),
    eager_call=partial(_eager, "log_softmax"),
    call_paths=function_paths("log_softmax", "log_softmax", True, ("LogSoftmax",)), **_COMMON,
    doc="out[r, c] = x[r, c] - max - log(sum_c exp(x[r, :] - max)) over the last dim; x contiguous "
    "[rows, cols]; fp32 math.",
    tolerances={
        # log-probabilities are large negative numbers: relative error rules, atol for values near 0.
        "float32": Tolerance(1e-5, 1e-5, "x - max - log(sum): one fp32 rounding of the "
                                         "log-sum-exp, relative to |out|"),
    })

SPECS = (SOFTMAX, LOG_SOFTMAX)
