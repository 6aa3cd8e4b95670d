"""KernelBench level 1, problem 42: MaxPool2d.

nn.MaxPool2d(kernel 4, stride 1, padding 1) over an NCHW tensor.
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
        self.pool = nn.MaxPool2d(kernel_size=4, stride=1, padding=1, dilation=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


SHAPE = (2, 4, 16, 16) if SMALL else (32, 64, 512, 512)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return []
