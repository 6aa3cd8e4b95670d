"""A region's canonical form lowered to what a kernel skeleton needs. Pure Python, no torch import.

The result (``Program``) is an iteration space, the reductions over its trailing dims in the order
they must run, and one expression per reduction element and for the output, each over *leaves*:
an input read at strides over the iteration space, or an earlier reduction's per-row result.
The C text of every expression comes from a small table of ATen ops (``_POINTWISE``); the
composites (softmax, log_softmax, layer_norm, group_norm, inference batch_norm) expand into
reductions and pointwise ops here. An op outside the table makes ``lower`` raise ``Uncovered``,
whose message is the "not covered: <op>" text the report shows.

How indexing is found: every value carries, per leaf, the strides at which that leaf is read
over the value's own shape, exactly as torch computes a view's strides (broadcasting gives stride
0; ``view``/``reshape`` use ``view_strides``, torch's rule). A group_norm reads its input as
[N, G, C/G, HW], which is not a view of [N, C, H, W] for every leaf (the per-group statistics), so
a value may be indexed in another *space* than its shape: one with the same elements in the same
order. At the end, every leaf is read over the iteration space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
HALF = ("float16", "bfloat16")


class Uncovered(Exception):
    """The region holds something the generated kernels do not compute; str() says what."""


@dataclass(frozen=True)
class Leaf:
    source: tuple  # ("in", k) | ("red", j)
    strides: tuple[int, ...]  # over the space of the value that holds it


@dataclass
class Val:
    shape: tuple[int, ...]
    space: tuple[int, ...]  # the shape its leaves are indexed over (== shape unless re-spaced)
    expr: str  # C float expression; {i} is the i-th leaf
    leaves: list[Leaf]
    dtype: str
    # the value is representable in ``dtype`` (an input read in its dtype, or a value just rounded to
    # it): an op that picks or negates such values (relu, max, abs ...) needs no rounding of its own
    exact: bool = False


@dataclass
class Reduction:
    combine: str  # "sum" | "max" | "min"
    val: Val  # the element value, over the iteration space
    scale: float = 1.0  # applied to the accumulated value (mean: 1 / count)
    post: str = "{0}"  # C expression of the scaled result (e.g. var -> var / (n - correction))


@dataclass(frozen=True)
class Window:
    """A 2-d pooling window over the last two dims of ``in_shape`` (PyTorch's rules).

    Output position o of a spatial dim reads the input rows of its window: max, from o * stride -
    pad in steps of ``dilation`` (k of them) clipped to the input (padding counts as -inf: it
    never wins); avg, o * stride - pad .. + k clipped to the input, the sum divided by
    ``divisor`` when set, else by the window's size counted up to the padded edge
    (``count_include_pad``) or by its in-bounds elements; adaptive, floor(o * H / OH) ..
    ceil((o + 1) * H / OH), the mean of those."""

    mode: str  # "max" | "avg" | "adaptive"
    in_shape: tuple[int, ...]  # the pooled value: lead dims, then H, W
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    count_include_pad: bool = True
    divisor: int = 0  # avg_pool2d's divisor_override (0: none)


@dataclass
class Program:
    kind: str  # "pointwise" | "row" | "window"
    space: tuple[int, ...]  # the iteration space
    nred: int  # trailing dims of ``space`` reduced (0 for pointwise)
    reductions: list[Reduction]
    out: Val  # over ``space`` (per element) or, ``per_row``, over the rows
    out_strides: tuple[int, ...]  # the output's strides over ``space`` (0 on reduced dims when per_row)
    input_dtypes: tuple[str, ...]
    out_dtype: str
    per_row: bool = False  # the output has one element per row (a reduction result with its epilogue)
    ops: tuple[str, ...] = field(default_factory=tuple)
    # window kind: the pooling; ``space`` is then the pooled output's shape, each reduction's value
    # is over ``window.in_shape`` and its result (one per output element) a leaf of ``out``
    window: Window | None = None
    # the output's dims in ``space`` order (space dim k is output dim out_perm[k]) where the reduction moved its
    # dims last (a norm over channels of NCHW: rows over N, H, W, columns over C); None: the output's own order
    out_perm: tuple[int, ...] | None = None

    @property
    def rows(self) -> int:
        return _prod(self.space[:len(self.space) - self.nred])

    @property
    def cols(self) -> int:
        return _prod(self.space[len(self.space) - self.nred:])

    @property
    def numel(self) -> int:
        return _prod(self.space)


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


def contiguous(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


# ------------------------------------------------------------------ strides of views


def view_strides(shape, strides, new_shape) -> tuple[int, ...] | None:
    """Strides of ``new_shape`` viewing a tensor of (shape, strides) without a copy; None when no
    view exists (torch's ``computeStride``: dims are matched in chunks of equal element count)."""
    shape, strides, new_shape = list(shape), list(strides), list(new_shape)
    if _prod(shape) != _prod(new_shape):
        return None
    if _prod(shape) == 0:
        return contiguous(new_shape)
    out = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = strides[-1] if strides else 1
    tensor_numel, view_numel = 1, 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                out[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = strides[d - 1]
                tensor_numel, view_numel = 1, 1
    if view_d != -1:
        return None
    return tuple(out)


def expand_strides(shape, strides, new_shape) -> tuple[int, ...] | None:
    """Strides of (shape, strides) broadcast to ``new_shape``; None when it does not broadcast."""
    lead = len(new_shape) - len(shape)
    if lead < 0:
        return None
    out = [0] * lead
    for s, st, n in zip(shape, strides, new_shape[lead:]):
        if s == n:
            out.append(st if n != 1 else 0)
        elif s == 1:
            out.append(0)
        else:
            return None
    return tuple(out)


def broadcast_shape(*shapes) -> tuple[int, ...]:
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(nd):
        sizes = {s[i - nd + len(s)] for s in shapes if i - nd + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise Uncovered(f"shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


# ------------------------------------------------------------------ values


def _shift(expr: str, off: int, n: int) -> str:
    return expr.format(*["{%d}" % (i + off) for i in range(n)]) if off else expr


def _const(v: Any) -> str:
    if isinstance(v, dict) and "float" in v:
        v = float(v["float"])
    if isinstance(v, bool):
        return "1.0f" if v else "0.0f"
    if isinstance(v, (int, float)):
        f = float(v)
        if f != f:
            return "FP_NAN"
        if math.isinf(f):
            return "FP_INF" if f > 0 else "(-FP_INF)"
        return f"((float){f!r})"
    raise Uncovered(f"a constant argument {v!r}")


def _is_ref(a) -> bool:
    return isinstance(a, dict) and ("in" in a or "n" in a)


def _promote(*dtypes: str) -> str:
    floats = [d for d in dtypes if d in FLOAT_DTYPES]
    if not floats:
        return "float32"  # integer / bool arithmetic is done in float here: the result is float
    for d in ("float64", "float32"):
        if d in floats:
            return d
    return floats[0] if len(set(floats)) == 1 else "float32"


def _rounded(expr: str, dtype: str) -> str:
    """A value of a 16-bit dtype is rounded to it, as eager rounds after every op."""
    if dtype == "bfloat16":
        return f"fp_round_bf16({expr})"
    if dtype == "float16":
        return f"fp_round_f16({expr})"
    return expr


def _combine(template: str, vals: list[Val], dtype: str, shape: tuple[int, ...] | None = None) -> Val:
    """A pointwise op over ``vals`` (broadcast to one shape): ``template`` uses {a0}, {a1} ..."""
    out_shape = shape if shape is not None else broadcast_shape(*[v.shape for v in vals])
    spaces = {v.space for v in vals if v.space != v.shape}
    if len(spaces) > 1:
        raise Uncovered("values indexed in two different spaces")
    space = spaces.pop() if spaces else out_shape
    if space != out_shape and _prod(space) != _prod(out_shape):
        raise Uncovered("a re-spaced value broadcast")
    leaves: list[Leaf] = []
    parts = []
    for v in vals:
        moved = []
        for leaf in v.leaves:
            if v.space != v.shape:  # already in ``space`` with shape == out shape (checked above)
                if v.shape != out_shape:
                    raise Uncovered("a re-spaced value broadcast")
                moved.append(leaf)
                continue
            st = expand_strides(v.shape, leaf.strides, out_shape)
            if st is None:
                raise Uncovered(f"shape {v.shape} does not broadcast to {out_shape}")
            if space != out_shape:
                st = view_strides(out_shape, st, space)
                if st is None:
                    raise Uncovered("an operand cannot be indexed in its partner's space")
            moved.append(Leaf(leaf.source, st))
        parts.append("(" + _shift(v.expr, len(leaves), len(v.leaves)) + ")")
        leaves.extend(moved)
    expr = template.format(**{f"a{i}": p for i, p in enumerate(parts)})
    if not (template in _EXACT and all(v.exact and v.dtype == dtype for v in vals)):
        expr = _rounded(expr, dtype)
    return Val(out_shape, space, expr, leaves, dtype, True)


def _reordered(v: Val, order) -> Val:
    """``v`` with its dims in ``order`` (dim k of the result is dim order[k] of ``v``): each leaf's strides reordered
    alike, so w[j] = v[i] with i[order[k]] = j[k]. ``v`` indexed in its own shape (not re-spaced)."""
    shape = tuple(v.shape[d] for d in order)
    return Val(shape, shape, v.expr, [Leaf(leaf.source, tuple(leaf.strides[d] for d in order)) for leaf in v.leaves],
               v.dtype, v.exact)


def _as_dtype(v: Val, dtype: str) -> Val:
    """A reduction's fp32 result as eager returns it: in the input's dtype (rounded once), unless fp32."""
    return v if dtype == v.dtype else _combine("{a0}", [v], dtype)


def _constant_val(x: Any, dtype: str) -> Val:
    return Val((), (), _const(x), [], dtype)


def _view(v: Val, new_shape) -> Val:
    new_shape = tuple(int(s) for s in new_shape)
    if -1 in new_shape:
        known = _prod(s for s in new_shape if s != -1)
        new_shape = tuple(_prod(v.shape) // max(known, 1) if s == -1 else s for s in new_shape)
    if v.space != v.shape:
        if _prod(new_shape) != _prod(v.shape):
            raise Uncovered("a view of a re-spaced value")
        return Val(new_shape, v.space, v.expr, v.leaves, v.dtype, v.exact)
    leaves = []
    for leaf in v.leaves:
        st = view_strides(v.shape, leaf.strides, new_shape)
        if st is None:
            # a leaf no strides read in the new shape (a broadcast operand whose batch and window dims are
            # merged: Swin's masked logits viewed [B * nW, heads, L, L]): the value keeps its own index space,
            # re-spaced (what later ops combine with is read in that space)
            return Val(new_shape, v.shape, v.expr, v.leaves, v.dtype, v.exact)
        leaves.append(Leaf(leaf.source, st))
    return Val(new_shape, new_shape, v.expr, leaves, v.dtype, v.exact)


def _expand(v: Val, sizes) -> Val:
    sizes = list(sizes)
    lead = len(sizes) - len(v.shape)
    new_shape = tuple(v.shape[i - lead] if s == -1 else int(s) for i, s in enumerate(sizes))
    if v.space != v.shape:
        if new_shape != v.shape:
            raise Uncovered("an expand of a re-spaced value")
        return v
    return _combine("{a0}", [v], v.dtype, new_shape) if v.leaves or new_shape != v.shape else v


def _respace(v: Val, space: tuple[int, ...]) -> Val:
    """``v`` indexed over ``space`` (same elements in the same order)."""
    if v.space == space:
        return v
    if v.space != v.shape:
        raise Uncovered("a value re-spaced twice")
    leaves = []
    for leaf in v.leaves:
        st = view_strides(v.shape, leaf.strides, space)
        if st is None:
            raise Uncovered(f"shape {v.shape} cannot be read as {space}")
        leaves.append(Leaf(leaf.source, st))
    return Val(v.shape, space, v.expr, leaves, v.dtype, v.exact)


# ------------------------------------------------------------------ the op table

# ATen overload (namespace dropped) -> C template over {a0}, {a1} ...; tensor or scalar operands
# in argument order, dtype follows promotion. Every function used is in both preludes
# (templates/kernels/cpu/_region.h, templates/kernels/cuda/_region.cuh).
_POINTWISE = {
    "add": "{a0} + {a1}", "sub": "{a0} - {a1}", "mul": "{a0} * {a1}", "div": "{a0} / {a1}",
    "neg": "-{a0}", "exp": "fp_exp({a0})", "log": "fp_log({a0})", "rsqrt": "fp_rsqrt({a0})",
    "sqrt": "fp_sqrt({a0})", "tanh": "fp_tanh({a0})", "cos": "fp_cos({a0})", "sin": "fp_sin({a0})",
    "sigmoid": "fp_sigmoid({a0})", "silu": "fp_silu({a0})",
    "relu": "fp_relu({a0})", "abs": "fp_abs({a0})", "reciprocal": "1.0f / {a0}", "erf": "fp_erf({a0})",
    "square": "{a0} * {a0}", "maximum": "fp_maxnan({a0}, {a1})", "minimum": "fp_minnan({a0}, {a1})",
    "eq": "({a0} == {a1} ? 1.0f : 0.0f)", "ne": "({a0} != {a1} ? 1.0f : 0.0f)",
    "gt": "({a0} > {a1} ? 1.0f : 0.0f)", "ge": "({a0} >= {a1} ? 1.0f : 0.0f)",
    "lt": "({a0} < {a1} ? 1.0f : 0.0f)", "le": "({a0} <= {a1} ? 1.0f : 0.0f)",
    "where": "({a0} != 0.0f ? {a1} : {a2})", "masked_fill": "({a1} != 0.0f ? {a2} : {a0})",
    "logical_not": "({a0} == 0.0f ? 1.0f : 0.0f)", "hardtanh": "fp_clamp({a0}, {a1}, {a2})",
}
_AND = "(({a0} != 0.0f) && ({a1} != 0.0f) ? 1.0f : 0.0f)"
_OR = "(({a0} != 0.0f) || ({a1} != 0.0f) ? 1.0f : 0.0f)"
_XOR = "(({a0} != 0.0f) != ({a1} != 0.0f) ? 1.0f : 0.0f)"
_LOGIC = {"__and__": _AND, "bitwise_and": _AND, "logical_and": _AND, "__or__": _OR, "bitwise_or": _OR,
          "logical_or": _OR, "__xor__": _XOR, "bitwise_xor": _XOR, "logical_xor": _XOR}

# activations with constant parameters, as PyTorch's kernels compute them in fp32 (one rounding after):
# MobileNetV3's hardswish / hardsigmoid, ELU / SELU / CELU, softplus and mish (YOLO-style detectors)
_ACTIVATIONS = ("hardswish", "hardsigmoid", "elu", "selu", "celu", "softplus", "mish")
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _activation(name: str, args: list, kwargs: dict) -> str:
    def arg(i: int, key: str, default: float) -> Any:
        v = args[i] if len(args) > i else kwargs.get(key, default)
        if _is_ref(v) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Uncovered(f"not covered: {name} with a non-constant {key}")
        return v

    relu6 = "fp_clamp_hi(fp_clamp_lo({a0} + 3.0f, 0.0f), 6.0f)"
    if name == "hardswish":
        return "{a0} * " + relu6 + " / 6.0f"
    if name == "hardsigmoid":
        return relu6 + " / 6.0f"
    if name in ("elu", "selu", "celu"):
        if name == "selu":
            alpha, scale, in_scale = _SELU_ALPHA, _SELU_SCALE, 1.0
        elif name == "celu":
            alpha = arg(1, "alpha", 1.0)
            scale, in_scale = 1.0, 1.0 / alpha
        else:
            alpha, scale, in_scale = arg(1, "alpha", 1.0), arg(2, "scale", 1.0), arg(3, "input_scale", 1.0)
        return (f"({{a0}} > 0.0f ? {{a0}} * {_const(scale)} : "
                f"fp_expm1({{a0}} * {_const(in_scale)}) * {_const(alpha * scale)})")
    softplus = "({{a0}} * {b} > {t} ? {{a0}} : fp_log1p(fp_exp({{a0}} * {b})) / {b})"
    if name == "softplus":
        return softplus.format(b=_const(arg(1, "beta", 1.0)), t=_const(arg(2, "threshold", 20.0)))
    return "{a0} * fp_tanh(" + softplus.format(b="1.0f", t="20.0f") + ")"  # mish


# ops whose result is one of their operands (or its negation / magnitude): exact in the operands'
# dtype when the operands are, so eager's rounding after them is the identity
_EXACT = {_POINTWISE[k] for k in ("relu", "neg", "abs", "maximum", "minimum")}
_COMPARE = ("eq", "ne", "gt", "ge", "lt", "le", "logical_not")
_IDENTITY = ("clone", "contiguous", "alias", "lift_fresh_copy", "detach", "dropout")
_VIEWS = ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "flatten")


def base(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) == 3 else parts[0]


class Lowering:
    def __init__(self, form: dict):
        self.form = form
        self.inputs = form["inputs"]
        self.made: list[Any] = []
        self.reductions: list[Reduction] = []
        self.space: tuple[int, ...] | None = None  # the iteration space, fixed by the first reduction
        self.nred = 0
        self.window: Window | None = None
        self.perm: tuple[int, ...] | None = None  # the dim order ``trailing`` gave the reduction's input

    # -- arguments
    def arg(self, a: Any) -> Any:
        if isinstance(a, dict) and "in" in a:
            spec = self.inputs[a["in"]]
            shape = tuple(spec["shape"])
            return Val(shape, shape, "{0}", [Leaf(("in", a["in"]), tuple(spec["strides"]))], spec["dtype"], True)
        if isinstance(a, dict) and "n" in a:
            return self.made[a["n"]]
        return a

    def operand(self, a: Any, dtype: str) -> Val:
        v = self.arg(a)
        if isinstance(v, Val):
            return v
        if v is None:
            raise Uncovered("an absent operand")
        return _constant_val(v, dtype)

    # -- reductions
    def domain(self, v: Val, dims: list[int]) -> None:
        nd = len(v.shape)
        dims = sorted(d % nd for d in dims) if dims else list(range(nd))
        if dims != list(range(nd - len(dims), nd)):
            raise Uncovered(f"a reduction over dims {dims} of {nd} that are not the trailing ones (strided)")
        if v.space != v.shape:
            # re-spaced by a view of its leading dims only: its rows are the space's leading dims, in order
            k = len(dims)
            if tuple(v.shape[nd - k:]) != tuple(v.space[len(v.space) - k:]):
                raise Uncovered("a reduction of a re-spaced value")
            self.set_space(tuple(v.space), k)
            return
        self.set_space(tuple(v.shape), len(dims))

    def set_space(self, space: tuple[int, ...], nred: int) -> None:
        if self.space is None:
            self.space, self.nred = space, nred
        elif (self.space, self.nred) != (space, nred):
            raise Uncovered("two reductions over different domains")

    def reduce(self, v: Val, combine: str, scale: float = 1.0, post: str = "{0}", keep_shape=None) -> Val:
        """Reduce ``v`` (over the iteration space) to a per-row leaf of shape ``keep_shape``."""
        assert self.space is not None
        if self.window is not None:
            raise Uncovered("a row reduction in a window region")
        v = _respace(v, self.space) if v.shape == self.space or v.space == self.space else v
        if v.space != self.space:
            raise Uncovered("a reduction input outside the region's domain")
        j = len(self.reductions)
        self.reductions.append(Reduction(combine, v, scale, post))
        rows_shape = tuple(self.space[:len(self.space) - self.nred])
        kept = tuple(keep_shape) if keep_shape is not None else rows_shape
        st = view_strides(rows_shape, contiguous(rows_shape), kept)
        if st is None:
            raise Uncovered("a reduction result of an unexpected shape")
        return Val(kept, kept, "{0}", [Leaf(("red", j), st)], "float32")

    def keep_shape(self, shape, dims, keepdim: bool) -> tuple[int, ...]:
        nd = len(shape)
        dims = {d % nd for d in dims} if dims else set(range(nd))
        return tuple(1 if d in dims else s for d, s in enumerate(shape) if keepdim or d not in dims)

    def row_stats(self, x: Val, correction: float = 0.0, keep=None) -> tuple[Val, Val]:
        """(mean, var) over the reduced dims, two passes (the mean first: no cancellation)."""
        cols = _prod(self.space[len(self.space) - self.nred:])
        if keep is None:  # the rows with the reduced dims kept as 1s, so that they broadcast back
            keep = tuple(self.space[:len(self.space) - self.nred]) + (1,) * self.nred
        xf = Val(x.shape, x.space, x.expr, x.leaves, "float32")
        mean = self.reduce(xf, "sum", 1.0 / cols, keep_shape=keep)
        dev = _combine("{a0} - {a1}", [xf, _expand(mean, x.shape)], "float32")
        var = self.reduce(_combine("{a0} * {a0}", [dev], "float32"), "sum", 1.0, f"{{0}} / (float){max(cols - correction, 0)!r}",
                          keep_shape=keep)
        return mean, var

    # -- the ops
    def lower(self) -> Program:
        for entry in self.form["ops"]:
            try:
                self.made.append(self.op(entry["op"], entry["args"], entry["kwargs"]))
            except Uncovered:
                raise
            except (TypeError, IndexError, KeyError, ValueError, AttributeError, ZeroDivisionError) as e:
                # arguments spelled unlike the table expects: reported as data, never a crash
                raise Uncovered(f"not covered: {entry['op']} with these arguments ({type(e).__name__}: {e})") from e
        out = self.made[-1]
        if not isinstance(out, Val):
            raise Uncovered("the region's output is not one tensor")
        return self.program(out)

    def op(self, op: str, args: list, kwargs: dict) -> Any:
        name = base(op)
        if name == "getitem":
            seq = self.arg(args[0])
            if not isinstance(seq, tuple):
                raise Uncovered("not covered: an element of a tuple made outside the region")
            if seq[args[1]] is None:
                raise Uncovered(f"not covered: output {args[1]} of {name}'s producer")
            return seq[args[1]]
        if name.endswith("_") and not name.startswith("_"):
            name = name[:-1]  # an in-place op inside a region computes what its functional form does
            op = op.replace(f".{name}_.", f".{name}.")
        if name in _IDENTITY or (name == "_to_copy" and "dtype" not in kwargs) or name == "to" and len(args) == 1:
            return self.arg(args[0])
        if name in ("_to_copy", "to", "type_as", "_convert_element_type", "convert_element_type"):
            dt = kwargs.get("dtype") or (args[1] if len(args) > 1 else None)
            if name == "type_as" and _is_ref(dt):  # Gemma's RMSNorm: out.type_as(x), x's dtype
                dt = {"dtype": self.arg(dt).dtype}
            if not (isinstance(dt, dict) and "dtype" in dt):
                raise Uncovered(f"not covered: {name} without a dtype")
            v = self.arg(args[0])
            d = dt["dtype"]
            expr = v.expr if v.exact and v.dtype == d else _rounded(v.expr, d)  # a cast to its own dtype: as is
            if d in ("bool",):
                expr = f"({v.expr} != 0.0f ? 1.0f : 0.0f)"
            elif d not in FLOAT_DTYPES:
                expr = f"fp_trunc({v.expr})"
            return Val(v.shape, v.space, expr, v.leaves, d, d in FLOAT_DTYPES)
        if name in _VIEWS:
            return self.view_op(name, args)
        if name in ("permute", "transpose"):
            return self.permute_op(name, args)
        if name in ("sum", "mean", "amax", "amin", "max", "min") and len(args) > 1:
            return self.reduction_op(name, args, kwargs)
        if name == "linalg_vector_norm":
            return self.norm_op(args, kwargs)
        if name in ("var", "var_mean", "std"):
            return self.var_op(op, name, args, kwargs)
        if name in ("softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax"):
            return self.softmax_op(name, args, kwargs)
        if name in ("layer_norm", "native_layer_norm"):
            return self.layer_norm_op(name, args)
        if name == "instance_norm":
            return self.instance_norm_op(args)
        if name in ("zeros_like", "ones_like", "full_like", "full", "zeros", "ones", "scalar_tensor", "new_ones",
                    "new_zeros", "new_full"):
            return self.constant_op(name, args, kwargs)
        if name in ("adaptive_avg_pool2d", "_adaptive_avg_pool2d") and list(args[1]) == [1, 1]:
            return self.reduction_op("mean", [args[0], [-2, -1], True], {})
        if name in WINDOW_OPS:
            out = self.window_op(name, args, kwargs)
            return (out, None) if name == "max_pool2d_with_indices" else out
        if name in ("group_norm", "native_group_norm"):
            return self.group_norm_op(name, args)
        if name in ("_native_batch_norm_legit_no_training", "batch_norm", "native_batch_norm",
                    "_native_batch_norm_legit"):
            return self.batch_norm_op(name, args)
        return self.pointwise_op(op, name, args, kwargs)

    def pointwise_op(self, op: str, name: str, args: list, kwargs: dict) -> Val:
        tensors = [self.arg(a) for a in args if _is_ref(a)]
        dtype = _promote(*[t.dtype for t in tensors]) if tensors else "float32"
        if name in _COMPARE:
            dtype = "bool"
        if name in ("pow",):
            if len(args) >= 2 and _is_ref(args[0]) and not _is_ref(args[1]):
                return _combine(_pow_template(args[1]), [self.arg(args[0])], dtype)
            if len(args) >= 2 and not _is_ref(args[0]) and _is_ref(args[1]):
                return _combine(f"fp_pow({_const(args[0])}, {{a0}})", [self.arg(args[1])], dtype)
            raise Uncovered("not covered: pow of two tensors")
        if name == "gelu":
            approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
            return _combine("fp_gelu_tanh({a0})" if approx == "tanh" else "fp_gelu({a0})", [self.arg(args[0])], dtype)
        if name in ("clamp", "clamp_min", "clamp_max"):
            lo = args[1] if name != "clamp_max" and len(args) > 1 else kwargs.get("min")
            hi = args[2] if name == "clamp" and len(args) > 2 else (args[1] if name == "clamp_max" else kwargs.get("max"))
            if _is_ref(lo) or _is_ref(hi):
                raise Uncovered("not covered: clamp with tensor bounds")
            expr = "{a0}"
            if lo is not None:
                expr = f"fp_clamp_lo({expr}, {_const(lo)})"
            if hi is not None:
                expr = f"fp_clamp_hi({expr}, {_const(hi)})"
            return _combine(expr, [self.arg(args[0])], dtype)
        if name in ("leaky_relu",):
            slope = args[1] if len(args) > 1 else 0.01
            return _combine(f"({{a0}} > 0.0f ? {{a0}} : {{a0}} * {_const(slope)})", [self.arg(args[0])], dtype)
        if name in ("hardtanh",):
            lo, hi = (args[1] if len(args) > 1 else -1.0), (args[2] if len(args) > 2 else 1.0)
            return _combine(f"fp_clamp_hi(fp_clamp_lo({{a0}}, {_const(lo)}), {_const(hi)})", [self.arg(args[0])], dtype)
        if name in _ACTIVATIONS:
            return _combine(_activation(name, args, kwargs), [self.arg(args[0])], dtype)
        if name in _LOGIC:  # the mask builders of transformers: bool & bool (bitwise on ints is not logic)
            if not name.startswith("logical_") and any(t.dtype != "bool" for t in tensors):
                raise Uncovered(f"not covered: {name} of non-boolean tensors")
            vals = [self.operand(a, "bool") for a in args[:2]]
            return _combine(_LOGIC[name], vals, "bool")
        if name in ("addcmul", "addcdiv"):  # self + value * t1 (* or /) t2, in the ops' promoted dtype
            value = args[3] if len(args) > 3 else kwargs.get("value", 1)
            if _is_ref(value) or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise Uncovered(f"not covered: {name} with a non-constant value")
            op = "*" if name == "addcmul" else "/"
            vals = [self.operand(a, dtype) for a in args[:3]]
            scaled = "{a1}" if value == 1 else f"{_const(value)} * {{a1}}"
            return _combine(f"{{a0}} + {scaled} {op} {{a2}}", vals, dtype)
        template = _POINTWISE.get(name)
        if template is None:
            raise Uncovered(f"not covered: {op}")
        if name == "div" and kwargs.get("rounding_mode") is not None:
            raise Uncovered(f"not covered: div with rounding_mode={kwargs['rounding_mode']}")
        if name in ("where", "masked_fill"):
            dtype = _promote(*[t.dtype for t in tensors if t is not tensors[0] or name == "masked_fill"])
        vals = [self.operand(a, dtype) for a in args[:_arity(template)]]
        alpha = kwargs.get("alpha")
        if name in ("add", "sub") and alpha not in (None, 1):
            template = template.replace("{a1}", f"({_const(alpha)} * {{a1}})")
        return _combine(template, vals, dtype)

    def constant_op(self, name: str, args: list, kwargs: dict) -> Val:
        """A tensor of one value (zeros_like, full ...): a constant broadcast to its shape."""
        dt = kwargs.get("dtype")
        dtype = dt["dtype"] if isinstance(dt, dict) and "dtype" in dt else "float32"
        if name in ("zeros_like", "ones_like", "full_like"):
            like = self.arg(args[0])
            shape, dtype = like.shape, (dtype if isinstance(dt, dict) else like.dtype)
            value = {"zeros_like": 0.0, "ones_like": 1.0}.get(name, args[1] if len(args) > 1 else 0.0)
        elif name in ("new_ones", "new_zeros", "new_full"):  # x.new_ones(size): x's dtype unless given
            shape, dtype = tuple(args[1]), (dtype if isinstance(dt, dict) else self.arg(args[0]).dtype)
            value = {"new_zeros": 0.0, "new_ones": 1.0}.get(name, args[2] if len(args) > 2 else 0.0)
        elif name == "scalar_tensor":
            shape, value = (), args[0]
        else:
            shape = tuple(args[0])
            value = {"zeros": 0.0, "ones": 1.0}.get(name, args[1] if len(args) > 1 else 0.0)
        if _is_ref(value):
            raise Uncovered(f"not covered: {name} of a tensor value")
        return Val(tuple(int(x) for x in shape), tuple(int(x) for x in shape), _const(value), [], dtype)

    def permute_op(self, name: str, args: list) -> Val:
        """A reordering of dims: each leaf's strides reordered alike (w[j] = v[i] with i[perm[k]] = j[k])."""
        v = self.arg(args[0])
        nd = len(v.shape)
        if name == "transpose":
            a, b = args[1] % max(nd, 1), args[2] % max(nd, 1)
            perm = list(range(nd))
            perm[a], perm[b] = perm[b], perm[a]
        else:
            perm = [d % max(nd, 1) for d in args[1]]
        if sorted(perm) != list(range(nd)):
            raise Uncovered(f"not covered: {name} {args[1:]} of a {nd}-d value")
        if v.space != v.shape:
            raise Uncovered(f"a {name} of a re-spaced value")
        return _reordered(v, perm)

    def view_op(self, name: str, args: list) -> Val:
        v = self.arg(args[0])
        if name in ("view", "_unsafe_view", "reshape"):
            return _view(v, args[1])
        if name == "unsqueeze":
            d = args[1] % (len(v.shape) + 1)
            return _view(v, v.shape[:d] + (1,) + v.shape[d:])
        if name == "squeeze":
            dims = args[1] if len(args) > 1 else list(range(len(v.shape)))
            dims = {d % max(len(v.shape), 1) for d in (dims if isinstance(dims, list) else [dims])}
            return _view(v, tuple(s for d, s in enumerate(v.shape) if not (d in dims and s == 1)))
        if name == "flatten":
            start = args[1] % len(v.shape) if len(args) > 1 else 0
            end = args[2] % len(v.shape) if len(args) > 2 else len(v.shape) - 1
            return _view(v, v.shape[:start] + (_prod(v.shape[start:end + 1]),) + v.shape[end + 1:])
        return _expand(v, args[1])

    def reduction_op(self, name: str, args: list, kwargs: dict) -> Val:
        v = self.arg(args[0])
        dims = args[1] if isinstance(args[1], list) else [args[1]]
        keepdim = bool(args[2]) if len(args) > 2 else bool(kwargs.get("keepdim", False))
        if name in ("max", "min"):
            raise Uncovered(f"not covered: {name} with indices")
        keep = self.keep_shape(v.shape, dims, keepdim)
        v = self.trailing(v, dims)
        combine = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min"}[name]
        scale = 1.0 / max(_prod(self.space[len(self.space) - self.nred:]), 1) if name == "mean" else 1.0
        dt = kwargs.get("dtype")
        if isinstance(dt, dict) and "dtype" in dt:
            out = dt["dtype"]
        else:  # eager's result dtype: the input's, but a sum of booleans or integers is int64
            out = v.dtype if v.dtype in FLOAT_DTYPES or combine != "sum" else "int64"
        return _as_dtype(self.reduce(v, combine, scale, keep_shape=keep), out)

    def norm_op(self, args: list, kwargs: dict) -> Val:
        """linalg_vector_norm(x, ord, dim, keepdim): ord 2 (sqrt of the sum of squares), 1 or +-inf (ConvNeXt V2's
        global response norm: the 2-norm over the spatial dims of an NHWC view)."""
        v = self.arg(args[0])
        order = args[1] if len(args) > 1 else kwargs.get("ord", 2)
        dims = args[2] if len(args) > 2 else kwargs.get("dim")
        keepdim = bool(args[3]) if len(args) > 3 else bool(kwargs.get("keepdim", False))
        if kwargs.get("dtype") is not None or _is_ref(order) or isinstance(order, bool):
            raise Uncovered("not covered: linalg_vector_norm with a dtype or a tensor order")
        dims = list(range(len(v.shape))) if dims is None else (dims if isinstance(dims, list) else [dims])
        order = float(order["float"]) if isinstance(order, dict) and "float" in order else float(order)
        keep = self.keep_shape(v.shape, dims, keepdim)
        v = self.trailing(v, dims)
        vf = Val(v.shape, v.space, v.expr, v.leaves, "float32")
        if order == 2.0:
            red = self.reduce(_combine("{a0} * {a0}", [vf], "float32"), "sum", post="fp_sqrt({0})", keep_shape=keep)
        elif order == 1.0:
            red = self.reduce(_combine("fp_abs({a0})", [vf], "float32"), "sum", keep_shape=keep)
        elif order in (math.inf, -math.inf):
            red = self.reduce(_combine("fp_abs({a0})", [vf], "float32"), "max" if order > 0 else "min",
                              keep_shape=keep)
        else:
            raise Uncovered(f"not covered: linalg_vector_norm of order {order}")
        return _as_dtype(red, v.dtype)

    def trailing(self, v: Val, dims: list) -> Val:
        """``v`` with the reduced dims moved last (a permute of its leaves' strides: a reduction over the spatial
        dims of an NHWC view reads each row at the memory's own strides) and the region's domain set over it."""
        nd = len(v.shape)
        red = sorted(d % nd for d in dims) if dims else list(range(nd))
        if red != list(range(nd - len(red), nd)):
            if v.space != v.shape:
                raise Uncovered("a reduction of a re-spaced value")
            order = [d for d in range(nd) if d not in red] + red
            if self.perm is not None and self.perm != tuple(order):
                raise Uncovered("two reductions over dims in different orders")
            self.perm = tuple(order)
            v = _reordered(v, order)
            red = list(range(nd - len(red), nd))
        self.domain(v, red)
        return v

    def var_op(self, op: str, name: str, args: list, kwargs: dict) -> Any:
        """var / std / var_mean in their three overloads: ``.correction`` (dim, then keyword-only correction and
        keepdim), ``.dim`` (dim, unbiased, keepdim: what ``x.var(-1, unbiased=False, keepdim=True)`` traces to)
        and ``.default`` (unbiased; every dim)."""
        v = self.arg(args[0])
        overload = op.rsplit(".", 1)[-1] if op.count(".") >= 2 else "correction"
        if overload == "default":
            dims, unbiased, keepdim = None, args[1] if len(args) > 1 else kwargs.get("unbiased", True), False
        elif overload == "dim":
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            unbiased = args[2] if len(args) > 2 else kwargs.get("unbiased", True)
            keepdim = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
        elif overload == "correction":
            dims, unbiased = args[1] if len(args) > 1 else kwargs.get("dim"), None
            keepdim = kwargs.get("keepdim", False)
        else:
            raise Uncovered(f"not covered: {op}")
        dims = list(range(len(v.shape))) if dims is None else dims if isinstance(dims, list) else [dims]
        correction = (1 if unbiased else 0) if overload != "correction" else kwargs.get("correction", 1)
        if correction is None:
            correction = 1
        keepdim = bool(keepdim)
        self.domain(v, dims)
        keep = self.keep_shape(v.shape, dims, keepdim)
        mean, var = self.row_stats(v, float(correction), keep)
        if name == "std":  # fp32 statistics, the result in the input's dtype (rounded once), as eager's
            return _as_dtype(_combine("fp_sqrt({a0})", [var], "float32"), v.dtype)
        var = _as_dtype(var, v.dtype)
        return (var, _as_dtype(mean, v.dtype)) if name == "var_mean" else var

    def softmax_op(self, name: str, args: list, kwargs: dict) -> Val:
        x = self.arg(args[0])
        dim = args[1]
        out_dtype = x.dtype
        if name in ("_softmax", "_log_softmax") and len(args) > 2 and args[2]:
            out_dtype = "float32"  # half_to_float
        dt = kwargs.get("dtype") or (args[2] if name in ("softmax", "log_softmax") and len(args) > 2 else None)
        if isinstance(dt, dict) and "dtype" in dt:
            out_dtype = dt["dtype"]
        self.domain(x, [dim])
        keep = self.keep_shape(x.shape, [dim], True)
        xf = Val(x.shape, x.space, x.expr, x.leaves, "float32")
        m = _expand(self.reduce(xf, "max", keep_shape=keep), x.shape)
        e = _combine("fp_exp({a0} - {a1})", [xf, m], "float32")
        s = _expand(self.reduce(e, "sum", keep_shape=keep), x.shape)
        if name in ("log_softmax", "_log_softmax"):
            return _combine("{a0} - {a1} - fp_log({a2})", [xf, m, s], out_dtype)
        if name == "_safe_softmax":  # a row of -inf gives 0, not NaN
            return _combine("({a1} == -FP_INF ? 0.0f : fp_exp({a0} - {a1}) / {a2})", [xf, m, s], out_dtype)
        return _combine("fp_exp({a0} - {a1}) / {a2}", [xf, m, s], out_dtype)

    def layer_norm_op(self, name: str, args: list) -> Any:
        x = self.arg(args[0])
        ns = list(args[1])
        w, b = (self.arg(args[2]) if len(args) > 2 else None), (self.arg(args[3]) if len(args) > 3 else None)
        eps = args[4] if len(args) > 4 else 1e-5
        nd = len(x.shape)
        dims = list(range(nd - len(ns), nd))
        self.domain(x, dims)
        keep = self.keep_shape(x.shape, dims, True)
        mean, var = self.row_stats(x, 0.0, keep)
        rstd = _combine(f"fp_rsqrt({{a0}} + {_const(eps)})", [var], "float32")
        out = self.affine(x, mean, rstd, w, b, x.dtype)
        return (out, mean, rstd) if name == "native_layer_norm" else out

    def instance_norm_op(self, args: list) -> Val:
        """instance_norm(x, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn): each
        (n, c) plane normalised by its own mean and biased variance, then the per-channel affine; with the running
        statistics instead (use_input_stats False), batch_norm's inference map."""
        x = self.arg(args[0])
        w, b, rm, rv, use_stats, eps = args[1], args[2], args[3], args[4], args[5], args[7]
        tail, dtype = (1,) * (len(x.shape) - 2), x.dtype

        def chan(a):
            v = self.arg(a) if a is not None else None
            return _view(v, (v.shape[0],) + tail) if isinstance(v, Val) else None

        if not use_stats:
            if rm is None or rv is None:
                raise Uncovered("not covered: instance_norm without input or running statistics")
            mean, var = chan(rm), chan(rv)
        else:
            dims = list(range(2, len(x.shape)))
            self.domain(x, dims)
            # shifted by the plane's first element (x - mean = d - mean(d), d = x - x[first]): a constant plane
            # gives d = 0 exactly, so its output is exactly 0 as eager's Welford statistics give; the fp32 mean
            # of the plane itself would carry the sum's rounding into every output, times 1 / sqrt(eps)
            k = len(dims)
            xf = Val(x.shape, x.space, x.expr, x.leaves, "float32")
            first = Val(x.shape, x.space, x.expr, [Leaf(leaf.source, leaf.strides[:len(leaf.strides) - k] + (0,) * k)
                                                   for leaf in x.leaves], "float32")
            x = _combine("{a0} - {a1}", [xf, first], "float32")
            mean, var = self.row_stats(x, 0.0, self.keep_shape(x.shape, dims, True))
        rstd = _combine(f"fp_rsqrt({{a0}} + {_const(eps)})", [var], "float32")
        return self.affine(x, mean, rstd, chan(w), chan(b), dtype)

    def affine(self, x: Val, mean: Val, rstd: Val, w: Val | None, b: Val | None, dtype: str) -> Val:
        xf = Val(x.shape, x.space, x.expr, x.leaves, "float32")
        y = _combine("({a0} - {a1}) * {a2}", [xf, _expand(mean, x.shape), _expand(rstd, x.shape)], "float32")
        if w is not None:
            y = _combine("{a0} * {a1}", [y, w], "float32")
        if b is not None:
            y = _combine("{a0} + {a1}", [y, b], "float32")
        return Val(y.shape, y.space, _rounded(y.expr, dtype), y.leaves, dtype, True)

    def group_norm_op(self, name: str, args: list) -> Any:
        x = self.arg(args[0])
        if name == "group_norm":  # group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn)
            groups = args[1]
            w = self.arg(args[2]) if len(args) > 2 else None
            b = self.arg(args[3]) if len(args) > 3 else None
            eps = args[4] if len(args) > 4 else 1e-5
        else:  # native_group_norm(input, weight, bias, N, C, HxW, group, eps)
            w, b, groups, eps = self.arg(args[1]), self.arg(args[2]), args[6], args[7]
        n, c = x.shape[0], x.shape[1]
        hw = _prod(x.shape[2:])
        cpg = c // groups
        space = (n, groups, cpg, hw)
        x2 = _respace(x, space)
        self.set_space(space, 2)
        xs = Val(space, space, x2.expr, x2.leaves, "float32")
        mean4, var = self.row_stats(xs, 0.0, None)
        rstd4 = _combine(f"fp_rsqrt({{a0}} + {_const(eps)})", [var], "float32")
        mean, rstd = _view(mean4, (n, groups)), _view(rstd4, (n, groups))
        per_channel = [(_view(t, (groups, cpg, 1)) if isinstance(t, Val) else None) for t in (w, b)]
        y = self.affine(xs, mean4, rstd4, per_channel[0], per_channel[1], x.dtype)
        out = Val(x.shape, space, y.expr, y.leaves, x.dtype)
        return (out, mean, rstd) if name == "native_group_norm" else out

    def batch_norm_op(self, name: str, args: list) -> Any:
        x = self.arg(args[0])
        if name == "_native_batch_norm_legit_no_training":
            w, b, rm, rv, eps = args[1], args[2], args[3], args[4], args[6]
        else:  # batch_norm(x, w, b, rm, rv, training, momentum, eps, ...) / native_batch_norm(x, w, b, rm, rv, training, momentum, eps)
            w, b, rm, rv, training, eps = args[1], args[2], args[3], args[4], args[5], args[7]
            if training or name == "_native_batch_norm_legit":
                raise Uncovered(f"not covered: {name} in training")
        if rm is None or rv is None:
            raise Uncovered(f"not covered: {name} without running statistics")
        tail = (1,) * (len(x.shape) - 2)

        def chan(a):
            v = self.arg(a)
            return _view(v, (v.shape[0],) + tail) if isinstance(v, Val) else None

        xf = Val(x.shape, x.space, x.expr, x.leaves, "float32")
        y = _combine(f"({{a0}} - {{a1}}) * fp_rsqrt({{a2}} + {_const(eps)})", [xf, chan(rm), chan(rv)], "float32")
        if chan(w) is not None:
            y = _combine("{a0} * {a1}", [y, chan(w)], "float32")
        if chan(b) is not None:
            y = _combine("{a0} + {a1}", [y, chan(b)], "float32")
        out = Val(y.shape, y.space, _rounded(y.expr, x.dtype), y.leaves, x.dtype, True)
        return (out, None, None)

    def window_op(self, name: str, args: list, kwargs: dict) -> Val:
        """A 2-d pooling: one window reduction per output element (``Window``); its result is a
        leaf over the output's shape that the epilogue reads once per element."""
        x = self.arg(args[0])
        if not isinstance(x, Val) or x.space != x.shape or len(x.shape) not in (3, 4):
            raise Uncovered(f"not covered: {name} of a {len(getattr(x, 'shape', ()))}-d or re-spaced value")
        if any(leaf.source[0] == "red" for leaf in x.leaves):
            raise Uncovered(f"not covered: {name} of a value computed from a reduction")
        a = _named(args, kwargs, WINDOW_OPS[name])
        h, w = x.shape[-2], x.shape[-1]
        if name in ("adaptive_avg_pool2d", "_adaptive_avg_pool2d"):
            oh, ow = _pair(a["output_size"])
            win = Window("adaptive", tuple(x.shape))
        else:
            k = _pair(a["kernel_size"])
            st = _pair(a.get("stride") or k)
            pad = _pair(a.get("padding", 0))
            dil = _pair(a.get("dilation", 1)) if name.startswith("max") else (1, 1)
            ceil = bool(a.get("ceil_mode", False))
            oh, ow = (_pool_size(n, k[i], st[i], pad[i], dil[i], ceil) for i, n in enumerate((h, w)))
            if name.startswith("max"):
                win = Window("max", tuple(x.shape), k, st, pad, dil)
            else:
                div = a.get("divisor_override")
                win = Window("avg", tuple(x.shape), k, st, pad, (1, 1), bool(a.get("count_include_pad", True)),
                             int(div) if div else 0)
        if oh < 1 or ow < 1:
            raise Uncovered(f"not covered: {name} with an empty output")
        out_shape = tuple(x.shape[:-2]) + (oh, ow)
        if self.window not in (None, win) or (self.window is None and self.reductions):
            raise Uncovered("a window reduction with another reduction over a different domain")
        self.window = win
        self.set_space(out_shape, 2)
        j = len(self.reductions)
        xf = Val(x.shape, x.space, x.expr, x.leaves, "float32")
        self.reductions.append(Reduction("max" if win.mode == "max" else "sum", xf))
        picked = win.mode == "max" and x.exact  # the max of values exact in x.dtype is one of them
        return Val(out_shape, out_shape, "{0}" if picked else _rounded("{0}", x.dtype),
                   [Leaf(("red", j), contiguous(out_shape))], x.dtype, True)

    # -- the result
    def program(self, out: Val) -> Program:
        if self.space is None:
            space, nred = out.shape, 0
        else:
            space, nred = self.space, self.nred
        rows_shape = space[:len(space) - nred]
        per_row = nred > 0 and _prod(out.shape) == _prod(rows_shape) and _prod(space) != _prod(rows_shape)
        target = rows_shape if per_row else space
        if _prod(out.shape) != _prod(target):
            raise Uncovered("an output smaller than the region's domain and not one value per row")
        out_perm = None
        if (not per_row and self.perm is not None and out.space == out.shape and len(out.shape) == len(space)
                and tuple(out.shape[d] for d in self.perm) == tuple(space) and tuple(out.shape) != tuple(space)):
            # the epilogue is in the model's dim order, the reduction's rows in ``trailing``'s: the output is
            # computed over the reduction's space, each leaf (and the output's strides) reordered alike
            out_perm = self.perm
            out = _reordered(out, out_perm)
        out_t = _respace(out, target) if out.space != target else out
        out_strides = contiguous(target)
        if out_perm is not None:
            own = contiguous(tuple(space[out_perm.index(d)] for d in range(len(space))))
            out_strides = tuple(own[d] for d in out_perm)
        kind = "window" if self.window is not None else ("row" if nred else "pointwise")
        return Program(kind, tuple(space), nred, self.reductions, out_t,
                       out_strides, tuple(i["dtype"] for i in self.inputs), out.dtype, per_row,
                       tuple(base(o["op"]) for o in self.form["ops"]), self.window, out_perm)


# pooling ops -> their argument names in schema order (args are read by position, then by keyword)
WINDOW_OPS = {
    "max_pool2d": ("self", "kernel_size", "stride", "padding", "dilation", "ceil_mode"),
    "max_pool2d_with_indices": ("self", "kernel_size", "stride", "padding", "dilation", "ceil_mode"),
    "avg_pool2d": ("self", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"),
    "adaptive_avg_pool2d": ("self", "output_size"),
    "_adaptive_avg_pool2d": ("self", "output_size"),
}


def _named(args: list, kwargs: dict, names: tuple[str, ...]) -> dict:
    out = dict(zip(names, args))
    out.update({k: v for k, v in kwargs.items() if k in names})
    return out


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return int(v[0]), int(v[0])
        if len(v) != 2:
            raise Uncovered(f"not covered: a 2-d pooling argument {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _pool_size(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """PyTorch's pooled length: floor (or ceil) of the span over the stride, plus one; with
    ceil_mode the last window must start inside the input or its left padding."""
    span = n + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


def _arity(template: str) -> int:
    n = 0
    while "{a%d}" % n in template:
        n += 1
    return n


def _pow_template(e: Any) -> str:
    if isinstance(e, dict):
        return f"fp_pow({{a0}}, {_const(e)})"
    f = float(e)
    return {2.0: "{a0} * {a0}", 1.0: "{a0}", 0.5: "fp_sqrt({a0})", -1.0: "1.0f / {a0}", 3.0: "{a0} * {a0} * {a0}",
            -0.5: "fp_rsqrt({a0})", 0.0: "1.0f"}.get(f, f"fp_pow({{a0}}, {_const(f)})")


def lower(form: dict, out_spec: dict | None = None) -> Program:
    """The region's program; raises ``Uncovered`` (its text is the reason) for what no skeleton computes."""
    prog = Lowering(form).lower()
    if out_spec is not None and out_spec.get("dtype", prog.out_dtype) != prog.out_dtype:
        # the kernel's store would be of the wrong width (a float written into a bf16 buffer runs past its end):
        # an op whose result dtype the lowering does not model is uncovered, never a kernel
        raise Uncovered(f"not covered: the lowered output is {prog.out_dtype}, the region's is {out_spec['dtype']}")
    if out_spec is not None:
        out_shape, strides = tuple(out_spec["shape"]), tuple(out_spec["strides"])
        if prog.out_perm is not None:  # the output read in the reduction's dim order
            out_shape, strides = tuple(out_shape[d] for d in prog.out_perm), tuple(strides[d] for d in prog.out_perm)
        target = prog.space[:len(prog.space) - prog.nred] if prog.per_row else prog.space
        st = view_strides(out_shape, strides, target)
        if st is None:
            raise Uncovered("the output's layout cannot be written in the region's order")
        prog.out_strides = st
    return prog
