"""Gemma 4 text model prefill, the issue-8 way: transformers `Gemma4ForCausalLM` built from a
Gemma 4 E2B-like text configuration with 6 layers (random weights, no download), eager attention,
bf16, one prompt of 2048 tokens (batch 1), no KV cache, logits of the last position only (what
`generate()` computes during prefill).

Gemma 4 E2B text configuration (google/gemma-4-E2B): hidden 1536, intermediate 6144, 35 layers
(4 sliding : 1 full), 8 query heads, 1 KV head, head_dim 256 (global layers 512, partial RoPE
0.25, theta 1e6; sliding layers theta 1e4, window 512), per-layer embeddings 256 wide over a
262144 vocabulary, vocab 262144 (tied), gelu_pytorch_tanh, final logit soft-capping 30,
20 KV-shared layers with double-wide MLPs. Here: the first 6 layers' pattern
(s, s, s, s, full, full: transformers forces the last layer to full attention) and no KV sharing
(in E2B only layers 15..34 share), everything else as E2B.

Real sizes (the defaults): input_ids (1, 2048); attention softmax bf16 in -> fp32 out
(1, 8, 2048, 2048) per layer (eager_attention_forward: softmax(dtype=float32)); Gemma4RMSNorm
(eager ops) on (1, 2048, 1536) and on the q/k heads (256 / 512 wide).

Environment knobs (all optional):
- FORGE_BENCH_SMALL=1           CPU smoke test only: 2 layers (sliding, full), hidden 256,
                                intermediate 512, vocab 4096, 64 tokens (heads and head dims as E2B).
- FORGE_BENCH_LAYERS=N          number of decoder layers (default 6).
- FORGE_BENCH_SEQ=N             prompt length (default 2048).
- FORGE_BENCH_DTYPE=float32     instead of bfloat16.
- FORGE_BENCH_DEVICE=cpu|cuda   where the weights are created (default: cuda when present).
"""

import os

import torch

from _bench_env import SMALL, causal_lm_prefill

LAYERS = int(os.environ.get("FORGE_BENCH_LAYERS", 2 if SMALL else 6))
SEQ = int(os.environ.get("FORGE_BENCH_SEQ", 64 if SMALL else 2048))
BATCH = 1

E2B_PATTERN = ["sliding_attention"] * 4 + ["full_attention"]  # repeated over E2B's 35 layers



def config():
    from transformers import Gemma4TextConfig

    layer_types = [E2B_PATTERN[i % 5] for i in range(LAYERS)]
    layer_types[-1] = "full_attention"  # transformers requires it (and would force it with a warning)
    sizes = (dict(hidden_size=256, intermediate_size=512, vocab_size=4096, vocab_size_per_layer_input=4096)
             if SMALL else
             dict(hidden_size=1536, intermediate_size=6144, vocab_size=262144, vocab_size_per_layer_input=262144))
    return Gemma4TextConfig(
        **sizes, num_hidden_layers=LAYERS, layer_types=layer_types,
        num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
        sliding_window=512, hidden_size_per_layer_input=256, num_kv_shared_layers=0,
        use_double_wide_mlp=True, attention_k_eq_v=False, hidden_activation="gelu_pytorch_tanh",
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, max_position_embeddings=131072,
        tie_word_embeddings=True, use_cache=False, pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )


def get_model() -> torch.nn.Module:
    from transformers import Gemma4ForCausalLM

    return causal_lm_prefill(Gemma4ForCausalLM, config())


def get_inputs():
    g = torch.Generator().manual_seed(1)
    vocab = 4096 if SMALL else 262144
    return (torch.randint(3, vocab, (BATCH, SEQ), generator=g),)
