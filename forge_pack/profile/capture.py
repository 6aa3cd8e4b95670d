"""Captured tensors: the exact inputs a target op received in the model, and its outputs.

One safetensors file per captured call holds ``in.<abi name>`` for each present input and
``out`` for the eager output. safetensors stores contiguous data, so the signature's strides are
applied again on load: a channels_last input comes back channels_last, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from forge_pack.targets.ops import empty_like_spec
from forge_pack.core.signature import Signature


def save_capture(path: str | Path, sig: Signature, tensors: dict[str, torch.Tensor | None],
                 out: torch.Tensor) -> int:
    """Write one call's inputs and output; returns the bytes written (tensor payload)."""
    payload = {f"in.{n}": t.detach().to("cpu").contiguous() for n, t in tensors.items() if t is not None}
    payload["out"] = out.detach().to("cpu").contiguous()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(payload, str(path), metadata={"signature": sig.key()})
    return sum(t.numel() * t.element_size() for t in payload.values())


def load_capture(path: str | Path, sig: Signature, device: str | torch.device = "cpu"
                 ) -> tuple[dict[str, torch.Tensor | None], torch.Tensor]:
    raw = load_file(str(path), device="cpu")
    tensors: dict[str, torch.Tensor | None] = {}
    for name, spec in sig.inputs:
        if spec is None:
            tensors[name] = None
            continue
        t = empty_like_spec(spec, device)
        t.copy_(raw[f"in.{name}"].view(spec.shape))
        tensors[name] = t
    out_raw = raw["out"]
    if sig.output is not None:
        out = empty_like_spec(sig.output, device)
        out.copy_(out_raw.view(sig.output.shape))
    else:
        out = out_raw.to(device)
    return tensors, out
