"""The op registry, torch side: how each target op is called, recognised, referenced and tested.

Per op: the call paths that reach it (``F.softmax``, ``torch.softmax``, ``Tensor.softmax``,
``nn.Softmax`` ...), how to turn a call's arguments into a ``Signature`` plus named tensors in the
op's ABI order (``forge_pack.targets.abi``), the exact eager call (for timing and torch.compile), a float64
reference, and generators of fresh, adversarial and odd-sized inputs. The pure-Python half of
the registry (size variables, byte counts) lives in ``forge_pack.targets.abi``; the eager call, the
reference, the fresh/adversarial generators and the derived-set transforms live in
``forge_pack.evaluate.verdict_rules`` (shipped verbatim in every package, so its ``verify`` draws the same
inputs) and are wrapped here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from forge_pack.evaluate import verdict_rules
from forge_pack.targets.abi import TARGET_OPS
from forge_pack.core.signature import Signature, TensorSpec, channels_last_strides, contiguous_strides

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
               torch.float64: "float64", torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def spec_of(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(dtype_name(t.dtype), tuple(t.shape), tuple(t.stride()))


@dataclass(frozen=True)
class CallPath:
    """One way user code reaches an op. ``owner``/``attr`` locate the patchable function."""

    label: str  # F.softmax | torch.softmax | Tensor.softmax | nn.Softmax
    owner: str  # "torch.nn.functional", "torch", "torch.Tensor"; "" for module paths
    attr: str
    style: str  # argument convention: "F" | "torch" | "method" | "module"
    via: str = ""  # for nn.* modules: the function path the module's forward calls


def _paths(op: str, f_attr: str, torch_attr: str | None, method: bool, modules: tuple[str, ...]) -> tuple:
    paths = [CallPath(f"F.{f_attr}", "torch.nn.functional", f_attr, "F")]
    if torch_attr:
        paths.append(CallPath(f"torch.{torch_attr}", "torch", torch_attr, "torch"))
    if method:
        paths.append(CallPath(f"Tensor.{f_attr}", "torch.Tensor", f_attr, "method"))
    for m in modules:
        paths.append(CallPath(f"nn.{m}", "torch.nn", m, "module", via=f"F.{f_attr}"))
    return tuple(paths)


CALL_PATHS: dict[str, tuple[CallPath, ...]] = {
    "softmax": _paths("softmax", "softmax", "softmax", True, ("Softmax",)),
    "log_softmax": _paths("log_softmax", "log_softmax", "log_softmax", True, ("LogSoftmax",)),
    "layer_norm": _paths("layer_norm", "layer_norm", "layer_norm", False, ("LayerNorm",)),
    "rms_norm": _paths("rms_norm", "rms_norm", "rms_norm", False, ("RMSNorm",)),
    "group_norm": _paths("group_norm", "group_norm", "group_norm", False, ("GroupNorm",)),
    "batch_norm": _paths("batch_norm", "batch_norm", "batch_norm", False,
                         ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d")),
    "adaptive_avg_pool2d": _paths("adaptive_avg_pool2d", "adaptive_avg_pool2d", None, False,
                                  ("AdaptiveAvgPool2d",)),
}
# The label "module:<Class>" marks a module composite (an RMSNorm written as eager ops).


def resolve(owner: str, attr: str) -> Any:
    obj: Any = {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor, "torch.nn": torch.nn}[owner]
    return getattr(obj, attr)


def function_table() -> dict[Any, tuple[str, CallPath]]:
    """Identity of each patchable function -> (op, call path); used to recognise calls."""
    table: dict[Any, tuple[str, CallPath]] = {}
    for op, paths in CALL_PATHS.items():
        for p in paths:
            if p.style != "module":
                table[resolve(p.owner, p.attr)] = (op, p)
    return table


MODULE_TYPES: dict[type, tuple[str, str]] = {
    # module class -> (op, label); the module's forward calls the F.* function of that op
    torch.nn.Softmax: ("softmax", "nn.Softmax"),
    torch.nn.LogSoftmax: ("log_softmax", "nn.LogSoftmax"),
    torch.nn.LayerNorm: ("layer_norm", "nn.LayerNorm"),
    torch.nn.GroupNorm: ("group_norm", "nn.GroupNorm"),
    torch.nn.BatchNorm1d: ("batch_norm", "nn.BatchNorm1d"),
    torch.nn.BatchNorm2d: ("batch_norm", "nn.BatchNorm2d"),
    torch.nn.BatchNorm3d: ("batch_norm", "nn.BatchNorm3d"),
    torch.nn.AdaptiveAvgPool2d: ("adaptive_avg_pool2d", "nn.AdaptiveAvgPool2d"),
}
if hasattr(torch.nn, "RMSNorm"):
    MODULE_TYPES[torch.nn.RMSNorm] = ("rms_norm", "nn.RMSNorm")


# ------------------------------------------------------------------ argument normalisation

class Unsupported(Exception):
    """A call of a target op that forge-pack does not target (e.g. batch_norm in training)."""


def _bind(names: tuple[str, ...], defaults: dict[str, Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = dict(defaults)
    for name, value in zip(names, args):
        bound[name] = value
    for k, v in kwargs.items():
        if k in names or k in defaults:
            bound[k] = v
    return bound


def _dim(d: Any, ndim: int) -> int:
    if d is None:
        # PyTorch's implicit-dim rule for softmax: 0 for 0/1/3-d inputs, else 1 (deprecated, but honoured)
        return 0 if ndim in (0, 1, 3) else 1
    return d + ndim if d < 0 else d


def normalize_call(op: str, style: str, args: tuple, kwargs: dict) -> tuple[dict[str, torch.Tensor | None], dict]:
    """(tensors by ABI name, params) for one call; raises Unsupported for calls not targeted."""
    kwargs = dict(kwargs or {})
    if op in ("softmax", "log_softmax"):
        # Only F.softmax has _stacklevel before dtype; torch.softmax(x, dim, dtype) and
        # Tensor.softmax(dim, dtype) take dtype third (as the package's _patch.py binds them).
        names = ("input", "dim", "_stacklevel", "dtype") if style == "F" else ("input", "dim", "dtype")
        b = _bind(names, {"dim": None, "dtype": None}, args, kwargs)
        x = b["input"]
        out_dtype = b["dtype"]
        params = {"dim": _dim(b["dim"], x.dim()), "dtype": dtype_name(out_dtype) if out_dtype is not None else None}
        return {"x": x}, params
    if op == "layer_norm":
        b = _bind(("input", "normalized_shape", "weight", "bias", "eps"), {"weight": None, "bias": None, "eps": 1e-5},
                  args, kwargs)
        return ({"x": b["input"], "weight": b["weight"], "bias": b["bias"]},
                {"normalized_shape": list(_shape(b["normalized_shape"])), "eps": float(b["eps"])})
    if op == "rms_norm":
        b = _bind(("input", "normalized_shape", "weight", "eps"), {"weight": None, "eps": None}, args, kwargs)
        x = b["input"]
        # eps=None: the eps of the dtype PyTorch computes in (float32 for half and bf16), not x's own
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        eps = b["eps"] if b["eps"] is not None else torch.finfo(compute).eps
        return ({"x": x, "weight": b["weight"]},
                {"normalized_shape": list(_shape(b["normalized_shape"])), "eps": float(eps), "weight_offset": 0.0,
                 "composite": False})
    if op == "group_norm":
        b = _bind(("input", "num_groups", "weight", "bias", "eps"), {"weight": None, "bias": None, "eps": 1e-5},
                  args, kwargs)
        return ({"x": b["input"], "weight": b["weight"], "bias": b["bias"]},
                {"num_groups": int(b["num_groups"]), "eps": float(b["eps"])})
    if op == "batch_norm":
        if style == "torch":
            b = _bind(("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
                       "cudnn_enabled"), {}, args, kwargs)
        else:
            b = _bind(("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
                      {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}, args, kwargs)
        if b["training"] or b["running_mean"] is None or b["running_var"] is None:
            raise Unsupported("batch_norm in training mode or without running statistics")
        return ({"x": b["input"], "running_mean": b["running_mean"], "running_var": b["running_var"],
                 "weight": b["weight"], "bias": b["bias"]}, {"eps": float(b["eps"]), "training": False})
    if op == "adaptive_avg_pool2d":
        b = _bind(("input", "output_size"), {}, args, kwargs)
        x = b["input"]
        size = b["output_size"]
        if isinstance(size, int):
            size = (size, size)
        size = tuple(x.shape[-2 + i] if s is None else int(s) for i, s in enumerate(size))
        return {"x": x}, {"output_size": list(size)}
    raise KeyError(op)


def _shape(s: Any) -> tuple[int, ...]:
    if isinstance(s, int):
        return (s,)
    return tuple(int(v) for v in s)


ABI_ORDER = {"softmax": ("x",), "log_softmax": ("x",), "layer_norm": ("x", "weight", "bias"),
             "rms_norm": ("x", "weight"), "group_norm": ("x", "weight", "bias"),
             "batch_norm": ("x", "running_mean", "running_var", "weight", "bias"), "adaptive_avg_pool2d": ("x",)}


def make_signature(op: str, tensors: dict[str, torch.Tensor | None], params: dict,
                   output: torch.Tensor | None = None) -> Signature:
    inputs = tuple((n, spec_of(tensors[n]) if tensors.get(n) is not None else None) for n in ABI_ORDER[op])
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
    return verdict_rules.eager_fn(sig.op, dict(sig.params), sig.output.dtype if sig.output else None)


composite_rms_norm = verdict_rules.composite_rms_norm


def reference64(sig: Signature, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """The op in float64 on the same device: the yardstick for every error measurement."""
    return verdict_rules.reference64(sig.op, dict(sig.params), t)


def empty_like_spec(spec: TensorSpec, device: str | torch.device) -> torch.Tensor:
    return torch.empty_strided(spec.shape, spec.strides, dtype=TORCH_DTYPES[spec.dtype], device=device)


def _plain(sig: Signature) -> list:
    return [(n, (s.dtype, s.shape, s.strides) if s is not None else None) for n, s in sig.inputs]


def make_inputs(sig: Signature, kind: str, gen: torch.Generator, device: str | torch.device) -> dict:
    """Inputs for one verification run: kind 'fresh' or one of adversarial_kinds(sig)."""
    return verdict_rules.make_inputs(_plain(sig), kind, gen, device)


def adversarial_kinds(sig: Signature) -> list[str]:
    return verdict_rules.adversarial_kinds(sig.op)


# Derived verification sets: random transforms of captured or fresh inputs, drawn anew for every
# evaluation (verdict_rules, so the package's verify derives the same sets).
DERIVED_KINDS = verdict_rules.DERIVED_KINDS


def derive_inputs(sig: Signature, kind: str, source: dict, gen: torch.Generator) -> dict:
    """New inputs from ``source`` (left untouched) by one random transform of DERIVED_KINDS."""
    return verdict_rules.derive_inputs(sig.op, dict(sig.params), kind, source, gen)


def odd_signatures(sig: Signature) -> list[Signature]:
    """Same op and parameters on odd sizes: catches hard-coded sizes, missing tails, races at edges."""
    x = sig.x
    out: list[Signature] = []

    def with_x(shape: tuple[int, ...], channels_last: bool = False, **others: tuple[int, ...]) -> Signature:
        strides = channels_last_strides(shape) if channels_last else contiguous_strides(shape)
        inputs = []
        for n, s in sig.inputs:
            if s is None:
                inputs.append((n, None))
            elif n == "x":
                inputs.append((n, TensorSpec(s.dtype, shape, strides)))
            else:
                new = others.get(n, s.shape)
                inputs.append((n, TensorSpec(s.dtype, new, contiguous_strides(new))))
        params = dict(sig.params)
        if "dim" in params:  # the reduced dim stays the last one on the new shape
            params["dim"] = len(shape) - 1
        return Signature(sig.op, tuple(inputs), tuple(sorted(params.items())), None)

    if sig.op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
        ncols = len(sig.param("normalized_shape") or [0]) if sig.op in ("layer_norm", "rms_norm") else 1
        tail = x.shape[len(x.shape) - ncols:]
        out.append(with_x((37,) + tail))
        if sig.op in ("softmax", "log_softmax") and x.shape[-1] > 2:
            out.append(with_x((3, x.shape[-1] - 1)))
    elif sig.op == "group_norm":
        n, c = x.shape[:2]
        out.append(with_x((min(n, 2) + 1, c) + (5, 7)[: max(len(x.shape) - 2, 0)]))
    elif sig.op in ("batch_norm", "adaptive_avg_pool2d"):
        c = x.shape[1]
        out.append(with_x((3, c, 5, 7), channels_last=x.layout == "channels_last" and not x.is_contiguous))
    return [s for s in out if s.key() != sig.key()]


def output_spec(sig: Signature, device: str | torch.device = "meta") -> TensorSpec:
    """The output's dtype, shape and strides, by running the eager op on empty inputs."""
    t = {n: (empty_like_spec(s, device) if s is not None else None) for n, s in sig.inputs}
    return spec_of(eager(sig)(t))


def with_output(sig: Signature) -> Signature:
    return sig if sig.output is not None else Signature(sig.op, sig.inputs, sig.params, output_spec(sig))


@dataclass(frozen=True)
class OpSpec:
    """One op's registry entry, as an object (the module-level functions take the op from the signature)."""

    name: str

    @property
    def call_paths(self) -> tuple[CallPath, ...]:
        return CALL_PATHS[self.name]

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
    if name not in CALL_PATHS:
        raise KeyError(f"unknown op {name!r}; known: {', '.join(TARGET_OPS)}")
    return OpSpec(name)


assert set(CALL_PATHS) == set(TARGET_OPS) == set(ABI_ORDER)
