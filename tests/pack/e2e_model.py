"""The end-to-end build test's model: a router softmax (bf16 logits, fp32 probabilities, as MoE code
calls it) and a layer norm, on shapes where a fused CPU kernel has room to beat eager."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Router(nn.Module):
    def __init__(self, dim: int = 512, experts: int = 2048):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.gate = nn.Linear(dim, experts, bias=False)

    def forward(self, x):
        logits = self.gate(self.norm(x).to(torch.bfloat16).float()).to(torch.bfloat16)
        return F.softmax(logits, dim=-1, dtype=torch.float32)


def get_model():
    torch.manual_seed(0)
    return Router()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(512, 512),)
