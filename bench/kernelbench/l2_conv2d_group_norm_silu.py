"""Level-2 style: Conv2d -> GroupNorm(32) -> SiLU (a VAE decoder block).

Conv2d(128, 128, 3, padding 1) on (8, 128, 256, 256), then GroupNorm(32, 128) and SiLU: the norm is the
memory-bound op forge-pack targets; the convolution stays cuDNN's.
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32.
Sizes: chosen here in the spirit of KernelBench level 2 (not its published sizes).
FORGE_BENCH_SMALL=1 shrinks every size for a CPU smoke test (tests/test_bench_kernelbench.py).
"""

import os

import torch
from torch import nn

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")


class Model(nn.Module):
    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(self.norm(self.conv(x)))


N, C, H, W, G = (1, 8, 8, 8, 4) if SMALL else (8, 128, 256, 256, 32)


def get_inputs():
    return [torch.randn(N, C, H, W)]


def get_init_inputs():
    return [C, G]
