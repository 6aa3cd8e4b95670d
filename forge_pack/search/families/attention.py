"""attention: kernel families. Pure Python, no torch import.

CUDA `flash` (templates/kernels/cuda/attention_flash.cu): FlashAttention-2 style forward on
tensor cores (mma.sync m16n8k16, bf16/fp16 in, fp32 accumulate), K/V tiles through shared memory
with cp.async, online softmax, causal tiles (and those before a sliding window) skipped, the mask tile
read in the accumulator layout,
GQA by head index. head_dim is a compile-time constant (64, 128, 256, 512 or any multiple of 16
up to 512). CPU `online` (templates/kernels/cpu/attention_online.cpp): query blocks in parallel,
each over fp32 key/value tiles with an online softmax, for every dtype.
"""

from __future__ import annotations

from forge_pack.core.signature import Signature
from forge_pack.search.template_kit import (GRAIN, Built, Family, Gpu, Knob, always, cdiv, first, grain_default, launch,
                                            spec)
from forge_pack.targets.abi import env as sizes

OPS = ("attention",)

# The kernel's parameters, in order (both backends): tensors, sizes, every stride, then the scalars.
ARGS = ["x", "k", "v", "mask", "out", "B", "H", "L", "S", "D", "G", "q_sb", "q_sh", "q_sl", "k_sb", "k_sh", "k_sl",
        "v_sb", "v_sh", "v_sl", "o_sb", "o_sh", "o_sl", "m_sb", "m_sh", "m_sl", "causal", "window", "scale",
        "softcap"]

BLOCK_M = Knob("block_m", (64, 128), "query rows per block (16 per warp: 4 or 8 warps)")
BLOCK_N = Knob("block_n", (32, 64, 128), "keys per shared-memory tile")
STAGES = Knob("stages", (1, 2), "K/V tiles in flight: 2 loads the next tile (cp.async) while this one is used")
O_SPLIT = Knob("o_split", (1, 2, 4), "blocks sharing one query block, each writing head_dim / o_split channels "
                                     "(each recomputes the logits; keeps head_dim 512 accumulators in registers)")
LDMATRIX = Knob("ldmatrix", (0, 1, 2), "mma fragments from shared memory: 0 by 32/16-bit loads, 1 V's by "
                                       "ldmatrix.trans, 2 also Q's and K's by ldmatrix")
PAD = 8  # halves of padding per shared row (attention_flash.cu's PAD)
# fp32 accumulators a thread may hold (O: DO/2, S: BLOCK_N/2) with room for addresses and fragments
# under the 255-register limit; beyond it ptxas spills in the inner loop.
ACC_REGS = 176
STRIDE_ALIGN = 8  # elements: cp.async moves 16 bytes, so every row of q, k, v starts 16-byte aligned


def _masked_zero(sig: Signature) -> int:
    return int(not sig.param("composite"))  # SDPA: an all -inf row is 0; the eager composite: NaN


def _windowed(sig: Signature) -> bool:
    """A causal sliding window (the window's code compiled in only then: it costs registers)."""
    return bool(sig.param("causal") and sig.param("window"))


def _aligned(sig: Signature) -> list[str]:
    names = ("q_sb", "q_sh", "q_sl", "k_sb", "k_sh", "k_sl", "v_sb", "v_sh", "v_sl")
    return [f"{n} % {STRIDE_ALIGN} == 0" for n in names] + ["o_sl % 2 == 0"]


# ---------------------------------------------------------------- CUDA


def _flash_applicable(sig: Signature, gpu: Gpu) -> str | None:
    if sig.x.dtype not in ("bfloat16", "float16"):
        return "tensor-core attention takes bf16 / fp16 inputs"
    d = sizes(sig)["D"]
    if d % 16 or d > 512:
        return f"head_dim {d} is not a multiple of 16 up to 512"
    return None


def _flash_defaults(sig: Signature, gpu: Gpu) -> dict:
    d = sizes(sig)["D"]
    if d <= 128:
        return {"block_m": 128, "block_n": 64, "stages": 2, "o_split": 1, "ldmatrix": 2}
    if d <= 256:
        return {"block_m": 64, "block_n": 64, "stages": 2, "o_split": 1, "ldmatrix": 2}
    return {"block_m": 64, "block_n": 32, "stages": 2, "o_split": 2, "ldmatrix": 2}


def flash_smem(d: int, p: dict) -> int:
    """Dynamic shared memory of one block: the Q tile, and `stages` K and V tiles, 16-bit elements."""
    dout = d // p["o_split"]
    return 2 * (p["block_m"] * (d + PAD) + p["stages"] * p["block_n"] * (d + PAD + dout + PAD))


def _flash_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    d = sizes(sig)["D"]
    if d % (16 * p["o_split"]):
        return f"head_dim {d} does not split into {p['o_split']} slices of 16-channel tiles"
    dout = d // p["o_split"]
    if dout // 2 + p["block_n"] // 2 > ACC_REGS:
        return f"{dout // 2 + p['block_n'] // 2} fp32 accumulators per thread exceed {ACC_REGS}"
    smem = flash_smem(d, p)
    if smem > gpu.plan_smem:
        return f"{smem} bytes of shared memory exceed the {gpu.plan_smem} planned per block"
    warps = p["block_m"] // 16
    defines = {"HEAD_DIM": d, "BLOCK_M": p["block_m"], "BLOCK_N": p["block_n"], "WARPS": warps,
               "STAGES": p["stages"], "O_SPLIT": p["o_split"], "MASKED_ZERO": _masked_zero(sig),
               "IS_BF16": int(sig.x.dtype == "bfloat16"), "LDMATRIX": p["ldmatrix"], "WINDOWED": int(_windowed(sig))}
    k = launch("attention_flash", ARGS, [f"ceil_div(L, {p['block_m']})", f"H * {p['o_split']}", "B"],
               [warps * 32], smem)
    return Built({**p, "warps": warps, "smem": smem}, defines, spec([k], requires=_aligned(sig) + [f"D == {d}"]))


def _flash_score(sig: Signature, gpu: Gpu) -> float:
    return 0


CUDA = (
    Family(OPS, "cuda", "flash", "attention_flash.cu", (BLOCK_M, BLOCK_N, STAGES, O_SPLIT, LDMATRIX),
           "FlashAttention-2 forward: BLOCK_M query rows per block (16 per warp), K/V tiles streamed through "
           "shared memory (cp.async), mma.sync for Q.K^T and P.V, online softmax in fp32, causal tiles skipped",
           _flash_applicable, _flash_defaults, _flash_build, _flash_score),
)


# ---------------------------------------------------------------- CPU

CPU_BLOCK_M = Knob("block_m", (4, 8, 16, 32, 64), "query rows per task (each fp32 key tile is reused by all of them)")
CPU_BLOCK_N = Knob("block_n", (32, 64, 128, 256), "keys per fp32 tile")


def _cpu_defaults(sig: Signature, gpu: Gpu) -> dict:
    e = sizes(sig)
    tasks = e["B"] * e["H"] * cdiv(e["L"], 16)
    return {"block_m": 16, "block_n": 64, "grain": grain_default(tasks)}


def _cpu_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    defines = {"BLOCK_M": p["block_m"], "BLOCK_N": p["block_n"], "GRAIN": p["grain"], "FAST_EXP": 1,
               "MASKED_ZERO": _masked_zero(sig)}
    return Built(dict(p), defines, spec([launch("attention_online", ARGS, [1], [1])]))


CPU = (
    Family(OPS, "cpu", "online", "attention_online.cpp", (CPU_BLOCK_M, CPU_BLOCK_N, GRAIN),
           "blocks of query rows in parallel, each over fp32 key/value tiles with an online softmax",
           always, _cpu_defaults, _cpu_build, first),
)

REFERENCES = ()
