"""KernelBench level 1, problem 24: LogSoftmax.

Over the last dim of a (batch, dim) tensor: out = torch.log_softmax(x, dim=1).
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32 as published.
Sizes: KernelBench's published level-1 sizes.
FORGE_BENCH_SMALL=1 shrinks every size for a CPU smoke test (tests/test_bench_kernelbench.py).
"""

import os

import torch
from torch import nn

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=1)


BATCH, DIM = (8, 1024) if SMALL else (4096, 393216)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
