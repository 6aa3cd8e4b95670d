"""What counts as a faster kernel: the one rule the search's report and the package share. No torch import."""

from __future__ import annotations

from collections.abc import Mapping

# A kernel must beat eager by 2% to count as a winner: below that a repeat timing could flip it.
WIN_MARGIN = 1.02


def is_winner(speedup_vs_eager: float | None) -> bool:
    """Whether a correct kernel with this speedup over eager is fast enough to ship."""
    return (speedup_vs_eager or 0.0) >= WIN_MARGIN


# Two standard errors of the difference of two medians: a difference smaller than that appears about
# one time in twenty between two equally fast kernels. The one noise rule of the project: confirm.judge,
# compile_gate.judge, model_gain.judge_gain, mcts.replaces_best and packager.within_noise all ask it.
NOISE_SE = 2.0


def median_se_us(iqr_us: float, n: int) -> float:
    """Standard error of a median from its IQR: 1.253 * sigma / sqrt(n), sigma ~ IQR / 1.349 (normal
    noise); n below 1 counts as 1, no IQR as no spread."""
    return 0.93 * float(iqr_us or 0.0) / max(int(n or 1), 1) ** 0.5


def _stats(t) -> tuple[float, float, int]:
    """(median_us, iqr_us, n) of a Timing (or any object with those fields) or of its JSON dict."""
    if isinstance(t, Mapping):
        return float(t.get("median_us") or 0.0), t.get("iqr_us"), t.get("n")
    return t.median_us, t.iqr_us, t.n


def noise_us(a, b) -> float:
    """The measurement noise of the difference of two timings (Timings or their JSON dicts)."""
    _, iqr_a, n_a = _stats(a)
    _, iqr_b, n_b = _stats(b)
    return NOISE_SE * (median_se_us(iqr_a, n_a) ** 2 + median_se_us(iqr_b, n_b) ** 2) ** 0.5


def clearly_faster(a, b) -> bool:
    """Whether timing `a` is faster than timing `b` by more than the measurement noise (Timings or
    their JSON dicts): a rerun would very likely order the two the same way."""
    return _stats(b)[0] - _stats(a)[0] > noise_us(a, b)
