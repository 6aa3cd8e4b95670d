"""A Llama-style decoder block as HF model code writes it: RMSNorm inline in forward
(pow/mean/rsqrt/mul with fp32 upcast), q/k/v/o projections, eager attention with an additive
causal mask and an fp32 softmax cast back, or sdpa, and a SiLU-gated MLP. bf16 by default."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, attn: str):
        super().__init__()
        self.heads, self.head_dim, self.attn = heads, dim // heads, attn
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.attn_dropout = nn.Dropout(0.0)  # HF's attention dropout, a no-op in eval

    def forward(self, x, mask):
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        if self.attn == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
            scores = scores + mask
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(self.attn_dropout(probs), v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128, attn: str = "eager"):
        super().__init__()
        self.input_weight = nn.Parameter(torch.ones(dim))
        self.post_weight = nn.Parameter(torch.ones(dim))
        self.eps = 1e-6
        self.self_attn = Attention(dim, heads, attn)
        self.mlp = MLP(dim, hidden)

    def forward(self, x, mask):
        x = x + self.self_attn(rms_norm(x, self.input_weight, self.eps), mask)
        return x + self.mlp(rms_norm(x, self.post_weight, self.eps))


def causal_mask(s: int, dtype) -> torch.Tensor:
    return torch.full((s, s), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]


def get_model(attn: str = "eager", dtype=torch.bfloat16):
    torch.manual_seed(0)
    model = Block(attn=attn)
    with torch.no_grad():
        model.input_weight.normal_(1.0, 0.1)
        model.post_weight.normal_(1.0, 0.1)
    return model.to(dtype).eval()


def get_inputs(seq: int = 16, dtype=torch.bfloat16):
    torch.manual_seed(1)
    return (torch.randn(2, seq, 64, dtype=dtype), causal_mask(seq, dtype))
