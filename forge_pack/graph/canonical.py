"""The canonical, self-contained form of a region's subgraph, and the graph rebuilt from it.

A region's form lists its inputs (dtype, shape, strides) and its ops in a canonical topological
order, each op with its arguments normalised: tensors are references (``{"in": k}`` for the
region's k-th input, ``{"n": j}`` for its j-th op), floats are kept exactly (inf and nan spelled
out, as JSON has neither), dims are non-negative, devices are dropped (a region is the same
computation on any device; the device is given back when the graph is rebuilt). Its JSON text
is the key; the hash of the key names the region. The form rebuilds an FX graph by itself (``rebuild``), so a worker process can run
a region's references from the JSON alone.

Torch only, and only relative imports: every package ships this file verbatim (with ``opclass``
and ``region_match``) as ``<pkg>/_graph/``, so its compile mode finds a region with the very
code that named it (forge_pack/pack/packager.py records each file's sha256).
"""

from __future__ import annotations

import hashlib
import json
import operator
from typing import Any

import torch
import torch.fx

from . import opclass

DIM_ARG_OPS = frozenset({"sum", "mean", "amax", "amin", "var", "std", "var_mean", "std_mean", "prod", "logsumexp",
                         "softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax", "argmax", "argmin",
                         "any", "all", "max", "min", "norm", "linalg_vector_norm"})
DEVICE = "<device>"


def op_name(n: torch.fx.Node) -> str:
    """A node's op as the form spells it: 'aten.add.Tensor', 'prims.convert_element_type.default',
    'getitem'; 'placeholder' and 'get_attr' for those nodes."""
    if n.op == "placeholder":
        return "placeholder"
    if n.op == "get_attr":
        return "get_attr"
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._opname}.{t._overloadname}"
    if isinstance(t, torch._ops.OpOverloadPacket):
        return f"aten.{t._qualified_op_name.split('::')[-1]}.default"
    return getattr(t, "__name__", str(t))


def tensor_spec(v) -> dict | None:
    """{dtype, shape, strides} of a tensor whose sizes and strides are plain ints (TensorSpec.to_json's
    layout); None for anything else (a symbolic size stands for sizes no form names)."""
    if not isinstance(v, torch.Tensor):
        return None
    shape, strides = list(v.shape), list(v.stride())
    if not all(type(d) is int for d in shape + strides):
        return None
    return {"dtype": str(v.dtype).replace("torch.", ""), "shape": shape, "strides": strides}


def canonical_order(nodes: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """A topological order that does not depend on how the tracer interleaved independent ops:
    Kahn's algorithm, ties broken by the op name, then by the graph order."""
    inside = set(nodes)
    position = {n: i for i, n in enumerate(nodes)}
    deps = {n: {a for a in n.all_input_nodes if a in inside} for n in nodes}
    done: list[torch.fx.Node] = []
    ready = [n for n in nodes if not deps[n]]
    while ready:
        ready.sort(key=lambda n: (op_name(n), position[n]))
        n = ready.pop(0)
        done.append(n)
        for m in n.users:
            if m in inside:
                deps[m].discard(n)
                if not deps[m] and m not in ready:
                    ready.append(m)
    return done


def form(nodes: list[torch.fx.Node], input_specs: dict[torch.fx.Node, dict],
         order: list[torch.fx.Node] | None = None) -> tuple[dict, list[torch.fx.Node]]:
    """(the canonical form, the region's input nodes in form order) of these region nodes; ``order``: the
    nodes in a given op order instead of ``canonical_order``'s (a matcher that has paired each node with
    an op of a known form, whose tie-breaks between independent branches came from another tracer)."""
    order = canonical_order(nodes) if order is None else order
    index = {n: j for j, n in enumerate(order)}
    inputs: list[torch.fx.Node] = []

    def ref(a: torch.fx.Node) -> dict:
        if a in index:
            return {"n": index[a]}
        if a not in inputs:
            inputs.append(a)
        return {"in": inputs.index(a)}

    ops = []
    for n in order:
        ndim = _ndim(n.args[0]) if n.args and isinstance(n.args[0], torch.fx.Node) else None
        args = [_norm(a, ref) for a in n.args]
        name = opclass.base_name(op_name(n))
        if name in DIM_ARG_OPS and ndim and len(args) > 1 and _is_dims(args[1]):
            args[1] = _pos_dims(args[1], ndim)
        kwargs = {k: _norm(v, ref) for k, v in sorted(n.kwargs.items()) if k != "device"}
        if "dim" in kwargs and name in DIM_ARG_OPS and ndim and _is_dims(kwargs["dim"]):
            kwargs["dim"] = _pos_dims(kwargs["dim"], ndim)
        ops.append({"op": op_name(n), "args": args, "kwargs": kwargs})
    body = {"inputs": [input_specs[a] for a in inputs], "ops": ops}
    return body, inputs


def key(body: dict) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def digest(body: dict) -> str:
    return hashlib.sha256(key(body).encode()).hexdigest()


def _ndim(n: torch.fx.Node) -> int | None:
    val = n.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dim()
    spec = n.meta.get("forge_spec")
    return len(spec.shape) if spec is not None else None


def _is_dims(a: Any) -> bool:
    return (isinstance(a, int) and not isinstance(a, bool)) or (
        isinstance(a, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in a))


def _pos_dims(a: Any, ndim: int) -> Any:
    if isinstance(a, list):
        return sorted(d % ndim for d in a)
    return a % ndim


def _norm(a: Any, ref) -> Any:
    if isinstance(a, torch.fx.Node):
        return ref(a)
    if isinstance(a, bool) or a is None or isinstance(a, (int, str)):
        return a
    if isinstance(a, float):
        if a != a or a in (float("inf"), float("-inf")):
            return {"float": repr(a)}  # JSON has no inf/nan
        return a  # exact: finfo(float32).min rounded to 9 digits no longer fits in a float32
    if isinstance(a, (list, tuple)):
        return [_norm(x, ref) for x in a]
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).replace("torch.", "")}
    if isinstance(a, torch.device):
        return DEVICE
    if isinstance(a, (torch.memory_format, torch.layout)):
        return {"enum": str(a).replace("torch.", "")}
    return {"repr": repr(a)}


# --- rebuild -------------------------------------------------------------------------------------

def resolve_op(name: str):
    if name == "getitem":
        return operator.getitem
    ns, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), packet), overload)


def rebuild(body: dict, device: str = "cpu", upcast: bool = False) -> torch.fx.GraphModule:
    """The region's subgraph from its form. ``upcast``: every floating dtype constant becomes
    float64, so casts inside the region keep float64 (the float64 reference)."""
    g = torch.fx.Graph()
    ins = [g.placeholder(f"in{k}") for k in range(len(body["inputs"]))]
    made: list[torch.fx.Node] = []

    def back(a: Any) -> Any:
        if isinstance(a, list):
            return [back(x) for x in a]
        if isinstance(a, dict):
            if "in" in a:
                return ins[a["in"]]
            if "n" in a:
                return made[a["n"]]
            if "dtype" in a:
                dt = getattr(torch, a["dtype"])
                return torch.float64 if upcast and dt.is_floating_point else dt
            if "float" in a:
                return float(a["float"])
            if "enum" in a:
                return getattr(torch, a["enum"])
            raise ValueError(f"cannot rebuild argument {a}")
        if a == DEVICE:
            return torch.device(device)
        return a

    for entry in body["ops"]:
        target = resolve_op(entry["op"])
        args = tuple(back(a) for a in entry["args"])
        kwargs = {k: back(v) for k, v in entry["kwargs"].items()}
        if "device" in _schema_kwargs(target) and "device" not in kwargs and not _has_tensor(args):
            kwargs["device"] = torch.device(device)  # a generator (full, arange) inside the region
        made.append(g.call_function(target, args, kwargs))
    g.output(made[-1])
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _schema_kwargs(target) -> set[str]:
    schema = getattr(target, "_schema", None)
    return {a.name for a in schema.arguments if a.kwarg_only} if schema is not None else set()


def _has_tensor(args: tuple) -> bool:
    return any(isinstance(a, torch.fx.Node) or (isinstance(a, list) and any(isinstance(x, torch.fx.Node) for x in a))
               for a in args)
