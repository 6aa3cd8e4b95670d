"""softmax and log_softmax (`LOG`) over the last dimension: kernel families and reference kernels.

CUDA: rows in registers (`warp_row`, `multi_row`, `block_row`), an online pass for any length
(`online`), few long rows split over many blocks (`split_row` through a workspace, `split_sync` in
one kernel with an inter-block barrier), and rows too long for a block held on chip by a persistent
grid (`resident`). CPU: `rows` and `online`. Kernels in templates/kernels/{cuda,cpu}/softmax_*. Pure
Python, no torch import.
"""

from __future__ import annotations

from forge_pack.core.candidate import Workspace
from forge_pack.core.signature import Signature
from forge_pack.search import resident_grid
from forge_pack.search.template_kit import (FAST_EXP, GRAIN, HINTS, ITEMS, SPLIT, THREADS, UNROLL, VEC, Built,
                                            Family, Gpu, Knob, ReferenceKernel, always, cdiv, clamp, elem_bytes,
                                            full_vec, grain_default, launch, pow2_ceil, regs_ok, rows_items, spec,
                                            stream_ok, vec_default, vec_ok)
from forge_pack.targets.abi import env as sizes

OPS = ("softmax", "log_softmax")
LANES = Knob("lanes", (2, 4, 8, 16), "threads per row (several short rows per warp)")
BLOCK_ROW_COLS = 1024 * 24  # the longest row `block_row` holds in one block's registers


def _log(sig: Signature) -> dict:
    return {"LOG": int(sig.op == "log_softmax")}


def _hint_defines(p: dict) -> dict:
    return {"FAST_EXP": p["fast_exp"], "LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}


def _few_rows(sig: Signature, gpu: Gpu) -> bool:
    """Fewer rows than two per SM: one block per row leaves SMs idle."""
    return sizes(sig)["rows"] < 2 * gpu.sm_count


def _base_defaults(sig: Signature) -> dict:
    return {"vec": vec_default(sig, sizes(sig)["cols"]), "fast_exp": 1, "load_hint": 0, "store_hint": 0}


def _nvec(sig: Signature, p: dict) -> int:
    return cdiv(sizes(sig)["cols"], p["vec"])


# ---------------------------------------------------------------- CUDA: the row in registers


def _row_in_registers(sig: Signature, p: dict, lanes: int, whole_block: bool) -> Built | str:
    """A row held by `lanes` threads (a warp, part of one, or the whole block) in registers."""
    cols, threads, vec = sizes(sig)["cols"], p["threads"], p["vec"]
    if lanes > threads:
        return "lanes exceed threads"
    items = rows_items(cols, lanes, vec)
    why = vec_ok(sig, p) or regs_ok(threads, items * vec)
    if why:
        return why
    if not whole_block and items * vec > 32:
        return "more than 32 values per lane: use a block per row"
    defines = {**_log(sig), "THREADS": threads, "VEC": vec, "ITEMS": items, "LANES": lanes, **_hint_defines(p)}
    if whole_block:
        k = launch("softmax_block_row", ["x", "out", "i32:cols"], ["rows"], [threads])
    else:
        k = launch("softmax_warp_row", ["x", "out", "rows", "i32:cols"], [f"ceil_div(rows, {threads // lanes})"],
                   [threads])
    return Built({**p, "items": items}, defines, spec([k], requires=[f"cols <= {lanes * vec * items}"]))


def _warp_row_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "rows too long for one warp's registers" if sizes(sig)["cols"] > 32 * 32 else None


def _warp_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {**_base_defaults(sig), "threads": 128}


def _warp_row_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    return _row_in_registers(sig, p, 32, whole_block=False)


def _warp_row_score(sig: Signature, gpu: Gpu) -> float:
    return 1 if sizes(sig)["cols"] <= 1024 else 4


def _multi_row_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "rows too long for a fraction of a warp" if sizes(sig)["cols"] > 16 * full_vec(sig) * 4 else None


def _multi_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    p = _base_defaults(sig)
    return {**p, "lanes": clamp(pow2_ceil(cdiv(_nvec(sig, p), 2)), 2, 16), "threads": 128}


def _multi_row_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    return _row_in_registers(sig, p, p["lanes"], whole_block=False)


def _multi_row_score(sig: Signature, gpu: Gpu) -> float:
    return 0 if sizes(sig)["cols"] <= 256 else 3


def _block_row_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "rows too long for one block's registers" if sizes(sig)["cols"] > BLOCK_ROW_COLS else None


def _block_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    p = _base_defaults(sig)
    return {**p, "threads": clamp(pow2_ceil(cdiv(_nvec(sig, p), 2)), 64, 1024)}


def _block_row_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    return _row_in_registers(sig, p, p["threads"], whole_block=True)


def _block_row_score(sig: Signature, gpu: Gpu) -> float:
    return 2 if not _few_rows(sig, gpu) or sizes(sig)["cols"] <= 4096 else 5


# ---------------------------------------------------------------- CUDA: online, any length


def _online_defaults(sig: Signature, gpu: Gpu) -> dict:
    p = _base_defaults(sig)
    return {**p, "threads": clamp(pow2_ceil(cdiv(_nvec(sig, p), 8)), 128, 1024), "unroll": 4}


def _online_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["vec"])
    if why:
        return why
    defines = {**_log(sig), "THREADS": p["threads"], "VEC": p["vec"], "UNROLL": p["unroll"], **_hint_defines(p)}
    k = launch("softmax_online", ["x", "out", "i32:cols"], ["rows"], [p["threads"]])
    return Built(dict(p), defines, spec([k]))


def _online_score(sig: Signature, gpu: Gpu) -> float:
    return 3.5


# ---------------------------------------------------------------- CUDA: few long rows


def _split_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "rows too short to split" if sizes(sig)["cols"] < 4096 else None


def _split_row_defaults(sig: Signature, gpu: Gpu) -> dict:
    p = _base_defaults(sig)
    rows, cols, vec = sizes(sig)["rows"], sizes(sig)["cols"], p["vec"]
    split = clamp(pow2_ceil(cdiv(4 * gpu.sm_count, max(rows, 1))), 4, 256)  # about 4 blocks per SM
    while split > 4 and cdiv(cols, split) < 256 * vec * 2:  # at least two passes of a 256-thread block
        split //= 2
    p.update(threads=256, unroll=4, split=split, load_hint=0, store_hint=1)
    return p


def _split_row_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["vec"])
    if why:
        return why
    split, vec = p["split"], p["vec"]
    if cdiv(sizes(sig)["cols"], split) < p["threads"] * vec:
        return "chunks smaller than one pass of the block"
    defines = {**_log(sig), "THREADS": p["threads"], "VEC": vec, "UNROLL": p["unroll"], "SPLIT": split,
               **_hint_defines(p)}
    chunk = f"i32:round_up(ceil_div(cols, {split}), {vec})"
    k1 = launch("softmax_split_stats", ["x", "ws", "i32:cols", chunk], [f"rows * {split}"], [p["threads"]])
    k2 = launch("softmax_split_norm", ["x", "ws", "out", "i32:cols", chunk], [f"rows * {split}"], [p["threads"]])
    return Built(dict(p), defines, spec([k1, k2], [Workspace("ws", f"rows * {split} * 8")]))


def _split_row_score(sig: Signature, gpu: Gpu) -> float:
    return 1.5 if _few_rows(sig, gpu) else 7


def _split_sync_applicable(sig: Signature, gpu: Gpu) -> str | None:
    cols = sizes(sig)["cols"]
    if cols < 4096:
        return "rows too short to split"
    if cdiv(cols, 1024 * full_vec(sig) * 8) > gpu.sm_count:
        return "rows too long for one resident wave of blocks"
    return None


def _split_sync_defaults(sig: Signature, gpu: Gpu) -> dict:
    p = _base_defaults(sig)
    rows, cols, vec = sizes(sig)["rows"], sizes(sig)["cols"], p["vec"]
    p.update(threads=512, items=4 if vec >= 4 else 8, store_hint=1)
    # fewer threads while a row would take fewer than 2 blocks per SM's share of the rows
    while p["threads"] > 128 and cdiv(cols, p["threads"] * vec * p["items"]) < 2 * max(1, cdiv(gpu.sm_count, rows * 4)):
        p["threads"] //= 2
    return p


def _split_sync_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    threads, vec, items = p["threads"], p["vec"], p["items"]
    why = vec_ok(sig, p) or regs_ok(threads, items * vec, overhead=72)
    if why:
        return why
    chunk = threads * vec * items
    split = cdiv(sizes(sig)["cols"], chunk)
    if split < 2 or split > gpu.sm_count:  # a row's blocks must all be resident at once (the barrier)
        return f"{split} blocks per row (needs 2..{gpu.sm_count})"
    defines = {**_log(sig), "THREADS": threads, "VEC": vec, "ITEMS": items, **_hint_defines(p)}
    nsplit = f"ceil_div(cols, {chunk})"
    k = launch("softmax_split_sync", ["x", "out", "ws", "sync", "i32:cols", f"i32:{nsplit}"],
               [f"rows * {nsplit}"], [threads])
    ws = [Workspace("ws", f"rows * {nsplit} * 8"), Workspace("sync", "(1 + 2 * rows) * 4", zero=True)]
    return Built({**p, "split": split}, defines, spec([k], ws, [f"{nsplit} <= {gpu.sm_count}"]))


def _split_sync_score(sig: Signature, gpu: Gpu) -> float:
    return 0.5 if _few_rows(sig, gpu) else 6


# ---------------------------------------------------------------- CUDA: rows held on chip by a persistent grid

RESIDENT_HINTS = {"fast_exp": 1, "load_hint": 2, "store_hint": 1}


def _resident_defaults(sig: Signature, gpu: Gpu) -> dict:
    """The most rows in flight that fit on chip (resident_grid.row_defaults)."""
    return resident_grid.row_defaults(sig, gpu, RESIDENT_HINTS)


def _resident_applicable(sig: Signature, gpu: Gpu) -> str | None:
    if sizes(sig)["cols"] <= BLOCK_ROW_COLS:
        return "rows short enough for one block's registers (block_row)"
    return resident_grid.rows_unfit(sig, gpu, RESIDENT_HINTS)


def _resident_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    plan = resident_grid.row_plan(sig, p, gpu)
    if isinstance(plan, str):
        return plan
    lay = resident_grid.layout(p, plan, "rows", "cols")
    defines = {**_log(sig), "THREADS": p["threads"], "VEC": plan["vec"], **lay.defines, **_hint_defines(p)}
    k = launch("softmax_resident", ["x", "out", "ws", "i32:cols", f"i32:{lay.slice}", "i32:rows"], [lay.blocks],
               [p["threads"]], plan["smem"])
    return Built({**p, "vec": plan["vec"]}, defines, spec([k], [lay.workspace], [lay.requires]))


def _resident_score(sig: Signature, gpu: Gpu) -> float:
    """First (before `online`) for rows of resident_grid.FIRST_ROW_BYTES or more among many: `online` and
    `split_row` read such a row twice, and with a block per row on every SM the second read no longer
    finds it in L2 (132 rows of 256 KiB are 33 MB); `resident` reads it once while the next rows stream in.
    Shorter rows: last (the second read hits L2, and a team's barrier costs time)."""
    if _few_rows(sig, gpu):
        return 2  # after split_sync and split_row, which spread few rows over the whole GPU
    row_bytes = sizes(sig)["cols"] * elem_bytes(sig.x.dtype)
    return 3 if row_bytes >= resident_grid.FIRST_ROW_BYTES else 8


CUDA = (
    Family(OPS, "cuda", "warp_row", "softmax_warp_row.cu", (THREADS, VEC, FAST_EXP, *HINTS),
           "one warp per row, row in registers, shuffle reductions (rows up to 32*vec*8)",
           _warp_row_applicable, _warp_row_defaults, _warp_row_build, _warp_row_score),
    Family(OPS, "cuda", "multi_row", "softmax_warp_row.cu", (LANES, THREADS, VEC, FAST_EXP, *HINTS),
           "several short rows per warp (2-16 lanes each): MoE routers, short rows",
           _multi_row_applicable, _multi_row_defaults, _multi_row_build, _multi_row_score),
    Family(OPS, "cuda", "block_row", "softmax_block_row.cu", (THREADS, VEC, FAST_EXP, *HINTS),
           "one block per row, row in registers: one read, one write",
           _block_row_applicable, _block_row_defaults, _block_row_build, _block_row_score),
    Family(OPS, "cuda", "online", "softmax_online.cu", (THREADS, VEC, UNROLL, FAST_EXP, *HINTS),
           "one block per row, single-pass online max/sum, then a normalise pass: any length",
           always, _online_defaults, _online_build, _online_score),
    Family(OPS, "cuda", "split_row", "softmax_split_row.cu", (SPLIT, THREADS, VEC, UNROLL, FAST_EXP, *HINTS),
           "few long rows: each split over `split` blocks; stats kernel -> workspace -> normalise kernel",
           _split_applicable, _split_row_defaults, _split_row_build, _split_row_score),
    Family(OPS, "cuda", "split_sync", "softmax_split_sync.cu", (THREADS, ITEMS, VEC, FAST_EXP, *HINTS),
           "few long rows in one kernel and one read: chunks in registers, inter-block barrier per row",
           _split_sync_applicable, _split_sync_defaults, _split_sync_build, _split_sync_score),
    Family(OPS, "cuda", "resident", "softmax_resident.cu",
           (resident_grid.THREADS, resident_grid.BPS, resident_grid.ROW_TEAMS, resident_grid.BUFS, resident_grid.REGS,
            resident_grid.STAGGER, FAST_EXP, *HINTS),
           "rows too long for a block, ONE read: persistent grid in `teams` teams, each normalising its own rows "
           "one after another with every block's slice kept in registers + shared memory (cp.async)",
           _resident_applicable, _resident_defaults, _resident_build, _resident_score, co_resident=True),
)


# ---------------------------------------------------------------- CPU

CPU_FAST_EXP = Knob("fast_exp", (0, 1), "exp: 0 std::exp, 1 a polynomial exp the compiler vectorises (~1 ulp)")
BLOCK = Knob("block", (256, 1024, 4096, 16384), "elements per online-statistics block")
LONG_ROW = 65536  # columns beyond which the CPU's online pass goes first (the row no longer stays in L2)


def _cpu_build(sig: Signature, p: dict, kernel: str, extra: dict) -> Built:
    defines = {**_log(sig), "FAST_EXP": p["fast_exp"], "GRAIN": p["grain"], **extra}
    return Built(dict(p), defines, spec([launch(kernel, ["x", "out", "rows", "cols"], [1], [1])]))


def _cpu_rows_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"fast_exp": 1, "grain": grain_default(sizes(sig)["rows"])}


def _cpu_rows_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    return _cpu_build(sig, p, "softmax_rows", {})


def _cpu_rows_score(sig: Signature, gpu: Gpu) -> float:
    return 0 if sizes(sig)["cols"] <= LONG_ROW else 1


def _cpu_online_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {**_cpu_rows_defaults(sig, gpu), "block": 1024}


def _cpu_online_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    return _cpu_build(sig, p, "softmax_online", {"BLOCK": p["block"]})


def _cpu_online_score(sig: Signature, gpu: Gpu) -> float:
    return 1 if sizes(sig)["cols"] <= LONG_ROW else 0


CPU = (
    Family(OPS, "cpu", "rows", "softmax_rows.cpp", (CPU_FAST_EXP, GRAIN),
           "rows in parallel; max, exp-sum (exps stored when the output is fp32) and write passes",
           always, _cpu_rows_defaults, _cpu_rows_build, _cpu_rows_score),
    Family(OPS, "cpu", "online", "softmax_online.cpp", (CPU_FAST_EXP, BLOCK, GRAIN),
           "rows in parallel; one online max/sum pass over blocks, one write pass (long rows)",
           always, _cpu_online_defaults, _cpu_online_build, _cpu_online_score),
)

REFERENCES = (ReferenceKernel("softmax"), ReferenceKernel("log_softmax"))
