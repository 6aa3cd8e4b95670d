"""batch_norm in inference (running statistics, optional affine): kernel families.

CUDA: NCHW per-plane tiles (`nchw_plane`), a flat NCHW stream for any H*W (`nchw_flat`), and
channels_last (`nhwc`). CPU: `nchw` and `nhwc`. Kernels in templates/kernels/{cuda,cpu}/batch_norm_*.
No reference kernel: the template families are the starting points. Pure Python, no torch import.
"""

from __future__ import annotations

from forge_pack.core.signature import Signature
from forge_pack.search.template_kit import (GRAIN, HINTS, ITEMS, THREADS, UNROLL, VEC, Built, Family, Gpu, cdiv,
                                            first, full_vec, grain_default, launch, pow2_ceil, present, spec,
                                            stream_ok, vec_default)
from forge_pack.targets.abi import env as sizes

OPS = ("batch_norm",)
_ARGS = ["x", "running_mean", "running_var", "weight", "bias", "out"]
NCHW, NHWC = ["channels_last == 0"], ["channels_last == 1"]


def _statistics(sig: Signature) -> str | None:
    if not all(present(sig, n) for n in ("running_mean", "running_var")):
        return "needs running statistics"
    return None


def _common_defines(p: dict) -> dict:
    return {"THREADS": p["threads"], "VEC": p["vec"], "LOAD_HINT": p["load_hint"], "STORE_HINT": p["store_hint"]}


# ---------------------------------------------------------------- CUDA


def _nchw_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return _statistics(sig) or ("input is channels_last" if sizes(sig)["channels_last"] else None)


def _nhwc_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return _statistics(sig) or (None if sizes(sig)["channels_last"] else "input is not channels_last")


def _plane_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"threads": 256, "vec": vec_default(sig, sizes(sig)["HW"]), "unroll": 1, "load_hint": 2, "store_hint": 1}


def _plane_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["vec"])
    if why:
        return why
    tile = p["threads"] * p["vec"] * p["unroll"]
    defines = {**_common_defines(p), "UNROLL": p["unroll"]}
    k = launch("batch_norm_nchw_plane", [*_ARGS, "i32:C", "i32:HW", "eps"], ["N * C", f"ceil_div(HW, {tile})"],
               [p["threads"]])
    return Built(dict(p), defines, spec([k], requires=[*NCHW, f"ceil_div(HW, {tile}) <= 65535"]))


def _plane_score(sig: Signature, gpu: Gpu) -> float:
    hw = sizes(sig)["HW"]
    return 0 if hw % 8 == 0 and hw >= 1024 else 1  # planes of whole 16-byte vectors, several per block


def _flat_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"threads": 256, "vec": full_vec(sig), "unroll": 2, "load_hint": 2, "store_hint": 1}


def _flat_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, p["vec"])
    if why:
        return why
    tile = p["threads"] * p["vec"] * p["unroll"]
    defines = {**_common_defines(p), "UNROLL": p["unroll"]}
    k = launch("batch_norm_nchw_flat", [*_ARGS, "numel", "i32:C", "i32:HW", "eps"], [f"ceil_div(numel, {tile})"],
               [p["threads"]])
    return Built(dict(p), defines, spec([k], requires=[*NCHW, "numel <= 2147483647"]))


def _flat_score(sig: Signature, gpu: Gpu) -> float:
    return 0.5


def _nhwc_defaults(sig: Signature, gpu: Gpu) -> dict:
    return {"threads": 256, "vec": vec_default(sig, sizes(sig)["C"]), "items": 4, "load_hint": 2, "store_hint": 1}


def _nhwc_build(sig: Signature, p: dict, gpu: Gpu) -> Built | str:
    why = stream_ok(sig, p, 3 * p["vec"], loads=p["items"])  # ITEMS vectors in flight, 3 fp32 coefficients
    if why:
        return why
    threads, vec = p["threads"], p["vec"]
    bx = min(threads, pow2_ceil(cdiv(sizes(sig)["C"], vec)))  # threads along the channel vectors
    by = threads // bx  # the rest along pixels
    defines = {**_common_defines(p), "ITEMS": p["items"]}
    k = launch("batch_norm_nhwc", [*_ARGS, "i64:N * HW", "i32:C", "eps"], [f"ceil_div(N * HW, {by * p['items']})"],
               [bx, by])
    return Built(dict(p), defines, spec([k], requires=NHWC))


CUDA = (
    Family(OPS, "cuda", "nchw_plane", "batch_norm_nchw_plane.cu", (THREADS, VEC, UNROLL, *HINTS),
           "NCHW, grid over (plane, tile): scale/shift once per block, vectorised stream",
           _nchw_applicable, _plane_defaults, _plane_build, _plane_score),
    Family(OPS, "cuda", "nchw_flat", "batch_norm_nchw_flat.cu", (THREADS, VEC, UNROLL, *HINTS),
           "NCHW flat 16-byte stream for any HW (7x7 too): channel found per vector",
           _nchw_applicable, _flat_defaults, _flat_build, _flat_score),
    Family(OPS, "cuda", "nhwc", "batch_norm_nhwc.cu", (THREADS, VEC, ITEMS, *HINTS),
           "channels_last: threads along channel vectors (scale/shift in registers), pixels along y",
           _nhwc_applicable, _nhwc_defaults, _nhwc_build, first),
)


# ---------------------------------------------------------------- CPU

_CPU_ARGS = [*_ARGS, "N", "C", "HW", "eps"]


def _cpu_nchw_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return _statistics(sig) or ("layout mismatch" if sizes(sig)["channels_last"] else None)


def _cpu_nhwc_applicable(sig: Signature, gpu: Gpu) -> str | None:
    return _statistics(sig) or (None if sizes(sig)["channels_last"] else "layout mismatch")


def _cpu_nchw_defaults(sig: Signature, gpu: Gpu) -> dict:
    e = sizes(sig)
    return {"grain": grain_default(e["N"] * e["C"])}


def _cpu_nhwc_defaults(sig: Signature, gpu: Gpu) -> dict:
    e = sizes(sig)
    return {"grain": grain_default(e["N"] * e["HW"])}


def _cpu_nchw_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    return Built(dict(p), {"GRAIN": p["grain"]}, spec([launch("batch_norm_nchw", _CPU_ARGS, [1], [1])], requires=NCHW))


def _cpu_nhwc_build(sig: Signature, p: dict, gpu: Gpu) -> Built:
    return Built(dict(p), {"GRAIN": p["grain"]}, spec([launch("batch_norm_nhwc", _CPU_ARGS, [1], [1])], requires=NHWC))


CPU = (
    Family(OPS, "cpu", "nchw", "batch_norm_nchw.cpp", (GRAIN,), "planes in parallel, per-plane scale/shift, vectorised",
           _cpu_nchw_applicable, _cpu_nchw_defaults, _cpu_nchw_build, first),
    Family(OPS, "cpu", "nhwc", "batch_norm_nhwc.cpp", (GRAIN,),
           "channels_last: scale/shift buffer, pixels in parallel, vectorised over C",
           _cpu_nhwc_applicable, _cpu_nhwc_defaults, _cpu_nhwc_build, first),
)

REFERENCES = ()
