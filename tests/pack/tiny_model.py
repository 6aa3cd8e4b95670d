"""A tiny model for the packaging tests: every call path of softmax, layer_norm, a Llama-style
RMSNorm module of eager ops (a composite), group_norm and adaptive_avg_pool2d, CPU-fast."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Tiny(nn.Module):
    def __init__(self, dim: int = 64):
        super().__init__()
        self.norm = TinyRMSNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.ln = nn.LayerNorm(dim)
        self.sm = nn.Softmax(dim=-1)

    def forward(self, x):
        h = self.proj(self.norm(x))
        probs = self.sm(h) + torch.softmax(h, -1) + h.softmax(-1) + F.softmax(h, dim=-1)
        y = self.ln(probs * 16.0)
        g = F.group_norm(y.reshape(4, 16, 8, 8), 4)
        pooled = F.adaptive_avg_pool2d(g, 1).flatten(1)
        return y, pooled


def get_model():
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        model.norm.weight.normal_(1.0, 0.1)
        model.ln.weight.normal_(1.0, 0.1)
        model.ln.bias.normal_(0.0, 0.1)
    return model


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(4, 16, 64),)
