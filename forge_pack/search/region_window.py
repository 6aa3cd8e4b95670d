"""C code for a window region (a 2-d pooling with its pointwise prologue and epilogue).

The skeletons (templates/kernels/{cpu,cuda}/region_window.*) walk the pooled output's elements by
a flat index ``e`` in the output's memory order (so consecutive threads write consecutive
addresses: along W for NCHW, along C for channels_last) and call the generated

- ``fp_window_value(REGION_PARAMS, e, &o)``: the output element e and its offset ``o``. It splits
  e into the output's coordinates, finds the window's input rows and columns (``region_lower.Window``
  holds PyTorch's rules), accumulates every reduction over the window with the prologue evaluated
  per input element (a cell outside the input adds nothing: padding is -inf for max, absent for
  avg), divides an average by its count, then evaluates the epilogue.

With fixed windows (max_pool2d, avg_pool2d) the window loops have compile-time trip counts
(unrolled; a cell outside the input is predicated off); adaptive windows loop between their
computed bounds. On CUDA, ``vec`` > 1 also emits ``fp_window_vec``: ``vec`` consecutive elements of
the innermost output dim when that dim is not a pooled one (channels_last's C), each input read as
``region_vector`` names it: uniform (once per run), contig (a vector of up to 16 bytes) or lane
(per element). ``wrun`` > 1 (both backends) emits ``fp_window_wrun``: ``wrun`` consecutive outputs
along the pooled W (NCHW), each input cell of their overlapping windows read and its prologue
computed once. Pure Python, no torch import.
"""

from __future__ import annotations

import re

from forge_pack.search.region_lower import Leaf, Program, Uncovered, contiguous
from forge_pack.search.region_vector import VEC_FLOATS

INIT = {"sum": "0.0f", "max": "(-FP_INF)"}
COMBINE = {"sum": "{a} + {b}", "max": "fp_maxnan({a}, {b})"}


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


_CALL = re.compile(r"fp_\w+\(")


def hoist_calls(expr: str, invariant: set[int]) -> tuple[str, list[str]]:
    """(``expr`` with each outermost function call that reads only ``invariant`` leaves replaced by
    the marker ``@HOIST<n>@``, those calls). A call on per-window values (the batch_norm affine's
    rsqrt of the running variance) is computed once per output element, before the window loops:
    the compiler does not share it between unrolled cells whose reads are predicated."""
    out, calls, i = [], [], 0
    while i < len(expr):
        m = _CALL.match(expr, i)
        if m is None:
            out.append(expr[i])
            i += 1
            continue
        depth, j = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(expr[j], 0)
            j += 1
        refs = {int(x) for x in re.findall(r"\{(\d+)\}", expr[i:j])}
        if refs and refs <= invariant:
            out.append(f"@HOIST{len(calls)}@")
            calls.append(expr[i:j])
            i = j
        else:  # scan inside: a nested call may still be hoistable
            out.append(expr[i:m.end()])
            i = m.end()
    return "".join(out), calls


def iteration_order(space: tuple[int, ...], out_strides: tuple[int, ...]) -> list[int]:
    """The output's dims outermost first, as its strides lay them out in memory (size-1 dims
    anywhere: they index nothing)."""
    return sorted(range(len(space)), key=lambda d: (-out_strides[d] if space[d] != 1 else 1, d))


def vector_dim(prog: Program) -> int | None:
    """The innermost output dim when it is not a pooled one (channels_last's C): the dim a vector
    of consecutive elements runs along; None otherwise (NCHW: W is pooled)."""
    order = [d for d in iteration_order(prog.space, prog.out_strides) if prog.space[d] != 1]
    if not order or order[-1] >= len(prog.space) - 2:
        return None
    return order[-1]


class WindowWriter:
    def __init__(self, prog: Program, types: dict):
        if prog.window is None:
            raise Uncovered("not a window program")
        self.p, self.w, self.types = prog, prog.window, types
        self.space = prog.space
        self.nd = len(prog.space)

    # ---- reads
    def _offset(self, strides: tuple[int, ...], sizes: tuple[int, ...], dims, idx) -> str:
        terms = []
        for d in dims:
            st = strides[d]
            if st != 0 and sizes[d] != 1:
                terms.append(idx(d) if st == 1 else f"{idx(d)} * {st}")
        return " + ".join(terms) if terms else "0"

    def _read(self, k: int, off: str) -> str:
        dtype = self.p.input_dtypes[k]
        return f"fp_ld(in{k} + ({off}))" if dtype in VEC_FLOATS else f"(float)(in{k}[{off}])"

    def _window_leaves(self) -> list[Leaf]:
        out: list[Leaf] = []
        for red in self.p.reductions:
            for leaf in red.val.leaves:
                if leaf.source[0] != "in":
                    raise Uncovered("a window reduction of a value computed from another reduction")
                if leaf not in out:
                    out.append(leaf)
        return out

    # ---- the window
    def _bounds(self) -> list[str]:
        w = self.w
        h, wd = w.in_shape[-2], w.in_shape[-1]
        pooled = ((self.nd - 2, h), (self.nd - 1, wd))
        lines = []
        for axis, (i, n) in enumerate(pooled):
            a = "hw"[axis]
            if w.mode == "adaptive":
                o = self.space[i]
                lines += [f"  const fp_idx {a}s = (i{i} * {n}) / {o};",
                          f"  const fp_idx {a}e = ((i{i} + 1) * {n} + {o - 1}) / {o};"]
            else:
                lines.append(f"  const fp_idx {a}0 = i{i} * {w.stride[axis]} - {w.pad[axis]};")
        return lines

    def _divisor(self) -> str:
        w = self.w
        if w.mode == "max":
            return ""
        if w.mode == "adaptive":
            return "(float)((he - hs) * (we - ws))"
        if w.divisor:
            return f"(float){w.divisor}"
        h, wd = w.in_shape[-2], w.in_shape[-1]
        if w.count_include_pad:  # the window up to the padded edge (pad cells count, cells past it do not)
            return (f"(float)((fp_min_idx(h0 + {w.kernel[0]}, {h + w.pad[0]}) - h0) * "
                    f"(fp_min_idx(w0 + {w.kernel[1]}, {wd + w.pad[1]}) - w0))")
        return (f"(float)((fp_min_idx(h0 + {w.kernel[0]}, {h}) - fp_max_idx(h0, 0)) * "
                f"(fp_min_idx(w0 + {w.kernel[1]}, {wd}) - fp_max_idx(w0, 0)))")

    def _loops(self, body: list[str]) -> list[str]:
        """The window loops around ``body`` (statements at input row ``ih``, column ``iw``; ``ok``
        says whether that cell lies inside the input). Out-of-range cells are not skipped with a
        branch: their loads are predicated off and their value left out of the accumulator, so
        the math on per-window values (the batch_norm affine's rsqrt) is common to every unrolled
        cell and computed once."""
        w = self.w
        h, wd = w.in_shape[-2], w.in_shape[-1]
        if w.mode == "adaptive":
            return ["  for (fp_idx ih = hs; ih < he; ++ih) {", "    for (fp_idx iw = ws; iw < we; ++iw) {",
                    "      const bool ok = true;", *["  " + b for b in body], "    }", "  }"]
        return ["  FP_WIN_UNROLL", f"  for (int kh = 0; kh < {w.kernel[0]}; ++kh) {{",
                f"    const fp_idx ih = h0 + (fp_idx)kh * {w.dilation[0]};",
                f"    const bool ok_h = ih >= 0 && ih < {h};",
                "    FP_WIN_UNROLL", f"    for (int kw = 0; kw < {w.kernel[1]}; ++kw) {{",
                f"      const fp_idx iw = w0 + (fp_idx)kw * {w.dilation[1]};",
                f"      const bool ok = ok_h && iw >= 0 && iw < {wd};", *["  " + b for b in body], "    }", "  }"]

    def _coords(self, order: list[int], var: str) -> list[str]:
        lines = [f"  fp_idx t = {var};"]
        live = [d for d in order if self.space[d] != 1]
        lines += [f"  const fp_idx i{d} = 0;" for d in range(self.nd) if self.space[d] == 1]
        for pos, d in enumerate(reversed(live)):
            if pos == len(live) - 1:
                lines.append(f"  const fp_idx i{d} = t;")
            else:
                lines.append(f"  const fp_idx i{d} = t % {self.space[d]}; t /= {self.space[d]};")
        lines.append("  (void)t; " + " ".join(f"(void)i{d};" for d in range(self.nd)))
        return lines

    def _in_offset(self, leaf: Leaf, base: str) -> str:
        st_h, st_w = leaf.strides[-2], leaf.strides[-1]
        off = base
        if self.w.in_shape[-2] != 1 and st_h:
            off += " + ih" + (f" * {st_h}" if st_h != 1 else "")
        if self.w.in_shape[-1] != 1 and st_w:
            off += " + iw" + (f" * {st_w}" if st_w != 1 else "")
        return off

    def _invariant(self, leaf: Leaf) -> bool:
        """Read once per window (a per-channel parameter): no stride over the pooled dims."""
        return all(st == 0 or n == 1 for st, n in zip(leaf.strides[-2:], self.w.in_shape[-2:]))

    def _lead(self, leaf: Leaf, idx) -> str:
        return self._offset(leaf.strides, self.w.in_shape, range(self.nd - 2), idx)

    # ---- the scalar function
    def scalar(self) -> list[str]:
        p = self.p
        order = iteration_order(p.space, p.out_strides)
        leaves = self._window_leaves()
        name = {leaf: f"b{n}" for n, leaf in enumerate(leaves)}
        plain = lambda d: f"i{d}"  # noqa: E731
        lines = ["FP_FN float fp_window_value(REGION_PARAMS, fp_idx e, fp_idx* o) {",
                 *self._coords(order, "e"), *self._bounds(),
                 *[f"  const fp_idx {name[leaf]} = {self._lead(leaf, plain)};" for leaf in leaves],
                 *[f"  float acc{j} = {INIT[red.combine]};" for j, red in enumerate(p.reductions)]]
        values = self._cell_values(leaves, name, lines)
        body = [f"    acc{j} = ok ? {COMBINE[red.combine].format(a=f'acc{j}', b=values[j])} : acc{j};"
                for j, red in enumerate(p.reductions)]
        lines += self._loops(body)
        div = self._divisor()
        lines.append(f"  float red[{len(p.reductions)}];")
        lines += [f"  red[{j}] = acc{j}" + (f" / {div};" if div else ";") for j in range(len(p.reductions))]
        lines.append(f"  *o = {self._offset(p.out_strides, p.space, range(self.nd), plain)};")
        return lines + [f"  return {p.out.expr.format(*self._out_tokens(plain))};", "}"]

    def _cell_values(self, leaves: list[Leaf], name: dict, lines: list[str]) -> list[str]:
        """Per reduction, its value at one window cell (row ``ih``, column ``iw``; reads predicated on
        ``ok``). Appends to ``lines`` what is computed once per window, before the loops: the reads the
        window does not move (a per-channel parameter, ``x<n>``) and the calls on those alone (the
        affine's rsqrt, ``h<j>_<n>``)."""
        lines += [f"  const float x{name[leaf][1:]} = {self._read(leaf.source[1], name[leaf])};"
                  for leaf in leaves if self._invariant(leaf)]
        values = []
        for j, red in enumerate(self.p.reductions):
            toks = [f"x{name[leaf][1:]}" if self._invariant(leaf) else
                    f"(ok ? {self._read(leaf.source[1], self._in_offset(leaf, name[leaf]))} : 0.0f)"
                    for leaf in red.val.leaves]
            expr, calls = hoist_calls(red.val.expr, {n for n, leaf in enumerate(red.val.leaves) if self._invariant(leaf)})
            for n, call in enumerate(calls):
                lines.append(f"  const float h{j}_{n} = {call.format(*toks)};")
                expr = expr.replace(f"@HOIST{n}@", f"h{j}_{n}")
            values.append(expr.format(*toks))
        return values

    def _out_tokens(self, idx) -> list[str]:
        """The epilogue's operands for one output element: ``red[k]`` for reduction k, other inputs read at
        the output's coordinates (``idx(d)``)."""
        p = self.p
        toks = []
        for leaf in p.out.leaves:
            kind, k = leaf.source
            if kind == "red":
                if leaf.strides != contiguous(p.space):
                    raise Uncovered("a window result read other than once per pooled element")
                toks.append(f"red[{k}]")
            else:
                toks.append(self._read(k, self._offset(leaf.strides, p.space, range(self.nd), idx)))
        return toks

    # ---- the vector function (CUDA)
    def vector(self, vec: int) -> list[str]:
        """``fp_window_vec(REGION_PARAMS, e0, o0, y)`` for the ``vec`` elements from e0 (a multiple of
        ``vec``) along ``vector_dim``, and ``fp_window_vec_ok`` / ``fp_window_store_vec``."""
        p = self.p
        vd = vector_dim(p)
        if vd is None or p.space[vd] % vec:
            raise Uncovered(f"vec {vec}: the innermost output dim is pooled or not a multiple of {vec}")
        order = iteration_order(p.space, p.out_strides)
        plain = lambda d: f"i{d}"  # noqa: E731
        lane = lambda d: f"(i{d} + j)" if d == vd else f"i{d}"  # noqa: E731
        aligned: list[str] = []
        leaves = self._window_leaves()
        cls = {leaf: self._class(leaf.strides, self.w.in_shape, vd, vec, leaf.source[1]) for leaf in leaves}
        name = {leaf: f"b{n}" for n, leaf in enumerate(leaves)}
        lines = [f"FP_FN void fp_window_vec(REGION_PARAMS, fp_idx e0, float* y) {{",
                 *self._coords(order, "e0"), *self._bounds(),
                 *[f"  const fp_idx {name[leaf]} = {self._lead(leaf, plain)};  // {cls[leaf]}" for leaf in leaves],
                 *[f"  float acc{j}[{vec}];" for j in range(len(p.reductions))],
                 "#pragma unroll", f"  for (int j = 0; j < {vec}; ++j) {{",
                 *[f"    acc{j}[j] = {INIT[red.combine]};" for j, red in enumerate(p.reductions)], "  }"]
        body, vals = [], {}
        for leaf in leaves:
            k = leaf.source[1]
            off = self._in_offset(leaf, name[leaf])
            hoist = self._invariant(leaf)  # loaded once, before the window loops
            if cls[leaf] == "contig":
                vals[leaf] = f"x{len(vals)}[j]"
                x = f"x{len(vals) - 1}"
                if hoist:
                    lines.append(f"  float {x}[{vec}]; fp_ldv<{vec}>(in{k} + ({off}), {x});")
                else:
                    body.append(f"  float {x}[{vec}] = {{}}; if (ok) fp_ldv<{vec}>(in{k} + ({off}), {x});")
                if f"fp_aligned<{vec}>(in{k})" not in aligned:
                    aligned.append(f"fp_aligned<{vec}>(in{k})")
            elif cls[leaf] == "uniform":
                vals[leaf] = f"x{len(vals)}"
                read = self._read(k, off) if hoist else f"(ok ? {self._read(k, off)} : 0.0f)"
                (lines if hoist else body).append(f"  const float x{len(vals) - 1} = {read};")
            else:
                read = self._read(k, f"({name[leaf]} + j * {leaf.strides[vd]})" + off[len(name[leaf]):])
                vals[leaf] = read if hoist else f"(ok ? {read} : 0.0f)"
        body += ["#pragma unroll", f"  for (int j = 0; j < {vec}; ++j) {{"]
        for j, red in enumerate(p.reductions):
            toks = [vals[leaf] for leaf in red.val.leaves]
            expr, calls = hoist_calls(red.val.expr, {n for n, leaf in enumerate(red.val.leaves) if self._invariant(leaf)})
            for n, call in enumerate(calls):
                lines += [f"  float h{j}_{n}[{vec}];", "#pragma unroll",
                          f"  for (int j = 0; j < {vec}; ++j) h{j}_{n}[j] = {call.format(*toks)};"]
                expr = expr.replace(f"@HOIST{n}@", f"h{j}_{n}[j]")
            expr = expr.format(*toks)
            combined = COMBINE[red.combine].format(a=f"acc{j}[j]", b=expr)
            body.append(f"    acc{j}[j] = ok ? {combined} : acc{j}[j];")
        body.append("  }")
        lines += self._loops(body)
        div = self._divisor()
        toks = []
        for leaf in p.out.leaves:
            kind, k = leaf.source
            if kind == "red":
                if leaf.strides != contiguous(p.space):
                    raise Uncovered("a window result read other than once per pooled element")
                toks.append(f"red{k}")
            else:  # epilogue inputs are read per element: a pooled output is a fraction of the window reads
                toks.append(self._read(k, self._offset(leaf.strides, p.space, range(self.nd), lane)))
        lines += [f"  const float count = {div};"] if div else []  # divided, as eager divides (not times 1 / count)
        lines += ["#pragma unroll", f"  for (int j = 0; j < {vec}; ++j) {{",
                  *[f"    const float red{j} = acc{j}[j]" + (" / count;" if div else ";")
                    for j in range(len(p.reductions))],
                  f"    y[j] = {p.out.expr.format(*toks)};", "  }", "}"]
        out_cls = self._class(p.out_strides, p.space, vd, vec, None)
        out_off = self._offset(p.out_strides, p.space, range(self.nd), plain)
        if out_cls == "contig":
            aligned.append(f"fp_aligned<{vec}>(out)")
            store = f"  fp_window_stv<{vec}>(out + ({out_off}), y);"
        else:
            store = (f"#pragma unroll\n  for (int j = 0; j < {vec}; ++j) "
                     f"forge_store(out + ({self._offset(p.out_strides, p.space, range(self.nd), lane)}), y[j]);")
        lines += ["FP_FN void fp_window_store_vec(REGION_PARAMS, fp_idx e0, const float* y) {",
                  *self._coords(order, "e0"), store, "}",
                  "FP_FN bool fp_window_vec_ok(REGION_PARAMS) {",
                  f"  return {' && '.join(aligned) if aligned else 'true'};", "}"]
        return [f"// vector path: runs of {vec} elements along dim {vd}; window reads "
                + ", ".join(f"in{leaf.source[1]} {cls[leaf]}" for leaf in leaves) + f"; output {out_cls}"] + lines

    # ---- runs along W (NCHW)
    def wrun(self, r: int) -> list[str]:
        """``fp_window_wrun(REGION_PARAMS, e0, y, o)``: the ``r`` consecutive outputs from e0 (a multiple of
        ``r``) along the pooled W, the innermost output dim (NCHW), and their offsets. The r windows
        overlap where the stride is below the kernel: each input cell of their union (SPAN columns
        per kernel row) is read and its prologue computed once, then combined into every window that
        holds it (a 3x3 / 2 max pool: 15 cells for 2 outputs, 27 for 4, instead of 9 each)."""
        p, w = self.p, self.w
        wdim = self.nd - 1
        order = iteration_order(p.space, p.out_strides)
        live = [d for d in order if p.space[d] != 1]
        if w.mode == "adaptive" or not live or live[-1] != wdim or p.space[wdim] % r:
            raise Uncovered(f"wrun {r}: needs a fixed window whose pooled W is the innermost output dim "
                            f"and a multiple of {r}")
        (kh, kw), sw, (dh, dw) = w.kernel, w.stride[1], w.dilation
        h, wd = w.in_shape[-2], w.in_shape[-1]
        span = (r - 1) * sw + (kw - 1) * dw + 1
        plain = lambda d: f"i{d}"  # noqa: E731
        leaves = self._window_leaves()
        name = {leaf: f"b{n}" for n, leaf in enumerate(leaves)}
        lines = [f"FP_FN void fp_window_wrun(REGION_PARAMS, fp_idx e0, float* y, fp_idx* o) {{",
                 *self._coords(order, "e0"), *self._bounds(),
                 f"  const fp_idx i{wdim}_run = i{wdim}, w0_run = w0; (void)i{wdim}_run; (void)w0_run;",
                 *[f"  const fp_idx {name[leaf]} = {self._lead(leaf, plain)};" for leaf in leaves],
                 *[f"  float acc{j}_{q} = {INIT[red.combine]};" for j, red in enumerate(p.reductions) for q in range(r)]]
        values = self._cell_values(leaves, name, lines)
        body = []
        for c in range(span):  # column c of the run's union: output q holds it when c - q * stride is a tap
            owners = [q for q in range(r) if 0 <= c - q * sw <= (kw - 1) * dw and (c - q * sw) % dw == 0]
            if not owners:
                continue  # between windows (a stride above the kernel): never read
            body += ["    {", f"      const fp_idx iw = w0 + {c};", f"      const bool ok = ok_h && iw >= 0 && iw < {wd};"]
            for j, red in enumerate(p.reductions):
                body.append(f"      const float v{j} = {values[j]};")
                body += [f"      acc{j}_{q} = ok ? {COMBINE[red.combine].format(a=f'acc{j}_{q}', b=f'v{j}')} : acc{j}_{q};"
                         for q in owners]
            body.append("    }")
        lines += ["  FP_WIN_UNROLL", f"  for (int kh = 0; kh < {kh}; ++kh) {{",
                  f"    const fp_idx ih = h0 + (fp_idx)kh * {dh};", f"    const bool ok_h = ih >= 0 && ih < {h};",
                  *body, "  }"]
        div = self._divisor()
        toks = self._out_tokens(plain)
        for q in range(r):  # output q: its coordinate along W and its window's first column, shadowed
            lines += ["  {", f"    const fp_idx i{wdim} = i{wdim}_run + {q}, w0 = w0_run + {q * sw}; "
                             f"(void)i{wdim}; (void)w0;",
                      f"    float red[{len(p.reductions)}];",
                      *[f"    red[{j}] = acc{j}_{q}" + (f" / {div};" if div else ";") for j in range(len(p.reductions))],
                      f"    o[{q}] = {self._offset(p.out_strides, p.space, range(self.nd), plain)};",
                      f"    y[{q}] = {p.out.expr.format(*toks)};", "  }"]
        return [f"// W runs: {r} outputs along the pooled W per call, {span} input columns per kernel row"] + lines + ["}"]

    def _class(self, strides, sizes, vd: int, vec: int, k) -> str:
        """uniform / contig / lane of a read over a run of ``vec`` along dim ``vd`` (the other dims fixed)."""
        if k is not None and self.p.input_dtypes[k] not in VEC_FLOATS:
            return "uniform" if strides[vd] == 0 else "lane"
        if strides[vd] == 0:
            return "uniform"
        others = [st for d, st in enumerate(strides) if d != vd and sizes[d] != 1]
        if strides[vd] == 1 and all(st % vec == 0 for st in others):
            return "contig"
        return "lane"

    def code(self, vec: int = 1, wrun: int = 1) -> tuple[str, dict]:
        p, w = self.p, self.w
        order = iteration_order(p.space, p.out_strides)
        head = (f"// window: {w.mode} pool of {list(w.in_shape)} to {list(p.space)}, kernel {list(w.kernel)}, "
                f"stride {list(w.stride)}, padding {list(w.pad)}, dilation {list(w.dilation)}; "
                f"elements in the output's memory order (dims {order}, outermost first)")
        lines = [head, *self.scalar()]
        if vec > 1:
            lines += [f"static_assert(VEC == {vec}, \"the vector code is generated for one vector width\");",
                      *self.vector(vec)]
        if wrun > 1:
            if vec > 1:
                raise Uncovered("vec and wrun together (a run is along C or along W, not both)")
            lines += self.wrun(wrun)
        defines = {"NUMEL": f"{p.numel}LL", "NRED": len(p.reductions), "WRUN": wrun}
        return "\n".join(lines) + "\n", defines
