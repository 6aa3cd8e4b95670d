"""A region of a model's graph as a search target: its ``Signature`` and its ``TargetSpec``.

A region signature is op ``region`` with the inputs ``in0..inK`` in form order and parameters
``form`` (the canonical form: it fixes every shape, stride, dtype and constant), ``kind``,
``pattern``, ``name`` and ``domain``. ``registry.spec_for(sig)`` builds the spec from those alone
(cached by the form), so a worker process needs nothing else:

- eager call: ``Region.reference()``, the subgraph rebuilt from the form;
- float64 reference: the same graph with floating inputs and every cast inside made float64
  (boolean and integer inputs stay as they are);
- tolerance: the generic rows of ``verdict_rules.TABLE`` by output dtype (float32 1e-5 / 1e-4,
  float16 1e-4 / 2e-3, bfloat16 1e-3 / 1.6e-2), with eager's own error allowance per set;
- fresh inputs by what each input means, read from the op that consumes it: a mask added before
  a softmax or max is 0 or ``finfo.min``, a value under rsqrt / sqrt / log or a running variance is
  positive, booleans are Bernoulli(0.2), integers small and non-negative, the rest normal(0, 1);
- adversarial sets and derived sets act on the *main* input (the largest plain floating one).

The region is never reached by an eager call: ``call_paths`` and ``bind`` stay empty.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from . import inputs as _inputs
from . import region_sensitivity
from .dtypes import torch_dtype
from .lazy_torch import torch
from .spec import TargetSpec

REGION_OP = "region"
MASK_FRACTION = 0.2  # masked positions in a drawn mask: several per row, never most of it
POSITIVE_OPS = ("rsqrt", "sqrt", "log", "reciprocal")


def signature(region) -> "Signature":
    """The search target of a ``forge_pack.graph.regions.Region`` (build side only: a package never
    makes signatures, so this file stays importable inside one, vendored as ``<pkg>/_targets/``)."""
    from forge_pack.core.signature import Signature

    inputs = tuple((f"in{k}", s) for k, s in enumerate(region.input_specs))
    params = {"form": region.form, "kind": region.kind, "pattern": region.pattern, "name": region.name,
              "domain": region.domain}
    return Signature(REGION_OP, inputs, tuple(sorted(params.items())), region.output_spec)


def is_region(sig: Any) -> bool:
    return getattr(sig, "op", None) == REGION_OP


def _base(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) == 3 else parts[0]


# the reductions through a row's max: an additive mask of -inf (or finfo.min) hides elements from them
MAX_REDUCTIONS = ("softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax", "amax")


def roles(form: dict) -> list[str]:
    """What each input means, from the ops that read it: mask | positive | bool | int | data."""
    ops = form["ops"]
    names = [_base(o["op"]) for o in ops]
    reduces_max = any(n in MAX_REDUCTIONS for n in names)
    out = []
    for k, spec in enumerate(form["inputs"]):
        dtype = spec["dtype"]
        if dtype == "bool":
            out.append("bool")
            continue
        if not dtype.startswith(("float", "bfloat")):
            out.append("int")
            continue
        role = "data"
        numel = _numel(spec["shape"])
        for j, o in enumerate(ops):
            refs = [i for i, a in enumerate(o["args"]) if a == {"in": k}]
            if not refs:
                continue
            n = names[j]
            if n in POSITIVE_OPS or (n == "pow" and isinstance(o["args"][1], float) and o["args"][1] % 1):
                role = "positive"
            elif n in ("_native_batch_norm_legit_no_training", "batch_norm", "native_batch_norm") and 4 in refs:
                role = "positive"
            elif n in ("add", "masked_fill", "where") and reduces_max and _smaller_than_partner(form, o, k, numel):
                role = "mask"
        out.append(role)
    return out


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _smaller_than_partner(form: dict, op: dict, k: int, numel: int) -> bool:
    """A mask is broadcast over the scores (fewer elements than an input it is added to), or, beside an operand
    of its own size or an intermediate (whose size the form does not say), the second operand of the add."""
    tensors = [a for a in op["args"] if isinstance(a, dict) and ("n" in a or (
        "in" in a and form["inputs"][a["in"]]["dtype"] != "bool"))]  # where's condition is no operand of a sum
    if len(tensors) < 2:
        return False
    sizes = [_numel(form["inputs"][a["in"]]["shape"]) for a in tensors if "in" in a]  # (its own is numel)
    if any(n > numel for n in sizes):
        return True
    if any(n < numel for n in sizes):  # the other input is the one broadcast over this one
        return False
    return tensors.index({"in": k}) == 1


def main_input(form: dict) -> int:
    """The input the adversarial and derived transforms act on: the largest plain floating one."""
    r = roles(form)
    best, size = 0, -1
    for k, spec in enumerate(form["inputs"]):
        n = _numel(spec["shape"])
        if r[k] == "data" and n > size:
            best, size = k, n
    return best


class RegionSpec(TargetSpec):
    """A ``TargetSpec`` whose fields come from one region's form (see the module doc)."""

    region = True

    def __init__(self, form: dict, kind: str):
        # a frozen dataclass: its own fields go through object.__setattr__
        object.__setattr__(self, "form_", form)
        object.__setattr__(self, "roles", roles(form))
        object.__setattr__(self, "main", f"in{main_input(form)}")
        object.__setattr__(self, "_graphs", {})
        object.__setattr__(self, "_units", [])  # [region_sensitivity.rounding_units(...)] once known
        n = len(form["inputs"])
        names = tuple(f"in{k}" for k in range(n))
        # -inf in the main input: softmax's masked rows (SDPA's math path's _safe_softmax among them: rows of
        # -inf are what it is for), and a max pool's windows that hold only -inf
        maxy = any(_base(o["op"]) in (*MAX_REDUCTIONS, "max_pool2d", "max_pool2d_with_indices") for o in form["ops"])
        adversarial = ("large", "constant") + (("neg_inf_rows",) if maxy else ()) if kind != "pointwise" else (
            "large",)
        super().__init__(
            name=REGION_OP, tensors=names, scalars=(), params=("domain", "form", "kind", "name", "pattern"),
            own_params=("domain", "form", "kind", "name", "pattern"),
            doc=("A fused region: out = the subgraph below, called with the inputs in0..inK in form order; out is "
                 "one tensor with the output's dtype, shape and strides. Every shape and stride is fixed."),
            size_vars=_size_vars, supports=_supports, float64_reference=self._ref64, eager_call=self._eager,
            tolerances={}, draws={}, adversarial=adversarial, rows=self._rows, permute=_permute_flat,
            odd_shapes=lambda sig: [], sensitivity=self._sensitivity)

    # -- the references
    def graph(self, device, upcast: bool):
        canonical = _canonical()

        key = (str(device), upcast)
        if key not in self._graphs:
            self._graphs[key] = canonical.rebuild(self.form_, str(device), upcast=upcast)
        return self._graphs[key]

    def _call(self, t: dict, upcast: bool):
        args = [t[f"in{k}"] for k in range(len(self.form_["inputs"]))]
        return self.graph(args[0].device if args else "cpu", upcast)(*args)

    def _ref64(self, params, t, lookup):
        return self._call(t, True)

    def reference64(self, params, tensors, lookup=None):
        """Floating inputs upcast to float64; boolean and integer ones kept (a mask stays a mask)."""
        d = {k: (v.double() if v is not None and v.is_floating_point() else v) for k, v in tensors.items()}
        return self._call(d, True).double()

    def _eager(self, params, out_dtype, lookup):
        return lambda t: self._call(t, False)

    def _sensitivity(self, tensors: dict):
        """The eager allowance's second key (``verdict_rules.rejudge``): ``region_sensitivity.sensitivity_key`` for
        a region that eager rounds in a 16-bit float, else None."""
        if not self._units:
            self._units.append(region_sensitivity.rounding_units(
                _canonical().rebuild(self.form_, "meta"), self.form_["inputs"]))
        if self._units[0] is None:
            return None
        units, out_unit = self._units[0]
        d = {k: (v.double() if v is not None and v.is_floating_point() else v) for k, v in tensors.items()}
        args = [d[f"in{k}"] for k in range(len(self.form_["inputs"]))]
        graph = self.graph(args[0].device if args else "cpu", True)
        return region_sensitivity.sensitivity_key(graph, units, out_unit, args, graph(*args))

    # -- inputs
    def make_inputs(self, inputs: list, kind: str, gen, device) -> dict:
        t: dict[str, Any] = {}
        for (name, s), role in zip(inputs, self.roles):
            t[name] = _draw(s, role, gen, device)
        if kind != "fresh":
            _inputs.ADVERSARIAL[kind](t[self.main])
        return t

    def _rows(self, params, xf):
        cols = _cols(params)
        if cols and xf.numel() % cols == 0 and xf.shape and xf.numel() >= cols:
            shape = tuple(xf.shape)
            return xf.reshape(-1, cols), lambda r: r.reshape(shape)
        shape = tuple(xf.shape)
        return xf.reshape(1, -1), lambda r: r.reshape(shape)


def _cols(params: dict) -> int:
    d = params.get("domain") or {}
    if not d:
        return 0
    n = 1
    for i in d["dims"]:
        n *= int(d["shape"][i])
    return n


def _permute_flat(params, xf, others, gen):
    """Any element order of the main input is another valid input of the region (drawn from small
    permutations above ``inputs.FULL_PERM`` elements: a GB input's whole randperm took minutes)."""
    return _inputs.flat_permuted(xf.reshape(-1), gen).reshape(xf.shape)


def _draw(s, role: str, gen, device):
    if s is None:
        return None
    dtype, shape, strides = s
    out = _inputs.empty(s, device)
    if role == "bool":
        out.copy_(torch.rand(tuple(shape), generator=gen) < MASK_FRACTION)
    elif role == "int":
        out.copy_(torch.randint(0, 4, tuple(shape), generator=gen))
    elif role == "mask":
        lo = torch.finfo(torch_dtype(dtype)).min
        masked = torch.rand(tuple(shape), generator=gen) < MASK_FRACTION
        out.copy_(torch.where(masked, torch.tensor(lo), torch.tensor(0.0)))
    elif role == "positive":
        out.copy_(_inputs.standard_normal(tuple(shape), gen).abs_() + 0.1)
    else:
        out.copy_(_inputs.standard_normal(tuple(shape), gen))
    return out


def _size_vars(sig) -> dict:
    d = sig.param("domain") or {}
    e: dict[str, int] = {}
    if d:
        total = _numel(d["shape"])
        cols = _cols({"domain": d})
        e.update(rows=total // max(cols, 1), cols=cols)
    return e


def _supports(sig) -> str | None:
    out = sig.output
    if out is None:
        return "the output is not one tensor"
    if out.dtype not in ("float32", "float16", "bfloat16"):
        return f"output dtype {out.dtype} is not targeted"
    if out.numel == 0:
        return "empty output"
    return None


def _canonical():
    """forge_pack.graph.canonical, or in a package its verbatim copy <pkg>/_graph/canonical.py (both are
    this package's sibling: forge_pack.targets / forge_pack.graph, <pkg>._targets / <pkg>._graph)."""
    try:
        from ..graph import canonical
    except ImportError:
        try:
            from .._graph import canonical
        except ImportError:  # loaded as a top-level package under a private name (templates/package run
            from forge_pack.graph import canonical  # from forge-pack's source tree, in its own tests)
    return canonical


@lru_cache(maxsize=64)
def _spec(key: str, kind: str) -> RegionSpec:
    return RegionSpec(json.loads(key), kind)


def spec_for(sig) -> RegionSpec:
    form = sig.param("form")
    return _spec(json.dumps(form, sort_keys=True), str(sig.param("kind")))


def spec_for_params(params: dict) -> RegionSpec:
    """The spec of a region from its signature's parameters (a package's manifest entry)."""
    return _spec(json.dumps(params["form"], sort_keys=True), str(params["kind"]))
