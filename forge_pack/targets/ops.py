"""The target kinds, torch side, over ``Signature``s: how calls are recognised and turned into
signatures, the eager call, the float64 reference, and verification inputs.

Everything kind-specific comes from ``forge_pack.targets.registry`` (the binders are the very
functions the shipped package runs); this module adapts it to forge-pack's ``Signature`` and
``TensorSpec``. The torch-free half (size variables, byte counts) is ``forge_pack.targets.abi``;
the derived-set transforms are ``forge_pack.evaluate.verdict_rules``' (shipped verbatim in every
package, so its ``verify`` derives the same sets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from forge_pack.core.signature import Signature, TensorSpec, channels_last_strides, contiguous_strides
from forge_pack.evaluate import verdict_rules
from forge_pack.targets import dtypes, registry
from forge_pack.targets.abi import TARGET_OPS
from forge_pack.targets.lazy_torch import resolve
from forge_pack.targets.rms_norm import composite_rms_norm  # noqa: F401  (re-exported for callers)
from forge_pack.targets.spec import CallPath, TargetSpec

__all__ = ["CALL_PATHS", "CallPath", "DERIVED_KINDS", "MODULE_TYPES", "TORCH_DTYPES", "Unsupported",
           "adversarial_kinds", "composite_rms_norm", "derive_inputs", "dtype_name", "eager", "empty_like_spec",
           "function_table", "get_op", "is_target", "make_inputs", "make_signature", "normalize_call",
           "odd_signatures", "output_spec", "reference64", "resolve", "spec_of", "with_output"]

TORCH_DTYPES: dict[str, torch.dtype] = {name: dtypes.torch_dtype(name) for name in dtypes.CANONICAL}
dtype_name = dtypes.name_of

CALL_PATHS: dict[str, tuple[CallPath, ...]] = {s.name: s.call_paths for s in registry.SPECS.values()}
# The label "module:<Class>" marks a module composite (an RMSNorm written as eager ops).


def spec_of(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(dtype_name(t.dtype), tuple(t.shape), tuple(t.stride()))


def function_table() -> dict[Any, tuple[str, CallPath]]:
    """Identity of each patchable function -> (op, call path); used to recognise calls."""
    return {resolve(p.owner, p.attr): (s.name, p) for s, p in registry.function_call_paths()}


def _module_types() -> dict[type, tuple[str, str]]:
    """module class -> (op, label); the module's forward calls the F.* function of that op. Classes
    this torch lacks (nn.RMSNorm before 2.4) are left out."""
    out = {}
    for s, p in registry.module_call_paths():
        cls = getattr(torch.nn, p.attr, None)
        if cls is not None:
            out[cls] = (s.name, p.label)
    return out


MODULE_TYPES: dict[type, tuple[str, str]] = _module_types()


# ------------------------------------------------------------------ argument normalisation

class Unsupported(Exception):
    """A call of a target op that forge-pack does not target (e.g. batch_norm in training), or
    arguments its binder does not recognise exactly."""


def normalize_call(op: str, style: str, args: tuple, kwargs: dict) -> tuple[dict[str, torch.Tensor | None], dict]:
    """(tensors by ABI name, params) for one call, by the kind's binder (the package's own);
    raises Unsupported for calls it does not take."""
    bound = registry.get(op).bind(style, tuple(args), dict(kwargs or {}))
    if bound is None:
        raise Unsupported(f"{op} called with arguments forge-pack does not target")
    return bound


def make_signature(op: str, tensors: dict[str, torch.Tensor | None], params: dict,
                   output: torch.Tensor | None = None) -> Signature:
    inputs = tuple((n, spec_of(tensors[n]) if tensors.get(n) is not None else None) for n in registry.get(op).tensors)
    return Signature(op, inputs, tuple(sorted(params.items())), spec_of(output) if output is not None else None)


def is_target(tensors: dict[str, Any]) -> bool:
    """Only plain tensors (no subclasses, no tracing fakes) are captured and targeted."""
    for t in tensors.values():
        if t is not None and (not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor and
                              not isinstance(t, torch.nn.Parameter)):
            return False
    return True


# ------------------------------------------------------------------ eager call, reference, inputs

def eager(sig: Signature) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """The exact PyTorch call the model makes, as a function of the named tensors."""
    return registry.spec_for(sig).eager(dict(sig.params), sig.output.dtype if sig.output else None)


def reference64(sig: Signature, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """The op in float64 on the same device: the yardstick for every error measurement."""
    return registry.spec_for(sig).reference64(dict(sig.params), t)


def empty_like_spec(spec: TensorSpec, device: str | torch.device) -> torch.Tensor:
    return torch.empty_strided(spec.shape, spec.strides, dtype=TORCH_DTYPES[spec.dtype], device=device)


def plain_inputs(sig: Signature) -> list:
    """[(name, (dtype, shape, strides) or None)]: the inputs as the shipped runtime takes them."""
    return [(n, (s.dtype, s.shape, s.strides) if s is not None else None) for n, s in sig.inputs]


def make_inputs(sig: Signature, kind: str, gen: torch.Generator, device: str | torch.device) -> dict:
    """Inputs for one verification run: kind 'fresh' or one of adversarial_kinds(sig)."""
    return registry.spec_for(sig).make_inputs(plain_inputs(sig), kind, gen, device)


def adversarial_kinds(sig: Signature) -> list[str]:
    return list(registry.spec_for(sig).adversarial)


# Derived verification sets: random transforms of captured or fresh inputs, drawn anew for every
# evaluation (verdict_rules, so the package's verify derives the same sets).
DERIVED_KINDS = verdict_rules.DERIVED_KINDS


def derive_inputs(sig: Signature, kind: str, source: dict, gen: torch.Generator) -> dict:
    """New inputs from ``source`` (left untouched) by one random transform of DERIVED_KINDS."""
    return verdict_rules.derive_inputs(registry.spec_for(sig), dict(sig.params), kind, source, gen)


def odd_signatures(sig: Signature) -> list[Signature]:
    """Same op and parameters on odd sizes: catches hard-coded sizes, missing tails, races at edges."""
    out: list[Signature] = []
    for shape, channels_last in registry.spec_for(sig).odd_shapes(sig):
        strides = channels_last_strides(shape) if channels_last else contiguous_strides(shape)
        new_inputs = []
        for n, s in sig.inputs:
            if s is None:
                new_inputs.append((n, None))
            elif n == "x":
                new_inputs.append((n, TensorSpec(s.dtype, shape, strides)))
            else:
                new_inputs.append((n, TensorSpec(s.dtype, s.shape, contiguous_strides(s.shape))))
        params = dict(sig.params)
        if "dim" in params:  # the reduced dim stays the last one on the new shape
            params["dim"] = len(shape) - 1
        out.append(Signature(sig.op, tuple(new_inputs), tuple(sorted(params.items())), None))
    return [s for s in out if s.key() != sig.key()]


def output_spec(sig: Signature, device: str | torch.device = "meta") -> TensorSpec:
    """The output's dtype, shape and strides, by running the eager op on empty inputs."""
    t = {n: (empty_like_spec(s, device) if s is not None else None) for n, s in sig.inputs}
    return spec_of(eager(sig)(t))


def with_output(sig: Signature) -> Signature:
    return sig if sig.output is not None else Signature(sig.op, sig.inputs, sig.params, output_spec(sig))


@dataclass(frozen=True)
class OpSpec:
    """One kind's registry entry over Signatures (the module-level functions take the kind from the
    signature)."""

    name: str

    @property
    def spec(self) -> TargetSpec:
        return registry.get(self.name)

    @property
    def call_paths(self) -> tuple[CallPath, ...]:
        return self.spec.call_paths

    def eager(self, sig: Signature):
        return eager(sig)

    def reference64(self, sig: Signature, tensors: dict) -> torch.Tensor:
        return reference64(sig, tensors)

    def make_inputs(self, sig: Signature, kind: str, generator: torch.Generator, device) -> dict:
        return make_inputs(sig, kind, generator, device)

    def adversarial_kinds(self, sig: Signature) -> list[str]:
        return adversarial_kinds(sig)

    def odd_signatures(self, sig: Signature) -> list[Signature]:
        return odd_signatures(sig)


def get_op(name: str) -> OpSpec:
    if name not in registry.SPECS and name != "region":  # a region's spec comes from its signature
        raise KeyError(f"unknown op {name!r}; known: {', '.join(TARGET_OPS)}")
    return OpSpec(name)
