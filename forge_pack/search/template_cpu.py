"""CPU template families (OpenMP, vectorised inner loops): parameters, applicability, specs.

The kernels are in templates/kernels/cpu/; they include forge_cpu.h (bf16/f16 conversions), which
the evaluator's compile step puts on the include path. Grid and block are ignored on the CPU: a
launch is one call of the entry point, which runs its own OpenMP loops. Pure Python, no torch.
"""

from __future__ import annotations

from forge_pack.targets.abi import env as abi_env
from forge_pack.core.signature import Signature
from forge_pack.search.template_kit import Built, Family, Knob, launch, present, spec

GRAIN = Knob("grain", (1, 4, 16, 64, 256), "rows / groups / planes per OpenMP chunk (schedule(static, grain))")
FAST_EXP = Knob("fast_exp", (0, 1), "exp: 0 std::exp, 1 a polynomial exp the compiler vectorises (~1 ulp)")
BLOCK = Knob("block", (256, 1024, 4096, 16384), "elements per online-statistics block")
STATS = Knob("stats", (0, 1), "statistics: 0 exact two-pass, 1 one pass of sum / sum of squares in double")
CBLOCK = Knob("cblock", (16, 64, 256, 1024), "channels summed together (stack accumulator length)")


def _grain_default(units: int) -> int:
    """Chunks of roughly units / 64, so static scheduling still balances a few cores."""
    g = 1
    while g * 4 <= 256 and g * 4 * 64 <= units:
        g *= 4
    return g


# ---------------------------------------------------------------- softmax / log_softmax


def _sm_build(kind: str):
    def build(sig: Signature, p: dict):
        defines = {"LOG": int(sig.op == "log_softmax"), "FAST_EXP": p["fast_exp"], "GRAIN": p["grain"]}
        if kind == "online":
            defines["BLOCK"] = p["block"]
        name = f"softmax_{kind}"
        return Built(dict(p), defines, spec([launch(name, ["x", "out", "rows", "cols"], [1], [1])]))

    return build


def _sm_defaults(kind: str):
    def defaults(sig: Signature) -> dict:
        p = {"fast_exp": 1, "grain": _grain_default(abi_env(sig)["rows"])}
        if kind == "online":
            p["block"] = 1024
        return p

    return defaults


def _sm_score(kind: str):
    def score(sig: Signature) -> float:
        cols = abi_env(sig)["cols"]
        return {"rows": 0 if cols <= 65536 else 1, "online": 1 if cols <= 65536 else 0}[kind]

    return score


SOFTMAX = [
    Family(("softmax", "log_softmax"), "cpu", "rows", "softmax_rows.cpp", (FAST_EXP, GRAIN),
           "rows in parallel; max, exp-sum (exps stored when the output is fp32) and write passes",
           lambda s: None, _sm_defaults("rows"), _sm_build("rows"), _sm_score("rows")),
    Family(("softmax", "log_softmax"), "cpu", "online", "softmax_online.cpp", (FAST_EXP, BLOCK, GRAIN),
           "rows in parallel; one online max/sum pass over blocks, one write pass (long rows)",
           lambda s: None, _sm_defaults("online"), _sm_build("online"), _sm_score("online")),
]


# ---------------------------------------------------------------- group_norm

_GN_ARGS = ["x", "weight", "bias", "out", "N", "C", "HW", "G", "eps"]


def _gn_build(kind: str):
    def build(sig: Signature, p: dict):
        defines = {"GRAIN": p["grain"]}
        if kind == "groups":
            defines["STATS"] = p["stats"]
        return Built(dict(p), defines, spec([launch(f"group_norm_{kind}", _GN_ARGS, [1], [1])]))

    return build


def _gn_defaults(kind: str):
    def defaults(sig: Signature) -> dict:
        e = abi_env(sig)
        if kind == "groups":
            return {"stats": 0, "grain": 1}
        return {"grain": _grain_default(e["N"] * e["C"])}

    return defaults


def _gn_applicable(sig: Signature) -> str | None:
    e = abi_env(sig)
    return "channels not divisible by groups" if e["C"] % max(e["G"], 1) else None


def _gn_score(kind: str):
    def score(sig: Signature) -> float:
        e = abi_env(sig)
        few = e["N"] * e["G"] < 16
        return {"groups": 1 if few else 0, "planes": 0 if few else 1}[kind]

    return score


GROUP_NORM = [
    Family(("group_norm",), "cpu", "groups", "group_norm_groups.cpp", (STATS, GRAIN),
           "groups in parallel; two-pass or one-pass (double) statistics, per-channel affine",
           _gn_applicable, _gn_defaults("groups"), _gn_build("groups"), _gn_score("groups")),
    Family(("group_norm",), "cpu", "planes", "group_norm_planes.cpp", (GRAIN,),
           "channel planes in parallel (few large groups): plane moments, Chan merge per group, apply",
           _gn_applicable, _gn_defaults("planes"), _gn_build("planes"), _gn_score("planes")),
]


# ---------------------------------------------------------------- batch_norm

_BN_ARGS = ["x", "running_mean", "running_var", "weight", "bias", "out", "N", "C", "HW", "eps"]


def _bn_family(kind: str, doc: str) -> Family:
    def applicable(sig: Signature) -> str | None:
        if not all(present(sig, n) for n in ("running_mean", "running_var")):
            return "needs running statistics"
        cl = abi_env(sig)["channels_last"]
        return "layout mismatch" if bool(cl) != (kind == "nhwc") else None

    def defaults(sig: Signature) -> dict:
        e = abi_env(sig)
        return {"grain": _grain_default(e["N"] * (e["HW"] if kind == "nhwc" else e["C"]))}

    def build(sig: Signature, p: dict):
        req = ["channels_last == 1"] if kind == "nhwc" else ["channels_last == 0"]
        return Built(dict(p), {"GRAIN": p["grain"]},
                     spec([launch(f"batch_norm_{kind}", _BN_ARGS, [1], [1])], requires=req))

    return Family(("batch_norm",), "cpu", kind, f"batch_norm_{kind}.cpp", (GRAIN,), doc, applicable, defaults, build,
                  lambda s: 0)


BATCH_NORM = [_bn_family("nchw", "planes in parallel, per-plane scale/shift, vectorised"),
              _bn_family("nhwc", "channels_last: scale/shift buffer, pixels in parallel, vectorised over C")]


# ---------------------------------------------------------------- adaptive_avg_pool2d


def _pool_family(kind: str, knobs: tuple, doc: str) -> Family:
    def applicable(sig: Signature) -> str | None:
        return "layout mismatch" if bool(abi_env(sig)["channels_last"]) != (kind == "nhwc") else None

    def defaults(sig: Signature) -> dict:
        e = abi_env(sig)
        if kind == "nhwc":
            return {"cblock": 256, "grain": 1}
        return {"grain": _grain_default(e["N"] * e["C"])}

    def build(sig: Signature, p: dict):
        defines = {"GRAIN": p["grain"], **({"CBLOCK": p["cblock"]} if kind == "nhwc" else {})}
        req = ["channels_last == 1"] if kind == "nhwc" else ["channels_last == 0"]
        k = launch(f"adaptive_avg_pool2d_{kind}", ["x", "out", "N", "C", "HW"], [1], [1])
        return Built(dict(p), defines, spec([k], requires=req))

    return Family(("adaptive_avg_pool2d",), "cpu", kind, f"adaptive_avg_pool2d_{kind}.cpp", knobs, doc, applicable,
                  defaults, build, lambda s: 0)


POOL = [_pool_family("nchw", (GRAIN,), "planes in parallel, vectorised sum per plane"),
        _pool_family("nhwc", (CBLOCK, GRAIN), "channels_last: channel blocks in parallel, vectorised along C")]


# ---------------------------------------------------------------- layer_norm / rms_norm


def _rn_build(sig: Signature, p: dict):
    rms = sig.op == "rms_norm"
    defines = {"RMS": int(rms), "GRAIN": p["grain"]}
    if rms:
        defines.update(T_BIAS="float", HAS_BIAS=0)  # rms_norm has no bias in its ABI
        args = ["x", "weight", "out", "rows", "cols", "eps", "weight_offset"]
    else:
        args = ["x", "weight", "bias", "out", "rows", "cols", "eps"]
    return Built(dict(p), defines, spec([launch(f"{sig.op}_rows", args, [1], [1])]))


ROWNORM = [Family(("layer_norm", "rms_norm"), "cpu", "rows", "rownorm_rows.cpp", (GRAIN,),
                  "rows in parallel; exact statistics, vectorised normalise(+affine)", lambda s: None,
                  lambda s: {"grain": _grain_default(abi_env(s)["rows"])}, _rn_build, lambda s: 0)]

FAMILIES = [*SOFTMAX, *GROUP_NORM, *BATCH_NORM, *POOL, *ROWNORM]
