"""KernelBench level 1, problem 36: RMSNorm over the channel dim.

x / sqrt(mean(x^2 over dim 1) + eps), written as eager ops: the mean is over the features (dim 1) of an
NCHW tensor, not over the last dim.
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32 as published.
Sizes: written from memory of KernelBench's level-1 file, not checked against it.
FORGE_BENCH_SMALL=1 shrinks every size for a CPU smoke test (tests/test_bench_kernelbench.py).
"""

import os

import torch
from torch import nn

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")


class Model(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features, self.eps = num_features, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
        return x / rms

N, C, H, W = (2, 8, 16, 16) if SMALL else (112, 64, 512, 512)


def get_inputs():
    return [torch.randn(N, C, H, W)]


def get_init_inputs():
    return [C]
