"""What counts as a faster kernel: the one rule the search's report and the package share. No torch import."""

from __future__ import annotations

# A kernel must beat eager by 2% to count as a winner: below that a repeat timing could flip it.
WIN_MARGIN = 1.02


def is_winner(speedup_vs_eager: float | None) -> bool:
    """Whether a correct kernel with this speedup over eager is fast enough to ship."""
    return (speedup_vs_eager or 0.0) >= WIN_MARGIN
