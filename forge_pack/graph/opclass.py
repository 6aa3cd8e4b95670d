"""What kind of work an ATen op does, as far as fusion is concerned. No torch import.

Names are ATen overload packets without the namespace ("add", "native_group_norm"); a trailing
"_" (in-place) is dropped first. Both spellings of composite ops appear in practice: torch.export
keeps ``group_norm``/``softmax``/``linear`` whole while make_fx and AOT hand out
``native_group_norm``/``_softmax``/``addmm``, so each table lists both.
"""

from __future__ import annotations

from typing import Any

# Views that keep the element order of a contiguous tensor: a fused kernel indexes through them.
VIEW = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "alias", "detach",
                  "getitem", "flatten", "unflatten", "view_as", "expand_as", "_reshape_alias"})
# Views that reorder or cut elements: a region stops at them (the kernel after it sees new strides), except
# a reordering inside a pointwise chain (PERMUTES): a pointwise kernel indexes through it as through any view.
LAYOUT_VIEW = frozenset({"permute", "transpose", "t", "slice", "select", "as_strided", "diagonal", "unfold",
                         "narrow", "split", "split_with_sizes", "unbind", "chunk", "movedim", "swapaxes",
                         "tensor_split", "numpy_T", "mT"})
PERMUTES = frozenset({"permute", "transpose"})
POINTWISE = frozenset({
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "neg", "abs",
    "reciprocal", "sqrt", "rsqrt", "pow", "square", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
    "sin", "cos", "tan", "tanh", "atan", "sigmoid", "erf", "erfinv", "sign", "floor", "ceil", "round", "trunc",
    "frac", "relu", "relu6", "gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "leaky_relu", "hardtanh",
    "hardswish", "hardsigmoid", "logit", "clamp", "clamp_min", "clamp_max", "clip", "where", "masked_fill",
    "maximum", "minimum", "fmax", "fmin", "lerp", "addcmul", "addcdiv", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_not", "logical_and", "logical_or", "logical_xor", "bitwise_not", "bitwise_and", "bitwise_or",
    "bitwise_xor", "isnan", "isinf", "isfinite", "nan_to_num", "_to_copy", "to", "type_as", "clone",
    "contiguous", "copy", "lift_fresh_copy", "fill", "zeros_like", "ones_like", "full_like",
    "dropout", "native_dropout", "_native_batch_norm_legit_no_training", "alias_copy", "view_copy",
    "_conj", "positive", "heaviside", "xlogy", "hypot", "atan2", "copysign", "float_power", "threshold",
    "triu", "tril", "full", "zeros", "ones", "scalar_tensor", "arange", "new_ones", "new_zeros", "new_full",
    "__and__", "__or__", "__xor__", "__invert__",
})
REDUCTION = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "prod", "logsumexp",
    "norm", "linalg_vector_norm", "argmax", "argmin", "any", "all", "softmax", "_softmax", "_safe_softmax",
    "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm", "group_norm", "native_group_norm",
    "rms_norm", "_fused_rms_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
    "instance_norm", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
    "adaptive_avg_pool3d", "_adaptive_avg_pool3d", "adaptive_max_pool2d", "avg_pool1d", "avg_pool2d",
    "avg_pool3d", "max_pool1d", "max_pool2d", "max_pool2d_with_indices", "max_pool3d",
    "max_pool3d_with_indices",
})
MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum",
                    "addbmm", "_addmm_activation", "_scaled_mm", "_int_mm", "_weight_int8pack_mm", "_grouped_mm",
                    "grouped_mm", "_scaled_grouped_mm"})
CONV = frozenset({"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d", "cudnn_convolution", "mkldnn_convolution"})
# Allocations: no values to compute (their contents are undefined until written).
ALLOC = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
# Side-effect-free bookkeeping the exporters leave in a graph: dropped at capture.
BOOKKEEPING = frozenset({"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range",
                         "sym_constrain_range_for_size", "_assert_async", "_functional_assert_async",
                         "_record_function_enter_new", "_record_function_exit", "sym_size", "sym_stride",
                         "sym_numel"})
WINDOW_POOLS = ("avg_pool", "max_pool", "adaptive_max_pool")
BATCH_NORMS = ("batch_norm", "native_batch_norm", "_native_batch_norm_legit", "instance_norm")


def base_name(op: str) -> str:
    """'aten.add_.Tensor' or 'aten::add_' -> 'add'; 'getitem' stays."""
    name = op.replace("::", ".")
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "torch", "_operator", "operator"):
        name = parts[1]
    else:
        name = parts[0]
    if name.endswith("_") and not name.endswith("__"):  # in-place spelling of the same op
        name = name[:-1]
    return name


def is_attention(name: str) -> bool:
    return "scaled_dot_product" in name or name in ("_flash_attention_forward", "_efficient_attention_forward",
                                                    "_cudnn_attention_forward", "flex_attention")


def classify(op: str, args: tuple = (), kwargs: dict | None = None) -> str:
    """One of: view, layout_view, pointwise, reduction, matmul, conv, attention, alloc, bookkeeping, other."""
    name = base_name(op)
    kwargs = kwargs or {}
    if name in BOOKKEEPING:
        return "bookkeeping"
    if name in ALLOC:
        return "alloc"
    if name in VIEW:
        return "view"
    if name in LAYOUT_VIEW:
        return "layout_view"
    if is_attention(name):
        return "attention"
    if name in MATMUL:
        return "matmul"
    if name in CONV:
        return "conv"
    if name in ("max", "min") and len(args) >= 2 and _is_tensor_ref(args[1]):
        return "pointwise"  # max(a, b) elementwise
    if name in ("batch_norm", "native_batch_norm", "_native_batch_norm_legit") and not _bn_training(name, args, kwargs):
        return "pointwise"  # inference batch_norm: a per-channel affine map, nothing is reduced
    if name == "instance_norm" and len(args) > 5 and not args[5]:
        return "pointwise"  # use_input_stats False: the running statistics' per-channel affine map
    if name in POINTWISE:
        return "pointwise"
    if name in REDUCTION:
        return "reduction"
    return "other"


def _is_tensor_ref(a: Any) -> bool:
    return type(a).__name__ == "Node"


def _bn_training(name: str, args: tuple, kwargs: dict) -> bool:
    if name == "_native_batch_norm_legit":
        return bool(args[5]) if len(args) > 5 else bool(kwargs.get("training", True))
    # batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn)
    # native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return bool(args[5]) if len(args) > 5 else bool(kwargs.get("training", False))


def reduction_domain(op: str, args: tuple, kwargs: dict, shape: tuple[int, ...],
                     strides: tuple[int, ...], out_numel: int) -> tuple[str, tuple[int, ...], tuple]:
    """(kind, reduced dims, extra) of a reduction on an input of this shape and strides.

    kind: "row" (the reduced dims are the innermost in memory), "strided" (reduced dims are
    outer, e.g. channels of NCHW or a channels_last spatial mean), "group" (group_norm),
    "global" (everything is reduced), "window" (pooling with a window smaller than the input)."""
    name = base_name(op)
    nd = len(shape)
    extra: tuple = ()
    if name in ("group_norm", "native_group_norm"):
        groups = args[1] if name == "group_norm" else args[6]
        return "group", tuple(range(1, nd)), (int(groups),)
    if name.startswith(WINDOW_POOLS) or name.startswith(("avg_pool", "max_pool")):
        return "window", tuple(range(2, nd)), tuple(_jsonable(a) for a in args[1:])
    if name.startswith(("adaptive_avg_pool", "_adaptive_avg_pool")):
        size = tuple(args[1]) if len(args) > 1 else ()
        if any(s != 1 for s in size):
            return "window", tuple(range(2, nd)), size
        dims = tuple(range(nd - len(size), nd))
    elif name in ("softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax"):
        dims = (int(args[1]) % nd,) if nd else ()
    elif name in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"):
        k = len(args[1])
        dims = tuple(range(nd - k, nd))
    elif name == "instance_norm":  # each (sample, channel) plane by its own statistics
        dims = tuple(range(2, nd))
    elif name in BATCH_NORMS:
        dims = tuple(d for d in range(nd) if d != 1)
    else:
        dim = kwargs.get("dim", args[1] if len(args) > 1 and _dim_like(args[1]) else None)
        if dim is None or dim == [] or dim == ():
            dims = tuple(range(nd))
        elif isinstance(dim, (list, tuple)):
            dims = tuple(sorted(int(d) % nd for d in dim))
        else:
            dims = (int(dim) % nd,)
    if out_numel == 1 or set(dims) >= {d for d in range(nd) if shape[d] != 1}:
        return "global", tuple(dims), extra
    return ("row" if _innermost(dims, shape, strides) else "strided"), tuple(dims), extra


def _dim_like(a: Any) -> bool:
    return a is None or isinstance(a, int) and not isinstance(a, bool) or (
        isinstance(a, (list, tuple)) and all(isinstance(d, int) for d in a))


def _innermost(dims: tuple[int, ...], shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether the reduced dims are the fastest-moving ones in memory (size-1 dims do not count)."""
    live = [d for d in range(len(shape)) if shape[d] != 1]
    order = sorted(live, key=lambda d: (strides[d], -d))  # fastest first
    reduced = [d for d in dims if shape[d] != 1]
    return set(order[:len(reduced)]) == set(reduced)


def _jsonable(a: Any) -> Any:
    if isinstance(a, (list, tuple)):
        return [_jsonable(x) for x in a]
    if isinstance(a, (int, float, bool, str)) or a is None:
        return a
    return str(a)
