"""4-d [N, C, H, W] kinds (batch_norm, adaptive_avg_pool2d): targeted contiguous or channels_last."""

from __future__ import annotations


def nchw_support(sig, name: str) -> str | None:
    x = sig.x
    if len(x.shape) != 4:
        return f"{name} is targeted on 4-d inputs only"
    if x.layout not in ("contiguous", "channels_last"):
        return "input is neither contiguous nor channels_last"
    return None


def is_channels_last(x) -> bool:
    """channels_last and not also contiguous (size-1 dims can make it both)."""
    return x.layout == "channels_last" and not x.is_contiguous


def nchw_size_vars(sig) -> dict:
    n, c, h, w = sig.x.shape
    return {"N": n, "C": c, "H": h, "W": w, "HW": h * w, "channels_last": int(is_channels_last(sig.x))}


def nchw_odd_shapes(sig) -> list:
    return [((3, sig.x.shape[1], 5, 7), is_channels_last(sig.x))]
