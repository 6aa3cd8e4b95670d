"""KernelBench level 1, problem 30: Softsign (x / (1 + |x|)).

Elementwise: out = x / (1 + torch.abs(x)) over a (batch, dim) tensor.
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32 as published.
Sizes: written from memory of KernelBench's level-1 file, not checked against it.
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
        return x / (1 + torch.abs(x))


BATCH, DIM = (8, 1024) if SMALL else (4096, 393216)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
