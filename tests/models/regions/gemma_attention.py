"""Gemma-style eager attention as HF model code writes it: grouped-query heads repeated by
``repeat_kv`` (4 query heads over 2 key/value heads), scaling by a query_pre_attn_scalar, logit
soft-capping (``tanh(w / cap) * cap``), an additive causal mask of finfo.min sliced to the key length
(the mask is built wider than the keys, as a static cache's is), the softmax in fp32 cast back, eval
dropout, and ``transpose(1, 2).contiguous()``. bf16 by default."""

import torch
import torch.nn as nn

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, SEQ, CACHE = 64, 4, 2, 16, 40, 48
SCALING, SOFTCAP = 0.3, 50.0


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = repeat_kv(self.k_proj(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2), HEADS // KV_HEADS)
        v = repeat_kv(self.v_proj(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2), HEADS // KV_HEADS)
        w = torch.matmul(q, k.transpose(2, 3)) * SCALING
        w = w / SOFTCAP
        w = torch.tanh(w)
        w = w * SOFTCAP
        w = w + mask[:, :, :, : k.shape[-2]]
        w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        w = nn.functional.dropout(w, p=0.1, training=self.training)
        out = torch.matmul(w, v).transpose(1, 2).contiguous()
        return self.o_proj(out.reshape(b, s, -1))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()

    def forward(self, x):
        s = x.shape[1]
        mask = torch.full((s, CACHE), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device).triu(1)
        return x + self.attn(x, mask[None, None])


def get_model(dtype=torch.bfloat16):
    torch.manual_seed(0)
    return Model().to(dtype).eval()


def get_inputs(dtype=torch.bfloat16):
    torch.manual_seed(1)
    return (torch.randn(2, SEQ, HIDDEN).to(dtype),)
