"""Level-2 style: Linear -> LayerNorm -> GELU (a transformer MLP input).

Linear(4096, 4096) on (8192, 4096) rows, then LayerNorm(4096) and GELU: the norm is the memory-bound op
forge-pack targets; the matmul stays cuBLAS's.
KernelBench form: ``Model``, ``get_inputs()``, ``get_init_inputs()``; fp32.
Sizes: chosen here in the spirit of KernelBench level 2 (not its published sizes).
FORGE_BENCH_SMALL=1 shrinks every size for a CPU smoke test (tests/test_bench_kernelbench.py).
"""

import os

import torch
from torch import nn

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.norm(self.fc(x)))


ROWS, FEATURES = (16, 64) if SMALL else (8192, 4096)


def get_inputs():
    return [torch.randn(ROWS, FEATURES)]


def get_init_inputs():
    return [FEATURES]
