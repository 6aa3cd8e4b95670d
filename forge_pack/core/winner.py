"""What counts as a faster kernel: the one rule the search's report and the package share. No torch import."""

from __future__ import annotations

# A kernel must beat eager by 2% to count as a winner: below that a repeat timing could flip it.
WIN_MARGIN = 1.02


def is_winner(speedup_vs_eager: float | None) -> bool:
    """Whether a correct kernel with this speedup over eager is fast enough to ship."""
    return (speedup_vs_eager or 0.0) >= WIN_MARGIN


# Two standard errors of the difference of two medians (the rule confirm.judge and model_gain apply):
# a difference smaller than that appears about one time in twenty between two equally fast kernels.
NOISE_SE = 2.0


def median_se_us(iqr_us: float, n: int) -> float:
    """Standard error of a median from its IQR: 1.253 * sigma / sqrt(n), sigma ~ IQR / 1.349."""
    return 0.93 * float(iqr_us or 0.0) / max(int(n or 1), 1) ** 0.5


def noise_us(a, b) -> float:
    """The measurement noise of the difference of two timings (objects with iqr_us and n)."""
    return NOISE_SE * (median_se_us(a.iqr_us, a.n) ** 2 + median_se_us(b.iqr_us, b.n) ** 2) ** 0.5


def clearly_faster(a, b) -> bool:
    """Whether timing `a` is faster than timing `b` by more than the measurement noise (objects with
    median_us, iqr_us and n): a rerun would very likely order the two the same way."""
    return b.median_us - a.median_us > noise_us(a, b)
