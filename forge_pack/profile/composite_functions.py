"""Model-code functions that compute a target kind as eager ops (``TargetSpec.composite_functions``:
HF transformers' ``eager_attention_forward``): where the profiler finds them, and whether one
computes what the kind's kernel would (its output against the float64 reference of the same call).
The profiler wraps each for the duration of its passes (``profiler._Recorder``)."""

from __future__ import annotations

import inspect
import sys

import torch

from forge_pack.targets import registry


def composite_functions(model: torch.nn.Module) -> tuple:
    """(Python module, name, kind spec) for each function a kind computes as eager ops
    (``TargetSpec.composite_functions``: HF's eager_attention_forward) defined in a Python module of
    one of the model's classes: model code calls such a function by its module-level name."""
    found, seen = [], set()
    for m in model.modules():
        pymod = sys.modules.get(type(m).__module__)
        if pymod is None or id(pymod) in seen:
            continue
        seen.add(id(pymod))
        for spec in registry.SPECS.values():
            for name in spec.composite_functions:
                if inspect.isfunction(vars(pymod).get(name)):
                    found.append((pymod, name, spec))
    return tuple(found)


def composite_mismatch(spec, name: str, tensors: dict, params: dict, out: torch.Tensor) -> str:
    """Why a composite function's output is not the kind's (its float64 reference on the same call),
    else "": a function of the expected name may compute something else (another masking, scaling or
    output layout), and the package would then replace it with the wrong math."""
    try:
        ref = spec.reference64(params, tensors)
    except Exception as e:  # noqa: BLE001 - arguments the reference cannot take: not the kind
        return f"{name}'s arguments do not fit the {spec.name} reference ({type(e).__name__})"
    got = out.detach().double()
    if tuple(got.shape) != tuple(ref.shape):
        return f"{name} returns shape {list(got.shape)}, the {spec.name} kernel would return {list(ref.shape)}"
    fin = torch.isfinite(ref) & torch.isfinite(got)
    if not torch.equal(torch.isfinite(ref), torch.isfinite(got)):
        return f"{name}'s output has NaN/Inf where softmax(q k^T * scale + mask) v has none (or the reverse)"
    scale = ref[fin].abs().max().clamp_min(1e-6) if fin.any() else torch.tensor(1.0)
    err = float(((got - ref).abs()[fin].max() / scale).item()) if fin.any() else 0.0
    # Within 16-bit rounding of the output and of the probabilities (a few bf16 ulps of the largest value).
    if err > 3e-2:
        return f"{name} does not compute softmax(q k^T * scale + mask) v here (relative error {err:.3g})"
    return ""
