"""KernelBench level 1, problem 35: GroupNorm (8 groups).

nn.GroupNorm(8, 64) over an NCHW tensor: 7.5 GB of fp32 input.
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32 as published.
Sizes: KernelBench's published level-1 sizes.
FORGE_BENCH_SMALL=1 shrinks every size for a CPU smoke test (tests/test_bench_kernelbench.py).
"""

import os

import torch
from torch import nn

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")


class Model(nn.Module):
    def __init__(self, num_features: int, num_groups: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)

N, C, H, W = (2, 16, 8, 8) if SMALL else (112, 64, 512, 512)


def get_inputs():
    return [torch.randn(N, C, H, W)]


def get_init_inputs():
    return [C, 8]
