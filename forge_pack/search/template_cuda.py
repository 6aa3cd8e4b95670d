"""CUDA template families: parameters, applicability, defaults and launch specs per signature.

The kernels themselves are in templates/kernels/cuda/ (read them: each file says what it does).
Every family reads its input dtype and writes the signature's output dtype (so bf16 in, fp32 out
is fused), takes 16-byte vector loads when sizes and pointers allow and falls back element-wise
at run time when they do not, so a candidate is correct for any signature its `requires` accept.
Pure Python, no torch import.
"""

from __future__ import annotations

from forge_pack.targets.abi import env as abi_env
from forge_pack.core.candidate import Workspace
from forge_pack.core.signature import Signature
from forge_pack.search.template_kit import (Built, Family, Knob, cdiv, clamp, elem_bytes, launch, nearest, out_dtype,
                                     pow2_ceil, present, spec)

THREADS = Knob("threads", (64, 128, 256, 512, 1024), "threads per block")
VEC = Knob("vec", (1, 2, 4, 8), "elements per vector access (16 bytes at most per load)")
UNROLL = Knob("unroll", (1, 2, 4, 8), "vector loads in flight per thread and loop trip")
FAST_EXP = Knob("fast_exp", (0, 1, 2), "exp: 0 expf, 1 __expf (MUFU), 2 exp2f of the difference times log2(e)")
LOAD_HINT = Knob("load_hint", (0, 1, 2), "loads: 0 plain, 1 read-only __ldg, 2 streaming __ldcs (evict-first)")
STORE_HINT = Knob("store_hint", (0, 1), "stores: 0 plain, 1 streaming __stcs")
LANES = Knob("lanes", (2, 4, 8, 16), "threads per row (several short rows per warp)")
LANES_ALL = Knob("lanes", (4, 8, 16, 32), "threads per row or plane (shuffle reductions only)")
SPLIT = Knob("split", (4, 8, 16, 32, 64, 128, 256), "blocks per row / group (partials in a workspace)")
ITEMS = Knob("items", (1, 2, 4, 8, 16), "vectors per thread kept in registers (chunk = threads*vec*items)")
TILE_ITEMS = Knob("items", (1, 2, 4, 8), "loop trips per block of the normalise kernel (tile size)")
PLANES = Knob("planes", (8, 16, 32, 64, 128), "planes per block staged through shared memory")
SPLIT_HW = Knob("ty", (1, 2, 4, 8, 16), "threads splitting the H*W pixels (threadIdx.y)")
STAGE = Knob("stage", (0, 1), "where a block keeps its chunk: 0 registers, 1 shared memory")
LAG = Knob("lag", (1, 2, 3, 4, 6), "groups between a group's statistics blocks and its normalise blocks")
L2_KEEP = Knob("l2", (0, 1), "1: first reads evict_last and second reads evict_first in L2 (cache policies)")
MIN_BLOCKS = Knob("minb", (0, 2, 4, 5, 6, 8), "blocks per SM the registers are capped for (0: the compiler's choice)")
TEAMS = Knob("teams", (1, 2, 3, 4, 6, 8), "groups in flight: the persistent grid splits into this many teams")
BPS = Knob("bps", (1, 2), "persistent blocks per SM (the grid is SMs x bps, resident at once)")
REGS = Knob("regs", (0, 2, 4, 8, 16), "16-byte vectors per thread and buffer kept in registers (the rest in shared "
            "memory)")
BUFS = Knob("bufs", (1, 2), "buffers per block: 2 streams a team's next group in while this one waits for statistics")
RES_THREADS = Knob("threads", (256, 512, 1024), "threads per block")
STAGGER = Knob("stagger", (0, 2, 4, 8, 16), "team t starts t x this many thousand cycles late (teams out of phase)")
HINTS = (LOAD_HINT, STORE_HINT)
SMEM_MAX = 200 * 1024  # dynamic shared memory per block (opt-in; H100/H200 allow 227 KB)

SMEM_PER_SM = 228 * 1024  # H100/H200 shared memory per SM; each resident block also reserves 1 KB
SM_COUNT = 132  # H200; the split_sync kernels also survive smaller GPUs (barrier timeout fallback)


# Families whose whole grid waits on itself, one block or more per SM: a GPU with fewer SMs than
# the one they were sized for stalls them until their wait timeouts (the package runs the original).
CO_RESIDENT = frozenset({"resident"})


def use_gpu(gpu: dict) -> None:
    """Size the persistent and shared-memory families for the GPU the search runs on (the evaluator's
    device report: `sm_count`, `smem_optin_bytes`); the H200 figures above stay where it says nothing.
    A grid sized for more SMs than the GPU has would stall on its barriers until their timeouts."""
    global SM_COUNT, SMEM_MAX, SMEM_PER_SM
    sms, optin = gpu.get("sm_count"), gpu.get("smem_optin_bytes")
    if isinstance(sms, int) and sms > 8:
        SM_COUNT = sms
    if isinstance(optin, int) and optin >= 48 * 1024:
        SMEM_MAX = min(200 * 1024, optin)
        SMEM_PER_SM = optin + 1024  # the opt-in maximum plus the 1 KB the runtime reserves per block
MAX_REG_ELEMS = 64  # fp32 values a thread keeps in registers at most (beyond: spills)


def _vec_ok(sig: Signature, p: dict) -> str | None:
    v = p.get("vec", 1)
    if v * elem_bytes(sig.x.dtype) > 16:
        return f"vec {v} of {sig.x.dtype} exceeds 16 bytes"
    if v * elem_bytes(out_dtype(sig)) > 32:
        return f"vec {v} of {out_dtype(sig)} output exceeds 32 bytes"
    return None


def _regs_ok(threads: int, floats: int, overhead: int = 40) -> str | None:
    """Values kept in registers per thread must fit the per-thread budget of a full block."""
    budget = min(255, 65536 // threads) - overhead
    if floats > min(MAX_REG_ELEMS, budget):
        return f"{floats} register values per thread exceed the budget at {threads} threads"
    return None


def _stream_ok(sig: Signature, p: dict, per_thread_floats: int = 0, loads: int | None = None) -> str | None:
    """Streaming kernels: `loads` raw vectors in flight (default: unroll) plus some fp32 values per
    thread must fit the register budget (beyond it ptxas spills)."""
    n = p.get("unroll", 1) if loads is None else loads
    raw = n * cdiv(p.get("vec", 1) * elem_bytes(sig.x.dtype), 4)
    return _vec_ok(sig, p) or _regs_ok(p["threads"], raw + per_thread_floats)


def _vec_default(sig: Signature, divides: int) -> int:
    v = 16 // elem_bytes(sig.x.dtype)
    while v > 1 and divides % v:
        v //= 2
    return v


def _sizes(sig: Signature) -> dict:
    return abi_env(sig)


# ================================================================= softmax / log_softmax


def _sm_common(sig: Signature) -> dict:
    return {"LOG": int(sig.op == "log_softmax")}


def _rows_items(cols: int, group: int, vec: int) -> int:
    return max(1, cdiv(cols, group * vec))


def _sm_rows_build(kind: str):
    """warp_row (32 lanes), multi_row (2..16 lanes) and block_row: the row in registers."""

    def build(sig: Signature, p: dict):
        e = _sizes(sig)
        cols, threads, vec = e["cols"], p["threads"], p["vec"]
        lanes = 32 if kind == "warp_row" else (threads if kind == "block_row" else p["lanes"])
        if lanes > threads:
            return "lanes exceed threads"
        items = _rows_items(cols, lanes, vec)
        why = _vec_ok(sig, p) or _regs_ok(threads, items * vec)
        if why:
            return why
        if kind != "block_row" and items * vec > 32:
            return "more than 32 values per lane: use a block per row"
        params = {**p, "items": items}
        defines = {**_sm_common(sig), "THREADS": threads, "VEC": vec, "ITEMS": items, "LANES": lanes,
                   "FAST_EXP": p["fast_exp"], "LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}
        cap = lanes * vec * items
        if kind == "block_row":
            k = launch("softmax_block_row", ["x", "out", "i32:cols"], ["rows"], [threads])
        else:
            k = launch("softmax_warp_row", ["x", "out", "rows", "i32:cols"], [f"ceil_div(rows, {threads // lanes})"],
                       [threads])
        return Built(params, defines, spec([k], requires=[f"cols <= {cap}"]))

    return build


def _sm_online_build(sig: Signature, p: dict):
    why = _stream_ok(sig, p, p["vec"])
    if why:
        return why
    defines = {**_sm_common(sig), "THREADS": p["threads"], "VEC": p["vec"], "UNROLL": p["unroll"],
               "FAST_EXP": p["fast_exp"], "LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}
    k = launch("softmax_online", ["x", "out", "i32:cols"], ["rows"], [p["threads"]])
    return Built(dict(p), defines, spec([k]))


def _sm_split_build(sig: Signature, p: dict):
    why = _stream_ok(sig, p, p["vec"])
    if why:
        return why
    e = _sizes(sig)
    split, vec = p["split"], p["vec"]
    if cdiv(e["cols"], split) < p["threads"] * vec:
        return "chunks smaller than one pass of the block"
    defines = {**_sm_common(sig), "THREADS": p["threads"], "VEC": vec, "UNROLL": p["unroll"], "SPLIT": split,
               "FAST_EXP": p["fast_exp"], "LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}
    chunk = f"i32:round_up(ceil_div(cols, {split}), {vec})"
    k1 = launch("softmax_split_stats", ["x", "ws", "i32:cols", chunk], [f"rows * {split}"], [p["threads"]])
    k2 = launch("softmax_split_norm", ["x", "ws", "out", "i32:cols", chunk], [f"rows * {split}"], [p["threads"]])
    return Built(dict(p), defines, spec([k1, k2], [Workspace("ws", f"rows * {split} * 8")]))


def _sm_sync_build(sig: Signature, p: dict):
    e = _sizes(sig)
    threads, vec, items = p["threads"], p["vec"], p["items"]
    why = _vec_ok(sig, p) or _regs_ok(threads, items * vec, overhead=72)
    if why:
        return why
    chunk = threads * vec * items
    split = cdiv(e["cols"], chunk)
    if split < 2 or split > SM_COUNT:
        return f"{split} blocks per row (needs 2..{SM_COUNT})"
    defines = {**_sm_common(sig), "THREADS": threads, "VEC": vec, "ITEMS": items, "FAST_EXP": p["fast_exp"],
               "LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}
    nsplit = f"ceil_div(cols, {chunk})"
    k = launch("softmax_split_sync", ["x", "out", "ws", "sync", "i32:cols", f"i32:{nsplit}"],
               [f"rows * {nsplit}"], [threads])
    ws = [Workspace("ws", f"rows * {nsplit} * 8"), Workspace("sync", "(1 + 2 * rows) * 4", zero=True)]
    return Built({**p, "split": split}, defines, spec([k], ws, [f"{nsplit} <= {SM_COUNT}"]))


def _sm_defaults(kind: str):
    def defaults(sig: Signature) -> dict:
        e = _sizes(sig)
        rows, cols = e["rows"], e["cols"]
        vec = _vec_default(sig, cols)
        p = {"vec": vec, "fast_exp": 1, "load_hint": 0, "store_hint": 0}
        nvec = cdiv(cols, vec)
        if kind == "warp_row":
            p["threads"] = 128
        elif kind == "multi_row":
            p["lanes"] = clamp(pow2_ceil(cdiv(nvec, 2)), 2, 16)
            p["threads"] = 128
        elif kind == "block_row":
            p["threads"] = clamp(pow2_ceil(cdiv(nvec, 2)), 64, 1024)
        elif kind == "online":
            p.update(threads=clamp(pow2_ceil(cdiv(nvec, 8)), 128, 1024), unroll=4)
        elif kind == "split_row":
            split = clamp(pow2_ceil(cdiv(4 * SM_COUNT, max(rows, 1))), 4, 256)
            while split > 4 and cdiv(cols, split) < 256 * vec * 2:
                split //= 2
            p.update(threads=256, unroll=4, split=split, load_hint=0, store_hint=1)
        elif kind == "split_sync":
            p.update(threads=512, items=4 if vec >= 4 else 8, store_hint=1)
            while p["threads"] > 128 and cdiv(cols, p["threads"] * vec * p["items"]) < 2 * max(1, cdiv(SM_COUNT, rows * 4)):
                p["threads"] //= 2
        return p

    return defaults


def _sm_applicable(kind: str):
    def applicable(sig: Signature) -> str | None:
        e = _sizes(sig)
        cols, vec = e["cols"], 16 // elem_bytes(sig.x.dtype)
        if kind == "multi_row" and cols > 16 * vec * 4:
            return "rows too long for a fraction of a warp"
        if kind == "warp_row" and cols > 32 * 32:
            return "rows too long for one warp's registers"
        if kind == "block_row" and cols > 1024 * 24:
            return "rows too long for one block's registers"
        if kind in ("split_row", "split_sync") and cols < 4096:
            return "rows too short to split"
        if kind == "split_sync" and cdiv(cols, 1024 * vec * 8) > SM_COUNT:
            return "rows too long for one resident wave of blocks"
        return None

    return applicable


def _sm_score(kind: str):
    def score(sig: Signature) -> float:
        e = _sizes(sig)
        rows, cols = e["rows"], e["cols"]
        few_rows = rows < 2 * SM_COUNT
        order = {
            "multi_row": 0 if cols <= 256 else 3,
            "warp_row": 1 if cols <= 1024 else 4,
            "block_row": 2 if not few_rows or cols <= 4096 else 5,
            "online": 3.5,
            "split_sync": 0.5 if few_rows else 6,
            "split_row": 1.5 if few_rows else 7,
        }
        return order[kind]

    return score


_SM_KNOBS = {
    "warp_row": (THREADS, VEC, FAST_EXP, *HINTS),
    "multi_row": (LANES, THREADS, VEC, FAST_EXP, *HINTS),
    "block_row": (THREADS, VEC, FAST_EXP, *HINTS),
    "online": (THREADS, VEC, UNROLL, FAST_EXP, *HINTS),
    "split_row": (SPLIT, THREADS, VEC, UNROLL, FAST_EXP, *HINTS),
    "split_sync": (THREADS, ITEMS, VEC, FAST_EXP, *HINTS),
}
_SM_DOCS = {
    "warp_row": "one warp per row, row in registers, shuffle reductions (rows up to 32*vec*8)",
    "multi_row": "several short rows per warp (2-16 lanes each): MoE routers, short rows",
    "block_row": "one block per row, row in registers: one read, one write",
    "online": "one block per row, single-pass online max/sum, then a normalise pass: any length",
    "split_row": "few long rows: each split over `split` blocks; stats kernel -> workspace -> normalise kernel",
    "split_sync": "few long rows in one kernel and one read: chunks in registers, inter-block barrier per row",
}
_SM_FILES = {"warp_row": "softmax_warp_row.cu", "multi_row": "softmax_warp_row.cu",
             "block_row": "softmax_block_row.cu", "online": "softmax_online.cu",
             "split_row": "softmax_split_row.cu", "split_sync": "softmax_split_sync.cu"}


def _sm_build(kind: str):
    if kind in ("warp_row", "multi_row", "block_row"):
        return _sm_rows_build(kind)
    return {"online": _sm_online_build, "split_row": _sm_split_build, "split_sync": _sm_sync_build}[kind]


SOFTMAX = [Family(("softmax", "log_softmax"), "cuda", kind, _SM_FILES[kind], _SM_KNOBS[kind], _SM_DOCS[kind],
                  _sm_applicable(kind), _sm_defaults(kind), _sm_build(kind), _sm_score(kind))
           for kind in _SM_KNOBS]


# ================================================================= group_norm

_GN_ARGS = ["x", "weight", "bias"]


def _gn_hints(p: dict) -> dict:
    return {"LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}


def _gn_block_build(kernel: str):
    def build(sig: Signature, p: dict):
        why = _stream_ok(sig, p, p["unroll"] * p["vec"])
        if why:
            return why
        defines = {"THREADS": p["threads"], "VEC": p["vec"], "UNROLL": p["unroll"], **_gn_hints(p)}
        k = launch(kernel, [*_GN_ARGS, "out", "i32:GROUP_SIZE", "i32:HW", "i32:CPG", "i32:G", "eps"], ["N * G"],
                   [p["threads"]])
        return Built(dict(p), defines, spec([k], requires=["GROUP_SIZE <= 2000000000"]))

    return build


def _gn_chunks(sig: Signature, p: dict) -> str | None:
    """Why each group cannot be cut into p["split"] streamed chunks (None when it can)."""
    why = _stream_ok(sig, p, p["unroll"] * p["vec"])
    if why:
        return why
    if cdiv(_sizes(sig)["GROUP_SIZE"], p["split"]) < p["threads"] * p["vec"]:
        return "chunks smaller than one pass of the block"
    return None


def _gn_chunk_arg(p: dict) -> str:
    """The kernel argument: elements per chunk, a multiple of the vector width."""
    return f"i32:round_up(ceil_div(GROUP_SIZE, {p['split']}), {p['vec']})"


def _gn_split_build(sig: Signature, p: dict):
    why = _gn_chunks(sig, p)
    if why:
        return why
    threads, vec, split = p["threads"], p["vec"], p["split"]
    tile = threads * vec * p["unroll"] * p["items"]
    defines = {"THREADS": threads, "VEC": vec, "UNROLL": p["unroll"], "ITEMS": p["items"], "SPLIT": split,
               **_gn_hints(p)}
    chunk = _gn_chunk_arg(p)
    tiles = f"ceil_div(GROUP_SIZE, {tile})"
    k1 = launch("group_norm_split_stats", ["x", "ws", "i32:GROUP_SIZE", "i32:HW", chunk], [f"N * G * {split}"],
                [threads])
    k2 = launch("group_norm_split_apply", [*_GN_ARGS, "ws", "out", "i32:GROUP_SIZE", "i32:HW", "i32:CPG", "i32:G",
                                           f"i32:{tiles}", "eps"], [f"N * G * {tiles}"], [threads])
    return Built(dict(p), defines, spec([k1, k2], [Workspace("ws", f"N * G * {split} * 16")],
                                        ["GROUP_SIZE <= 2000000000"]))


def _gn_flow_build(sig: Signature, p: dict):
    why = _gn_chunks(sig, p)
    if why:
        return why
    threads, split, minb = p["threads"], p["split"], p.get("minb", 0)  # runs stored before `minb`: 0
    if minb and 65536 // (threads * minb) < 32:
        return f"{minb} blocks of {threads} threads leave fewer than 32 registers per thread"
    defines = {"THREADS": threads, "VEC": p["vec"], "UNROLL": p["unroll"], "SPLIT": split, "LAG": p["lag"],
               "L2": p["l2"], "MINB": minb, **_gn_hints(p)}
    k = launch("group_norm_split_flow", [*_GN_ARGS, "out", "ws", "sync", "i32:GROUP_SIZE", "i32:HW", "i32:CPG",
                                         "i32:G", _gn_chunk_arg(p), "eps"], [f"2 * N * G * {split}"], [threads])
    ws = [Workspace("ws", f"N * G * {split} * 16"), Workspace("sync", "(1 + 2 * N * G) * 4", zero=True)]
    return Built(dict(p), defines, spec([k], ws, ["GROUP_SIZE <= 2000000000", f"2 * N * G * {split} <= 2147483647"]))


def _gn_sync_build(sig: Signature, p: dict):
    e = _sizes(sig)
    threads, vec, items, stage = p["threads"], p["vec"], p["items"], p["stage"]
    chunk_bytes = threads * vec * items * elem_bytes(sig.x.dtype)
    if stage:  # the chunk waits in shared memory; registers only hold the vectors in flight
        why = _vec_ok(sig, p) or (None if chunk_bytes <= SMEM_MAX else "chunk exceeds shared memory")
    else:  # the chunk stays in registers as raw input bits: 16-bit types pack two per register
        why = _vec_ok(sig, p) or _regs_ok(threads, cdiv(items * vec * elem_bytes(sig.x.dtype), 4), overhead=72)
    if why:
        return why
    chunk = threads * vec * items
    split = cdiv(e["GROUP_SIZE"], chunk)
    if split < 2 or split > SM_COUNT - 4:
        return f"{split} blocks per group (needs 2..{SM_COUNT - 4})"
    # UNROLL: only for the element-wise path taken on misaligned pointers
    defines = {"THREADS": threads, "VEC": vec, "ITEMS": items, "STAGE": stage, "UNROLL": 4, **_gn_hints(p)}
    nsplit = f"ceil_div(GROUP_SIZE, {chunk})"
    k = launch("group_norm_split_sync", [*_GN_ARGS, "out", "ws", "sync", "i32:GROUP_SIZE", "i32:HW", "i32:CPG",
                                          "i32:G", f"i32:{nsplit}", "eps"], [f"N * G * {nsplit}"], [threads],
               chunk_bytes if stage else 0)
    ws = [Workspace("ws", f"N * G * {nsplit} * 16"), Workspace("sync", "(1 + 2 * N * G) * 4", zero=True)]
    return Built({**p, "split": split}, defines,
                 spec([k], ws, [f"{nsplit} <= {SM_COUNT - 4}", "GROUP_SIZE <= 2000000000"]))


def _gn_resident_plan(sig: Signature, p: dict) -> dict | str:
    """Sizes of a `resident` launch: team, slice per block, vectors per thread in registers and in
    shared memory, dynamic shared memory; or why the group does not fit on chip that way."""
    e = _sizes(sig)
    eb = elem_bytes(sig.x.dtype)
    vec = 16 // eb
    threads, bps, teams, regs, bufs = p["threads"], p["bps"], p["teams"], p["regs"], p.get("bufs", 1)
    if threads * bps > 2048:
        return f"{threads * bps} threads per SM (at most 2048)"
    if teams > e["N"] * e["G"]:
        return f"{teams} teams for {e['N'] * e['G']} groups"
    budget = min(255, 65536 // (threads * bps))
    if bufs * regs * 4 + 40 > budget:
        return f"{bufs} x {regs} vectors in registers exceed {budget} registers per thread"
    team = SM_COUNT * bps // teams
    slice_ = -(-cdiv(e["GROUP_SIZE"], team) // vec) * vec
    nv = cdiv(slice_ // vec, threads)
    if regs > nv:
        return f"{regs} register vectors per thread, but a slice needs only {nv}"
    slots = nv - regs
    if bufs * slots > 32:
        return f"{bufs} x {slots} shared-memory vectors per thread (at most 32)"
    smem = bufs * slots * threads * 16
    if smem > SMEM_MAX or bps * (smem + 1024 + 1024) > SMEM_PER_SM:
        return f"slices of {slice_} elements ({slots} shared-memory vectors per thread) exceed shared memory"
    return {"vec": vec, "team": team, "slice": slice_, "nv": nv, "slots": slots, "smem": smem}


def _gn_resident_build(sig: Signature, p: dict):
    plan = _gn_resident_plan(sig, p)
    if isinstance(plan, str):
        return plan
    threads, bps, teams, vec, team = p["threads"], p["bps"], p["teams"], plan["vec"], plan["team"]
    blocks = team * teams
    defines = {"THREADS": threads, "VEC": vec, "BPS": bps, "TEAMS": teams, "REGS": p["regs"], "SLOTS": plan["slots"],
               "BUFS": p.get("bufs", 1), "STAGGER": p.get("stagger", 0), "UNROLL": 1, **_gn_hints(p)}
    slice_ = f"round_up(ceil_div(GROUP_SIZE, {team}), {vec})"
    k = launch("group_norm_resident", [*_GN_ARGS, "out", "ws", "i32:GROUP_SIZE", "i32:HW", "i32:CPG", "i32:G",
                                       f"i32:{slice_}", "i32:N * G", "eps"], [blocks], [threads], plan["smem"])
    ws = [Workspace("ws", f"N * G * {team} * 8", zero=True)]  # one flagged partial per block and group
    return Built({**p, "vec": vec}, defines,
                 spec([k], ws, ["GROUP_SIZE <= 2000000000", f"ceil_div({slice_}, {vec * threads}) <= {plan['nv']}"]))


def _gn_resident_defaults(sig: Signature) -> dict:
    """The most groups in flight that fit on chip, preferring a team count that divides the groups
    (every team then walks as many groups); per team count, the first block shape that fits."""
    ng = _sizes(sig)["N"] * _sizes(sig)["G"]
    hints = {"load_hint": 2, "store_hint": 1}
    shapes = [(1024, 1, 4), (512, 2, 4), (512, 2, 8), (512, 1, 16), (256, 2, 16), (512, 2, 0), (1024, 1, 0)]
    for teams in sorted(TEAMS.values, key=lambda t: (ng % t == 0, t), reverse=True):
        for threads, bps, regs in shapes:
            for r in sorted({regs, 0}, reverse=True):  # fewer register vectors when a slice needs fewer
                # teams that start together reach their barriers together: start them ~2 us apart
                p = {"threads": threads, "bps": bps, "teams": teams, "bufs": 1, "regs": r,
                     "stagger": 4 if teams > 1 else 0, **hints}
                if not isinstance(_gn_resident_plan(sig, p), str):
                    return p
    return {"threads": 512, "bps": 2, "teams": 1, "bufs": 1, "regs": 0, "stagger": 0, **hints}


def _gn_defaults(kind: str):
    def defaults(sig: Signature) -> dict:
        e = _sizes(sig)
        groups, gs = e["N"] * e["G"], e["GROUP_SIZE"]
        vec = _vec_default(sig, e["HW"])
        p = {"vec": vec, "load_hint": 0, "store_hint": 0}
        if kind in ("welford", "two_pass"):
            p.update(threads=clamp(pow2_ceil(cdiv(gs, vec * 4)), 64, 512), unroll=4)
        elif kind == "resident":
            return _gn_resident_defaults(sig)
        elif kind == "split":
            split = clamp(pow2_ceil(cdiv(4 * SM_COUNT, groups)), 4, 256)
            while split > 4 and cdiv(gs, split) < 512 * vec * 2:
                split //= 2
            p.update(threads=512, unroll=4, items=2, split=split, store_hint=1)
        elif kind == "split_flow":
            split = clamp(pow2_ceil(cdiv(gs, 32768)), 4, 256)  # chunks of ~32 K elements
            while split > 4 and cdiv(gs, split) < 256 * vec * 4:
                split //= 2
            group_mb = gs * elem_bytes(sig.x.dtype) / 2 ** 20
            lag = nearest(LAG.values, clamp(int(24 / max(group_mb, 1e-3)) - 1, 1, 6))
            p.update(threads=256, unroll=4, split=split, lag=lag, load_hint=2, store_hint=1, l2=0, minb=0)
        elif kind == "split_sync":
            p.update(threads=512, items=8 if elem_bytes(sig.x.dtype) == 2 else 4, load_hint=2, store_hint=1, stage=0)
            # smallest chunk that keeps a group within one resident wave, and >= 2 blocks per SM overall
            while p["items"] > 1 and groups * cdiv(gs, 512 * vec * p["items"] // 2) <= 8 * SM_COUNT \
                    and cdiv(gs, 512 * vec * p["items"] // 2) <= SM_COUNT - 4:
                p["items"] //= 2
            if cdiv(gs, 512 * vec * p["items"]) * 2 > SM_COUNT:
                # a group fills the GPU: stage chunks in shared memory (256 threads x 64 KB: 3 blocks
                # per SM) so that about three groups are resident and their phases overlap
                p.update(threads=256, items=p["items"] * 2, stage=1)
        return p

    return defaults


def _gn_applicable(kind: str):
    def applicable(sig: Signature) -> str | None:
        e = _sizes(sig)
        if e["C"] % max(e["G"], 1):
            return "channels not divisible by groups"
        vec = 16 // elem_bytes(sig.x.dtype)
        if kind in ("split", "split_flow") and e["GROUP_SIZE"] < 8192:
            return "groups too small to split"
        if kind == "resident":
            if e["GROUP_SIZE"] < 1 << 20:
                return "groups too small for a whole-GPU persistent kernel"
            if isinstance(_gn_resident_plan(sig, _gn_resident_defaults(sig)), str):
                return "a group does not fit in the GPU's registers and shared memory"
            if e["HW"] % (16 // elem_bytes(sig.x.dtype)):
                return "H*W not a multiple of a 16-byte vector"
        if kind == "split_sync" and (e["GROUP_SIZE"] < 8192 or cdiv(e["GROUP_SIZE"], 1024 * vec * 8) > SM_COUNT - 4):
            return "groups too small to split, or too large for one resident wave"
        return None

    return applicable


def _gn_score(kind: str):
    def score(sig: Signature) -> float:
        e = _sizes(sig)
        few = e["N"] * e["G"] < 2 * SM_COUNT
        return {"resident": 0 if few else 5, "split_flow": 1 if few else 2, "split": 1 if few else 4,
                "split_sync": 2 if few else 3, "welford": 3 if few else 0, "two_pass": 5 if few else 1}[kind]

    return score


_GN = {
    "welford": ((THREADS, VEC, UNROLL, *HINTS), "group_norm_welford_block.cu", _gn_block_build("group_norm_welford"),
                "one block per group; one-pass Welford/Chan statistics, then normalise(+affine)"),
    "two_pass": ((THREADS, VEC, UNROLL, *HINTS), "group_norm_two_pass.cu", _gn_block_build("group_norm_two_pass"),
                 "one block per group; exact two-pass mean then variance, then normalise (small groups)"),
    "split": ((SPLIT, THREADS, VEC, UNROLL, TILE_ITEMS, *HINTS), "group_norm_split.cu", _gn_split_build,
              "huge groups: stats kernel with `split` blocks per group -> workspace -> normalise kernel"),
    "split_flow": ((SPLIT, THREADS, VEC, UNROLL, LAG, L2_KEEP, MIN_BLOCKS, *HINTS), "group_norm_split_flow.cu",
                   _gn_flow_build,
                   "huge groups in one kernel: statistics blocks, then (LAG groups later) normalise blocks that "
                   "re-read the chunk from L2; start-order tickets, no co-residency bound"),
    "resident": ((RES_THREADS, BPS, TEAMS, BUFS, REGS, STAGGER, *HINTS), "group_norm_resident.cu", _gn_resident_build,
                 "huge groups, ONE read: persistent grid in `teams` teams, each normalising its own groups one "
                 "after another with every block's slice kept in registers + shared memory (cp.async)"),
    "split_sync": ((THREADS, ITEMS, VEC, STAGE, *HINTS), "group_norm_split_sync.cu", _gn_sync_build,
                   "large groups in one kernel and ONE read: chunks in registers, inter-block barrier per group"),
}
GROUP_NORM = [Family(("group_norm",), "cuda", k, f, knobs, doc, _gn_applicable(k), _gn_defaults(k), build, _gn_score(k))
              for k, (knobs, f, build, doc) in _GN.items()]


# ================================================================= batch_norm (inference)

_BN_ARGS = ["x", "running_mean", "running_var", "weight", "bias", "out"]


def _bn_build(kind: str):
    def build(sig: Signature, p: dict):
        if kind == "nhwc":  # ITEMS vectors in flight, three fp32 coefficients per channel
            why = _stream_ok(sig, p, 3 * p["vec"], loads=p["items"])
        else:
            why = _stream_ok(sig, p, p["vec"])
        if why:
            return why
        e = _sizes(sig)
        threads, vec = p["threads"], p["vec"]
        defines = {"THREADS": threads, "VEC": vec, "LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}
        if kind == "nchw_plane":
            tile = threads * vec * p["unroll"]
            defines["UNROLL"] = p["unroll"]
            k = launch("batch_norm_nchw_plane", [*_BN_ARGS, "i32:C", "i32:HW", "eps"], ["N * C", f"ceil_div(HW, {tile})"],
                       [threads])
            return Built(dict(p), defines, spec([k], requires=["channels_last == 0", f"ceil_div(HW, {tile}) <= 65535"]))
        if kind == "nchw_flat":
            tile = threads * vec * p["unroll"]
            defines["UNROLL"] = p["unroll"]
            k = launch("batch_norm_nchw_flat", [*_BN_ARGS, "numel", "i32:C", "i32:HW", "eps"],
                       [f"ceil_div(numel, {tile})"], [threads])
            return Built(dict(p), defines, spec([k], requires=["channels_last == 0", "numel <= 2147483647"]))
        bx = min(threads, pow2_ceil(cdiv(e["C"], vec)))
        by = threads // bx
        defines["ITEMS"] = p["items"]
        k = launch("batch_norm_nhwc", [*_BN_ARGS, "i64:N * HW", "i32:C", "eps"],
                   [f"ceil_div(N * HW, {by * p['items']})"], [bx, by])
        return Built(dict(p), defines, spec([k], requires=["channels_last == 1"]))

    return build


def _bn_defaults(kind: str):
    def defaults(sig: Signature) -> dict:
        e = _sizes(sig)
        if kind == "nhwc":
            return {"threads": 256, "vec": _vec_default(sig, e["C"]), "items": 4, "load_hint": 2, "store_hint": 1}
        vec = _vec_default(sig, e["HW"]) if kind == "nchw_plane" else 16 // elem_bytes(sig.x.dtype)
        return {"threads": 256, "vec": vec, "unroll": 2 if kind == "nchw_flat" else 1, "load_hint": 2,
                "store_hint": 1}

    return defaults


def _bn_applicable(kind: str):
    def applicable(sig: Signature) -> str | None:
        if not all(present(sig, n) for n in ("running_mean", "running_var")):
            return "needs running statistics"
        cl = _sizes(sig)["channels_last"]
        if kind == "nhwc" and not cl:
            return "input is not channels_last"
        if kind != "nhwc" and cl:
            return "input is channels_last"
        return None

    return applicable


def _bn_score(kind: str):
    def score(sig: Signature) -> float:
        hw = _sizes(sig)["HW"]
        return {"nhwc": 0, "nchw_plane": 0 if hw % 8 == 0 and hw >= 1024 else 1, "nchw_flat": 0.5}[kind]

    return score


_BN = {
    "nchw_plane": ((THREADS, VEC, UNROLL, *HINTS), "batch_norm_nchw_plane.cu",
                   "NCHW, grid over (plane, tile): scale/shift once per block, vectorised stream"),
    "nchw_flat": ((THREADS, VEC, UNROLL, *HINTS), "batch_norm_nchw_flat.cu",
                  "NCHW flat 16-byte stream for any HW (7x7 too): channel found per vector"),
    "nhwc": ((THREADS, VEC, ITEMS, *HINTS), "batch_norm_nhwc.cu",
             "channels_last: threads along channel vectors (scale/shift in registers), pixels along y"),
}
BATCH_NORM = [Family(("batch_norm",), "cuda", k, f, knobs, doc, _bn_applicable(k), _bn_defaults(k), _bn_build(k),
                     _bn_score(k)) for k, (knobs, f, doc) in _BN.items()]


# ================================================================= adaptive_avg_pool2d to (1, 1)


def _pool_build(kind: str):
    def build(sig: Signature, p: dict):
        why = _stream_ok(sig, p, p["vec"])
        if why:
            return why
        e = _sizes(sig)
        threads, vec = p["threads"], p["vec"]
        defines = {"THREADS": threads, "VEC": vec, "UNROLL": p["unroll"], "LOAD_HINT": p["load_hint"]}
        if kind == "nchw_lanes":
            lanes = p["lanes"]
            if lanes > threads:
                return "lanes exceed threads"
            defines["LANES"] = lanes
            k = launch("adaptive_avg_pool2d_nchw_lanes", ["x", "out", "i64:N * C", "i32:HW"],
                       [f"ceil_div(N * C, {threads // lanes})"], [threads])
            return Built(dict(p), defines, spec([k], requires=["channels_last == 0"]))
        if kind == "nchw_tile":
            planes = p["planes"]
            if threads % planes or threads // planes > 32:
                return "threads per plane must be a power of two <= 32"
            defines["PLANES"] = planes
            eb = elem_bytes(sig.x.dtype)
            k = launch("adaptive_avg_pool2d_nchw_tile", ["x", "out", "i64:N * C", "i32:HW"],
                       [f"ceil_div(N * C, {planes})"], [threads], f"round_up({planes} * HW * {eb}, 16)")
            return Built(dict(p), defines, spec([k], requires=["channels_last == 0",
                                                              f"{planes} * HW * {eb} <= 49152"]))
        ty = p["ty"]
        if ty > threads // 8:
            return "too few threads along channels"
        bx = threads // ty
        smem = bx * ty * vec * 4 if ty > 1 else 0
        k = launch("adaptive_avg_pool2d_nhwc", ["x", "out", "i32:C", "i32:HW"], [f"ceil_div(C, {bx * vec})", "N"],
                   [bx, ty], smem)
        return Built(dict(p), defines, spec([k], requires=["channels_last == 1", "N <= 65535"]))

    return build


def _pool_defaults(kind: str):
    def defaults(sig: Signature) -> dict:
        e = _sizes(sig)
        hw, c = e["HW"], e["C"]
        if kind == "nchw_lanes":
            return {"threads": 256, "lanes": clamp(pow2_ceil(cdiv(hw, 8)), 4, 32), "vec": _vec_default(sig, hw),
                    "unroll": 2, "load_hint": 2}
        if kind == "nchw_tile":
            # 128 threads, 4 vectors each in flight: the fastest setting on an H200 for (256,2048,7,7), 17.6 µs =
            # 70% of copy bandwidth (bench/results/search.md), at the read-only ceiling of bench/results/pool_probe.md
            planes = 64 if hw * 64 * elem_bytes(sig.x.dtype) <= 49152 else 16
            return {"threads": 128, "planes": planes, "vec": 16 // elem_bytes(sig.x.dtype), "unroll": 4,
                    "load_hint": 2}
        vec = _vec_default(sig, c)
        threads = 256
        ty = clamp(pow2_ceil(cdiv(threads * vec, c)), 1, 16)  # spare threads go to the pixels
        return {"threads": threads, "vec": vec, "ty": ty, "unroll": 4, "load_hint": 2}

    return defaults


def _pool_applicable(kind: str):
    def applicable(sig: Signature) -> str | None:
        e = _sizes(sig)
        if kind == "nhwc" and not e["channels_last"]:
            return "input is not channels_last"
        if kind != "nhwc" and e["channels_last"]:
            return "input is channels_last"
        if kind == "nchw_tile" and e["HW"] * 8 * elem_bytes(sig.x.dtype) > 49152:
            return "planes too large to stage in shared memory"
        return None

    return applicable


def _pool_score(kind: str):
    def score(sig: Signature) -> float:
        hw = _sizes(sig)["HW"]
        return {"nhwc": 0, "nchw_tile": 0 if hw < 256 else 2, "nchw_lanes": 1}[kind]

    return score


_POOL = {
    "nchw_lanes": ((THREADS, LANES_ALL, VEC, UNROLL, LOAD_HINT), "adaptive_avg_pool2d_nchw_lanes.cu",
                   "NCHW: `lanes` threads per plane, shuffle reduction"),
    "nchw_tile": ((THREADS, PLANES, VEC, UNROLL, LOAD_HINT), "adaptive_avg_pool2d_nchw_tile.cu",
                  "NCHW small planes (7x7): 16-byte coalesced tile of planes through shared memory"),
    "nhwc": ((THREADS, SPLIT_HW, VEC, UNROLL, LOAD_HINT), "adaptive_avg_pool2d_nhwc.cu",
             "channels_last: threads along channel vectors, pixels split over threadIdx.y"),
}
POOL = [Family(("adaptive_avg_pool2d",), "cuda", k, f, knobs, doc, _pool_applicable(k), _pool_defaults(k),
               _pool_build(k), _pool_score(k)) for k, (knobs, f, doc) in _POOL.items()]


# ================================================================= layer_norm / rms_norm


def _rn_build(kind: str):
    def build(sig: Signature, p: dict):
        why = _stream_ok(sig, p, p.get("unroll", 1) * p["vec"] * 2) if kind == "online" else _vec_ok(sig, p)
        if why:
            return why
        e = _sizes(sig)
        rms = sig.op == "rms_norm"
        threads, vec = p["threads"], p["vec"]
        defines = {"RMS": int(rms), "THREADS": threads, "VEC": vec, "LOAD_HINT": p["load_hint"],
                   "STORE_HINT": p["store_hint"]}
        if rms:
            defines.update(T_BIAS="float", HAS_BIAS=0)  # rms_norm has no bias in its ABI
        head = ["x", "weight"] + ([] if rms else ["bias"]) + ["out"]
        tail = ["eps"] + (["weight_offset"] if rms else [])
        params = dict(p)
        requires: list[str] = []
        if kind in ("warp_row", "block_row"):
            lanes = threads if kind == "block_row" else p["lanes"]
            if lanes > threads:
                return "lanes exceed threads"
            items = _rows_items(e["cols"], lanes, vec)
            why = _regs_ok(threads, items * vec)
            if why:
                return why
            if kind == "warp_row" and items * vec > 32:
                return "more than 32 values per lane: use a block per row"
            params["items"] = items
            defines.update(ITEMS=items, LANES=lanes)
            requires.append(f"cols <= {lanes * vec * items}")
        else:
            defines["UNROLL"] = p["unroll"]
        name = f"{sig.op}_{kind}"
        if kind == "warp_row":
            k = launch(name, [*head, "rows", "i32:cols", *tail], [f"ceil_div(rows, {threads // p['lanes']})"], [threads])
        else:
            k = launch(name, [*head, "i32:cols", *tail], ["rows"], [threads])
        return Built(params, defines, spec([k], requires=requires))

    return build


def _rn_defaults(kind: str):
    def defaults(sig: Signature) -> dict:
        cols = _sizes(sig)["cols"]
        vec = _vec_default(sig, cols)
        nvec = cdiv(cols, vec)
        p = {"vec": vec, "load_hint": 0, "store_hint": 0}
        if kind == "warp_row":
            p.update(threads=128, lanes=clamp(pow2_ceil(cdiv(nvec, 2)), 4, 32))
        elif kind == "block_row":
            p["threads"] = clamp(pow2_ceil(cdiv(nvec, 2)), 64, 1024)
        else:
            p.update(threads=clamp(pow2_ceil(cdiv(nvec, 8)), 128, 1024), unroll=4)
        return p

    return defaults


def _rn_applicable(kind: str):
    def applicable(sig: Signature) -> str | None:
        cols = _sizes(sig)["cols"]
        if kind == "warp_row" and cols > 32 * 32:
            return "rows too long for one warp's registers"
        if kind == "block_row" and cols > 1024 * 24:
            return "rows too long for one block's registers"
        return None

    return applicable


def _rn_score(kind: str):
    def score(sig: Signature) -> float:
        cols = _sizes(sig)["cols"]
        return {"warp_row": 0 if cols <= 1024 else 2, "block_row": 1 if cols <= 1024 else 0, "online": 3}[kind]

    return score


_RN = {
    "warp_row": ((THREADS, LANES_ALL, VEC, *HINTS), "rownorm_warp_row.cu",
                 "`lanes` threads per row, row in registers, shuffle reductions (short and medium rows)"),
    "block_row": ((THREADS, VEC, *HINTS), "rownorm_block_row.cu", "one block per row, row in registers"),
    "online": ((THREADS, VEC, UNROLL, *HINTS), "rownorm_online.cu",
               "one block per row, statistics pass then normalise pass: any length"),
}
ROWNORM = [Family(("layer_norm", "rms_norm"), "cuda", k, f, knobs, doc, _rn_applicable(k), _rn_defaults(k),
                  _rn_build(k), _rn_score(k)) for k, (knobs, f, doc) in _RN.items()]

FAMILIES = [*SOFTMAX, *GROUP_NORM, *BATCH_NORM, *POOL, *ROWNORM]
