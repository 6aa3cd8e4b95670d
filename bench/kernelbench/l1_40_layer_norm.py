"""KernelBench level 1, problem 40: LayerNorm over (64, 256, 256).

nn.LayerNorm((64, 256, 256)) on (16, 64, 256, 256): 16 rows of 4 M elements each (few huge rows).
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32 as published.
Sizes: KernelBench's published level-1 sizes.
FORGE_BENCH_SMALL=1 shrinks every size for a CPU smoke test (tests/test_bench_kernelbench.py).
"""

import os

import torch
from torch import nn

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


BATCH, FEATURES, DIM1, DIM2 = (2, 4, 8, 8) if SMALL else (16, 64, 256, 256)


def get_inputs():
    return [torch.randn(BATCH, FEATURES, DIM1, DIM2)]


def get_init_inputs():
    return [(FEATURES, DIM1, DIM2)]
