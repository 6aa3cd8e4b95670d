"""Folding an inference batch_norm into the convolution before it, the digest of what was folded, and
the folded tensors as files (safetensors).

    scale  = bn_weight / sqrt(running_var + eps)
    weight' = weight * scale[c]             (per output channel c)
    bias'   = (conv_bias - running_mean) * scale + bn_bias

computed in float64 from the model's own parameters (whatever their dtype), then rounded once: the
weight to the convolution's dtype (the convolution runs in the model's precision), the bias kept in
float32 (the epilogue adds it in float32; float64 for a float64 model). The folded chain therefore rounds differently from the
original: there the convolution's output is rounded to the model's dtype before the batch_norm, here
``weight * scale`` is rounded instead. It is held to the whole-model rule (``conv_check``): its error
against the chain computed in float64 may be at most twice the original chain's own error plus one
atol of the output dtype.

The digest (sha256 over each folded parameter's role, dtype, shape and bytes) ties the folded tensors
to the parameters they came from: a model whose weights changed after the build does not match, and
the package then runs the original ops.

Torch (and safetensors, when installed) only, relative imports: shipped verbatim in every package as
``<pkg>/_graph/conv_fold.py``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import torch

# the chain inputs that are the model's parameters (folded, digested); the activation and residual vary per call
PARAM_ROLES = ("weight", "conv_bias", "bn_weight", "bn_bias", "running_mean", "running_var")
FORMAT = "safetensors"  # or "torch" (torch.save / torch.load(weights_only=True)) where safetensors is missing


def fold(weight: torch.Tensor, conv_bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
         bn_bias: torch.Tensor | None, running_mean: torch.Tensor, running_var: torch.Tensor,
         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(folded weight in weight's dtype and memory layout, folded bias in float32, or float64 for a float64 weight)."""
    var = running_var.detach().double()
    scale = torch.rsqrt(var + eps)
    if bn_weight is not None:
        scale = scale * bn_weight.detach().double()
    w64 = weight.detach().double() * scale.view(-1, 1, 1, 1)
    b64 = -running_mean.detach().double()
    if conv_bias is not None:
        b64 = b64 + conv_bias.detach().double()
    b64 = b64 * scale
    if bn_bias is not None:
        b64 = b64 + bn_bias.detach().double()
    w = torch.empty_strided(weight.shape, weight.stride(), dtype=weight.dtype, device=weight.device)
    w.copy_(w64)
    return w, b64 if weight.dtype == torch.float64 else b64.float()


def param_digest(params: dict[str, torch.Tensor | None]) -> str:
    """sha256 of the folded parameters (role, dtype, shape, bytes in logical order); absent ones count too."""
    h = hashlib.sha256()
    for role in PARAM_ROLES:
        t = params.get(role)
        if t is None:
            h.update(f"{role}:none;".encode())
            continue
        t = t.detach()
        h.update(f"{role}:{str(t.dtype).replace('torch.', '')}:{list(t.shape)};".encode())
        h.update(_bytes(t))
    return h.hexdigest()


def _bytes(t: torch.Tensor) -> bytes:
    flat = t.reshape(-1).contiguous().cpu()
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(torch.uint8).numpy().tobytes()


def save(path: str | Path, weight: torch.Tensor, bias: torch.Tensor) -> str:
    """Write the folded tensors (the weight's strides kept in the metadata); returns the format used."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    meta = {"weight_strides": json.dumps(list(weight.stride()))}
    tensors = {"weight": weight.detach().contiguous().cpu(), "bias": bias.detach().contiguous().cpu()}
    try:
        from safetensors.torch import save_file
    except ImportError:
        torch.save({"tensors": tensors, "meta": meta}, str(path))
        return "torch"
    save_file(tensors, str(path), metadata=meta)
    return FORMAT


def load(path: str | Path, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(weight with its recorded strides, bias) on `device`, from a file ``save`` wrote in either format."""
    path = str(path)
    try:
        from safetensors import safe_open
    except ImportError:
        safe_open = None
    if safe_open is not None and _is_safetensors(path):
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    else:
        doc = torch.load(path, weights_only=True)
        tensors, meta = doc["tensors"], doc["meta"]
    w = tensors["weight"]
    strides = json.loads(meta.get("weight_strides", "null")) or list(w.stride())
    weight = torch.empty_strided(w.shape, strides, dtype=w.dtype, device=device)
    weight.copy_(w)
    return weight, tensors["bias"].to(device)


def _is_safetensors(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{"  # u64 header length, then the JSON header


def params_of(inputs: Sequence, roles: Sequence[str]) -> dict[str, torch.Tensor | None]:
    """The folded parameters among a chain's inputs (form order, with their roles)."""
    return {role: inputs[roles.index(role)] if role in roles else None for role in PARAM_ROLES}


def memory_perm(strides: Sequence[int]) -> list[int]:
    """The dims in memory order, outermost first (ties, size-1 dims: logical order): NCHW [0, 1, 2, 3],
    channels_last [0, 2, 3, 1]. The epilogue runs over the activation permuted so, a dense tensor whose
    flat index is its memory order: the kernel's every access is then stride-1 or a broadcast."""
    return sorted(range(len(strides)), key=lambda d: (-strides[d], d))


def epilogue_args(names: Sequence[str], perm: Sequence[int], y: torch.Tensor, bias: torch.Tensor,
                  residual: torch.Tensor | None) -> list:
    """The epilogue kernel's arguments in its form order: y and the residual permuted to memory order, the
    folded [C] bias shaped to broadcast along the channel's position there ([C, 1, 1] NCHW, [C] NHWC)."""
    pos = list(perm).index(1)
    by_name = {"y": y.permute(*perm), "b": bias.view([-1] + [1] * (y.dim() - 1 - pos)),
               "r": residual.permute(*perm) if residual is not None else None}
    return [by_name[n] for n in names]


def from_memory_order(out: torch.Tensor, perm: Sequence[int]) -> torch.Tensor:
    """The epilogue's output (in memory order) as the chain's logical [N, C, H, W] view."""
    return out.permute(*[list(perm).index(d) for d in range(len(perm))])


def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv: dict) -> torch.Tensor:
    """The folded convolution (bias usually None: the epilogue adds the float32 bias)."""
    return torch.ops.aten.convolution.default(x, weight, bias, list(conv["stride"]), list(conv["padding"]),
                                              list(conv["dilation"]), False, [0, 0], int(conv["groups"]))
