"""The demo's model: an LM output head after the decoder, written the way HF-style code writes it:
an RMSNorm module of eager ops (fp32 variance, rsqrt, weight) over the hidden states, then the
token probabilities in fp32 (`F.softmax(..., dtype=torch.float32)` over bf16 logits).

No matmul: the time goes to the norm and the softmax, both memory-bound passes that eager PyTorch
runs as several kernels each (the norm as five), where one fused CPU kernel reads and writes the
tensor once; on a small CPU that is where forge-pack's kernels can make the whole model faster.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
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


class NormHead(nn.Module):
    def __init__(self, dim: int = 1024):
        super().__init__()
        self.norm = RMSNorm(dim)

    def forward(self, hidden, logits):
        h = self.norm(hidden)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        return h, probs


def get_model():
    torch.manual_seed(0)
    m = NormHead()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
    return m


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(2048, 1024), torch.randn(1024, 2048).to(torch.bfloat16))
