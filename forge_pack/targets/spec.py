"""What a target kind provides: ``TargetSpec``, one frozen record per kind.

A kind is anything forge-pack can replace with one kernel: today a single op (softmax,
layer_norm ...), next a region (a fused chain of ops from the model's graph). Every field works
from a signature's named tensors and parameters (never from the op's name), so a region fills
the same record: its tensors and parameters, its float64 reference and eager call as functions
of them, its tolerance rows, how its inputs are drawn. Call paths and a binder are what a kind
needs to be recognised in eager code; a kind reached otherwise leaves them empty.

The torch-free fields (names, scalars, doc, size variables, applicability, tolerance rows,
adversarial kinds) are read by the search and the LLM prompt without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import inputs as _inputs
from .lazy_torch import resolve

Tensors = dict  # ABI name -> tensor or None
Params = dict  # parameter name -> JSON value
Lookup = Callable[[str, str], Callable]  # (owner, attr) -> the PyTorch function to call


@dataclass(frozen=True)
class CallPath:
    """One way user code reaches a kind. ``owner``/``attr`` locate the patchable object."""

    label: str  # F.softmax | torch.softmax | Tensor.softmax | nn.Softmax
    owner: str  # "torch.nn.functional" | "torch" | "torch.Tensor" | "torch.nn" (module classes)
    attr: str
    style: str  # the binder's argument convention: "F" | "torch" | "method" | "module"
    via: str = ""  # module paths: the function path the module's forward calls


def function_paths(f_attr: str, torch_attr: str | None, method: bool, modules: tuple[str, ...]
                   ) -> tuple[CallPath, ...]:
    """The usual paths of a functional op: F.<op>, torch.<op>, Tensor.<op>, nn.<Module>s."""
    paths = [CallPath(f"F.{f_attr}", "torch.nn.functional", f_attr, "F")]
    if torch_attr:
        paths.append(CallPath(f"torch.{torch_attr}", "torch", torch_attr, "torch"))
    if method:
        paths.append(CallPath(f"Tensor.{f_attr}", "torch.Tensor", f_attr, "method"))
    for m in modules:
        paths.append(CallPath(f"nn.{m}", "torch.nn", m, "module", via=f"F.{f_attr}"))
    return tuple(paths)


@dataclass(frozen=True)
class Tolerance:
    """One tolerance row: an element passes when |out - ref| <= atol + rtol * |ref|."""

    atol: float
    rtol: float
    reason: str


@dataclass(frozen=True)
class Draw:
    """How a fresh tensor argument is drawn: normal(shift, scale) values; a positive one (a
    variance) takes |value| + ``floor``."""

    scale: float = 1.0
    shift: float = 0.0
    positive_floor: float | None = None


def default_lookup(owner: str, attr: str) -> Callable:
    """The PyTorch function as it is now (the build never patches; the package passes its originals)."""
    return resolve(owner, attr)


@dataclass(frozen=True, eq=False)
class TargetSpec:
    name: str
    tensors: tuple[str, ...]  # ABI order; the first is the main input "x"; optional ones may be None
    scalars: tuple[str, ...]  # float parameters a kernel receives (f32)
    params: tuple[str, ...]  # every parameter a signature of this kind carries
    own_params: tuple[str, ...]  # of those, forge-pack's own (not arguments of the PyTorch call)
    doc: str  # the kernel's contract, one paragraph: docs and LLM prompts
    size_vars: Callable[[Any], dict]  # signature -> integer size variables (besides numel, has_*)
    supports: Callable[[Any], str | None]  # signature -> None if targeted, else why not
    float64_reference: Callable[[Params, Tensors, Lookup], Any]  # on float64 tensors
    eager_call: Callable[[Params, str | None, Lookup], Callable[[Tensors], Any]]  # (params, out dtype)
    tolerances: dict  # output dtype -> Tolerance; dtypes absent use the generic table
    draws: dict  # tensor name -> Draw for fresh inputs (absent: Draw())
    adversarial: tuple[str, ...]  # adversarial input kinds (see inputs.ADVERSARIAL and ADVERSARIAL_SETS)
    rows: Callable[[Params, Any], tuple]  # (params, x float64) -> (rows reduced together, way back)
    permute: Callable[[Params, Any, dict, Any], Any]  # (params, x, other tensors, generator) -> x
    odd_shapes: Callable[[Any], list]  # signature -> [(x shape, channels_last)] of odd sizes to try
    call_paths: tuple[CallPath, ...] = ()
    bind: Callable[[str, tuple, dict], tuple | None] | None = None  # (style, args, kwargs) -> (tensors, params)
    # a module whose forward is the kind written as eager ops (a composite):
    # (module, args, kwargs) -> (tensors, the params a call is matched on) or None
    bind_module: Callable[[Any, tuple, dict], tuple | None] | None = None
    # model-code functions (not modules) that compute the kind as eager ops, found by name in the
    # Python modules of a model's classes and bound by ``bind_module(function, args, kwargs)``:
    composite_functions: tuple[str, ...] = ()
    composite_output: Callable[[Any], Any] | None = None  # such a function's return value -> the kernel's output
    composite_return: Callable[[Any], Any] | None = None  # the kernel's output -> what the function returns
    magnitude: Callable[[Tensors], Any] | None = None  # the eager allowance's lookup key where not |ref|
    # a second key, tried only where an output fails under the first (verdict_rules.rejudge): regions rounded in
    # 16-bit floats, keyed by each element's sensitivity to those roundings (region_sensitivity)
    sensitivity: Callable[[Tensors], Any] | None = None
    complete: Callable[[dict], tuple | None] | None = None  # parsed call kwargs: defaults in place, (error, hint)

    def reference64(self, params: Params, tensors: Tensors, lookup: Lookup | None = None):
        """The kind in float64 on the tensors' device: the yardstick for every error measurement."""
        d = {k: (v.double() if v is not None else None) for k, v in tensors.items()}
        return self.float64_reference(params, d, lookup or default_lookup)

    def eager(self, params: Params, out_dtype: str | None, lookup: Lookup | None = None) -> Callable:
        """The exact PyTorch call the model makes, as a function of the named tensors. PyTorch's
        function is looked up once, here: eager timing measures the closure, which then does no
        more per call than the model's own call does."""
        return self.eager_call(params, out_dtype, lookup or default_lookup)

    def make_inputs(self, inputs: list, kind: str, gen, device) -> dict:
        """One input set: kind "fresh" or one of ``adversarial``; ``inputs`` is
        [(name, (dtype, shape, strides) or None)] in ABI order."""
        return _inputs.make_inputs(self, inputs, kind, gen, device)

    def tolerance(self, dtype: str) -> Tolerance | None:
        return self.tolerances.get(dtype)

    def draw(self, name: str) -> Draw:
        return self.draws.get(name) or Draw()
