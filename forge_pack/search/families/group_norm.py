"""group_norm (NCHW, optional affine) and instance_norm (its groups of one channel): kernel families and reference
kernel.

CUDA: a block per group (`welford`, `two_pass`); huge groups split over blocks through a workspace
(`split`), in one kernel with an inter-block barrier (`split_sync`), with statistics and normalise
blocks in one start-ordered grid (`split_flow`), or held on chip by a persistent grid (`resident`).
CPU: `groups` and `planes`. Kernels in templates/kernels/{cuda,cpu}/group_norm_*. Pure Python, no
torch import.
"""

from __future__ import annotations

from forge_pack.core.candidate import Workspace
from forge_pack.core.signature import Signature
from forge_pack.search import resident_grid
from forge_pack.search.template_kit import (GRAIN, HINTS, ITEMS, SPLIT, THREADS, UNROLL, VEC, Built, Family, Gpu, Knob,
                                            ReferenceKernel, cdiv, clamp, elem_bytes, full_vec, grain_default, launch,
                                            nearest, pow2_ceil, regs_ok, spec, stream_ok, vec_default, vec_ok)
from forge_pack.targets.abi import env as sizes

OPS = ("group_norm", "instance_norm")  # instance_norm: G = C groups of one channel (its size variables)

TILE_ITEMS = Knob("items", (1, 2, 4, 8), "loop trips per block of the normalise kernel (tile size)")
STAGE = Knob("stage", (0, 1), "where a block keeps its chunk: 0 registers, 1 shared memory")
LAG = Knob("lag", (1, 2, 3, 4, 6), "groups between a group's statistics blocks and its normalise blocks")
L2_KEEP = Knob("l2", (0, 1), "1: first reads evict_last and second reads evict_first in L2 (cache policies)")
MIN_BLOCKS = Knob("minb", (0, 2, 4, 5, 6, 8), "blocks per SM the registers are capped for (0: the compiler's choice)")
TEAMS = Knob("teams", (1, 2, 3, 4, 6, 8, 16, 32), "groups in flight: the persistent grid splits into this many teams")

SPLIT_MIN_GROUP = 8192  # elements per group below which a block per group is enough (splitting only adds launches)
RESIDENT_MIN_GROUP = 1 << 20  # a persistent grid pays off only when a group alone fills the GPU,
# or when the groups are many and together far larger than any L2 (a block per group then reads each twice from
# DRAM): groups of RESIDENT_MIN_PLANE elements or more (instance_norm's planes) in a tensor of RESIDENT_MIN_BYTES
RESIDENT_MIN_PLANE = 1 << 16
RESIDENT_MIN_BYTES = 256 << 20
SYNC_SPARE_SMS = 4  # split_sync leaves 4 SMs of the resident wave free, so a group's blocks fit beside others
MAX_GROUP = 2000000000  # the kernels index a group with 32-bit integers
_ARGS = ["x", "weight", "bias"]


def _hints(p: dict) -> dict:
    return {"LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}


def _groups_divide(sig: Signature) -> str | None:
    e = sizes(sig)
    return "channels not divisible by groups" if e["C"] % max(e["G"], 1) else None


def _few_groups(sig: Signature, gpu: Gpu) -> bool:
    """Fewer groups than two per SM: a block per group leaves SMs idle."""
    e = sizes(sig)
    return e["N"] * e["G"] < 2 * gpu.sm_count


def _base_defaults(sig: Signature) -> dict:
    return {"vec": vec_default(sig, sizes(sig)["HW"]), "load_hint": 0, "store_hint": 0}


# ---------------------------------------------------------------- CUDA: a block per group


def _block_defaults(sig: Signature, gpu: Gpu) -> dict:
    p = _base_defaults(sig)
    p.update(threads=clamp(pow2_ceil(cdiv(sizes(sig)["GROUP_SIZE"], p["vec"] * 4)), 64, 512), unroll=4)
    return p


def _block_build(sig: Signature, p: dict, kernel: str) -> Built | str:
    why = stream_ok(sig, p, p["unroll"] * p["vec"])
    if why:
        return why
    defines = {"THREADS": p["threads"], "VEC": p["vec"], "UNROLL": p["unroll"], **_hints(p)}
    k = launch(kernel, [*_ARGS, "out", "i32:GROUP_SIZE", "i32:HW", "i32:CPG", "i32:G", "eps"], ["N * G"],
               [p["threads"]])
    return Built(dict(p), defines, spec([k], requires=[f"GROUP_SIZE <= {MAX_GROUP}"]))


def _applicable(sig: Signature, gpu: Gpu) -> str | None:
    return _groups_divide(sig)


def _welford_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    return _block_build(sig, p, "group_norm_welford")


def _welford_score(sig: Signature, gpu: Gpu) -> float:
    return 3 if _few_groups(sig, gpu) else 0


def _two_pass_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    return _block_build(sig, p, "group_norm_two_pass")


def _two_pass_score(sig: Signature, gpu: Gpu) -> float:
    return 5 if _few_groups(sig, gpu) else 1


# ---------------------------------------------------------------- CUDA: groups split over blocks


def _split_applicable(sig: Signature, gpu: Gpu) -> str | None:
    why = _groups_divide(sig)
    if why:
        return why
    return "groups too small to split" if sizes(sig)["GROUP_SIZE"] < SPLIT_MIN_GROUP else None


def _chunks(sig: Signature, p: dict) -> str | None:
    """Why each group cannot be cut into p["split"] streamed chunks (None when it can)."""
    why = stream_ok(sig, p, p["unroll"] * p["vec"])
    if why:
        return why
    if cdiv(sizes(sig)["GROUP_SIZE"], p["split"]) < p["threads"] * p["vec"]:
        return "chunks smaller than one pass of the block"
    return None


def _chunk_arg(p: dict) -> str:
    """The kernel argument: elements per chunk, a multiple of the vector width."""
    return f"i32:round_up(ceil_div(GROUP_SIZE, {p['split']}), {p['vec']})"


def _split_defaults(sig: Signature, gpu: Gpu) -> dict:
    e, p = sizes(sig), _base_defaults(sig)
    groups, gs, vec = e["N"] * e["G"], e["GROUP_SIZE"], p["vec"]
    split = clamp(pow2_ceil(cdiv(4 * gpu.sm_count, groups)), 4, 256)  # about 4 blocks per SM
    while split > 4 and cdiv(gs, split) < 512 * vec * 2:  # at least two passes of a 512-thread block
        split //= 2
    p.update(threads=512, unroll=4, items=2, split=split, store_hint=1)
    return p


def _split_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = _chunks(sig, p)
    if why:
        return why
    threads, vec, split = p["threads"], p["vec"], p["split"]
    tile = threads * vec * p["unroll"] * p["items"]
    defines = {"THREADS": threads, "VEC": vec, "UNROLL": p["unroll"], "ITEMS": p["items"], "SPLIT": split,
               **_hints(p)}
    tiles = f"ceil_div(GROUP_SIZE, {tile})"
    k1 = launch("group_norm_split_stats", ["x", "ws", "i32:GROUP_SIZE", "i32:HW", _chunk_arg(p)],
                [f"N * G * {split}"], [threads])
    k2 = launch("group_norm_split_apply", [*_ARGS, "ws", "out", "i32:GROUP_SIZE", "i32:HW", "i32:CPG", "i32:G",
                                           f"i32:{tiles}", "eps"], [f"N * G * {tiles}"], [threads])
    return Built(dict(p), defines, spec([k1, k2], [Workspace("ws", f"N * G * {split} * 16")],
                                        [f"GROUP_SIZE <= {MAX_GROUP}"]))


def _split_score(sig: Signature, gpu: Gpu) -> float:
    return 1 if _few_groups(sig, gpu) else 4


def _flow_defaults(sig: Signature, gpu: Gpu) -> dict:
    p = _base_defaults(sig)
    gs, vec = sizes(sig)["GROUP_SIZE"], p["vec"]
    split = clamp(pow2_ceil(cdiv(gs, 32768)), 4, 256)  # chunks of ~32 K elements
    while split > 4 and cdiv(gs, split) < 256 * vec * 4:
        split //= 2
    group_mb = gs * elem_bytes(sig.x.dtype) / 2 ** 20
    lag = nearest(LAG.values, clamp(int(24 / max(group_mb, 1e-3)) - 1, 1, 6))  # ~24 MB in flight (in L2)
    p.update(threads=256, unroll=4, split=split, lag=lag, load_hint=2, store_hint=1, l2=0, minb=0)
    return p


def _flow_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = _chunks(sig, p)
    if why:
        return why
    threads, split, minb = p["threads"], p["split"], p.get("minb", 0)  # runs stored before `minb`: 0
    if minb and 65536 // (threads * minb) < 32:
        return f"{minb} blocks of {threads} threads leave fewer than 32 registers per thread"
    defines = {"THREADS": threads, "VEC": p["vec"], "UNROLL": p["unroll"], "SPLIT": split, "LAG": p["lag"],
               "L2": p["l2"], "MINB": minb, **_hints(p)}
    k = launch("group_norm_split_flow", [*_ARGS, "out", "ws", "sync", "i32:GROUP_SIZE", "i32:HW", "i32:CPG",
                                         "i32:G", _chunk_arg(p), "eps"], [f"2 * N * G * {split}"], [threads])
    ws = [Workspace("ws", f"N * G * {split} * 16"), Workspace("sync", "(1 + 2 * N * G) * 4", zero=True)]
    return Built(dict(p), defines, spec([k], ws, [f"GROUP_SIZE <= {MAX_GROUP}", f"2 * N * G * {split} <= 2147483647"]))


def _flow_score(sig: Signature, gpu: Gpu) -> float:
    return 1 if _few_groups(sig, gpu) else 2


# ---------------------------------------------------------------- CUDA: one kernel, one read


def _sync_applicable(sig: Signature, gpu: Gpu) -> str | None:
    why = _groups_divide(sig)
    if why:
        return why
    gs = sizes(sig)["GROUP_SIZE"]
    if gs < SPLIT_MIN_GROUP or cdiv(gs, 1024 * full_vec(sig) * 8) > gpu.sm_count - SYNC_SPARE_SMS:
        return "groups too small to split, or too large for one resident wave"
    return None


def _sync_defaults(sig: Signature, gpu: Gpu) -> dict:
    e, p = sizes(sig), _base_defaults(sig)
    groups, gs, vec = e["N"] * e["G"], e["GROUP_SIZE"], p["vec"]
    wave = gpu.sm_count - SYNC_SPARE_SMS
    p.update(threads=512, items=8 if elem_bytes(sig.x.dtype) == 2 else 4, load_hint=2, store_hint=1, stage=0)
    # smallest chunk that keeps a group within one resident wave, and >= 2 blocks per SM overall
    while p["items"] > 1 and groups * cdiv(gs, 512 * vec * p["items"] // 2) <= 8 * gpu.sm_count \
            and cdiv(gs, 512 * vec * p["items"] // 2) <= wave:
        p["items"] //= 2
    if cdiv(gs, 512 * vec * p["items"]) * 2 > gpu.sm_count:
        # a group fills the GPU: stage chunks in shared memory (256 threads x 64 KB: 3 blocks
        # per SM) so that about three groups are resident and their phases overlap
        p.update(threads=256, items=p["items"] * 2, stage=1)
    return p


def _sync_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    threads, vec, items, stage = p["threads"], p["vec"], p["items"], p["stage"]
    chunk_bytes = threads * vec * items * elem_bytes(sig.x.dtype)
    if stage:  # the chunk waits in shared memory; registers only hold the vectors in flight
        why = vec_ok(sig, p) or (None if chunk_bytes <= gpu.plan_smem else "chunk exceeds shared memory")
    else:  # the chunk stays in registers as raw input bits: 16-bit types pack two per register
        why = vec_ok(sig, p) or regs_ok(threads, cdiv(items * vec * elem_bytes(sig.x.dtype), 4), overhead=72)
    if why:
        return why
    chunk = threads * vec * items
    split = cdiv(sizes(sig)["GROUP_SIZE"], chunk)
    wave = gpu.sm_count - SYNC_SPARE_SMS
    if split < 2 or split > wave:
        return f"{split} blocks per group (needs 2..{wave})"
    # UNROLL: only for the element-wise path taken on misaligned pointers
    defines = {"THREADS": threads, "VEC": vec, "ITEMS": items, "STAGE": stage, "UNROLL": 4, **_hints(p)}
    nsplit = f"ceil_div(GROUP_SIZE, {chunk})"
    k = launch("group_norm_split_sync", [*_ARGS, "out", "ws", "sync", "i32:GROUP_SIZE", "i32:HW", "i32:CPG",
                                         "i32:G", f"i32:{nsplit}", "eps"], [f"N * G * {nsplit}"], [threads],
               chunk_bytes if stage else 0)
    ws = [Workspace("ws", f"N * G * {nsplit} * 16"), Workspace("sync", "(1 + 2 * N * G) * 4", zero=True)]
    return Built({**p, "split": split}, defines,
                 spec([k], ws, [f"{nsplit} <= {wave}", f"GROUP_SIZE <= {MAX_GROUP}"]))


def _sync_score(sig: Signature, gpu: Gpu) -> float:
    return 2 if _few_groups(sig, gpu) else 3


# ---------------------------------------------------------------- CUDA: the persistent grid


def resident_plan(sig: Signature, p: dict, gpu: Gpu) -> dict | str:
    """Sizes of a `resident` launch (resident_grid.plan over the N * G groups), or why a group does not fit."""
    e = sizes(sig)
    return resident_grid.plan(e["N"] * e["G"], e["GROUP_SIZE"], full_vec(sig), p, gpu)


def _resident_applicable(sig: Signature, gpu: Gpu) -> str | None:
    why = _groups_divide(sig)
    if why:
        return why
    e = sizes(sig)
    large = e["N"] * e["G"] * e["GROUP_SIZE"] * elem_bytes(sig.x.dtype) >= RESIDENT_MIN_BYTES
    if e["GROUP_SIZE"] < (RESIDENT_MIN_PLANE if large else RESIDENT_MIN_GROUP):
        return "groups too small for a whole-GPU persistent kernel"
    if isinstance(resident_plan(sig, _resident_defaults(sig, gpu), gpu), str):
        return "a group does not fit in the GPU's registers and shared memory"
    if e["HW"] % full_vec(sig):
        return "H*W not a multiple of a 16-byte vector"
    return None


def _resident_defaults(sig: Signature, gpu: Gpu) -> dict:
    """The most groups in flight that fit on chip (resident_grid.defaults)."""
    hints = {"load_hint": 2, "store_hint": 1}
    return resident_grid.defaults(sizes(sig)["N"] * sizes(sig)["G"], TEAMS.values,
                                  lambda q: not isinstance(resident_plan(sig, q, gpu), str), hints)


def _resident_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    plan = resident_plan(sig, p, gpu)
    if isinstance(plan, str):
        return plan
    lay = resident_grid.layout(p, plan, "N * G", "GROUP_SIZE")
    defines = {"THREADS": p["threads"], "VEC": plan["vec"], **lay.defines, "UNROLL": 1, **_hints(p)}
    k = launch("group_norm_resident", [*_ARGS, "out", "ws", "i32:GROUP_SIZE", "i32:HW", "i32:CPG", "i32:G",
                                       f"i32:{lay.slice}", "i32:N * G", "eps"], [lay.blocks], [p["threads"]],
               plan["smem"])
    return Built({**p, "vec": plan["vec"]}, defines,
                 spec([k], [lay.workspace], [f"GROUP_SIZE <= {MAX_GROUP}", lay.requires]))


def _resident_score(sig: Signature, gpu: Gpu) -> float:
    """First wherever it applies (groups of RESIDENT_MIN_GROUP elements or more, or of RESIDENT_MIN_PLANE in a tensor
    of RESIDENT_MIN_BYTES): the other families read such a group twice, and with many of them in flight (a block per
    group on every SM) the second read misses L2.
    Among many groups it goes before `welford` (0): on 32 groups of 8 MB it measured 74-76% of copy bandwidth
    against 56% for the two-read `split` (bench/results/kernel_sweep.md), and KernelBench's 896 groups of 8 MB,
    searched with `welford` first for 3 evaluations, ended at 0.96x torch.compile and 64% (kernelbench.md)."""
    return 0 if _few_groups(sig, gpu) else -1


CUDA = (
    Family(OPS, "cuda", "welford", "group_norm_welford_block.cu", (THREADS, VEC, UNROLL, *HINTS),
           "one block per group; one-pass Welford/Chan statistics, then normalise(+affine)",
           _applicable, _block_defaults, _welford_build, _welford_score),
    Family(OPS, "cuda", "two_pass", "group_norm_two_pass.cu", (THREADS, VEC, UNROLL, *HINTS),
           "one block per group; exact two-pass mean then variance, then normalise (small groups)",
           _applicable, _block_defaults, _two_pass_build, _two_pass_score),
    Family(OPS, "cuda", "split", "group_norm_split.cu", (SPLIT, THREADS, VEC, UNROLL, TILE_ITEMS, *HINTS),
           "huge groups: stats kernel with `split` blocks per group -> workspace -> normalise kernel",
           _split_applicable, _split_defaults, _split_build, _split_score),
    Family(OPS, "cuda", "split_flow", "group_norm_split_flow.cu",
           (SPLIT, THREADS, VEC, UNROLL, LAG, L2_KEEP, MIN_BLOCKS, *HINTS),
           "huge groups in one kernel: statistics blocks, then (LAG groups later) normalise blocks that "
           "re-read the chunk from L2; start-order tickets, no co-residency bound",
           _split_applicable, _flow_defaults, _flow_build, _flow_score),
    Family(OPS, "cuda", "resident", "group_norm_resident.cu",
           (resident_grid.THREADS, resident_grid.BPS, TEAMS, resident_grid.BUFS, resident_grid.REGS,
            resident_grid.STAGGER, *HINTS),
           "huge groups, ONE read: persistent grid in `teams` teams, each normalising its own groups one "
           "after another with every block's slice kept in registers + shared memory (cp.async)",
           _resident_applicable, _resident_defaults, _resident_build, _resident_score, co_resident=True),
    Family(OPS, "cuda", "split_sync", "group_norm_split_sync.cu", (THREADS, ITEMS, VEC, STAGE, *HINTS),
           "large groups in one kernel and ONE read: chunks in registers, inter-block barrier per group",
           _sync_applicable, _sync_defaults, _sync_build, _sync_score),
)


# ---------------------------------------------------------------- CPU

STATS = Knob("stats", (0, 1), "statistics: 0 exact two-pass, 1 one pass of sum / sum of squares in double")
CPU_FEW_GROUPS = 16  # fewer groups than this: channel planes in parallel keep the cores busy
_CPU_ARGS = ["x", "weight", "bias", "out", "N", "C", "HW", "G", "eps"]


def _cpu_few(sig: Signature) -> bool:
    e = sizes(sig)
    return e["N"] * e["G"] < CPU_FEW_GROUPS


def _cpu_groups_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"stats": 0, "grain": 1}


def _cpu_groups_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    defines = {"GRAIN": p["grain"], "STATS": p["stats"]}
    return Built(dict(p), defines, spec([launch("group_norm_groups", _CPU_ARGS, [1], [1])]))


def _cpu_groups_score(sig: Signature, gpu: Gpu) -> float:
    return 1 if _cpu_few(sig) else 0


def _cpu_planes_defaults(sig: Signature, gpu: Gpu) -> dict:
    e = sizes(sig)
    return {"grain": grain_default(e["N"] * e["C"])}


def _cpu_planes_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    return Built(dict(p), {"GRAIN": p["grain"]}, spec([launch("group_norm_planes", _CPU_ARGS, [1], [1])]))


def _cpu_planes_score(sig: Signature, gpu: Gpu) -> float:
    return 0 if _cpu_few(sig) else 1


CPU = (
    Family(OPS, "cpu", "groups", "group_norm_groups.cpp", (STATS, GRAIN),
           "groups in parallel; two-pass or one-pass (double) statistics, per-channel affine",
           _applicable, _cpu_groups_defaults, _cpu_groups_build, _cpu_groups_score),
    Family(OPS, "cpu", "planes", "group_norm_planes.cpp", (GRAIN,),
           "channel planes in parallel (few large groups): plane moments, Chan merge per group, apply",
           _applicable, _cpu_planes_defaults, _cpu_planes_build, _cpu_planes_score),
)

REFERENCES = (ReferenceKernel("group_norm"),)
