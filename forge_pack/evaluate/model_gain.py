"""Whether the whole model got faster: the speed half of the whole-model gate.

``model_gate`` keeps the kernels whose patched model still computes the same outputs; this module
reads the same check's interleaved end-to-end timing (``confirm.compare_patched``: eager and patched
medians, IQRs and call counts) and says whether the patched model is faster by more than the
noise; ``judge_compile_gain`` reads the compile gate's result the same way for ``<pkg>.compile``.
``build`` and ``pack`` write no package when neither mode is faster, unless told ``--allow-no-gain``.

The noise is the one every comparison of two timings uses (``core.winner.noise_us``): the two medians must
differ by more than two standard errors of their difference, each standard error estimated from its
IQR and n. A patched model measured faster by less than that is "within the noise", and a package
that may not speed anything up is not worth installing.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge_pack.core.winner import clearly_faster, noise_us


@dataclass(frozen=True)
class GainVerdict:
    gain: bool
    speedup: float | None  # eager median / patched median (None: the check was not timed)
    reason: str  # a sentence with the measured figures


def figures(model_result: dict) -> str:
    """'13.753 ms eager (IQR 0.210, n=50) -> 16.269 ms patched (IQR 0.330, n=50), 0.85x'."""
    e, p = model_result["eager"], model_result["patched"]

    def one(t: dict, what: str) -> str:
        return f"{t['median_us'] / 1e3:.3f} ms {what} (IQR {t['iqr_us'] / 1e3:.3f}, n={t['n']})"

    return f"{one(e, 'eager')} -> {one(p, 'patched')}, {model_result['speedup']:.2f}x"


def judge_gain(model_result: dict | None) -> GainVerdict:
    """The verdict on a whole-model check's timing; an untimed check (None, or no timings) is no gain
    shown, with the reason saying so."""
    if not model_result or not model_result.get("eager") or not model_result.get("patched"):
        return GainVerdict(False, None, "the whole model was not timed")
    e, p = model_result["eager"], model_result["patched"]
    speedup = e["median_us"] / max(p["median_us"], 1e-9)
    noise = noise_us(e, p)
    line = figures({**model_result, "speedup": speedup})
    if p["median_us"] >= e["median_us"]:
        return GainVerdict(False, speedup, f"the patched model is not faster: {line}")
    # The bar is "faster beyond the noise": a package that may not speed anything up is not worth installing.
    if not clearly_faster(p, e):
        return GainVerdict(False, speedup, f"the patched model is faster by less than the measurement noise "
                                           f"({noise / 1e3:.3f} ms): {line}")
    return GainVerdict(True, speedup, f"the patched model is faster by more than the measurement noise "
                                      f"({noise / 1e3:.3f} ms): {line}")


def judge_compile_gain(compile_result: dict | None) -> GainVerdict:
    """The verdict on the compile gate's summary (``compile_gate.record``): the gate uses a set of
    kernels only when the compiled model is faster with them than plain torch.compile by more than the
    noise and as accurate, so a set in use is a gain; none in use, or no compiled check, is none."""
    if not compile_result:
        return GainVerdict(False, None, "the model was not checked compiled")
    if compile_result.get("error"):
        return GainVerdict(False, None, f"compile mode unavailable: {compile_result['error'].splitlines()[0][:200]}")
    used, c, w = compile_result.get("used") or [], compile_result.get("compiled_ms"), compile_result.get("compiled_with_ms")
    if not used or not c or not w:
        return GainVerdict(False, None, "no kernel is faster inside torch.compile's graph than Inductor's own code")
    return GainVerdict(True, c / w, f"torch.compile {c:.3f} ms -> {w:.3f} ms with {', '.join(used)} "
                                    f"({c / w:.2f}x, faster by more than the measurement noise)")
