"""Two attention layers the way model code writes them: one calls F.scaled_dot_product_attention
(causal, grouped-query: 4 query heads over 2 key/value heads), the other HF transformers' eager
attention, a module-level ``eager_attention_forward`` with ``repeat_kv`` and an additive mask of
finfo.min (the function the package replaces at its module-level name). Small enough for CPU CI."""

import torch
import torch.nn as nn
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, SEQ = 64, 4, 2, 48


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class Attention(nn.Module):
    def __init__(self, eager: bool):
        super().__init__()
        self.eager = eager
        self.head_dim = HIDDEN // HEADS
        self.num_key_value_groups = HEADS // KV_HEADS
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(HIDDEN, HEADS * self.head_dim, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.o_proj = nn.Linear(HEADS * self.head_dim, HIDDEN, bias=False)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, HEADS, self.head_dim).transpose(1, 2).contiguous()
        k = self.k_proj(x).view(b, s, KV_HEADS, self.head_dim).transpose(1, 2).contiguous()
        v = self.v_proj(x).view(b, s, KV_HEADS, self.head_dim).transpose(1, 2)  # a strided view, as in HF
        if self.eager:
            out, _ = eager_attention_forward(self, q, k, v, mask, scaling=self.scaling)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
        return self.o_proj(out.reshape(b, s, -1))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.sdpa = Attention(eager=False)
        self.eager = Attention(eager=True)

    def forward(self, x):
        s = x.shape[1]
        mask = torch.full((s, s), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device).triu(1)
        x = x + self.sdpa(x, None)
        return x + self.eager(x, mask[None, None])


def get_model():
    torch.manual_seed(0)
    return Model().eval()


def get_inputs():
    torch.manual_seed(1)
    return (torch.randn(1, SEQ, HIDDEN),)
