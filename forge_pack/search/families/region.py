"""Regions (fused chains of a model's memory-bound ops): skeleton families with generated code.

A region signature (op ``region``, see forge_pack/targets/region_target.py) carries the region's
canonical form. ``region_lower`` turns the form into an iteration space, reductions and
expressions; ``region_emit`` writes them as C; the skeletons in templates/kernels/{cpu,cuda}/
region_{pointwise,row,window}.* hold the loops. Every size and stride is a compile-time constant (the
form fixes them). A form the lowering does not cover gets no family: ``coverage`` says why.
Pure Python, no torch import.
"""

from __future__ import annotations

from functools import lru_cache

from forge_pack.core.signature import Signature
from forge_pack.search.region_emit import emit, index_type
from forge_pack.search.region_lower import Program, Uncovered, lower
from forge_pack.search.region_vector import leaf_class
from forge_pack.search.region_window import vector_dim
from forge_pack.search.template_kit import (GRAIN, THREADS, Built, Family, Gpu, Knob, cdiv, clamp, first,
                                            grain_default, launch, pow2_ceil, spec)

OPS = ("region",)
REGION_OP = "region"

CHUNK = Knob("chunk", (1024, 4096, 16384, 65536), "elements per OpenMP chunk")
VEC = Knob("vec", (1, 2, 4, 8), "consecutive columns per thread and access (16 bytes at most per load)")
ROWS_PER_BLOCK = Knob("rows_per_block", (1, 2, 4, 8, 16, 32, 64, 128, 256),
                      "rows one block reduces at once (threads/rows per row; = threads: one row per thread)")
FAST_MATH = Knob("fast_math", (0, 1), "exp: 0 expf, 1 __expf (MUFU)")
CACHE = Knob("cache", (0, 1), "1: a lane's runs of its row read once into registers for every pass and the epilogue "
             "(at most CACHE_ELEMS elements per lane)")
PW_VEC = Knob("vec", (1, 2, 4, 8), "consecutive elements per thread and access (16 bytes of output at most)")
ILP = Knob("ilp", (1, 2, 4), "vector runs per thread in flight (all loaded before any is stored)")
GRID_STRIDE = Knob("grid_stride", (0, 1), "0: one tile per block; 1: a resident grid striding over the tiles")
ROW_THREADS = Knob("threads", (32, 64, 128, 256, 512, 1024), "threads per block")
WIN_CHUNK = Knob("chunk", (16, 64, 256, 1024, 4096), "pooled elements per OpenMP chunk")
WIN_VEC = Knob("vec", (1, 2, 4, 8), "consecutive outputs along a non-pooled innermost dim per thread (channels_last C)")
WIN_ILP = Knob("ilp", (1, 2, 4), "runs of vec outputs per thread in flight")
WIN_WRUN = Knob("wrun", (1, 2, 4), "consecutive outputs along a pooled innermost W per call (NCHW), each input "
                "cell of their overlapping windows read and its prologue computed once")
MAX_GRID = 1 << 20  # blocks at most: the kernels stride over the rest (grid-stride loops)


@lru_cache(maxsize=256)
def _lowered(key: str, out_key: str) -> Program | str:
    import json

    try:
        return lower(json.loads(key), json.loads(out_key))
    except Uncovered as e:
        return str(e)


def program(sig: Signature) -> Program | str:
    """The lowered region of this signature, or why it is not covered."""
    import json

    form = sig.param("form")
    if sig.op != REGION_OP or form is None or sig.output is None:
        return "not a region signature with an output"
    return _lowered(json.dumps(form, sort_keys=True), json.dumps(sig.output.to_json(), sort_keys=True))


def coverage(sig: Signature) -> str:
    """"" when a skeleton computes this region, else "not covered: <why>"."""
    prog = program(sig)
    if isinstance(prog, str):
        return prog if prog.startswith("not covered") else f"not covered: {prog}"
    for backend in ("cpu", "cuda"):
        try:
            emit(prog, backend)
        except Uncovered as e:
            return f"not covered: {e}"
    return ""


def _applicable(kind: str):
    def check(sig: Signature, gpu: Gpu) -> str | None:
        prog = program(sig)
        if isinstance(prog, str):
            return prog
        if prog.kind != kind:
            return f"a {prog.kind} region"
        return None

    return check


def _code(sig: Signature, backend: str, vec: int = 1, wrun: int = 1) -> tuple[str, dict] | str:
    prog = program(sig)
    if isinstance(prog, str):
        return prog
    try:
        code, defines = emit(prog, backend, vec, wrun)
    except Uncovered as e:
        return str(e)
    tensors = [(s.shape, s.strides) for _, s in sig.inputs if s is not None] + [(sig.output.shape, sig.output.strides)]
    return code, {**defines, "FP_IDX_T": index_type(_index_extent(prog), tensors)}


def _index_extent(prog: Program) -> int:
    """The largest index the generated code forms besides the tensors' offsets: the iteration space, and an
    adaptive window's bounds ((o + 1) * H before its division by the pooled size)."""
    w = prog.window
    if w is None or w.mode != "adaptive":
        return prog.numel
    return max(prog.numel, (w.in_shape[-2] + 1) * prog.space[-2], (w.in_shape[-1] + 1) * prog.space[-1])


def _args(sig: Signature) -> list[str]:
    return [n for n, s in sig.inputs if s is not None] + ["out"]


# ---------------------------------------------------------------- CPU


def _cpu_pw_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"chunk": 4096}


def _cpu_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    prog = program(sig)
    rows = 1 if isinstance(prog, str) else max(prog.rows, 1)
    return {"grain": grain_default(rows)}


def _cpu_win_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"chunk": 256, "wrun": 1}


def _cpu_build(entry: str, knob: str, suffix: str = ""):
    """The build of a CPU skeleton: the generated code, its size defines and the knob as ``knob.upper()``
    (``suffix``: the C literal's, "LL" where the skeleton compares it with 64-bit indices)."""
    def build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
        made = _code(sig, "cpu")
        if isinstance(made, str):
            return made
        code, defines = made
        return Built(dict(p), {**defines, knob.upper(): f"{p[knob]}{suffix}"},
                     spec([launch(entry, _args(sig), [1], [1])]), code)

    return build


_cpu_pw_build = _cpu_build("region_pointwise", "chunk", "LL")
_cpu_row_build = _cpu_build("region_row", "grain")
def _cpu_win_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    made = _code(sig, "cpu", 1, p["wrun"])
    if isinstance(made, str):
        return made
    code, defines = made
    return Built(dict(p), {**defines, "CHUNK": p["chunk"]}, spec([launch("region_window", _args(sig), [1], [1])]),
                 code)


CPU = (
    Family(OPS, "cpu", "pointwise", "region_pointwise.cpp", (CHUNK,),
           "generated elementwise chain over the region's iteration space, chunks in parallel",
           _applicable("pointwise"), _cpu_pw_defaults, _cpu_pw_build, first),
    Family(OPS, "cpu", "row", "region_row.cpp", (GRAIN,),
           "rows in parallel; one pass per reduction with the generated prologue, then the epilogue",
           _applicable("row"), _cpu_row_defaults, _cpu_row_build, first),
    Family(OPS, "cpu", "window", "region_window.cpp", (WIN_CHUNK, WIN_WRUN),
           "pooled elements in the output's memory order, chunks in parallel; per element its window "
           "with the generated prologue, every reduction, the epilogue",
           _applicable("window"), _cpu_win_defaults, _cpu_win_build, first),
)


# ---------------------------------------------------------------- CUDA


def _out_bytes(sig: Signature) -> int:
    return {"float32": 4}.get(sig.output.dtype if sig.output is not None else "", 2)


def _lane_leaves(prog: Program, vec: int) -> int:
    """Leaves the vector path would read element by element at this width."""
    return sum(leaf_class(prog.space, leaf.strides, 0, vec) == "lane" for leaf in prog.out.leaves)


def _cuda_pw_defaults(sig: Signature, gpu: Gpu) -> dict:
    # 16 bytes of output per vector access and two runs in flight per thread (about what a copy
    # kernel needs to reach the H200's bandwidth); a narrower vector, with more runs in flight, when
    # it turns a per-element read into a per-run one (NCHW at H*W = 196: vec 4 keeps the channel)
    full = 16 // _out_bytes(sig)
    vec, prog = full, program(sig)
    if not isinstance(prog, str) and _lane_leaves(prog, full):
        vec = next((v for v in (full // 2, full // 4) if v >= 2 and not _lane_leaves(prog, v)), full)
    return {"threads": 256, "vec": vec, "ilp": min(4, 2 * full // vec), "grid_stride": 0, "fast_math": 0}


def _cuda_pw_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    if p["vec"] * _out_bytes(sig) > 16:
        return f"vec {p['vec']} moves {p['vec'] * _out_bytes(sig)} bytes of output per access (16 at most)"
    made = _code(sig, "cuda", p["vec"])
    if isinstance(made, str):
        return made
    code, defines = made
    prog = program(sig)
    assert not isinstance(prog, str)
    tiles = cdiv(prog.numel, p["threads"] * p["vec"] * p["ilp"])
    # grid-stride: enough resident blocks to fill every SM (2048 threads per SM), no more
    cap = gpu.sm_count * max(2048 // p["threads"], 1) if p["grid_stride"] else MAX_GRID
    grid = clamp(tiles, 1, cap)
    defines = {**defines, "THREADS": p["threads"], "VEC": p["vec"], "ILP": p["ilp"], "FAST_MATH": p["fast_math"]}
    return Built(dict(p), defines, spec([launch("region_pointwise", _args(sig), [grid], [p["threads"]])]), code)


STRIDED_ROWS_PER_SM = 2048  # a strided region with this many rows per SM fills every SM with one row per thread
CACHE_ELEMS = 128  # cache: elements of its row one lane holds in registers at most (KernelBench's channel RMS norm:
#                    64 fp32 values and no spill; tests/test_region_cuda_compile.py builds the largest)


def _cuda_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    prog = program(sig)
    cols = 1024 if isinstance(prog, str) else prog.cols
    group = clamp(pow2_ceil(cdiv(cols, 8)), 1, 1024)  # ~8 elements per thread and pass
    threads = max(group, 128)
    # 16 bytes per access of the first input (the row's data, in form order)
    vec = 8 if sig.inputs and sig.inputs[0][1] is not None and sig.inputs[0][1].dtype in ("bfloat16", "float16") else 4
    if not isinstance(prog, str) and sig.param("kind") == "strided" and prog.rows >= STRIDED_ROWS_PER_SM * gpu.sm_count:
        # the reduced dims are outer in memory (the channels of NCHW) and consecutive rows are neighbours: one row
        # per thread, so each column's load is a warp's 32 consecutive elements (with GROUP lanes on one row, a
        # warp read 32 / GROUP neighbours per column: half of every 32-byte sector unused at GROUP 8, fp32)
        # and, where the row fits one thread's registers, its inputs read once (cache) rather than once per pass
        # and again for the epilogue
        return {"threads": 256, "rows_per_block": 256, "vec": vec, "fast_math": 0, "cache": int(prog.cols <= 64)}
    p = {"threads": threads, "rows_per_block": clamp(threads // group, 1, 32), "vec": vec, "fast_math": 0, "cache": 0}
    # each lane's runs read once for every pass where they fit its registers: on an H100 cache=1 was as fast or
    # faster in all six pairs of bench/results/kernel_sweep_region.md (an LLM's RMS norm and a float32 softmax,
    # 1, 4 and 8 rows per block; 0-11% less time)
    p["cache"] = int(not isinstance(prog, str) and cached_elements(prog.cols, p) <= CACHE_ELEMS)
    return p


def cached_elements(cols: int, p: dict) -> int:
    """Elements of its row one lane holds with cache: its runs of vec columns (region_row.cu's RUNS)."""
    group, vec = p["threads"] // p["rows_per_block"], p["vec"]
    return cdiv(cols // vec * vec, group * vec) * vec


def _cuda_row_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    if p["threads"] % p["rows_per_block"] or p["threads"] // p["rows_per_block"] < 1:
        return "threads must split evenly into rows"
    cache = p.get("cache", 0)
    prog = program(sig)
    if cache and not isinstance(prog, str) and (per := cached_elements(prog.cols, p)) > CACHE_ELEMS:
        return f"cache holds at most {CACHE_ELEMS} elements of a row per lane in registers ({per} here)"
    made = _code(sig, "cuda", p["vec"])
    if isinstance(made, str):
        return made
    code, defines = made
    assert not isinstance(prog, str)
    grid = clamp(cdiv(prog.rows, p["rows_per_block"]), 1, MAX_GRID)
    defines = {**defines, "THREADS": p["threads"], "ROWS_PER_BLOCK": p["rows_per_block"], "VEC": p["vec"],
               "FAST_MATH": p["fast_math"], "CACHE": cache}
    return Built(dict(p), defines, spec([launch("region_row", _args(sig), [grid], [p["threads"]])]), code)


def _cuda_win_defaults(sig: Signature, gpu: Gpu) -> dict:
    # 16 bytes of output per access along channels_last's C when C allows it (a narrower vector
    # when C is not a multiple of the full one). NCHW pools W, the innermost dim: where the windows
    # overlap along W (stride below the kernel), runs of 4 (else 2) outputs along W, each input cell
    # read once (the ResNet-50 stem's 3x3 / 2 max pool, bf16 B256 on the H100: 1.64x of Inductor's
    # fused kernel at wrun 4, 1.06x at wrun 1, bench/results/window.md); one element each otherwise
    prog = program(sig)
    vec, wrun = 1, 1
    if not isinstance(prog, str) and (vd := vector_dim(prog)) is not None:
        vec = next((v for v in (8, 4, 2) if v * _out_bytes(sig) <= 16 and prog.space[vd] % v == 0), 1)
    elif not isinstance(prog, str) and prog.window is not None and prog.window.mode != "adaptive":
        w = prog.window
        if w.stride[1] < (w.kernel[1] - 1) * w.dilation[1] + 1:
            wrun = next((r for r in (4, 2) if not isinstance(_code(sig, "cuda", 1, r), str)), 1)
    return {"threads": 256, "vec": vec, "ilp": 1, "wrun": wrun}


def _cuda_win_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    if p["vec"] * _out_bytes(sig) > 16:
        return f"vec {p['vec']} moves {p['vec'] * _out_bytes(sig)} bytes of output per access (16 at most)"
    if p["vec"] > 1 and p["wrun"] > 1:
        return "vec and wrun together (a run is along C or along W, not both)"
    made = _code(sig, "cuda", p["vec"], p["wrun"])
    if isinstance(made, str):
        return made
    code, defines = made
    prog = program(sig)
    assert not isinstance(prog, str)
    grid = clamp(cdiv(prog.numel, p["threads"] * p["vec"] * p["ilp"] * p["wrun"]), 1, MAX_GRID)
    defines = {**defines, "THREADS": p["threads"], "VEC": p["vec"], "ILP": p["ilp"], "FAST_MATH": 0}
    return Built(dict(p), defines, spec([launch("region_window", _args(sig), [grid], [p["threads"]])]), code)


CUDA = (
    Family(OPS, "cuda", "pointwise", "region_pointwise.cu", (THREADS, PW_VEC, ILP, GRID_STRIDE, FAST_MATH),
           "generated elementwise chain, vector loads/stores of vec elements per operand where the layout "
           "allows (broadcasts once per run), ilp runs in flight, scalar tail",
           _applicable("pointwise"), _cuda_pw_defaults, _cuda_pw_build, first),
    Family(OPS, "cuda", "row", "region_row.cu", (ROW_THREADS, ROWS_PER_BLOCK, VEC, FAST_MATH, CACHE),
           "rows_per_block rows per block; per pass vector loads of vec columns and a group reduction "
           "(shuffles, shared memory); epilogue; cache: a lane's runs read once into registers for every pass",
           _applicable("row"), _cuda_row_defaults, _cuda_row_build, first),
    Family(OPS, "cuda", "window", "region_window.cu", (THREADS, WIN_VEC, WIN_ILP, WIN_WRUN),
           "one pooled element per thread (or vec along channels_last's C, vector loads of the window's "
           "inputs; or wrun along NCHW's W, each input cell read once for the overlapping windows), "
           "generated prologue per window element, epilogue; scalar tail",
           _applicable("window"), _cuda_win_defaults, _cuda_win_build, first),
)

REFERENCES = ()
