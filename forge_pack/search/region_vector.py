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


def plan(prog: Program, vec: int) -> dict:
    """{(source, strides): class} for every distinct leaf, and "out" for the output."""
    out: dict = {}
    for leaf in prog.out.leaves:
        key = (leaf.source, leaf.strides)
        if key in out:
            continue
        cls = classify(prog.space, leaf.strides, vec)
        if cls == "contig" and prog.input_dtypes[leaf.source[1]] not in VEC_FLOATS:
            cls = "lane"
        out[key] = cls
    out["out"] = classify(prog.space, prog.out_strides, vec)
    return out


def vector_code(prog: Program, vec: int) -> str:
    """``fp_out_vec`` (vec values of the output from c0), ``fp_store_vec`` and ``fp_vec_aligned``."""
    from forge_pack.search.region_emit import _groups, _offset

    if vec not in (1, 2, 4, 8):
        raise Uncovered(f"a vector of {vec} elements")
    total = prog.numel
    classes = plan(prog, vec)
    names: dict = {}
    loads, aligned = [], []
    tokens = []
    for leaf in prog.out.leaves:
        kind, k = leaf.source
        if kind != "in":
            raise Uncovered("a reduction result in a pointwise region")
        key = (leaf.source, leaf.strides)
        cls = classes[key]
        groups = _groups(prog.space, leaf.strides)
        dtype = prog.input_dtypes[k]
        floaty = dtype in VEC_FLOATS
        if cls == "lane":
            off = _offset("c", total, groups)
            tokens.append(f"fp_ld(in{k} + ({off}))" if floaty else f"(float)(in{k}[{off}])")
            continue
        if key not in names:
            q = names[key] = f"u{len(names)}"
            off = _offset("c0", total, groups)
            if cls == "uniform":
                read = f"fp_ld(in{k} + ({off}))" if floaty else f"(float)(in{k}[{off}])"
                loads.append(f"  const float {q} = {read};  // in{k}: one element for the whole run")
            else:
                loads.append(f"  float {q}[{vec}]; fp_ldv<{vec}>(in{k} + ({off}), {q});  // in{k}: {vec} consecutive")
                aligned.append(f"fp_aligned<{vec}>(in{k})")
        tokens.append(names[key] if cls == "uniform" else f"{names[key]}[j]")
    expr = prog.out.expr.format(*tokens)
    out_groups = _groups(prog.space, prog.out_strides)
    if classes["out"] == "contig":
        store = f"  fp_stv<{vec}>(out + ({_offset('c0', total, out_groups)}), y);"
        aligned.append(f"fp_aligned<{vec}>(out)")
    else:
        store = (f"#pragma unroll\n  for (int j = 0; j < {vec}; ++j) "
                 f"forge_store(out + fp_out_offset(0, c0 + j), y[j]);")
    lines = [
        f"// vector path: runs of {vec} elements; leaves {', '.join(f'{n}={classes[k]}' for k, n in names.items()) or 'none'}"
        f"; output {classes['out']}",
        f"static_assert(VEC == {vec}, \"the vector code is generated for one vector width\");",
        "FP_FN void fp_out_vec(REGION_PARAMS, long long c0, float* y) {",
        *loads,
        "#pragma unroll",
        f"  for (int j = 0; j < {vec}; ++j) {{",
        "    const long long c = c0 + j; (void)c;",
        f"    y[j] = {expr};",
        "  }",
        "}",
        "FP_FN void fp_store_vec(REGION_PARAMS, long long c0, const float* y) {",
        "  (void)c0;",
        store,
        "}",
        "FP_FN bool fp_vec_aligned(REGION_PARAMS) {",
        f"  return {' && '.join(aligned) if aligned else 'true'};",
        "}",
    ]
    return "\n".join(lines) + "\n"
