"""Capture a model's forward on its real inputs as an ATen-level FX graph.

Routes, tried in this order (the first that succeeds is recorded in ``Graph.route``):
1. ``export``: ``torch.export.export(strict=False)`` then ``run_decompositions({})``: one
   functional graph whose placeholders are named parameters, buffers and user inputs; composite
   ops (linear, group_norm, softmax, sdpa) stay whole, which is the granularity regions want.
   It fails on data-dependent control flow (an MoE router loop over ``nonzero``).
2. ``make_fx``: the forward traced with real tensors under functionalisation: Python control
   flow simply runs, so anything eager can run traces (specialised to these inputs). Composite
   ops come out decomposed (``native_group_norm``, ``addmm``, ``_softmax``).
3. ``dynamo``: ``torch.compile`` with an AOT backend that keeps every forward graph; graph breaks
   give several graphs, joined into one. Dynamo hands its backend the real tensors of the call,
   which feed the AOT graph when its inputs are exactly dynamo's (else the graph has no values).

Every node's output dtype, shape and strides come from running the graph once on the real
tensors (from the fake ``meta['val']`` on the dynamo route). Per-node time comes from a
profiler run of the eager model, its aten calls matched to nodes in order (``timing``).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch.utils import _pytree as pytree

from forge_pack.core.errors import ForgeError
from forge_pack.graph import opclass
from forge_pack.graph.canonical import op_name  # noqa: F401  (re-exported: the graph's op spelling)
from forge_pack.core.signature import TensorSpec

ROUTES = ("export", "make_fx", "dynamo")
ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                 "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}


def spec_of(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(str(t.dtype).replace("torch.", ""), tuple(int(s) for s in t.shape),
                      tuple(int(s) for s in t.stride()))


def spec_bytes(spec: TensorSpec | None) -> int:
    if spec is None:
        return 0
    return spec.numel * ELEMENT_BYTES.get(spec.dtype, 4)


def _specs(value: Any) -> tuple[TensorSpec | None, ...]:
    if isinstance(value, torch.Tensor):
        return (spec_of(value),)
    if isinstance(value, (tuple, list)):
        return tuple(spec_of(v) if isinstance(v, torch.Tensor) else None for v in value)
    return ()


@dataclass
class GraphNode:
    name: str
    op: str  # "aten.add.Tensor", "getitem"; placeholders: "placeholder"
    kind: str  # opclass.classify, or "placeholder"
    inputs: tuple[str, ...]  # producer node names, in argument order
    outputs: tuple[TensorSpec | None, ...]
    users: tuple[str, ...]
    module: str = ""  # the nn.Module path that called it, when the route records one
    source: str = ""  # placeholders: "param:layer.weight", "buffer:...", "input:0"
    time_us: float = 0.0  # per forward
    time_source: str = ""  # "profile" | "estimate" | "" (placeholders, bookkeeping)

    @property
    def output(self) -> TensorSpec | None:
        return self.outputs[0] if self.outputs else None

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "kind": self.kind, "inputs": list(self.inputs),
                "outputs": [o.to_json() if o else None for o in self.outputs], "users": list(self.users),
                "module": self.module, "source": self.source, "time_us": self.time_us,
                "time_source": self.time_source}


@dataclass
class Graph:
    gm: torch.fx.GraphModule
    nodes: dict[str, GraphNode]  # in graph (topological) order
    values: list[Any] | None  # real placeholder values in order; None when the route could not keep them
    route: str
    device: str
    attempts: list[tuple[str, str]] = field(default_factory=list)  # (route, "ok" or why it failed)
    time_source: str = "estimate"  # "profile" | "profile+estimate" | "estimate"
    profiled_fraction: float = 0.0  # of compute nodes matched to a profiler event
    forward_us: float = 0.0  # measured per forward by the profiler (0 when not profiled)
    notes: list[str] = field(default_factory=list)
    # The captured graph's outputs against the eager forward's: "equal", "max abs diff X", or why
    # they were not compared. A graph that computes something else would give wrong regions.
    output_check: str = ""

    def fx_node(self, name: str) -> torch.fx.Node:
        for n in self.gm.graph.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def total_us(self) -> float:
        return sum(n.time_us for n in self.nodes.values())

    def run(self, keep: Iterable[str] = ()) -> dict[str, Any]:
        """Run the graph on its real values; return the values of the nodes named in ``keep``."""
        if self.values is None:
            raise ValueError(f"the {self.route} route keeps no real values: run regions on generated inputs")
        rec = _Recorder(self.gm, set(keep))
        with torch.no_grad():
            rec.run(*self.values)
        return rec.kept

    def to_json(self) -> dict:
        return {"route": self.route, "device": self.device, "attempts": [list(a) for a in self.attempts],
                "time_source": self.time_source, "profiled_fraction": self.profiled_fraction,
                "forward_us": self.forward_us, "total_us": self.total_us, "notes": self.notes,
                "output_check": self.output_check,
                "nodes": [n.to_json() for n in self.nodes.values()]}


class _Recorder(torch.fx.Interpreter):
    """Runs the graph, recording each node's output specs and keeping the values asked for."""

    def __init__(self, gm: torch.fx.GraphModule, keep: set[str]):
        super().__init__(gm, garbage_collect_values=True)
        self.keep, self.kept, self.specs = keep, {}, {}
        self.result: Any = None

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        self.specs[n.name] = _specs(out)
        if n.name in self.keep:
            self.kept[n.name] = out
        if n.op == "output":
            self.result = out
        return out


def capture(module: torch.nn.Module, args: tuple, kwargs: dict | None = None,
            routes: Iterable[str] = ROUTES, profile: bool = True, iterations: int = 2) -> Graph:
    """The model's forward as an ATen graph, every node with specs and a time per forward."""
    kwargs = dict(kwargs or {})
    args = tuple(args)
    device = _device_of(module, args, kwargs)
    attempts: list[tuple[str, str]] = []
    for route in routes:
        try:
            with torch.no_grad():
                gm, values, sources = TRACERS[route](module, args, kwargs)
        except Exception as e:  # a route that cannot trace this model: say why, try the next
            attempts.append((route, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"))
            continue
        attempts.append((route, "ok"))
        graph, outputs = _build(gm, values, sources, route, device)
        graph.attempts = attempts
        graph.output_check = _check_outputs(outputs, module, args, kwargs, gm.meta.get("forge_graph_count", 1))
        del outputs
        if profile:
            from forge_pack.graph.timing import attach_times
            attach_times(graph, module, args, kwargs, iterations)
        else:
            from forge_pack.graph.timing import estimate_times
            estimate_times(graph)
        return graph
    raise ForgeError("no graph capture route worked for this model: "
                     + "; ".join(f"{r}: {why}" for r, why in attempts),
                     "the op profile does not need a graph; run the forward under torch.export or "
                     "torch.compile yourself to see where tracing stops")


def _device_of(module: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    for t in list(module.parameters()) + list(module.buffers()) + pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            return t.device.type
    return "cpu"


# --- routes --------------------------------------------------------------------------------------

def _trace_export(module, args, kwargs):
    ep = torch.export.export(module, args, kwargs, strict=False)
    ep = ep.run_decompositions({})
    user = iter(pytree.tree_leaves((args, kwargs)))
    values, sources = [], []
    for i, spec in enumerate(ep.graph_signature.input_specs):
        kind = spec.kind.name
        if kind in ("PARAMETER", "BUFFER"):
            v = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
            sources.append(f"{'param' if kind == 'PARAMETER' else 'buffer'}:{spec.target}")
        elif kind == "CONSTANT_TENSOR":
            v = ep.constants[spec.target]
            sources.append(f"constant:{spec.target}")
        elif kind == "USER_INPUT":
            v = next(user)
            sources.append(f"input:{len([s for s in sources if s.startswith('input:')])}")
        else:
            raise RuntimeError(f"unsupported export input kind {kind}")
        values.append(v)
    return ep.graph_module, values, sources


def _trace_make_fx(module, args, kwargs):
    from torch.fx.experimental.proxy_tensor import make_fx

    state = dict(module.named_parameters(remove_duplicate=False))
    params = set(state)
    state.update(module.named_buffers(remove_duplicate=False))
    leaves, spec = pytree.tree_flatten((state, args, kwargs))
    names = list(state) + [None] * (len(leaves) - len(state))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def forward(*tensors):
        filled = list(leaves)
        for i, t in zip(where, tensors):
            filled[i] = t
        s, a, k = pytree.tree_unflatten(filled, spec)
        return torch.func.functional_call(module, s, a, k)

    options = {"tracing_mode": "real"}
    accepted = inspect.signature(make_fx).parameters
    if "record_module_stack" in accepted:
        options["record_module_stack"] = True
    if "_error_on_data_dependent_ops" in accepted:  # real values: `if x.sum() > 0` just takes its branch
        options["_error_on_data_dependent_ops"] = False
    gm = make_fx(torch.func.functionalize(forward), **options)(*[leaves[i] for i in where])
    sources, k = [], 0
    for i in where:
        if names[i] is not None:
            sources.append(("param:" if names[i] in params else "buffer:") + names[i])
        else:
            sources.append(f"input:{k}")
            k += 1
    return gm, [leaves[i] for i in where], sources


def _trace_dynamo(module, args, kwargs):
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[torch.fx.GraphModule] = []
    feeds: list[list | None] = []
    names: list[list[str]] = []

    def backend(gm, example_inputs):
        real = list(example_inputs)  # dynamo hands the backend the real tensors of this call
        dynamo_names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]

        def keep(fw_gm, fake_inputs):
            graphs.append(fw_gm)
            feeds.append(real if _inputs_fit(fw_gm, real) else None)
            names.append(dynamo_names)
            return fw_gm.forward

        return aot_autograd(fw_compiler=keep)(gm, example_inputs)

    torch._dynamo.reset()
    try:
        compiled = torch.compile(module, backend=backend, dynamic=False)
        compiled(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    if not graphs:
        raise RuntimeError("dynamo produced no graph")
    joined = _join(graphs)
    joined.meta["forge_graph_count"] = len(graphs)
    if any(f is None for f in feeds):
        return joined, None, None
    sources = [f"dynamo:{n}" for ns in names for n in ns]
    return joined, [t for f in feeds for t in f], sources


def _inputs_fit(gm: torch.fx.GraphModule, real: list) -> bool:
    """Whether the AOT graph takes exactly dynamo's inputs, in order (so the real ones feed it)."""
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(ph) != len(real):
        return False
    for n, t in zip(ph, real):
        val = n.meta.get("val")
        if isinstance(t, torch.Tensor) != isinstance(val, torch.Tensor):
            return False
        if isinstance(t, torch.Tensor) and (tuple(t.shape) != tuple(val.shape) or t.dtype != val.dtype):
            return False
    return True


def _join(graphs: list[torch.fx.GraphModule]) -> torch.fx.GraphModule:
    """One graph holding every dynamo graph (after graph breaks), placeholders prefixed g<k>_."""
    joined = torch.fx.Graph()
    outs = []
    for k, gm in enumerate(graphs):
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        for n in gm.graph.nodes:
            if n.op == "output":
                outs.extend(pytree.tree_leaves(torch.fx.node.map_arg(n.args[0], lambda a: env[a])))
                continue
            new = joined.node_copy(n, lambda a: env[a])
            if n.op == "placeholder" and len(graphs) > 1:
                new.name = new.target = f"g{k}_{n.name}"
            env[n] = new
    joined.output(tuple(o for o in outs if isinstance(o, torch.fx.Node)))
    root = torch.nn.Module()
    for gm in graphs:  # get_attr targets of the AOT graphs
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                setattr(root, n.target, getattr(gm, n.target))
    return torch.fx.GraphModule(root, joined)


TRACERS: dict[str, Callable] = {"export": _trace_export, "make_fx": _trace_make_fx, "dynamo": _trace_dynamo}


# --- graph -> nodes ------------------------------------------------------------------------------

def _drop_bookkeeping(gm: torch.fx.GraphModule) -> None:
    for n in reversed(list(gm.graph.nodes)):
        if n.op == "call_function" and not n.users and opclass.classify(op_name(n)) == "bookkeeping":
            gm.graph.erase_node(n)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _module_path(n: torch.fx.Node) -> str:
    stack = n.meta.get("nn_module_stack")
    if not stack:
        return ""
    last = list(stack.values())[-1]
    path = last[0] if isinstance(last, tuple) else str(last)
    return re.sub(r"^L\['[^']*'\]\.?", "", path).replace("L__self___", "")


def _build(gm, values, sources, route: str, device: str) -> Graph:
    _drop_bookkeeping(gm)
    specs: dict[str, tuple] = {}
    notes: list[str] = []
    outputs: Any = None
    if values is not None:
        rec = _Recorder(gm, set())
        try:
            with torch.no_grad():
                rec.run(*values)
            specs, outputs = rec.specs, rec.result
        except Exception as e:  # the capture is kept; specs fall back to the tracer's fake values
            notes.append(f"running the captured graph failed ({type(e).__name__}: {e}); specs from meta")
    nodes: dict[str, GraphNode] = {}
    ph = 0
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        name = op_name(n)
        kind = "placeholder" if n.op in ("placeholder", "get_attr") else opclass.classify(name, n.args, n.kwargs)
        outs = specs.get(n.name) or _specs(n.meta.get("val"))
        if outs and outs[0] is not None:
            n.meta["forge_spec"] = outs[0]  # measured, for the passes that read the fx graph
        source = ""
        if n.op == "placeholder":
            source = sources[ph] if sources else f"input:{ph}"
            ph += 1
        elif n.op == "get_attr":
            source = f"constant:{n.target}"
        inputs = tuple(a.name for a in n.all_input_nodes)
        nodes[n.name] = GraphNode(n.name, name, kind, inputs, tuple(outs), tuple(u.name for u in n.users),
                                  _module_path(n), source)
    return Graph(gm, nodes, values, route, device, notes=notes), outputs


def _check_outputs(outputs: Any, module, args: tuple, kwargs: dict, module_graphs: int = 1) -> str:
    """Compare the graph's outputs with one eager forward's, tensor by tensor in pytree order."""
    if outputs is None:
        return "not compared: the graph was not run on real values"
    if module_graphs > 1:
        return f"not compared: {module_graphs} graphs around graph breaks (their outputs include intermediates)"
    with torch.no_grad():
        eager = module(*args, **kwargs)
    got = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    want = [t for t in pytree.tree_leaves(eager) if isinstance(t, torch.Tensor)]
    if len(got) < len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        return f"not compared: {len(got)} graph outputs against {len(want)} eager ones"
    worst = 0.0
    for g, w in zip(got, want):  # the graph may also return mutated buffers after the user outputs
        if g.is_floating_point() or w.is_floating_point():
            diff = (g.double() - w.double()).abs().nan_to_num(nan=float("inf"), posinf=0.0, neginf=0.0)
            same_nan = torch.equal(g.isnan(), w.isnan())
            worst = max(worst, float(diff.max()) if diff.numel() else 0.0, 0.0 if same_nan else float("inf"))
        elif not torch.equal(g, w):
            worst = float("inf")
    return "equal" if worst == 0.0 else f"max abs diff {worst:.3g}"

