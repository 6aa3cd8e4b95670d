"""What the issue-8 model files share: the environment knobs and the LLM prefill wrapper.

The model files import this as a sibling module (forge-pack puts a model file's folder on
sys.path while importing it).
"""

import os

import torch

SMALL = os.environ.get("FORGE_BENCH_SMALL", "") not in ("", "0")  # CPU smoke test sizes only
DTYPE = getattr(torch, os.environ.get("FORGE_BENCH_DTYPE", "bfloat16"))


def device() -> str:
    """Where weights are created: FORGE_BENCH_DEVICE, else cuda when present."""
    return os.environ.get("FORGE_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


class Prefill(torch.nn.Module):
    """input_ids -> next-token logits (1, 1, vocab), as the prefill step of generation."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False, logits_to_keep=1).logits


def causal_lm_prefill(lm_class, config) -> torch.nn.Module:
    """A transformers causal LM with random weights, eager attention, in DTYPE, as a Prefill module."""
    torch.manual_seed(0)
    with torch.device(device()):
        lm = lm_class._from_config(config, dtype=DTYPE, attn_implementation="eager")
    return Prefill(lm.to(DTYPE)).eval()
