"""Qwen3.5-MoE text model prefill, the issue-8 way: transformers `Qwen3_5MoeForCausalLM` built from
the Qwen3.5-35B-A3B text configuration with 4 layers (random weights, no download), hybrid
attention as the configuration defines it (3 Gated DeltaNet linear-attention layers, then 1 full
attention layer), 256 experts, eager attention, bf16, one prompt of 2048 tokens (batch 1), no KV
cache, logits of the last position only (what `generate()` computes during prefill).

Qwen3.5-35B-A3B text configuration (transformers' Qwen3_5MoeTextConfig defaults): hidden 2048,
40 layers (full attention every 4th), 16 query heads, 2 KV heads, head_dim 256, partial RoPE 0.25,
linear attention 16 key / 32 value heads of 128, conv kernel 4, 256 experts of intermediate 512,
8 per token, one shared expert of 512, vocab 248320, untied lm_head. The experts run with
transformers' default experts implementation (grouped_mm where torch supports it, else eager).
The Gated DeltaNet runs its pure-torch fallback (no flash-linear-attention / causal-conv1d).

Real sizes (the defaults): input_ids (1, 2048); router softmax bf16 in -> fp32 out (2048, 256) per
layer; attention softmax bf16 in -> fp32 out (1, 16, 2048, 2048) in the full-attention layer;
Qwen3_5MoeRMSNorm (eager ops, (1 + w) scale) on (1, 2048, 2048) and the q/k heads.

Environment knobs (all optional):
- FORGE_BENCH_SMALL=1           CPU smoke test only: hidden 256, expert intermediate 32, vocab 4096,
                                64 tokens (4 layers, 256 experts, heads and head dims as the real model).
- FORGE_BENCH_LAYERS=N          number of decoder layers (default 4).
- FORGE_BENCH_SEQ=N             prompt length (default 2048).
- FORGE_BENCH_DTYPE=float32     instead of bfloat16.
- FORGE_BENCH_DEVICE=cpu|cuda   where the weights are created (default: cuda when present).
"""

import os

import torch

from _bench_env import SMALL, causal_lm_prefill

LAYERS = int(os.environ.get("FORGE_BENCH_LAYERS", 4))
SEQ = int(os.environ.get("FORGE_BENCH_SEQ", 64 if SMALL else 2048))
BATCH = 1


def config():
    from transformers import Qwen3_5MoeTextConfig

    sizes = (dict(hidden_size=256, moe_intermediate_size=32, shared_expert_intermediate_size=32, vocab_size=4096)
             if SMALL else
             dict(hidden_size=2048, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                  vocab_size=248320))
    return Qwen3_5MoeTextConfig(
        **sizes, num_hidden_layers=LAYERS,  # layer_types left to the config: full attention every 4th layer
        num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=32,
        num_experts=256, num_experts_per_tok=8, hidden_act="silu", rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=False, use_cache=False,
    )


def get_model() -> torch.nn.Module:
    from transformers import Qwen3_5MoeForCausalLM

    return causal_lm_prefill(Qwen3_5MoeForCausalLM, config())


def get_inputs():
    g = torch.Generator().manual_seed(1)
    vocab = 4096 if SMALL else 248320
    return (torch.randint(0, vocab, (BATCH, SEQ), generator=g),)
