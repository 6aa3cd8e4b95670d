"""CUDA code that computes ``vec`` consecutive elements of a pointwise region at once.

The pointwise skeleton (templates/kernels/cuda/region_pointwise.cu) walks the flat iteration
index. Its vector path gives each thread runs of ``vec`` elements starting at a multiple of
``vec`` (c0, c0 + 1, ... c0 + vec - 1); over such a run every leaf is one of:

- ``uniform``: the same element for the whole run (a per-channel scale of NCHW when H*W is a
  multiple of ``vec``, a scalar): loaded once per run, and whatever the expression computes from
  uniform leaves only (the batch_norm affine's rsqrt) is the same value in every lane;
- ``contig``: ``vec`` consecutive elements, the first at an element offset that is a multiple of
  ``vec`` (the activations, a channels_last per-channel parameter when C is a multiple of
  ``vec``): one vector load of up to 16 bytes per access (``fp_ldv``), if the base pointer is
  aligned to it, which the kernel checks at run time (``fp_vec_aligned``: an input can be an
  offset view; an unaligned pointer sends every tile down the scalar path);
- ``lane``: anything else, read per element at its own offset (the scalar code's read).

The output is stored the same way (``contig``: vector stores; else per element). Pure Python.
"""

from __future__ import annotations

from forge_pack.search.region_lower import Program, Uncovered

VEC_FLOATS = ("float32", "bfloat16", "float16")  # the dtypes fp_ldv / fp_stv move as raw bytes
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8, "int32": 4,
               "bool": 1, "uint8": 1, "int8": 1}


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def classify(sizes: tuple[int, ...], strides: tuple[int, ...], vec: int) -> str:
    """How a leaf read at ``strides`` over ``sizes`` behaves over a run of ``vec`` consecutive flat
    indices starting at a multiple of ``vec``: "uniform", "contig" or "lane" (see the module doc)."""
    from forge_pack.search.region_emit import _groups

    total = _prod(sizes)
    groups = _groups(sizes, strides)
    # (c / div) % size is constant over the run exactly when div is a multiple of vec
    if all(div % vec == 0 for _, _, div in groups):
        return "uniform"
    inner = [g for g in groups if g[2] == 1]
    if inner and inner[0][1] == 1:
        size = inner[0][0]
        # the stride-1 run must hold whole vectors, and every other dim must keep the start a
        # multiple of vec (so that the access is as aligned as the base pointer)
        if (size == total or size % vec == 0) and all(st % vec == 0 for _, st, div in groups if div != 1):
            return "contig"
    return "lane"


def leaf_class(sizes, strides, split: int, vec: int) -> str:
    """``classify`` over the column dims (those from ``split`` on); a contiguous leaf must also
    start every row at a multiple of ``vec`` (so that its accesses are as aligned as its base)."""
    cls = classify(tuple(sizes[split:]), tuple(strides[split:]), vec)
    if cls == "contig" and any(st % vec for s_, st in zip(sizes[:split], strides[:split]) if s_ != 1):
        return "lane"
    return cls


class VectorWriter:
    """The vector functions of one program at one width; collects the operands that need an
    aligned base pointer (``aligned``)."""

    def __init__(self, prog: Program, vec: int, space: tuple[int, ...], split: int):
        if vec not in (1, 2, 4, 8):
            raise Uncovered(f"a vector of {vec} elements")
        self.p, self.vec, self.space, self.split = prog, vec, tuple(space), split
        self.aligned: list[str] = []

    def _offsets(self, strides, cvar: str) -> str:
        from forge_pack.search.region_emit import _groups, _offset

        rs, cs = self.space[:self.split], self.space[self.split:]
        row = _offset("r", _prod(rs), _groups(rs, strides[:self.split]))
        col = _offset(cvar, _prod(cs), _groups(cs, strides[self.split:]))
        return col if row == "0" else (row if col == "0" else f"{row} + {col}")

    def _class(self, leaf) -> str:
        """The leaf's class over a run (leaf_class); a contig leaf of a non-float dtype is read per lane."""
        cls = leaf_class(self.space, leaf.strides, self.split, self.vec)
        return "lane" if cls == "contig" and self.p.input_dtypes[leaf.source[1]] not in VEC_FLOATS else cls

    def _read(self, leaf, cvar: str) -> str:
        """One element of the leaf at column ``cvar``."""
        k = leaf.source[1]
        off = self._offsets(leaf.strides, cvar)
        return f"fp_ld(in{k} + ({off}))" if self.p.input_dtypes[k] in VEC_FLOATS else f"(float)(in{k}[{off}])"

    def _read_vector(self, leaf, dest: str) -> str:
        """The leaf's run at column c0 into ``dest`` (an fp_ldv, which needs the base pointer aligned)."""
        k = leaf.source[1]
        if f"fp_aligned<{self.vec}>(in{k})" not in self.aligned:
            self.aligned.append(f"fp_aligned<{self.vec}>(in{k})")
        return f"fp_ldv<{self.vec}>(in{k} + ({self._offsets(leaf.strides, 'c0')}), {dest});"

    def _value(self, head: str, unused: str, loads: list[str], expr: str) -> list[str]:
        """A vector function: ``head`` (its signature), then y[j] = expr for the run's vec columns."""
        return [head, f"  {unused}", *loads, "#pragma unroll", f"  for (int j = 0; j < {self.vec}; ++j) {{",
                "    const fp_idx c = c0 + j; (void)c;", f"    y[j] = {expr};", "  }", "}"]

    def function(self, name: str, val) -> tuple[list[str], str]:
        """``name(REGION_PARAMS, r, c0, red, y)``: y[j] = the value at column c0 + j, j < vec."""
        vec = self.vec
        names: dict = {}
        classes: dict = {}
        loads, tokens = [], []
        for leaf in val.leaves:
            kind, k = leaf.source
            if kind == "red":
                tokens.append(f"red[{k}]")  # one value per row
                continue
            key = (leaf.source, leaf.strides)
            cls = self._class(leaf)
            if cls == "lane":
                tokens.append(self._read(leaf, "c"))
                continue
            if key not in names:
                q = names[key] = f"u{len(names)}"
                classes[q] = cls
                if cls == "uniform":
                    loads.append(f"  const float {q} = {self._read(leaf, 'c0')};  // in{k}: one element for the whole run")
                else:
                    loads.append(f"  float {q}[{vec}]; {self._read_vector(leaf, q)}  // in{k}: {vec} consecutive")
            tokens.append(names[key] if classes[names[key]] == "uniform" else f"{names[key]}[j]")
        lines = self._value(f"FP_FN void {name}(REGION_PARAMS, fp_idx r, fp_idx c0, const float* red, float* y) {{",
                            "(void)r; (void)red;", loads, val.expr.format(*tokens))
        summary = ", ".join(f"{q}={c}" for q, c in classes.items()) or "none"
        return lines, summary

    def run_code(self, values: list[tuple[str, object]]) -> list[str]:
        """A row's cached path: ``fp_run`` holds every input leaf of ``values`` over one run of vec columns (a
        vector, one element for the whole run, or vec elements read one by one), ``fp_load_run(REGION_PARAMS, r,
        c0, q)`` reads them all, and ``<name>_run(q, r, c0, red, y)`` computes each value from them, so a lane's
        runs, loaded once into registers, serve every pass and the epilogue (region_row.cu's CACHE). Loads the
        compiler would merge on its own are not enough: it does not move them across the group reduction's
        shuffles."""
        vec = self.vec
        fields, loads, names = [], [], {}
        for _, val in values:
            for leaf in val.leaves:
                key = (leaf.source, leaf.strides)
                if leaf.source[0] == "red" or key in names:
                    continue
                q = f"u{len(names)}"
                cls = self._class(leaf)
                names[key] = (q, cls)
                if cls == "uniform":
                    fields.append(f"  float {q};")
                    loads.append(f"  q.{q} = {self._read(leaf, 'c0')};")
                elif cls == "contig":
                    fields.append(f"  float {q}[{vec}];")
                    loads.append(f"  {self._read_vector(leaf, f'q.{q}')}")
                else:
                    fields.append(f"  float {q}[{vec}];")
                    loads.append(f"#pragma unroll\n  for (int j = 0; j < {vec}; ++j) {{ const fp_idx c = c0 + j; "
                                 f"q.{q}[j] = {self._read(leaf, 'c')}; }}")
        lines = ["struct fp_run {", *fields, "};",
                 "FP_FN void fp_load_run(REGION_PARAMS, fp_idx r, fp_idx c0, fp_run& q) {",
                 "  (void)r; (void)c0; (void)q;", *loads, "}"]
        for name, val in values:
            tokens = []
            for leaf in val.leaves:
                kind, k = leaf.source
                if kind == "red":
                    tokens.append(f"red[{k}]")
                    continue
                q, cls = names[(leaf.source, leaf.strides)]
                tokens.append(f"q.{q}" if cls == "uniform" else f"q.{q}[j]")
            lines += self._value(f"FP_FN void {name}_run(const fp_run& q, fp_idx r, fp_idx c0, const float* red, "
                                 "float* y) {", "(void)q; (void)r; (void)red;", [], val.expr.format(*tokens))
        return lines

    def store(self) -> tuple[list[str], str]:
        """``fp_store_vec(REGION_PARAMS, r, c0, y)``: the output's columns c0 .. c0 + vec - 1."""
        cls = leaf_class(self.space, self.p.out_strides, self.split, self.vec)
        if cls == "contig":
            body = f"  fp_stv<{self.vec}>(out + ({self._offsets(self.p.out_strides, 'c0')}), y);"
            self.aligned.append(f"fp_aligned<{self.vec}>(out)")
        else:
            cls = "lane"
            body = (f"#pragma unroll\n  for (int j = 0; j < {self.vec}; ++j) "
                    f"forge_store(out + fp_out_offset(r, c0 + j), y[j]);")
        return ["FP_FN void fp_store_vec(REGION_PARAMS, fp_idx r, fp_idx c0, const float* y) {",
                "  (void)r; (void)c0;", body, "}"], cls

    def aligned_check(self) -> list[str]:
        return ["FP_FN bool fp_vec_aligned(REGION_PARAMS) {",
                f"  return {' && '.join(self.aligned) if self.aligned else 'true'};", "}"]


def vector_code(prog: Program, vec: int) -> str:
    """The vector path of a region at width ``vec``: pointwise, ``fp_out_vec`` (vec output values
    from flat index c0); row, ``fp_elem_vec<j>`` per reduction and (unless one value per row)
    ``fp_out_vec`` over a row's columns; ``fp_store_vec``; ``fp_vec_aligned``."""
    split = len(prog.space) - prog.nred if prog.nred else 0
    w = VectorWriter(prog, vec, prog.space, split)
    head = [f"static_assert(VEC == {vec}, \"the vector code is generated for one vector width\");"]
    body: list[str] = []
    notes = []
    for j, red in enumerate(prog.reductions):
        lines, summary = w.function(f"fp_elem_vec{j}", red.val)
        body += lines
        notes.append(f"reduction {j}: {summary}")
    if not prog.per_row:
        lines, summary = w.function("fp_out_vec", prog.out)
        store, out_cls = w.store()
        body += lines + store
        notes.append(f"leaves {summary}; output {out_cls}" if not prog.nred else f"output: {summary}; stored {out_cls}")
    if prog.nred:  # the cached row (region_row.cu's CACHE)
        values = [(f"fp_elem_vec{j}", red.val) for j, red in enumerate(prog.reductions)]
        body += w.run_code(values + ([] if prog.per_row else [("fp_out_vec", prog.out)]))
    comment = f"// vector path: runs of {vec} elements; " + "; ".join(notes)
    return "\n".join([comment, *head, *body, *w.aligned_check()]) + "\n"
