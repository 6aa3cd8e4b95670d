"""The row-normalisation families layer_norm and rms_norm share (templates rownorm_*, `RMS` picks
the op): `warp_row` and `block_row` hold the row in registers, `online` streams any length,
`split_row` spreads each of a few long rows over many blocks, `resident` holds rows too long for a block on
chip with a persistent grid (as softmax's and group_norm's); layer_norm's `strided_row` reads an x
whose rows are each contiguous but not packed (a transposed view). The CPU has `rows` and
(layer_norm) `strided_rows`. Every family but the strided ones needs a contiguous x. layer_norm.py and rms_norm.py each instantiate them for their op. Pure Python, no torch.
"""

from __future__ import annotations

from forge_pack.core.candidate import Workspace
from forge_pack.core.signature import Signature
from forge_pack.search import resident_grid
from forge_pack.search.template_kit import (GRAIN, HINTS, LANES_ALL, SPLIT, THREADS, UNROLL, VEC, Built, Family, Gpu,
                                            always, cdiv, clamp, elem_bytes, first, grain_default,
                                            launch, pow2_ceil, regs_ok, rows_items, spec, stream_ok, vec_default,
                                            vec_ok)
from forge_pack.targets.abi import env as sizes


def _is_rms(sig: Signature) -> bool:
    return sig.op == "rms_norm"


def _head_tail(sig: Signature) -> tuple[list[str], list[str]]:
    """Kernel arguments before and after the sizes: rms_norm has no bias and takes Gemma's weight offset."""
    rms = _is_rms(sig)
    return ["x", "weight"] + ([] if rms else ["bias"]) + ["out"], ["eps"] + (["weight_offset"] if rms else [])


def _rms_defines(sig: Signature) -> dict:
    return {"T_BIAS": "float", "HAS_BIAS": 0} if _is_rms(sig) else {}  # rms_norm has no bias in its ABI


def _defines(sig: Signature, p: dict) -> dict:
    return {"RMS": int(_is_rms(sig)), "THREADS": p["threads"], "VEC": p["vec"], "LOAD_HINT": p["load_hint"],
            "STORE_HINT": p["store_hint"], **_rms_defines(sig)}


def _base_defaults(sig: Signature) -> tuple[dict, int]:
    cols = sizes(sig)["cols"]
    vec = vec_default(sig, cols)
    return {"vec": vec, "load_hint": 0, "store_hint": 0}, cdiv(cols, vec)


# ---------------------------------------------------------------- CUDA: the row in registers


def _row_in_registers(sig: Signature, p: dict, lanes: int, whole_block: bool) -> Built | str:
    why = vec_ok(sig, p)
    if why:
        return why
    threads, vec = p["threads"], p["vec"]
    if lanes > threads:
        return "lanes exceed threads"
    items = rows_items(sizes(sig)["cols"], lanes, vec)
    why = regs_ok(threads, items * vec)
    if why:
        return why
    if not whole_block and items * vec > 32:
        return "more than 32 values per lane: use a block per row"
    head, tail = _head_tail(sig)
    defines = {**_defines(sig, p), "ITEMS": items, "LANES": lanes}
    if whole_block:
        k = launch(f"{sig.op}_block_row", [*head, "i32:cols", *tail], ["rows"], [threads])
    else:
        k = launch(f"{sig.op}_warp_row", [*head, "rows", "i32:cols", *tail], [f"ceil_div(rows, {threads // lanes})"],
                   [threads])
    return Built({**p, "items": items}, defines, spec([k], requires=[f"cols <= {lanes * vec * items}"]))


def _warp_row_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "rows too long for one warp's registers" if sizes(sig)["cols"] > 32 * 32 else None


def _warp_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    p, nvec = _base_defaults(sig)
    return {**p, "threads": 128, "lanes": clamp(pow2_ceil(cdiv(nvec, 2)), 4, 32)}


def _warp_row_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    return _row_in_registers(sig, p, p["lanes"], whole_block=False)


def _warp_row_score(sig: Signature, gpu: Gpu) -> float:
    return 0 if sizes(sig)["cols"] <= 1024 else 2


def _block_row_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "rows too long for one block's registers" if sizes(sig)["cols"] > 1024 * 24 else None


def _block_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    p, nvec = _base_defaults(sig)
    return {**p, "threads": clamp(pow2_ceil(cdiv(nvec, 2)), 64, 1024)}


def _block_row_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    return _row_in_registers(sig, p, p["threads"], whole_block=True)


def _block_row_score(sig: Signature, gpu: Gpu) -> float:
    return 1 if sizes(sig)["cols"] <= 1024 else 0


# ---------------------------------------------------------------- CUDA: online, any length


def _online_defaults(sig: Signature, gpu: Gpu) -> dict:
    p, nvec = _base_defaults(sig)
    return {**p, "threads": clamp(pow2_ceil(cdiv(nvec, 8)), 128, 1024), "unroll": 4}


def _online_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p.get("unroll", 1) * p["vec"] * 2)  # two fp32 values per element in flight
    if why:
        return why
    head, tail = _head_tail(sig)
    defines = {**_defines(sig, p), "UNROLL": p["unroll"]}
    k = launch(f"{sig.op}_online", [*head, "i32:cols", *tail], ["rows"], [p["threads"]])
    return Built(dict(p), defines, spec([k]))


def _online_score(sig: Signature, gpu: Gpu) -> float:
    return 3


# ---------------------------------------------------------------- CUDA: few long rows


SPLIT_MIN_COLS = 4096  # below this a row is one block's work: splitting only adds a second launch


def _few_rows(sig: Signature, gpu: Gpu) -> bool:
    """Fewer rows than two per SM: one block per row leaves SMs idle."""
    return sizes(sig)["rows"] < 2 * gpu.sm_count


def _split_row_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "rows too short to split" if sizes(sig)["cols"] < SPLIT_MIN_COLS else None


def _split_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    p, _ = _base_defaults(sig)
    rows, cols, vec = sizes(sig)["rows"], sizes(sig)["cols"], p["vec"]
    split = clamp(pow2_ceil(cdiv(4 * gpu.sm_count, max(rows, 1))), 4, 256)  # about 4 blocks per SM
    while split > 4 and cdiv(cols, split) < 256 * vec * 2:  # at least two passes of a 256-thread block
        split //= 2
    p.update(threads=256, unroll=4, split=split, store_hint=1)  # the output is not read again: stream it
    return p


def _split_row_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["unroll"] * p["vec"] * 2)  # as `online`: two fp32 values per element in flight
    if why:
        return why
    split, vec = p["split"], p["vec"]
    if cdiv(sizes(sig)["cols"], split) < p["threads"] * vec:
        return "chunks smaller than one pass of the block"
    head, tail = _head_tail(sig)
    defines = {**_defines(sig, p), "UNROLL": p["unroll"], "SPLIT": split}
    chunk = f"i32:round_up(ceil_div(cols, {split}), {vec})"
    k1 = launch(f"{sig.op}_split_stats", ["x", "ws", "i32:cols", chunk], [f"rows * {split}"], [p["threads"]])
    k2 = launch(f"{sig.op}_split_norm", [*head[:-1], "ws", "out", "i32:cols", chunk, *tail], [f"rows * {split}"],
                [p["threads"]])
    return Built(dict(p), defines, spec([k1, k2], [Workspace("ws", f"rows * {split} * 16")]))


def _split_row_score(sig: Signature, gpu: Gpu) -> float:
    return -1 if _few_rows(sig, gpu) else 4


# ---------------------------------------------------------------- CUDA: rows held on chip by a persistent grid


RESIDENT_MIN_COLS = 32768  # shorter rows: one block per row holds them (block_row), or its second read hits L2


RESIDENT_HINTS = {"load_hint": 2, "store_hint": 1}


def _resident_defaults(sig: Signature, gpu: Gpu) -> dict:
    """The most rows in flight that fit on chip (resident_grid.row_defaults)."""
    return resident_grid.row_defaults(sig, gpu, RESIDENT_HINTS)


def _resident_applicable(sig: Signature, gpu: Gpu) -> str | None:
    if sizes(sig)["cols"] < RESIDENT_MIN_COLS:
        return f"rows shorter than {RESIDENT_MIN_COLS} elements: a block per row holds or re-reads them from L2"
    return resident_grid.rows_unfit(sig, gpu, RESIDENT_HINTS)


def _resident_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    plan = resident_grid.row_plan(sig, p, gpu)
    if isinstance(plan, str):
        return plan
    q = {**p, "vec": plan["vec"]}
    lay = resident_grid.layout(p, plan, "rows", "cols")
    head, tail = _head_tail(sig)
    k = launch(f"{sig.op}_resident", [*head, "ws", "i32:cols", f"i32:{lay.slice}", "i32:rows", *tail], [lay.blocks],
               [p["threads"]], plan["smem"])
    return Built(q, {**_defines(sig, q), **lay.defines}, spec([k], [lay.workspace], [lay.requires]))


def _resident_score(sig: Signature, gpu: Gpu) -> float:
    """First (before `split_row`) for rows of resident_grid.FIRST_ROW_BYTES or more among many rows: the other
    families read such a row twice, and with rows on every SM at once the second read misses L2 (softmax's
    `resident` at 90% of copy bandwidth where `online` reads twice, bench/results/eval_memory_resident.md). Few
    rows (under two per SM): second, after `split_row`, which spreads a row over the whole GPU so that its second
    read finds it in L2 (KernelBench's 16 rows of 16 MB on an H100: `split_row` 299-316 µs, `resident` 325 µs).
    Shorter rows: last."""
    if sizes(sig)["cols"] * elem_bytes(sig.x.dtype) < resident_grid.FIRST_ROW_BYTES:
        return 8
    return 0 if _few_rows(sig, gpu) else -2


# ---------------------------------------------------------------- strided rows (CUDA and CPU)


def _contiguous(applicable):
    """The packed-row families: a strided x (norm_common.row_layout) is the strided families' job."""
    def check(sig: Signature, gpu: Gpu) -> str | None:
        return "x is not contiguous (strided_row reads it)" if not sig.x.is_contiguous else applicable(sig, gpu)

    return check


def _strided_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "x is contiguous: the packed-row families read it" if sig.x.is_contiguous else None


def _strided_args(sig: Signature, kernel: str, head: list[str], tail: list[str], cols: str) -> list[str]:
    return [*head, "rows", cols, f"{kernel}:x_inner", "i64:x_so", "i64:x_si", *tail]


def _strided_defaults(sig: Signature, gpu: Gpu) -> dict:
    p, nvec = _base_defaults(sig)
    return {**p, "threads": 256, "unroll": clamp(pow2_ceil(cdiv(nvec, 32)), 1, 4)}  # a warp per row


def _strided_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["unroll"] * p["vec"] * 2)  # as `online`: two fp32 values per element in flight
    if why:
        return why
    if p["threads"] < 32:
        return "a warp per row needs 32 threads"
    head, tail = _head_tail(sig)
    defines = {**_defines(sig, p), "UNROLL": p["unroll"]}
    k = launch(f"{sig.op}_strided_row", _strided_args(sig, "i32", head, tail, "i32:cols"),
               [f"ceil_div(rows, {p['threads'] // 32})"], [p["threads"]])
    return Built(dict(p), defines, spec([k]))


def cuda_families(op: str) -> tuple[Family, ...]:
    """The families of `op` (layer_norm or rms_norm). Only layer_norm takes a strided x (rms_norm's
    composite form gives out x's own layout), so only it gets the strided families."""
    ops = (op,)
    return (
        Family(ops, "cuda", "warp_row", "rownorm_warp_row.cu", (THREADS, LANES_ALL, VEC, *HINTS),
               "`lanes` threads per row, row in registers, shuffle reductions (short and medium rows)",
               _contiguous(_warp_row_applicable), _warp_row_defaults, _warp_row_build, _warp_row_score),
        Family(ops, "cuda", "block_row", "rownorm_block_row.cu", (THREADS, VEC, *HINTS),
               "one block per row, row in registers",
               _contiguous(_block_row_applicable), _block_row_defaults, _block_row_build, _block_row_score),
        Family(ops, "cuda", "online", "rownorm_online.cu", (THREADS, VEC, UNROLL, *HINTS),
               "one block per row, statistics pass then normalise pass: any length",
               _contiguous(always), _online_defaults, _online_build, _online_score),
        Family(ops, "cuda", "split_row", "rownorm_split_row.cu", (SPLIT, THREADS, VEC, UNROLL, *HINTS),
               "few long rows: each split over `split` blocks; stats kernel -> workspace -> normalise kernel",
               _contiguous(_split_row_applicable), _split_row_defaults, _split_row_build, _split_row_score),
        Family(ops, "cuda", "resident", "rownorm_resident.cu",
               (resident_grid.THREADS, resident_grid.BPS, resident_grid.ROW_TEAMS, resident_grid.BUFS, resident_grid.REGS,
                resident_grid.STAGGER, *HINTS),
               "rows too long for a block, ONE read: persistent grid in `teams` teams, each normalising its own rows "
               "one after another with every block's slice kept in registers + shared memory (cp.async)",
               _contiguous(_resident_applicable), _resident_defaults, _resident_build, _resident_score,
               co_resident=True),
    ) + (_strided_cuda() if op == "layer_norm" else ())


def _strided_cuda() -> tuple[Family, ...]:
    return (Family(("layer_norm",), "cuda", "strided_row", "rownorm_strided_row.cu", (THREADS, VEC, UNROLL, *HINTS),
                   "x's rows each contiguous but not packed (a transposed view): a warp per row at its own start, "
                   "statistics pass then normalise pass, contiguous out",
                   _strided_applicable, _strided_defaults, _strided_build, first),)


# ---------------------------------------------------------------- CPU


def _cpu_rows_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"grain": grain_default(sizes(sig)["rows"])}


def _cpu_rows_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    head, tail = _head_tail(sig)
    defines = {"RMS": int(_is_rms(sig)), "GRAIN": p["grain"], **_rms_defines(sig)}
    return Built(dict(p), defines, spec([launch(f"{sig.op}_rows", [*head, "rows", "cols", *tail], [1], [1])]))


def _cpu_strided_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    head, tail = _head_tail(sig)
    defines = {"RMS": int(_is_rms(sig)), "GRAIN": p["grain"], **_rms_defines(sig)}
    k = launch(f"{sig.op}_strided_rows", _strided_args(sig, "i64", head, tail, "cols"), [1], [1])
    return Built(dict(p), defines, spec([k]))


def cpu_families(op: str) -> tuple[Family, ...]:
    """As cuda_families: the strided family for layer_norm only."""
    rows = Family((op,), "cpu", "rows", "rownorm_rows.cpp", (GRAIN,),
                  "rows in parallel; exact statistics, vectorised normalise(+affine)",
                  _contiguous(always), _cpu_rows_defaults, _cpu_rows_build, first)
    strided = Family((op,), "cpu", "strided_rows", "rownorm_strided_rows.cpp", (GRAIN,),
                     "x's rows each contiguous but not packed (a transposed view): rows in parallel at their own "
                     "starts; exact statistics, vectorised normalise(+affine), contiguous out",
                     _strided_applicable, _cpu_rows_defaults, _cpu_strided_build, first)
    return (rows, strided) if op == "layer_norm" else (rows,)
