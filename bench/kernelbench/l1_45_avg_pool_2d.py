"""KernelBench level 1, problem 45: AvgPool2d.

nn.AvgPool2d(kernel 11) over an NCHW tensor.
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32 as published.
Sizes: chosen here (KernelBench's own were not at hand); the op and its parameters are the problem's.
FORGE_BENCH_SMALL=1 shrinks every size for a CPU smoke test (tests/test_bench_kernelbench.py).
"""

import os

import torch
from torch import nn

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=11)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


SHAPE = (2, 4, 22, 22) if SMALL else (16, 64, 1024, 1024)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return []
