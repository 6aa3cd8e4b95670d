"""C code for a lowered region (``region_lower.Program``): what fills a skeleton's ``//{{CODE}}``.

The skeletons (templates/kernels/{cpu,cuda}/region_{pointwise,row}.*) hold the loops, the
parallel split and the reductions; the code here gives them, for one region:

- ``REGION_PARAMS`` / ``REGION_ARGS``: the kernel's arguments, the inputs in form order then ``out``
  (the ABI a region's package op is called with);
- ``fp_elem<j>(args, r, c, red)``: the element value reduction j accumulates at row r, column c;
- ``fp_out_value(args, r, c, red)`` and ``fp_out_offset(r, c)``: the output element and where it goes;
- ``FP_INIT<j>``, ``FP_COMBINE<j>``, ``FP_FINAL<j>``, ``FP_SUM<j>``: how reduction j accumulates;
- the sizes (``NUMEL``, ``ROWS``, ``COLS``, ``NRED``, ``PER_ROW``), all compile-time constants: a
  region's key fixes every shape and stride, so the kernel is specialised to them;
- index math in ``fp_idx`` (the skeleton's typedef of ``FP_IDX_T``: ``int`` where every offset fits,
  see ``index_type``), with unsuffixed constants (C++ gives a constant too large for int a wider type).

Inputs are read at the strides the lowering found, split into a row part (hoisted out of the
column loop by the compiler) and a column part; dims that are contiguous with each other are
merged first, so a plain row costs one multiply. Pure Python, no torch import.
"""

from __future__ import annotations

from forge_pack.search import template_kit
from forge_pack.search.region_lower import Leaf, Program, Uncovered, Val, contiguous
from forge_pack.search.region_vector import vector_code
from forge_pack.search.region_window import WindowWriter

MAX_REDUCTIONS = 8  # passes the skeletons unroll (layer/group norm: 2, softmax: 2; 4 log_softmax of one row: 8)
# the templates' type names, and the dtypes only a region's inputs take (a uint8 mask, a float64 constant)
_REGION_ONLY = {"uint8": "unsigned char", "int8": "signed char", "float64": "double"}
CPU_TYPES = {**template_kit.CPU_TYPES, **_REGION_ONLY}
CUDA_TYPES = {**template_kit.CUDA_TYPES, **_REGION_ONLY}
FLOATS16 = ("bfloat16", "float16")
INIT = {"sum": "0.0f", "max": "(-FP_INF)", "min": "FP_INF"}
COMBINE = {"sum": "((a) + (b))", "max": "fp_maxnan((a), (b))", "min": "fp_minnan((a), (b))"}


def _groups(sizes: tuple[int, ...], strides: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(size, stride, divisor) per run of dims that merge (stride[d] == stride[d+1] * size[d+1]);
    size-1 and stride-0 dims drop out. ``divisor``: the product of the sizes after the run."""
    out: list[tuple[int, int, int]] = []
    after = 1
    run: list[int] | None = None  # [size, stride, divisor]
    for s, st in zip(reversed(sizes), reversed(strides)):
        if s != 1:
            if run is not None and st != 0 and st == run[1] * run[0]:
                run[0] *= s
            else:
                if run is not None and run[1] != 0:
                    out.append((run[0], run[1], run[2]))
                run = [s, st, after]
        after *= s
    if run is not None and run[1] != 0:
        out.append((run[0], run[1], run[2]))
    return out


def _offset(var: str, total: int, groups: list[tuple[int, int, int]]) -> str:
    terms = []
    for size, stride, div in groups:
        idx = var if div == 1 else f"({var} / {div})"
        if size * div < total:
            idx = f"({idx} % {size})"
        terms.append(idx if stride == 1 else f"{idx} * {stride}")
    return " + ".join(terms) if terms else "0"


def _scaled(acc: str, scale: float) -> str:
    """A reduction's result times its scale; a mean (scale 1 / n) divides by n, as eager's mean does: the sum of
    a constant row (1.5 x 240 = 360, exact) divided by 240 is exactly the constant, times fp32(1 / 240) is not, and
    that rounding, normalised by 1 / sqrt(eps), would move every output of a constant row."""
    if scale == 1.0:
        return acc
    n = round(1.0 / scale) if scale > 0 else 0
    if n > 1 and 1.0 / n == scale:
        return f"({acc} / (float){n})"
    return f"({acc} * (float){scale!r})"


class Emitter:
    def __init__(self, prog: Program, backend: str):
        self.p, self.backend = prog, backend
        self.types = CUDA_TYPES if backend == "cuda" else CPU_TYPES
        # dims before ``split`` index the row, the rest the column; a pointwise region is one row
        self.split = len(prog.space) - prog.nred if prog.nred else 0

    def type_of(self, dtype: str) -> str:
        t = self.types.get(dtype)
        if t is None:
            raise Uncovered(f"an input of dtype {dtype}")
        return t

    def params(self) -> tuple[str, str]:
        ins = [f"const {self.type_of(d)}* FP_RESTRICT in{k}" for k, d in enumerate(self.p.input_dtypes)]
        out_t = self.type_of(self.p.out_dtype) if self.p.out_dtype != "float64" else None
        if out_t is None or self.p.out_dtype not in ("float32", "bfloat16", "float16"):
            raise Uncovered(f"an output of dtype {self.p.out_dtype}")
        params = ", ".join(ins + [f"{out_t}* FP_RESTRICT out"])
        args = ", ".join([f"in{k}" for k in range(len(self.p.input_dtypes))] + ["out"])
        return params, args

    def leaf(self, leaf: Leaf, space: tuple[int, ...], split: int) -> str:
        """The C read of one leaf over ``space`` (dims before ``split`` are the row's)."""
        kind, k = leaf.source
        row_sizes, col_sizes = space[:split], space[split:]
        row_st, col_st = leaf.strides[:split], leaf.strides[split:]
        if kind == "red":
            if any(st != 0 for s, st in zip(col_sizes, col_st) if s != 1) or \
                    _groups(row_sizes, row_st) != _groups(row_sizes, contiguous(row_sizes)):
                raise Uncovered("a reduction result read other than once per row")
            return f"red[{k}]"
        rows_total, cols_total = _prod(row_sizes), _prod(col_sizes)
        row_off = _offset("r", rows_total, _groups(row_sizes, row_st))
        col_off = _offset("c", cols_total, _groups(col_sizes, col_st))
        off = col_off if row_off == "0" else (row_off if col_off == "0" else f"{row_off} + {col_off}")
        dtype = self.p.input_dtypes[k]
        if dtype in ("float32", "bfloat16", "float16"):
            return f"fp_ld(in{k} + ({off}))"
        return f"(float)(in{k}[{off}])"

    def value(self, v: Val, space: tuple[int, ...], split: int) -> str:
        return v.expr.format(*[self.leaf(leaf, space, split) for leaf in v.leaves])

    def code(self) -> tuple[str, dict]:
        p = self.p
        if len(p.reductions) > MAX_REDUCTIONS:
            raise Uncovered(f"{len(p.reductions)} reductions (the skeletons run {MAX_REDUCTIONS} passes at most)")
        params, args = self.params()
        lines = [f"// generated for ops: {' '.join(p.ops)}",
                 f"#define REGION_PARAMS {params}", f"#define REGION_ARGS {args}"]
        sig = "(REGION_PARAMS, fp_idx r, fp_idx c, const float* red)"
        unused = "(void)r; (void)c; (void)red;"
        for j, red in enumerate(p.reductions):
            expr = self.value(red.val, p.space, self.split)
            lines.append(f"FP_FN float fp_elem{j}{sig} {{ {unused} return {expr}; }}")
            final = red.post.format(_scaled("(acc)", red.scale))
            lines += [f"#define FP_INIT{j} {INIT[red.combine]}",
                      f"#define FP_COMBINE{j}(a, b) {COMBINE[red.combine]}",
                      f"#define FP_FINAL{j}(acc) ({final})",
                      f"#define FP_SUM{j} {1 if red.combine == 'sum' else 0}",
                      f"#define FP_OP{j} {('sum', 'max', 'min').index(red.combine)}"]
        if p.per_row:
            rows_space = p.space[:self.split]
            out_expr = self.value(p.out, rows_space, len(rows_space))
            out_off = _offset("r", p.rows, _groups(rows_space, p.out_strides))
        else:
            out_expr = self.value(p.out, p.space, self.split)
            out_off = self.offset_rc(p.out_strides)
        lines.append(f"FP_FN float fp_out_value{sig} {{ {unused} return {out_expr}; }}")
        lines.append(f"FP_FN fp_idx fp_out_offset(fp_idx r, fp_idx c) {{ (void)r; (void)c; return {out_off}; }}")
        rows, cols = _prod(p.space[:self.split]), _prod(p.space[self.split:])
        defines = {"NUMEL": f"{p.numel}LL", "ROWS": f"{rows}LL", "COLS": f"{cols}LL",
                   "NRED": len(p.reductions), "PER_ROW": int(p.per_row)}
        return "\n".join(lines) + "\n", defines

    def offset_rc(self, strides: tuple[int, ...]) -> str:
        space, split = self.p.space, self.split
        row = _offset("r", _prod(space[:split]), _groups(space[:split], strides[:split]))
        col = _offset("c", _prod(space[split:]), _groups(space[split:], strides[split:]))
        return col if row == "0" else (row if col == "0" else f"{row} + {col}")


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


INDEX_LIMIT = 1 << 30  # 32-bit index math below this many elements (half of int's range: room for a window's +k)


def index_type(numel: int, tensors) -> str:
    """The C type of the generated index math (``FP_IDX_T``): ``int`` when the iteration space and
    every tensor's furthest element (``tensors``: (shape, strides) pairs) lie below ``INDEX_LIMIT``,
    else ``long long``. On a GPU, 64-bit division by a constant is a long emulated sequence: with it
    an index-heavy region (a 3x3 window over 200 M elements) is bound by integer instructions."""
    furthest = max([int(numel)] + [1 + sum((int(n) - 1) * abs(int(st)) for n, st in zip(shape, strides) if int(n) > 0)
                                   for shape, strides in tensors])
    return "int" if furthest < INDEX_LIMIT else "long long"


def window_code(prog: Program, backend: str, vec: int = 1, wrun: int = 1) -> tuple[str, dict]:
    """A window region's code (``region_window``) with the kernel's parameters."""
    em = Emitter(prog, backend)
    params, args = em.params()
    if len(prog.reductions) > MAX_REDUCTIONS:
        raise Uncovered(f"{len(prog.reductions)} reductions (the skeletons run {MAX_REDUCTIONS} passes at most)")
    head = [f"// generated for ops: {' '.join(prog.ops)}", f"#define REGION_PARAMS {params}",
            f"#define REGION_ARGS {args}"]
    body, defines = WindowWriter(prog, em.types).code(vec if backend == "cuda" else 1, wrun)
    return "\n".join(head) + "\n" + body, defines


def emit(prog: Program, backend: str, vec: int = 1, wrun: int = 1) -> tuple[str, dict]:
    """(the generated code, the size defines) for a skeleton; ``Uncovered`` when it cannot be.
    ``vec``: on CUDA, also the code that handles ``vec`` consecutive elements at once
    (``region_vector``); ``wrun``: a window region's runs along W (``region_window.WindowWriter.wrun``)."""
    if prog.kind == "window":
        return window_code(prog, backend, vec, wrun)
    code, defines = Emitter(prog, backend).code()
    if backend == "cuda":
        code += vector_code(prog, vec)
    return code, defines
