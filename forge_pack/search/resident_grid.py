"""The persistent ("resident") grid that the `resident` families of group_norm, softmax and layer/RMS norm share.

SMs x bps blocks, all resident at once, split into `teams` teams. A team holds one unit (a norm
group, a softmax row) on chip: each of its blocks keeps the same slice of the unit in registers
(`regs` 16-byte vectors per thread) and dynamic shared memory (the rest, `slots` vectors per
thread), `bufs` times over. This module sizes that layout for a GPU, or says why a unit does not fit;
the kernels share templates/kernels/cuda/_resident.cuh. Pure Python, no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from forge_pack.core.candidate import Workspace
from forge_pack.search.template_kit import SMEM_BLOCK_RESERVE, STATIC_SMEM, Gpu, Knob, cdiv, full_vec
from forge_pack.targets.abi import env

BPS = Knob("bps", (1, 2), "persistent blocks per SM (the grid is SMs x bps, resident at once)")
REGS = Knob("regs", (0, 2, 4, 8, 16), "16-byte vectors per thread and buffer kept in registers (the rest in shared "
            "memory)")
BUFS = Knob("bufs", (1, 2), "buffers per block: 2 streams a team's next unit in while this one waits for statistics")
THREADS = Knob("threads", (256, 512, 1024), "threads per block")
STAGGER = Knob("stagger", (0, 2, 4, 8, 16), "team t starts t x this many thousand cycles late (teams out of phase)")
# rows (softmax, layer_norm, rms_norm) are smaller units than norm groups: more of them fit on chip at once
ROW_TEAMS = Knob("teams", (1, 2, 4, 8, 16, 32, 64), "rows in flight: the persistent grid splits into this many teams")
FIRST_ROW_BYTES = 256 << 10  # rows from which a block per row (or a second read) no longer finds the row in L2
MAX_SLOTS = 32  # shared-memory vectors per thread and buffer: the kernels' cp.async wait takes 0..31 pending groups
# The block shapes tried for the defaults, most registers first: (threads, bps, register vectors)
SHAPES = ((1024, 1, 4), (512, 2, 4), (512, 2, 8), (512, 1, 16), (256, 2, 16), (512, 2, 0), (1024, 1, 0))


def plan(units: int, unit_size: int, vec: int, p: dict, gpu: Gpu, noun: str = "groups") -> dict | str:
    """Sizes of a resident launch over `units` units of `unit_size` elements read in vectors of `vec`:
    team (blocks per unit), slice (elements per block), vectors per thread in registers and in shared
    memory, dynamic shared memory per block; or why a unit does not fit on chip that way."""
    threads, bps, teams, regs, bufs = p["threads"], p["bps"], p["teams"], p["regs"], p.get("bufs", 1)
    if threads * bps > 2048:
        return f"{threads * bps} threads per SM (at most 2048)"
    if teams > units:
        return f"{teams} teams for {units} {noun}"
    team = gpu.sm_count * bps // teams
    if team < 1:
        return f"{teams} teams for {gpu.sm_count * bps} blocks"
    budget = min(255, 65536 // (threads * bps))
    if bufs * regs * 4 + 40 > budget:
        return f"{bufs} x {regs} vectors in registers exceed {budget} registers per thread"
    slice_ = -(-cdiv(unit_size, team) // vec) * vec
    nv = cdiv(slice_ // vec, threads)
    if regs > nv:
        return f"{regs} register vectors per thread, but a slice needs only {nv}"
    slots = nv - regs
    if bufs * slots > MAX_SLOTS:
        return f"{bufs} x {slots} shared-memory vectors per thread (at most {MAX_SLOTS})"
    smem = bufs * slots * threads * 16
    if smem > gpu.plan_smem or bps * (smem + SMEM_BLOCK_RESERVE + STATIC_SMEM) > gpu.smem_per_sm:
        return f"slices of {slice_} elements ({slots} shared-memory vectors per thread) exceed shared memory"
    return {"vec": vec, "team": team, "slice": slice_, "nv": nv, "slots": slots, "smem": smem}


def defaults(units: int, team_counts: tuple, fits: Callable[[dict], bool], hints: dict,
             walk_min: int | None = None) -> dict:
    """The most units in flight that fit on chip, preferring a balanced team count: one that divides the
    units (every team then walks as many) or, with `walk_min`, leaves every team at least that many units
    (the last round's idle teams are then a small part); per team count, the first block shape of SHAPES
    that fits (`fits`), with fewer register vectors when a slice needs fewer. When none fits, one team of
    512-thread blocks, two per SM (the family's applicability then says why it does not apply)."""
    def balanced(t: int) -> bool:
        return units % t == 0 or (walk_min is not None and units >= walk_min * t)

    for teams in sorted(team_counts, key=lambda t: (balanced(t), t), reverse=True):
        for threads, bps, regs in SHAPES:
            for r in sorted({regs, 0}, reverse=True):
                # teams that start together reach their barriers together: start them ~2 us apart
                p = {"threads": threads, "bps": bps, "teams": teams, "bufs": 1, "regs": r,
                     "stagger": 4 if teams > 1 else 0, **hints}
                if fits(p):
                    return p
    return {"threads": 512, "bps": 2, "teams": 1, "bufs": 1, "regs": 0, "stagger": 0, **hints}


def _rows(sig) -> tuple[int, int, int]:
    """A row signature's (rows, cols, 16-byte vector), as its launch sizes them."""
    e = env(sig)
    return e["rows"], e["cols"], full_vec(sig)


def row_plan(sig, p: dict, gpu: Gpu) -> dict | str:
    """`plan` with a row signature's rows as the units (softmax's and layer/RMS norm's `resident`)."""
    rows, cols, vec = _rows(sig)
    return plan(rows, cols, vec, p, gpu, noun="rows")


def row_defaults(sig, gpu: Gpu, hints: dict) -> dict:
    """`defaults` over a row signature's rows: every team count of ROW_TEAMS, each team walking at least 4 rows
    where the teams do not divide them."""
    return defaults(_rows(sig)[0], ROW_TEAMS.values, lambda q: not isinstance(row_plan(sig, q, gpu), str), hints,
                    walk_min=4)


def rows_unfit(sig, gpu: Gpu, hints: dict) -> str | None:
    """Why a row signature's rows take no resident grid at their defaults (`hints` added), or None."""
    _, cols, vec = _rows(sig)
    if cols % vec:
        return "rows not a multiple of a 16-byte vector"
    if isinstance(row_plan(sig, row_defaults(sig, gpu, hints), gpu), str):
        return "a row does not fit in the GPU's registers and shared memory"
    return None


@dataclass(frozen=True)
class Layout:
    """What a resident launch spec needs from a plan: the grid's defines, the slice size expression (a kernel
    argument), the grid size, the workspace of one flagged 64-bit partial per block and unit, and the launch's
    requirement that a unit's slice fits the vectors the kernel was compiled for."""

    defines: dict
    slice: str
    blocks: int
    workspace: Workspace
    requires: str


def layout(p: dict, plan: dict, units: str, size: str) -> Layout:
    """The launch of plan `plan` (from `plan`) at parameters `p`; `units` and `size` are the launch-time
    expressions of the unit count and of the elements per unit."""
    team, vec = plan["team"], plan["vec"]
    defines = {"BPS": p["bps"], "TEAMS": p["teams"], "REGS": p["regs"], "SLOTS": plan["slots"],
               "BUFS": p.get("bufs", 1), "STAGGER": p.get("stagger", 0)}
    slice_ = f"round_up(ceil_div({size}, {team}), {vec})"
    return Layout(defines, slice_, team * p["teams"], Workspace("ws", f"{units} * {team} * 8", zero=True),
                  f"ceil_div({slice_}, {vec * p['threads']}) <= {plan['nv']}")
