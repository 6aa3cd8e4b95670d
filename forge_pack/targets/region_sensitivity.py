"""How sensitive each output element of a region is to the roundings eager PyTorch makes inside it: the eager
allowance's second lookup key (``TargetSpec.sensitivity``) for regions computed in 16-bit floats, tried where an
output fails under |reference| (``verdict_rules.rejudge``).

Why. The allowance lets an element err up to 2x the largest error eager itself makes on elements of no
larger magnitude (``verdict_rules.eager_allowance``). Keyed by |reference|, that is right for one op
rounded once. A region rounds after every op, as eager does: in ``layer_norm(x) * 2 + 1`` in bf16 the
product is rounded near 1 (a step of 2^-8) before the sum cancels it to, say, 0.013. Every such element
errs by a step of the intermediate, eager's and an exact copy of eager's alike, but its |reference|
bucket holds the few elements near 0.013, where eager happened to err less: an honest kernel, one
fp32 summation order away from eager, failed there (1 element of 480).

What. For each op whose result eager rounds (a floating result that is not a view), the float64 reference
is run again with that op's result alone moved by one step of the dtype eager computes it in (2 unit
roundoffs, relative), each element up or down at random (seeded, so the build and the package's verify
agree). An element's sensitivity is the sum over those ops of how far it moved, in units of the output
dtype's roundoff: about |reference| for an element rounded once, far more where a large intermediate
cancels. One op per run, so two ops' moves never cancel by chance; each element's own move random, as
roundings are (a move of a whole row alike would vanish in a normalisation). The key is max(|reference|,
sensitivity): the element above is bucketed with the elements whose intermediates were near 1, and its
allowance is eager's own error there; an element no rounding moves keeps its |reference| key, as before.
Cost: one float64 run per rounding op (measured on 2 CPU cores: 2.9 s for a 5-op bf16 mask + softmax over
2x8x512x512, 17x its reference; 8.5 s for an 11-op group norm + SiLU over 1x128x256x256), which is why it is a
second key, computed only for an output that fails under the first, and only for 16-bit regions.

The key only decides which elements' eager errors an element is measured against; the allowance is
still eager's own measured error, and the rtol / atol rows are unchanged. Regions whose every op is
float32 or wider keep |reference| (None here): their intermediates' roundings (2^-24) are far below
the float32 atol.

Torch only: packages ship this file in ``<pkg>/_targets/`` with ``region_target``.
"""

from __future__ import annotations

from typing import Any

from .lazy_torch import torch

SEED = 0x5EED  # fixed: a set's key is the same in the build and in the package's verify
_UNITS = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
SIXTEEN_BIT = 2.0 ** -11  # units at least this large: a dtype the key is for


def _unit(v: Any) -> float | None:
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return _UNITS.get(str(v.dtype).replace("torch.", ""))
    return None


def _is_view(target: Any) -> bool:
    """An op whose result aliases its input (view, permute, expand, ...): eager rounds nothing there."""
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _units_of(v: Any) -> Any:
    """The unit roundoff of each floating result of an op (a tuple for an op of several results)."""
    if isinstance(v, (tuple, list)):
        return tuple(_units_of(x) for x in v)
    return _unit(v)


def _flat(u: Any) -> list:
    return [x for y in u for x in _flat(y)] if isinstance(u, tuple) else [u]


def rounding_units(graph: Any, specs: list) -> tuple[list, float] | None:
    """Per op of ``graph`` (the region rebuilt in its own dtypes), the unit roundoff eager rounds that op's result
    to (None where it rounds nothing: views, getitem, integer and boolean results; a tuple for an op of several
    results), and the output's; from a run on meta tensors of the form's input specs (dtype, shape, strides).
    None when an op cannot run on meta tensors or nothing is rounded in a 16-bit float."""
    args = [torch.empty_strided(tuple(s["shape"]), tuple(s["strides"]), dtype=getattr(torch, s["dtype"]),
                                device="meta") for s in specs]
    units: list = []

    class Units(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op == "call_function":
                exact = _is_view(n.target) or getattr(n.target, "__name__", "") == "getitem"
                units.append(None if exact else _units_of(out))
            return out

    try:
        result = Units(graph).run(*args)
    except Exception:  # an op without a meta kernel: no key, |reference| as for any op
        return None
    out_unit = _unit(result)
    if out_unit is None or not any(u is not None and u >= SIXTEEN_BIT for u in _flat(tuple(units))):
        return None
    return units, out_unit


def _perturbed(v: Any, unit: Any, gen: Any) -> Any:
    """v with every element moved one step of its dtype (2 unit roundoffs, relative), up or down at random: two
    correct roundings of nearly the same value (eager's, and a kernel's that summed in another order) differ by
    up to this much, element by element (a move of all elements alike would vanish in a normalisation)."""
    if isinstance(v, (tuple, list)):
        return type(v)(_perturbed(x, w, gen) for x, w in zip(v, unit))
    if unit is None or not (isinstance(v, torch.Tensor) and v.is_floating_point()):
        return v
    sign = torch.empty(v.shape, dtype=v.dtype, device=v.device).bernoulli_(0.5, generator=gen).mul_(2).sub_(1)
    return v * sign.mul_(2 * unit).add_(1)


def sensitivity_key(graph64: Any, units: list, out_unit: float, args: list, ref: Any) -> Any:
    """max(|ref|, S / ``out_unit``) as float32 of ref's shape, S the sum over the ops eager rounds of how far
    the float64 reference graph ``graph64`` (on ``args``) moves from ``ref`` when that op's result alone moves
    one step per element (``_perturbed``): about how far roundings inside the region can move an element. One
    run per rounding op, each op alone, so that no two ops' moves cancel by chance; within a run an element's
    own move dominates what a reduction gathers from the others. |ref| where an element or its move is not
    finite."""
    class Moved(torch.fx.Interpreter):  # the graph with the result of its ``source``-th op moved
        def __init__(self, source: int, gen: Any):
            super().__init__(graph64)
            self.source, self.gen, self.at = source, gen, 0

        def run_node(self, n):
            out = super().run_node(n)
            if n.op == "call_function":
                if self.at == self.source:
                    out = _perturbed(out, units[self.source], self.gen)
                self.at += 1
            return out

    ref = ref.double()
    total = torch.zeros_like(ref)
    for source in [k for k, u in enumerate(units) if u is not None]:
        gen = torch.Generator(device=ref.device).manual_seed(SEED + source)
        dev = (Moved(source, gen).run(*args).double() - ref).abs_()
        total.add_(torch.where(torch.isfinite(dev), dev, torch.zeros_like(dev)))
        del dev
    key = torch.maximum(ref.abs(), total.div_(out_unit))
    key = torch.where(torch.isfinite(ref), key, ref.abs())
    return key.clamp_(max=torch.finfo(torch.float32).max).float()
