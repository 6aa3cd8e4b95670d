"""A decoder-only LLM layer stack the way HF-style model code writes it: an RMSNorm module of
eager ops, eager attention with the softmax in fp32, a mixture-of-experts MLP with a router
softmax, and a final norm + log-probabilities."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LlamaStyleRMSNorm(nn.Module):
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


class GemmaStyleRMSNorm(nn.Module):
    """Zero-centred weight: the scale is (1 + weight)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.k_weight = nn.Parameter(torch.ones(self.head_dim))

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q = self.q_norm(q)
        k = F.rms_norm(k, (self.head_dim,), self.k_weight, eps=1e-6)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d)
        return self.o(out)


class MoE(nn.Module):
    def __init__(self, dim: int, experts: int, top_k: int, hidden: int):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.w_in = nn.Parameter(torch.randn(experts, dim, hidden) * dim ** -0.5)
        self.w_out = nn.Parameter(torch.randn(experts, hidden, dim) * hidden ** -0.5)

    def forward(self, x):
        b, s, d = x.shape
        flat = x.reshape(-1, d)
        logits = self.router(flat)
        weights = logits.softmax(dim=-1, dtype=torch.float)  # the router softmax, as MoE code calls it
        top_w, top_i = torch.topk(weights, self.top_k, dim=-1)
        top_w = (top_w / top_w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e in range(self.w_in.shape[0]):
            rows, slot = torch.nonzero(top_i == e, as_tuple=True)
            if rows.numel():
                h = F.silu(flat[rows] @ self.w_in[e]) @ self.w_out[e]
                out.index_add_(0, rows, h * top_w[rows, slot, None])
        return out.view(b, s, d)


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, experts: int):
        super().__init__()
        self.input_norm = LlamaStyleRMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.post_norm = GemmaStyleRMSNorm(dim)
        self.moe = MoE(dim, experts, top_k=2, hidden=dim * 2)

    def forward(self, x, mask):
        x = x + self.attn(self.input_norm(x), mask)
        return x + self.moe(self.post_norm(x))


class TinyDecoder(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 128, heads: int = 4, layers: int = 2, experts: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads, experts) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.logprobs = nn.LogSoftmax(dim=-1)

    def forward(self, tokens):
        s = tokens.shape[1]
        mask = torch.full((s, s), float("-inf"), device=tokens.device).triu(1)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, mask)
        x = F.layer_norm(self.final_norm(x), (x.shape[-1],))  # an extra un-affine norm, as some heads do
        logits = self.head(x)
        # the same op on each remaining path, as sampling code tends to mix them
        lp = self.logprobs(logits)
        lp = lp + F.log_softmax(logits, dim=-1) + torch.log_softmax(logits, -1) + logits.log_softmax(-1)
        probs = torch.softmax(logits[:, -1], dim=-1) + torch.layer_norm(logits[:, -1], (logits.shape[-1],)).softmax(-1)
        scaled = torch.rms_norm(x, (x.shape[-1],), eps=1e-6)
        return lp, probs, scaled


def get_model():
    torch.manual_seed(0)
    model = TinyDecoder()
    with torch.no_grad():  # trained-looking norm weights rather than the constant init
        for m in model.modules():
            if isinstance(m, (LlamaStyleRMSNorm, GemmaStyleRMSNorm)):
                m.weight.normal_(0.0 if isinstance(m, GemmaStyleRMSNorm) else 1.0, 0.1)
    return model


def get_inputs():
    torch.manual_seed(3)
    return (torch.randint(0, 512, (2, 64)),)
