"""adaptive_avg_pool2d to (1, 1) (a global average per channel): kernel families and reference kernel.

CUDA: NCHW with `lanes` threads per plane (`nchw_lanes`), NCHW small planes staged through shared
memory (`nchw_tile`), channels_last (`nhwc`). CPU: `nchw` and `nhwc`. Kernels in
templates/kernels/{cuda,cpu}/adaptive_avg_pool2d_*. Pure Python, no torch import.
"""

from __future__ import annotations

from forge_pack.core.signature import Signature
from forge_pack.search.template_kit import (GRAIN, LANES_ALL, LOAD_HINT, THREADS, UNROLL, VEC, Built, Family, Gpu,
                                            Knob, ReferenceKernel, cdiv, clamp, elem_bytes, first, full_vec,
                                            grain_default, launch, pow2_ceil, spec, stream_ok, vec_default)
from forge_pack.targets.abi import env as sizes

OPS = ("adaptive_avg_pool2d",)
PLANES = Knob("planes", (8, 16, 32, 64, 128), "planes per block staged through shared memory")
SPLIT_HW = Knob("ty", (1, 2, 4, 8, 16), "threads splitting the H*W pixels (threadIdx.y)")
TILE_SMEM = 49152  # nchw_tile stays within the 48 KB of dynamic shared memory every launch may use without opt-in
NCHW, NHWC = ["channels_last == 0"], ["channels_last == 1"]


def _nchw(sig: Signature) -> str | None:
    return "input is channels_last" if sizes(sig)["channels_last"] else None


def _defines(p: dict) -> dict:
    return {"THREADS": p["threads"], "VEC": p["vec"], "UNROLL": p["unroll"], "LOAD_HINT": p["load_hint"]}


# ---------------------------------------------------------------- CUDA


def _lanes_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return _nchw(sig)


def _lanes_defaults(sig: Signature, gpu: Gpu) -> dict:
    hw = sizes(sig)["HW"]
    return {"threads": 256, "lanes": clamp(pow2_ceil(cdiv(hw, 8)), 4, 32), "vec": vec_default(sig, hw),
            "unroll": 2, "load_hint": 2}


def _lanes_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["vec"])
    if why:
        return why
    threads, lanes = p["threads"], p["lanes"]
    if lanes > threads:
        return "lanes exceed threads"
    defines = {**_defines(p), "LANES": lanes}
    k = launch("adaptive_avg_pool2d_nchw_lanes", ["x", "out", "i64:N * C", "i32:HW"],
               [f"ceil_div(N * C, {threads // lanes})"], [threads])
    return Built(dict(p), defines, spec([k], requires=NCHW))


def _lanes_score(sig: Signature, gpu: Gpu) -> float:
    return 1


def _tile_applicable(sig: Signature, gpu: Gpu) -> str | None:
    if _nchw(sig):
        return _nchw(sig)
    if sizes(sig)["HW"] * 8 * elem_bytes(sig.x.dtype) > TILE_SMEM:  # not even the fewest planes fit
        return "planes too large to stage in shared memory"
    return None


def _tile_defaults(sig: Signature, gpu: Gpu) -> dict:
    # 128 threads, 4 vectors each in flight: the fastest setting on an H200 for (256,2048,7,7), 17.6 µs =
    # 70% of copy bandwidth (bench/results/search.md), at the read-only ceiling of bench/results/pool_probe.md
    planes = 64 if sizes(sig)["HW"] * 64 * elem_bytes(sig.x.dtype) <= TILE_SMEM else 16
    return {"threads": 128, "planes": planes, "vec": full_vec(sig), "unroll": 4, "load_hint": 2}


def _tile_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["vec"])
    if why:
        return why
    threads, planes = p["threads"], p["planes"]
    if threads % planes or threads // planes > 32:
        return "threads per plane must be a power of two <= 32"
    eb = elem_bytes(sig.x.dtype)
    defines = {**_defines(p), "PLANES": planes}
    k = launch("adaptive_avg_pool2d_nchw_tile", ["x", "out", "i64:N * C", "i32:HW"],
               [f"ceil_div(N * C, {planes})"], [threads], f"round_up({planes} * HW * {eb}, 16)")
    return Built(dict(p), defines, spec([k], requires=[*NCHW, f"{planes} * HW * {eb} <= {TILE_SMEM}"]))


def _tile_score(sig: Signature, gpu: Gpu) -> float:
    return 0 if sizes(sig)["HW"] < 256 else 2


def _nhwc_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return None if sizes(sig)["channels_last"] else "input is not channels_last"


def _nhwc_defaults(sig: Signature, gpu: Gpu) -> dict:
    vec = vec_default(sig, sizes(sig)["C"])
    threads = 256
    ty = clamp(pow2_ceil(cdiv(threads * vec, sizes(sig)["C"])), 1, 16)  # spare threads go to the pixels
    return {"threads": threads, "vec": vec, "ty": ty, "unroll": 4, "load_hint": 2}


def _nhwc_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["vec"])
    if why:
        return why
    threads, vec, ty = p["threads"], p["vec"], p["ty"]
    if ty > threads // 8:
        return "too few threads along channels"
    bx = threads // ty
    smem = bx * ty * vec * 4 if ty > 1 else 0  # partial sums of the pixel-splitting threads
    k = launch("adaptive_avg_pool2d_nhwc", ["x", "out", "i32:C", "i32:HW"], [f"ceil_div(C, {bx * vec})", "N"],
               [bx, ty], smem)
    return Built(dict(p), _defines(p), spec([k], requires=[*NHWC, "N <= 65535"]))


CUDA = (
    Family(OPS, "cuda", "nchw_lanes", "adaptive_avg_pool2d_nchw_lanes.cu", (THREADS, LANES_ALL, VEC, UNROLL, LOAD_HINT),
           "NCHW: `lanes` threads per plane, shuffle reduction",
           _lanes_applicable, _lanes_defaults, _lanes_build, _lanes_score),
    Family(OPS, "cuda", "nchw_tile", "adaptive_avg_pool2d_nchw_tile.cu", (THREADS, PLANES, VEC, UNROLL, LOAD_HINT),
           "NCHW small planes (7x7): 16-byte coalesced tile of planes through shared memory",
           _tile_applicable, _tile_defaults, _tile_build, _tile_score),
    Family(OPS, "cuda", "nhwc", "adaptive_avg_pool2d_nhwc.cu", (THREADS, SPLIT_HW, VEC, UNROLL, LOAD_HINT),
           "channels_last: threads along channel vectors, pixels split over threadIdx.y",
           _nhwc_applicable, _nhwc_defaults, _nhwc_build, first),
)


# ---------------------------------------------------------------- CPU

CBLOCK = Knob("cblock", (16, 64, 256, 1024), "channels summed together (stack accumulator length)")
_CPU_ARGS = ["x", "out", "N", "C", "HW"]


def _cpu_nchw_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return "layout mismatch" if sizes(sig)["channels_last"] else None


def _cpu_nhwc_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return None if sizes(sig)["channels_last"] else "layout mismatch"


def _cpu_nchw_defaults(sig: Signature, gpu: Gpu) -> dict:
    e = sizes(sig)
    return {"grain": grain_default(e["N"] * e["C"])}


def _cpu_nhwc_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"cblock": 256, "grain": 1}


def _cpu_nchw_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    k = launch("adaptive_avg_pool2d_nchw", _CPU_ARGS, [1], [1])
    return Built(dict(p), {"GRAIN": p["grain"]}, spec([k], requires=NCHW))


def _cpu_nhwc_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    k = launch("adaptive_avg_pool2d_nhwc", _CPU_ARGS, [1], [1])
    return Built(dict(p), {"GRAIN": p["grain"], "CBLOCK": p["cblock"]}, spec([k], requires=NHWC))


CPU = (
    Family(OPS, "cpu", "nchw", "adaptive_avg_pool2d_nchw.cpp", (GRAIN,), "planes in parallel, vectorised sum per plane",
           _cpu_nchw_applicable, _cpu_nchw_defaults, _cpu_nchw_build, first),
    Family(OPS, "cpu", "nhwc", "adaptive_avg_pool2d_nhwc.cpp", (CBLOCK, GRAIN),
           "channels_last: channel blocks in parallel, vectorised along C",
           _cpu_nhwc_applicable, _cpu_nhwc_defaults, _cpu_nhwc_build, first),
)

REFERENCES = (ReferenceKernel("adaptive_avg_pool2d"),)
