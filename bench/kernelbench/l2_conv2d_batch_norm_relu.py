"""Level-2 style: Conv2d -> BatchNorm2d -> ReLU (a ResNet stem block, inference).

Conv2d(64, 64, 3, padding 1) on (32, 64, 224, 224), then BatchNorm2d(64) in eval mode and ReLU.
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32.
Sizes: chosen here in the spirit of KernelBench level 2 (not its published sizes).
FORGE_BENCH_SMALL=1 shrinks every size for a CPU smoke test (tests/test_bench_kernelbench.py).
"""

import os

import torch
from torch import nn

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


N, C, H, W = (2, 8, 8, 8) if SMALL else (32, 64, 224, 224)


def get_inputs():
    return [torch.randn(N, C, H, W)]


def get_init_inputs():
    return [C]
