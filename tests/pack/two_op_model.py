"""Two targetable ops around a matmul, small enough that the compile gate's several compiles stay fast."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TwoOps(nn.Module):
    def __init__(self, dim: int = 64):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return F.softmax(self.proj(self.ln(x)), dim=-1)


def get_model():
    torch.manual_seed(0)
    return TwoOps()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(32, 64),)
