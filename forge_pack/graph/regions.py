"""Regions: the maximal chains of a graph's memory-bound ops that one kernel can compute.

A region is a reduction (row, group, strided, global or window) with its pointwise prologue and
epilogue, or a pointwise chain. It grows backwards from its output: a producer joins when it is
pointwise, a reduction over the same domain (same input shape, reduced dims and groups) as the
region's, a view that keeps element order, or a permute / transpose inside a chain without a reduction
(ConvNeXt's layer scale, permuted back, then its residual add), and when every one of its users is
already in the region. So a region has one output by construction, and it stops at matmuls,
convolutions, attention, other layout-changing views (slice, select, ...), a permute next to a
reduction, ops it cannot fuse, and any value that another op outside it also reads. A single
memory-bound op is a region of one.

Each region has a canonical form (``canonical``): its key is stable across captures and routes,
its hash names it, and the form alone rebuilds the subgraph for the eager and float64 references.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from forge_pack.graph import canonical, opclass
from forge_pack.graph.capture import Graph, op_name, spec_bytes
from forge_pack.core.signature import TensorSpec

FUSABLE = ("pointwise", "reduction", "view")
# Display labels of ops inside a region's pattern name (the rest use their ATen name).
LABELS = {"_to_copy": "cast", "to": "cast", "type_as": "cast", "native_group_norm": "group_norm",
          "_softmax": "softmax", "_safe_softmax": "softmax", "_log_softmax": "log_softmax",
          "native_layer_norm": "layer_norm", "_native_batch_norm_legit_no_training": "batch_norm",
          "native_batch_norm": "batch_norm", "_fused_rms_norm": "rms_norm", "clamp_min": "clamp",
          "_adaptive_avg_pool2d": "adaptive_avg_pool2d", "max_pool2d_with_indices": "max_pool2d"}


@dataclass
class Region:
    """One region instance of a graph; regions with equal ``key`` are the same search target."""

    name: str  # "<pattern>_<hash10>": the same for every instance with this signature
    kind: str  # "row" | "group" | "strided" | "global" | "window" | "pointwise"
    pattern: str  # recognised chain, e.g. "rms_norm", "add+softmax+cast", "group_norm+silu"
    nodes: tuple[str, ...]  # graph node names, canonical order; the last is the output
    ops: tuple[str, ...]  # their ATen overloads, same order ("aten.pow.Tensor_Scalar")
    inputs: tuple[str, ...]  # graph names of the values read from outside, in input order
    input_specs: tuple[TensorSpec, ...]
    output_spec: TensorSpec | None
    form: dict  # canonical.form: the self-contained signature (inputs, ops, normalised args)
    key: str  # canonical.key(form): stable text identity
    digest: str  # sha256 of key
    time_us: float  # per forward, sum of the nodes' times
    time_share: float  # of the graph's attributed time, in [0, 1]
    time_source: str  # "profile" | "estimate" | "profile+estimate"
    module: str = ""  # the nn.Module path of the output node, when the route records one
    device: str = "cpu"
    domain: dict = field(default_factory=dict)  # reductions: {"shape", "dims", "extra"} of what is reduced
    notes: list[str] = field(default_factory=list)

    @property
    def short_ops(self) -> tuple[str, ...]:
        return tuple(opclass.base_name(o) for o in self.ops)

    @property
    def compute_ops(self) -> tuple[str, ...]:
        """The ops that do work (views, permutes and tuple selects left out)."""
        return tuple(o for o in self.short_ops if o not in opclass.VIEW and o not in opclass.PERMUTES)

    def reference(self, device: str | None = None) -> torch.fx.GraphModule:
        """The eager reference: the subgraph rebuilt from the form; call it with the inputs."""
        return canonical.rebuild(self.form, device or self.device)

    def reference_f64(self, device: str | None = None):
        """The float64 reference: floating inputs and every cast inside upcast to float64."""
        gm = canonical.rebuild(self.form, device or self.device, upcast=True)

        def run(*tensors):
            return gm(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in tensors])

        return run

    def bytes_moved(self) -> int:
        """Fewest bytes a kernel moves: each input read once (broadcast ones at their size), the output written once."""
        return sum(spec_bytes(s) for s in self.input_specs) + spec_bytes(self.output_spec)

    def tensor_names(self) -> list[str]:
        """Argument names a kernel for this region takes: the inputs in form order, then `out`."""
        return [f"in{k}" for k in range(len(self.input_specs))] + ["out"]

    def env(self) -> dict[str, int]:
        """Integer size variables for launch expressions, like ``abi.env`` for an op."""
        out = self.output_spec
        e = {"numel": out.numel if out is not None else 0}
        if not self.domain:
            return e
        shape, dims = tuple(self.domain["shape"]), tuple(self.domain["dims"])
        total = 1
        for s in shape:
            total *= s
        reduced = 1
        for d in dims:
            reduced *= shape[d]
        if self.kind == "group":
            n, c, g = shape[0], shape[1], int(self.domain["extra"][0])
            hw = total // max(n * c, 1)
            e.update(N=n, C=c, G=g, HW=hw, CPG=c // g, GROUP_SIZE=(c // g) * hw)
        elif self.kind == "window":
            e.update(N=shape[0], C=shape[1], H=shape[-2] if len(shape) > 2 else 1, W=shape[-1])
        else:  # row, strided, global: `rows` independent reductions of `cols` elements each
            e.update(rows=total // max(reduced, 1), cols=reduced)
        return e

    def unsupported(self) -> str:
        """Why a kernel cannot target this region as it stands ("" when it can)."""
        if self.output_spec is None:
            return "the output is not one tensor"
        if any(s.dtype == "?" for s in self.input_specs):
            return "an input's dtype and shape are unknown"
        if self.output_spec.dtype not in ("float32", "float16", "bfloat16"):
            return f"output dtype {self.output_spec.dtype} is not targeted"
        if self.output_spec.numel == 0:
            return "empty output"
        return ""

    @staticmethod
    def from_json(d: dict) -> "Region":
        form = d["form"]
        return Region(d["name"], d["kind"], d["pattern"], tuple(d["nodes"]), tuple(d["ops"]), tuple(d["inputs"]),
                      tuple(TensorSpec.from_json(s) for s in d["input_specs"]),
                      TensorSpec.from_json(d["output_spec"]) if d.get("output_spec") else None, form,
                      canonical.key(form), canonical.digest(form), d["time_us"], d["time_share"], d["time_source"],
                      d.get("module", ""), d.get("device", "cpu"), d.get("domain", {}), list(d.get("notes", [])))

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "pattern": self.pattern, "nodes": list(self.nodes),
                "ops": list(self.ops), "inputs": list(self.inputs),
                "input_specs": [s.to_json() for s in self.input_specs],
                "output_spec": self.output_spec.to_json() if self.output_spec else None,
                "form": self.form, "digest": self.digest, "time_us": self.time_us, "time_share": self.time_share,
                "time_source": self.time_source, "module": self.module, "device": self.device,
                "domain": self.domain, "bytes_moved": self.bytes_moved(), "env": self.env(),
                "unsupported": self.unsupported(), "notes": self.notes}


@dataclass
class _Group:
    sink: torch.fx.Node
    members: list[torch.fx.Node]
    domain: tuple | None = None  # (kind, input shape, reduced dims, extra) of its reductions
    full_numel: int = 0  # the iteration space: the domain's input size, else the largest output
    permuted: bool = False  # holds a permute / transpose: pointwise only, no reduction may join


def find_regions(graph: Graph) -> list[Region]:
    """Every region of the graph, in graph order of their outputs."""
    order = [n for n in graph.gm.graph.nodes if n.op == "call_function"]
    group_of: dict[torch.fx.Node, _Group] = {}
    groups: list[_Group] = []
    for n in reversed(order):
        if ((_kind(graph, n) not in FUSABLE and not _is_permute(graph, n))
                or _spec(n) is None and op_name(n) != "getitem" and not _is_multi(n)):
            continue
        users = list(n.users)
        owners = {id(group_of.get(u)) for u in users}
        g = group_of.get(users[0]) if users else None
        if (g is not None and len(owners) == 1 and not _select_of_other_domain(graph, g, n)
                and not _copy_for_a_view(n) and _admits(graph, g, n)):
            g.members.append(n)
            group_of[n] = g
            continue
        g = _Group(n, [n], full_numel=_numel(n))
        if not _admits(graph, g, n, fresh=True):
            continue
        groups.append(g)
        group_of[n] = g
    position = {n: i for i, n in enumerate(order)}
    regions = []
    for g in reversed(groups):
        _drop_outside_selects(g)
        _trim_trailing_views(graph, g)
        if not g.members or all(_kind(graph, m) == "view" or _is_permute(graph, m) for m in g.members):
            continue  # views only: nothing to compute
        g.members.sort(key=position.__getitem__)
        regions.append(_region(graph, g))
    return regions


def _kind(graph: Graph, n: torch.fx.Node) -> str:
    node = graph.nodes.get(n.name)
    return node.kind if node is not None else "other"


def _spec(n: torch.fx.Node) -> TensorSpec | None:
    return n.meta.get("forge_spec")


def _is_multi(n: torch.fx.Node) -> bool:
    return isinstance(n.meta.get("val"), (tuple, list))


def _numel(n: torch.fx.Node) -> int:
    spec = _spec(n)
    return spec.numel if spec is not None else 0


def _domain(graph: Graph, n: torch.fx.Node) -> tuple | None:
    src = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
    spec = _spec(src) if src is not None else None
    if spec is None:
        return None
    out = graph.nodes[n.name].output
    try:
        kind, dims, extra = opclass.reduction_domain(op_name(n), n.args, n.kwargs, spec.shape, spec.strides,
                                                     out.numel if out is not None else 0)
    except (IndexError, TypeError, ValueError, ZeroDivisionError):  # an overload spelled unlike the tables
        return None  # the reduction stays out of every region and is reported as uncovered
    return (kind, spec.shape, dims, extra)


def _is_permute(graph: Graph, n: torch.fx.Node) -> bool:
    return _kind(graph, n) == "layout_view" and opclass.base_name(op_name(n)) in opclass.PERMUTES


def _admits(graph: Graph, g: _Group, n: torch.fx.Node, fresh: bool = False) -> bool:
    """Whether n can join g (or, ``fresh``, start a group) and one kernel still computes it."""
    kind = _kind(graph, n)
    if _is_permute(graph, n):
        # inside a pointwise chain only: a reduction's rows are found from the reduced dims' strides, which a
        # permute between its ops would reorder; a region does not start (end) at one either
        if fresh or g.domain is not None:
            return False
        g.permuted = True
        return True
    if kind == "reduction":
        if g.permuted:
            return False
        d = _domain(graph, n)
        if d is None:
            return False
        size = 1
        for s in d[1]:
            size *= s
        if fresh:
            g.domain, g.full_numel = d, size
            return True
        if g.domain is not None and g.domain != d:
            return False  # a second reduction over other dims needs its own pass over memory
        if g.domain is None and size < g.full_numel:
            return False  # the epilogue would recompute the reduction for every broadcast copy
        g.domain, g.full_numel = d, max(size, g.full_numel)
        return True
    if fresh:
        return True
    numel = _numel(n)
    if g.domain is None:
        g.full_numel = max(g.full_numel, numel)
        return True
    return numel <= g.full_numel  # a prologue no larger than what the reduction reads


_COPIES = ("clone", "contiguous")


def _copy_for_a_view(n: torch.fx.Node) -> bool:
    """A copy whose reader views the copy in a shape its input's layout cannot be viewed in (``reshape`` of a
    permuted tensor: Swin's window partition and its mask): the copy is what makes that view possible, so it ends
    its own region (it writes the reordered tensor) and the view starts the next, as eager runs it. Inside one
    region the kernel would index the copy's input through the view, which no strides express."""
    if opclass.base_name(op_name(n)) not in _COPIES or not n.args or not isinstance(n.args[0], torch.fx.Node):
        return False
    spec = _spec(n.args[0])
    if spec is None:
        return False
    src = torch.empty_strided(tuple(spec.shape), tuple(spec.strides), device="meta")
    for u in n.users:
        if opclass.base_name(op_name(u)) in ("view", "_unsafe_view", "reshape") and _spec(u) is not None:
            try:
                src.view(tuple(_spec(u).shape))
            except RuntimeError:
                return True
    return False


def _select_of_other_domain(graph: Graph, g: _Group, n: torch.fx.Node) -> bool:
    """An element of a reduction's tuple (max_pool2d_with_indices' values) whose reduction cannot
    join the consumer's region stays with its reduction: the select then ends that region, whose
    output is the one tensor, instead of being an input of the consumer's region read out of a tuple."""
    if op_name(n) != "getitem" or not n.args or not isinstance(n.args[0], torch.fx.Node):
        return False
    producer = n.args[0]
    return (_kind(graph, producer) == "reduction" and g.domain is not None
            and _domain(graph, producer) != g.domain)


def _drop_outside_selects(g: _Group) -> None:
    """An element of a tuple made outside the region (topk's values, a split) is one of the region's
    inputs, not one of its ops: the tuple itself is no tensor a kernel can read."""
    inside = set(g.members)
    g.members[:] = [m for m in g.members if not (op_name(m) == "getitem" and isinstance(m.args[0], torch.fx.Node)
                                                 and m.args[0] not in inside and m is not g.sink)]


def _trim_trailing_views(graph: Graph, g: _Group) -> None:
    """A region ends at its last op that computes: the views (and permutes) after it are free reinterpretations."""
    while g.members and (_kind(graph, g.sink) == "view" and op_name(g.sink) != "getitem" or _is_permute(graph, g.sink)):
        inner = [a for a in g.sink.all_input_nodes if a in g.members]
        g.members.remove(g.sink)
        if len(inner) != 1:
            g.members.clear()
            return
        g.sink = inner[0]


def _region(graph: Graph, g: _Group) -> Region:
    members = g.members  # in graph order
    inside = set(members)
    specs: dict[torch.fx.Node, dict] = {}
    for n in members:
        for a in n.all_input_nodes:
            if a not in inside:
                spec = _spec(a)
                specs[a] = spec.to_json() if spec is not None else {"dtype": "?", "shape": [], "strides": []}
    body, inputs = canonical.form(members, specs)
    order = canonical.canonical_order(members)
    digest = canonical.digest(body)
    nodes = [graph.nodes[n.name] for n in order]
    time_us = sum(x.time_us for x in nodes)
    total = graph.total_us
    sources = {x.time_source for x in nodes if x.kind in ("pointwise", "reduction")}
    ops = tuple(op_name(n) for n in order)
    kind = g.domain[0] if g.domain is not None else "pointwise"
    pattern = pattern_name(tuple(opclass.base_name(o) for o in ops))
    return Region(
        name=f"{pattern.replace('+', '_')}_{digest[:10]}", kind=kind, pattern=pattern,
        nodes=tuple(n.name for n in order), ops=ops, inputs=tuple(a.name for a in inputs),
        input_specs=tuple(_spec(a) or TensorSpec("?", (), ()) for a in inputs), output_spec=_spec(order[-1]),
        form=body, key=canonical.key(body), digest=digest, time_us=time_us,
        time_share=time_us / total if total > 0 else 0.0,
        time_source="+".join(sorted(sources)) if len(sources) > 1 else (sources.pop() if sources else "estimate"),
        module=graph.nodes[order[-1].name].module, device=graph.device,
        domain={"shape": list(g.domain[1]), "dims": list(g.domain[2]), "extra": list(g.domain[3])} if g.domain else {})


# Ops a norm or softmax written as eager ops is made of: they collapse into its name.
CORES = {
    "rms_norm": {"_to_copy", "to", "type_as", "pow", "square", "mean", "add", "rsqrt", "sqrt", "div", "reciprocal",
                 "mul"},
    "layer_norm": {"_to_copy", "to", "type_as", "var_mean", "var", "mean", "sub", "add", "rsqrt", "sqrt", "div", "mul",
                   "getitem"},
    "softmax": {"_to_copy", "to", "type_as", "amax", "max", "sub", "exp", "sum", "div", "mul", "reciprocal"},
}


def pattern_name(ops: tuple[str, ...]) -> str:
    """A readable name of the chain: a norm or softmax written as eager ops is named as such
    (x2 when the region holds two over the same rows), other ops keep their labels in order."""
    work = [o for o in ops if o not in opclass.VIEW and o not in opclass.PERMUTES]
    s = set(work)
    core, count = None, 0
    if "mean" in s and "sub" not in s and ("rsqrt" in s or work.count("pow") >= 2 or "sqrt" in s) and (
            s & {"pow", "square", "mul"}):
        core, count = "rms_norm", work.count("mean")
    elif ("var_mean" in s or "var" in s) and ("rsqrt" in s or "sqrt" in s):
        core, count = "layer_norm", work.count("var_mean") + work.count("var")
    elif {"amax", "exp", "sum"} <= s and ("div" in s or "reciprocal" in s):
        core, count = "softmax", work.count("amax")
    labels: list[str] = [core + (f" x{count}" if count > 1 else "")] if core else []
    for o in work:
        if core and o in CORES[core]:
            continue
        label = LABELS.get(o, o)
        if not labels or labels[-1] != label:
            labels.append(label)
    return "+".join(labels) if labels else "empty"


def uncovered(graph: Graph, regions: list[Region]) -> list[dict[str, Any]]:
    """The graph's time outside every region, by reason: [{reason, ops, time_us, time_share}]."""
    covered = {name for r in regions for name in r.nodes}
    total = graph.total_us
    by_reason: dict[str, dict[str, Any]] = {}
    for n in graph.nodes.values():
        if n.name in covered or n.kind in ("placeholder", "bookkeeping") or n.time_us <= 0:
            continue
        reason = REASONS.get(n.kind, f"{n.kind}: not a fusable memory-bound op")
        entry = by_reason.setdefault(reason, {"reason": reason, "ops": {}, "time_us": 0.0})
        short = opclass.base_name(n.op)
        entry["ops"][short] = entry["ops"].get(short, 0) + 1
        entry["time_us"] += n.time_us
    out = sorted(by_reason.values(), key=lambda e: -e["time_us"])
    for e in out:
        e["time_share"] = e["time_us"] / total if total > 0 else 0.0
    return out


REASONS = {
    "matmul": "matmul: compute-bound, bounds a region (left to cuBLAS / Inductor)",
    "conv": "convolution: bounds a region (one followed by an inference batch_norm is a conv epilogue region)",
    "attention": "attention (sdpa): bounds a region (an SDPA call is the attention op target; eager attention chains are attention regions)",
    "layout_view": "layout-changing view (a slice or select, or a permute next to a reduction): bounds a region",
    "view": "view outside any region",
    "alloc": "allocation: nothing to compute",
    "other": "op outside the fusable set (gather, scatter, cat, index, data-dependent)",
    "pointwise": "pointwise op left out of every region",
    "reduction": "reduction left out of every region",
}
