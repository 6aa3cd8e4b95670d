"""Which transformers architectures' eager attention forge-pack finds as one attention region.

    python bench/attention_chains.py [OUT_BASE]      (needs transformers; no GPU needed)

Per architecture: a causal LM built from a tiny configuration (random weights, 2 layers, 4 query heads
over 2 key/value heads where the architecture has GQA, bf16, `attn_implementation="eager"`), one
prompt of 32 tokens, captured as forge-pack captures a model (`graph.capture`). Recorded: the capture
route, how many attention chains `find_attention_chains` found (one per layer is every layer), their
pattern, scale and soft cap, `attention_chain.check`'s verdict (the chain's own subgraph in float64
against the attention reference), and the kernels the hotspots ask for (`attention_hotspots`, from the
masks the run gave): causal, a sliding window of W (the architectures with one get a window of 16, below
the prompt), or the mask read, with their instance counts. A coverage survey, not a timing: the sizes do
not matter.
Writes OUT_BASE.{json,md} (default bench/results/attention_chains).
"""

from __future__ import annotations

import time

from _common import environment, out_path, write

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128, pad_token_id=0)
GQA = dict(num_key_value_heads=2)


def cases(tf) -> dict:
    """name -> (config class, model class, config kwargs)."""
    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {**COMMON, **GQA}),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, {**COMMON, **GQA, "sliding_window": None}),
        "mistral_sliding": (tf.MistralConfig, tf.MistralForCausalLM, {**COMMON, **GQA, "sliding_window": 16}),
        "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM, {**COMMON, **GQA, "num_local_experts": 4}),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {**COMMON, **GQA}),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {**COMMON, **GQA, "head_dim": 16}),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM,
                   {**COMMON, **GQA, "head_dim": 16, "attn_logit_softcapping": 50.0, "sliding_window": 16}),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, {**COMMON, **GQA, "head_dim": 16, "sliding_window": 16,
                                                               "layer_types": ["sliding_attention", "full_attention"]}),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, {**COMMON, **GQA}),
        "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel, dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=128)),
        **{name: (getattr(tf, config), getattr(tf, model), kwargs) for name, (config, model, kwargs) in MORE.items()
           if hasattr(tf, config) and hasattr(tf, model)},
    }


# More architectures, by class name (skipped where the installed transformers lacks them).
MORE = {
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {**COMMON}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {**COMMON, **GQA}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {**COMMON, **GQA}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {**COMMON, **GQA}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {**COMMON, **GQA, "attention_multiplier": 0.1}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {**COMMON, **GQA}),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    {**COMMON, "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                     "qk_nope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
                     "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                                                num_attention_heads=4, word_embed_proj_dim=64,
                                                max_position_embeddings=128)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**COMMON, **GQA, "num_experts": 4,
                                                            "moe_intermediate_size": 32,
                                                            "shared_expert_intermediate_size": 32}),
    "glm": ("GlmConfig", "GlmForCausalLM", {**COMMON, **GQA, "head_dim": 16}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {**COMMON, **GQA}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {**COMMON, **GQA}),
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", {**COMMON, **GQA, "head_dim": 16, "num_local_experts": 2,
                                                         "intermediate_size_mlp": 128}),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                                         num_attention_heads=4, new_decoder_architecture=True,
                                                         num_kv_heads=2)),
    # not found, each for a reason of its own (NOT_FOUND)
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                   n_positions=128)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(vocab_size=128, hidden_size=64, n_layer=2, n_head=4)),
    "mpt": ("MptConfig", "MptForCausalLM", dict(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=128)),
}
# What the captured graph holds around the softmax where no chain is found (read from the graphs, this survey).
NOT_FOUND = {
    "gptj": "q and k cast to float32 before the product (scores never rounded to bf16), then cast back after the "
            "softmax: not the composite's spelling",
    "bloom": "ALiBi: baddbmm of a position bias over [B * H, L, S] (3-d), then bmm",
    "mpt": "ALiBi: a sliced position bias added, masked_fill, softmax: the bias is not a mask the target takes",
}


def prefill_model(tf, name: str):
    """The causal LM ``cases(tf)[name]`` (seeded random weights, bf16, eager attention) as a module returning the
    logits of a prompt (no cache): what the capture exports."""
    import torch

    class Prefill(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False).logits

    config_cls, model_cls, kwargs = cases(tf)[name]
    torch.manual_seed(0)
    lm = model_cls._from_config(config_cls(**kwargs), attn_implementation="eager", dtype=torch.bfloat16).eval()
    return Prefill(lm).eval()


def survey_one(tf, name: str) -> dict:
    import torch

    import tempfile

    from forge_pack.graph.attention_chain import check, find_attention_chains
    from forge_pack.graph.attention_hotspots import attention_hotspots, keep_names
    from forge_pack.graph.capture import capture

    row = {"model": name, "layers": 2}
    try:
        model = prefill_model(tf, name)
        graph = capture(model, (torch.randint(1, 128, (1, 32)),), {}, profile=False)
        chains = find_attention_chains(graph)
        row.update(route=graph.route, chains=len(chains),
                   found=[{"pattern": c.region.pattern, "scale": c.scale, "softcap": c.softcap,
                           "signature": c.signature().pretty(), "check": check(c) or "ok"} for c in chains])
        with tempfile.TemporaryDirectory() as run_dir:
            hs = attention_hotspots(chains, graph.run(keep=keep_names(chains)), run_dir)
        row["kernels"] = [{"causal": bool(h.signature.param("causal")), "window": h.signature.param("window", 0),
                           "reads_mask": h.signature.input("mask") is not None,
                           "instances": int(h.calls_per_forward), "skipped": h.unsupported} for h in hs]
    except Exception as e:  # noqa: BLE001 - a row per architecture, whatever happens
        row.update(error=f"{type(e).__name__}: {str(e)[:300]}")
    return row


def main() -> None:
    import transformers as tf

    base = out_path("attention_chains")
    t0 = time.time()
    rows = [survey_one(tf, name) for name in cases(tf)]
    doc = {"command": "python bench/attention_chains.py", "environment": {**environment(),
                                                                          "transformers": tf.__version__},
           "seconds": round(time.time() - t0, 1), "rows": rows}
    lines = ["# Eager attention of transformers architectures as forge-pack attention regions", "",
             f"Command: `{doc['command']}`; torch {doc['environment']['torch']}, transformers {tf.__version__}; "
             "tiny configurations (2 layers, random weights), bf16, eager attention, 32 tokens.", "",
             "| model | route | chains (of 2 layers) | pattern | scale | soft cap | check | kernels (instances) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.get("chains") == 0 and r["model"] in NOT_FOUND:
            lines.append(f"| {r['model']} | {r['route']} | 0 | not found: {NOT_FOUND[r['model']]} | | | | |")
            continue
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | error: {r['error'][:120]} | | | | |")
            continue
        f = r["found"][0] if r["found"] else {}
        checks = sorted({x["check"] for x in r["found"]}) or ["-"]
        kernels = ", ".join(
            ("mask read" if k["reads_mask"] else f"causal, window {k['window']}" if k["window"] else "causal")
            + f" ({k['instances']})" + (f" skipped: {k['skipped']}" if k["skipped"] else "") for k in r["kernels"])
        lines.append(f"| {r['model']} | {r['route']} | {r['chains']} | {f.get('pattern', '-')} | "
                     f"{f.get('scale', '-')} | {f.get('softcap') or '-'} | {'; '.join(checks)} | {kernels or '-'} |")
    write(base, doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
