"""Where a region's canonical form occurs in a compiled model's ATen graph, and one op in its place.

Compile mode runs this inside Inductor (the package's ``_compile.py``), on the graph AOTAutograd
traced with Inductor's decompositions. A form captured on another route spells its ops otherwise
(``softmax`` whole on the export route, ``_softmax`` after AOTAutograd, ``amax/sub/exp/sum/div``
after Inductor's decompositions), so a form is first **respelled**: its graph rebuilt from the form
alone (``canonical.rebuild``), traced by AOTAutograd with the same decompositions on fake inputs of
its input specs, and its canonical form taken again (``canonical.form``). Decompositions are local
(an op's decomposition depends on its arguments' dtypes, shapes and strides, which the form fixes),
so the model's graph holds that respelled form wherever the region is.

``find`` anchors at every node computing the form's last op, follows the arguments backwards to
assign each of the form's ops a node, demands that no value but the last is read outside those
nodes, and accepts the set only when ``canonical.form`` of it has the respelled key: same ops,
arguments, constants, and every input's dtype, shape and strides (metadata asserts that read a
value inside go with the region). Anything else is left as it is.
``replace`` puts one call of the region's op there, its inputs in the original form's order (the
kernel's ABI).

Torch only, and only relative imports: shipped verbatim in every package as
``<pkg>/_graph/region_match.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from . import canonical, opclass


@dataclass(frozen=True)
class Respelled:
    """A region's form as a compiled graph spells it."""

    body: dict  # the canonical form of the traced region
    key: str  # canonical.key(body)
    order: tuple[int, ...]  # respelled input i is the original form's input order[i]
    output: dict  # tensor spec of the region's output, as traced


@dataclass
class Match:
    nodes: list[torch.fx.Node]  # the region's nodes, in graph order; the last computes the output
    inputs: list[torch.fx.Node]  # the values it reads, in the original form's input order
    output: torch.fx.Node
    asserts: list[torch.fx.Node]  # bookkeeping (torch.export's metadata asserts) on values inside: erased too


def respell(form: dict, device: str, decompositions: dict | None) -> Respelled:
    """Trace the form's graph as AOTAutograd traces a model (functional, inference, these
    decompositions) on fake inputs; ValueError when the traced region is not one a kernel of the
    original form can replace (an input no longer read, a constant tensor, not one output)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm = canonical.rebuild(form, device)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    out.args = ((out.args[0],),)  # AOTAutograd wants a tuple of outputs
    gm.recompile()
    with FakeTensorMode():
        inputs = [torch.empty_strided(s["shape"], s["strides"], dtype=getattr(torch, s["dtype"]), device=device)
                  for s in form["inputs"]]
    traced: list[torch.fx.GraphModule] = []

    def keep(fgm: torch.fx.GraphModule, _inputs: Any) -> Callable:
        traced.append(fgm)
        return fgm.forward

    # outside any compile in progress: its tracing context and fake mode are not this trace's
    with torch._guards.tracing(None), torch.no_grad():
        aot_module_simplified(gm, inputs, fw_compiler=keep, decompositions=decompositions or {})
    graph = traced[0].graph
    graph.eliminate_dead_code()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if any(n.op == "get_attr" for n in graph.nodes):
        raise ValueError("the traced region holds a constant tensor")
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    result = next(n for n in graph.nodes if n.op == "output").args[0]
    if not nodes or len(result) != 1 or result[0] is not nodes[-1]:
        raise ValueError("the traced region does not end in the op computing its one output")
    specs = {n: canonical.tensor_spec(n.meta.get("val")) for n in placeholders}
    body, ins = canonical.form(nodes, specs)
    if len(ins) != len(placeholders):
        raise ValueError("an input of the region is not read once it is traced")
    output = canonical.tensor_spec(nodes[-1].meta.get("val"))
    if output is None:
        raise ValueError("the traced region's output is not one tensor")
    return Respelled(body, canonical.key(body), tuple(placeholders.index(n) for n in ins), output)


def find(graph: torch.fx.Graph, region: Respelled) -> list[Match]:
    """Every place `graph` computes the region exactly (none overlapping), in graph order."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    ops = region.body["ops"]
    last = ops[-1]["op"]
    taken: set[torch.fx.Node] = set()
    found = []
    for anchor in list(graph.nodes):
        if anchor.op != "call_function" or anchor in taken or canonical.op_name(anchor) != last:
            continue
        if canonical.tensor_spec(anchor.meta.get("val")) != region.output:
            continue
        m = _match_at(anchor, region, position)
        if m is not None and not taken.intersection(m.nodes):
            taken.update(m.nodes)
            found.append(m)
    return found


def _match_at(anchor: torch.fx.Node, region: Respelled, position: dict) -> Match | None:
    ops = region.body["ops"]
    node_of: dict[int, torch.fx.Node] = {len(ops) - 1: anchor}
    op_of: dict[torch.fx.Node, int] = {anchor: len(ops) - 1}
    input_of: dict[int, torch.fx.Node] = {}

    def pair(spec: Any, value: Any, todo: list) -> bool:
        """Follow the form's references in `spec` into the graph's `value` (constants are compared
        by the key at the end)."""
        if isinstance(spec, list):
            return isinstance(value, (list, tuple)) and len(spec) == len(value) and all(
                pair(s, v, todo) for s, v in zip(spec, value))
        if isinstance(spec, dict) and ("n" in spec or "in" in spec):
            if not isinstance(value, torch.fx.Node):
                return False
            if "n" in spec:
                j = spec["n"]
                if j in node_of:
                    return node_of[j] is value
                if value in op_of or value.op != "call_function" or canonical.op_name(value) != ops[j]["op"]:
                    return False
                node_of[j], op_of[value] = value, j
                todo.append(j)
                return True
            k = spec["in"]
            if k in input_of:
                return input_of[k] is value
            input_of[k] = value
            return True
        return not isinstance(value, torch.fx.Node)

    todo = [len(ops) - 1]
    while todo:
        j = todo.pop()
        node, entry = node_of[j], ops[j]
        if len(node.args) != len(entry["args"]):
            return None
        if not all(pair(s, v, todo) for s, v in zip(entry["args"], node.args)):
            return None
        for k, s in entry["kwargs"].items():
            if k not in node.kwargs or not pair(s, node.kwargs[k], todo):
                return None
    if len(node_of) != len(ops) or len(input_of) != len(region.body["inputs"]):
        return None
    members = set(op_of)
    if members.intersection(input_of.values()):
        return None
    asserts = []
    for n in members:
        if n is anchor:
            continue
        for u in n.users:
            if u in members:
                continue
            if _bookkeeping(u):
                if u not in asserts:
                    asserts.append(u)
                continue
            return None  # a value inside the region is read elsewhere: one op cannot stand for it
    nodes = sorted(members, key=position.__getitem__)
    specs = {v: canonical.tensor_spec(v.meta.get("val")) for v in input_of.values()}
    if any(s is None for s in specs.values()):
        return None
    # in the form's own op order: the pairing above fixed which node is which op, and canonical_order's
    # tie-break between independent branches (attention's key and value paths) follows the tracer's order
    body, ins = canonical.form(nodes, specs, order=[node_of[j] for j in range(len(ops))])
    if canonical.key(body) != region.key:
        return None
    ordered: list[Any] = [None] * len(ins)
    for i, v in enumerate(ins):
        ordered[region.order[i]] = v
    return Match(nodes, ordered, anchor, asserts)


def _bookkeeping(n: torch.fx.Node) -> bool:
    """A side-effect-free check on a value that nothing reads (torch.export's _assert_tensor_metadata)."""
    return n.op == "call_function" and not n.users and opclass.classify(canonical.op_name(n)) == "bookkeeping"


def replace(graph: torch.fx.Graph, match: Match, op: Any) -> torch.fx.Node:
    """One call of `op` (the region's kernel: inputs in the original form's order, one output)
    where `match` was; the match's nodes are erased."""
    with graph.inserting_before(match.output):
        new = graph.call_function(op, tuple(match.inputs))
    new.meta.update({k: v for k, v in match.output.meta.items() if k in ("val", "tensor_meta", "stack_trace")})
    vals = [i.meta.get("val") if isinstance(i, torch.fx.Node) else i for i in match.inputs]
    if all(isinstance(v, torch.Tensor) for v in vals):
        # The inputs' traced layouts are the kernel's verified ones (the form fixes every input's strides).
        # Inductor holds an op's inputs to these only where the node records them ("eager_input_vals", as
        # AOTAutograd's tracing does for an op needing exact strides); a node a pass inserts without them gets
        # whatever layout Inductor picks, and the package's binding then copies it back on every call.
        new.meta["eager_input_vals"] = (tuple(vals), {})
    match.output.replace_all_uses_with(new)
    for n in match.asserts:
        graph.erase_node(n)
    for n in reversed(match.nodes):
        graph.erase_node(n)
    return new


# --- a mask the kernel computes: proven constant and causal in the compiled graph ----------------------

# A mask entry counts as masked when adding it leaves exp() at exactly 0 for any logit a model computes:
# at most half the dtype's lowest value (finfo.min, HF's fill, is -3.4e38 in bf16 and fp32, -65504 in
# fp16), or -inf. With fp16's -32752 a row's logits would have to differ by more than 32000 for eager to
# give the masked key any weight; the kernel gives it none.
def masked_bound(dtype: torch.dtype) -> float:
    return 0.5 * torch.finfo(dtype).min


def causal_window(mask: torch.Tensor) -> int | None:
    """The causal pattern of an additive mask [.., L, S], or None when it is not one: 0 for the top-left causal
    mask (0 where key j <= query i, masked (``masked_bound``) where j > i), W > 0 for a sliding window of W keys
    (0 where i - W < j <= i, masked elsewhere: transformers' sliding-window causal mask), in every broadcast
    slice. A window as wide as every row's causal keys is the causal mask and gives 0."""
    if mask.dim() < 2 or not mask.is_floating_point() or mask.numel() == 0:
        return None
    m = mask.detach()
    rows, cols = m.shape[-2], m.shape[-1]
    i = torch.arange(rows, device=m.device)[:, None]
    j = torch.arange(cols, device=m.device)[None, :]
    # the widest row: the window (or every causal key); rows narrower than it are the first ones only
    width = int((m == 0).reshape(-1, rows, cols).sum(dim=-1).max())
    window = width if width < min(rows, cols) else 0
    keep = (j <= i) & ((i - j) < window) if window else (j <= i)
    if not bool(((m == 0) == keep).all()):
        return None
    if not bool((m.masked_fill(keep, float("-inf")) <= masked_bound(m.dtype)).all()):
        return None
    return window


def is_causal_mask(mask: torch.Tensor) -> bool:
    """Whether an additive mask [.., L, S] is the top-left causal one without a window (``causal_window`` 0)."""
    return causal_window(mask) == 0


# ops whose value is not a function of their arguments (random draws, uninitialised memory)
_NOT_CONSTANT = ("rand", "normal", "bernoulli", "uniform", "multinomial", "dropout", "empty", "exponential",
                 "geometric", "cauchy", "log_normal", "poisson")
CONSTANT_NODES = 256  # a mask builder is tens of ops (transformers' is 33-38); a larger closure is not one


def constant_value(graph: torch.fx.Graph, node: torch.fx.Node) -> Any:
    """The value of `node` when it depends on no input of the graph (only ops of constant arguments and the
    graph's own constants), computed now with real tensors; None otherwise. Such a value is the same at every
    call of the compiled graph, so what it is now is what it always is."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    seen: set = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > CONSTANT_NODES or n.op not in ("call_function", "get_attr"):
            return None
        if n.op == "call_function" and (not isinstance(n.target, torch._ops.OpOverload)
                                        or any(w in n.target.name() for w in _NOT_CONSTANT)):
            return None
        stack.extend(n.all_input_nodes)
    owner = graph.owning_module
    env: dict = {}
    try:
        with unset_fake_temporarily(), torch.no_grad():
            for n in graph.nodes:
                if n not in seen:
                    continue
                if n.op == "get_attr":
                    value = owner
                    for part in str(n.target).split("."):
                        value = getattr(value, part)
                    env[n] = value
                else:
                    env[n] = n.target(*torch.fx.node.map_arg(n.args, env.__getitem__),
                                      **torch.fx.node.map_arg(n.kwargs, env.__getitem__))
    except Exception:  # noqa: BLE001 - not computable here: not proven constant
        return None
    value = env.get(node)
    if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
        return None  # a fake or other subclass: no real value
    return value


def constant_causal_window(graph: torch.fx.Graph, node: torch.fx.Node) -> int | None:
    """``causal_window`` of `node`'s value when `node` is a constant of the graph (``constant_value``); None
    when it is not a constant or not a causal mask."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    value = constant_value(graph, node)
    if not isinstance(value, torch.Tensor):
        return None
    with unset_fake_temporarily(), torch.no_grad():  # inside Inductor's passes a fake mode is active
        return causal_window(value)
