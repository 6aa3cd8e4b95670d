"""Convolution epilogue regions: conv -> inference batch_norm -> optional residual add -> optional activation.

Such a chain is one region whose first op is a convolution (2-d, any stride, padding, dilation and
groups; not transposed) whose only reader is a batch_norm in inference form (its input the conv
output, its statistics the model's running buffers), followed by at most one ``add`` of a tensor of
the output's shape (the residual) and at most one ``relu`` / ``silu`` / ``gelu``. Every value inside
has exactly one reader, the next op of the chain, so one op can stand for the whole chain. The conv
weight (and bias) and the batch_norm's weight, bias, running mean and running variance must be the
model's own parameters and buffers (graph placeholders): they are folded once at build time
(``conv_fold``), so the chain becomes a convolution with a new weight and bias plus an epilogue
(bias, residual, activation) that one pointwise kernel computes.

The chain's canonical form (``canonical.form``) is its identity, exactly as for memory-bound regions:
compile mode finds it in Inductor's graph with ``region_match`` and replaces it with the package's op.
Its *epilogue form* is the pointwise region the search generates a kernel for: ``act((y + b) [+ r])``
computed in float32 with the folded bias in float32 and one rounding to the chain's dtype at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx

from forge_pack.core.signature import TensorSpec
from forge_pack.graph import canonical, conv_fold, opclass
from forge_pack.graph.capture import Graph, op_name
from forge_pack.graph.regions import Region

CONV_OPS = ("conv2d", "convolution", "_convolution")
BN_OPS = ("_native_batch_norm_legit_no_training", "batch_norm", "native_batch_norm")
ACTIVATIONS = ("relu", "silu", "gelu")


@dataclass
class ConvChain:
    """One conv + batch_norm (+ add) (+ activation) chain of a captured graph."""

    region: Region  # kind "conv": the chain as a region (form, key, name, specs, time)
    roles: tuple[str, ...]  # per form input: x | weight | conv_bias | bn_weight | bn_bias | running_mean | running_var | residual
    sources: tuple[str, ...]  # per form input: the placeholder's source ("param:conv1.weight", "input:0", "")
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    eps: float
    activation: str  # "" | "relu" | "silu" | "gelu" | "gelu_tanh"
    residual: bool
    conv_output: TensorSpec  # the convolution's own output (what the folded conv writes)
    conv_us: float = 0.0  # the convolution's own time per forward (region.time_us holds the whole chain's)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.region.name

    def index(self, role: str) -> int | None:
        return self.roles.index(role) if role in self.roles else None

    def conv_args(self) -> dict:
        return {"stride": list(self.stride), "padding": list(self.padding), "dilation": list(self.dilation),
                "groups": self.groups}

    def to_json(self) -> dict:
        return {"name": self.name, "pattern": self.region.pattern, "roles": list(self.roles),
                "sources": list(self.sources), **self.conv_args(), "eps": self.eps, "activation": self.activation,
                "residual": self.residual, "conv_output": self.conv_output.to_json(),
                "region": self.region.to_json(), "notes": self.notes}


def find_conv_chains(graph: Graph) -> list[ConvChain]:
    """Every conv epilogue chain of the graph, in graph order of their convolutions."""
    out = []
    claimed: set[str] = set()  # an add of two conv + batch_norm branches (a downsampling shortcut) joins the first
    for n in graph.gm.graph.nodes:
        if n.op == "call_function" and opclass.base_name(op_name(n)) in CONV_OPS:
            chain = _chain_at(graph, n, claimed)
            if chain is not None:
                out.append(chain)
                claimed.update(chain.region.nodes)
    return out


def _only_user(n: torch.fx.Node) -> torch.fx.Node | None:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _conv_params(n: torch.fx.Node) -> tuple | None:
    """(x, weight, bias, stride, padding, dilation, groups) of a 2-d, non-transposed convolution."""
    name = opclass.base_name(op_name(n))
    a = list(n.args) + [None] * 12
    kw = n.kwargs
    x, w = a[0], a[1] if a[1] is not None else kw.get("weight")
    bias = a[2] if len(n.args) > 2 else kw.get("bias")
    if name == "conv2d":
        stride, padding, dilation, groups = (a[3] if len(n.args) > 3 else kw.get("stride", 1),
                                             a[4] if len(n.args) > 4 else kw.get("padding", 0),
                                             a[5] if len(n.args) > 5 else kw.get("dilation", 1),
                                             a[6] if len(n.args) > 6 else kw.get("groups", 1))
        if isinstance(padding, str):
            return None  # "same" / "valid": the numbers are the tracer's, not this call's
    else:  # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...)
        if len(n.args) < 9 or a[6]:
            return None
        stride, padding, dilation, groups = a[3], a[4], a[5], a[8]
    if not isinstance(w, torch.fx.Node) or not isinstance(x, torch.fx.Node):
        return None
    wspec = w.meta.get("forge_spec")
    if wspec is None or len(wspec.shape) != 4:
        return None

    def pair(v):
        v = [int(v)] * 2 if isinstance(v, int) else [int(e) for e in v]
        return tuple(v * 2 if len(v) == 1 else v)

    return x, w, bias, pair(stride), pair(padding), pair(dilation), int(groups)


def _bn(n: torch.fx.Node) -> tuple | None:
    """(input, weight, bias, running_mean, running_var, eps) of an inference batch_norm node."""
    name = opclass.base_name(op_name(n))
    if name not in BN_OPS or opclass.classify(op_name(n), n.args, n.kwargs) != "pointwise":
        return None
    a = n.args
    if name == "_native_batch_norm_legit_no_training":  # (input, weight, bias, mean, var, momentum, eps)
        eps = a[6] if len(a) > 6 else n.kwargs.get("eps", 1e-5)
    else:  # (input, weight, bias, mean, var, training, momentum, eps[, cudnn])
        eps = a[7] if len(a) > 7 else n.kwargs.get("eps", 1e-5)
    if len(a) < 5 or not isinstance(a[3], torch.fx.Node) or not isinstance(a[4], torch.fx.Node):
        return None
    return a[0], a[1], a[2], a[3], a[4], float(eps)


def _source(graph: Graph, v: torch.fx.Node) -> str:
    node = graph.nodes.get(v.name)
    return node.source if node is not None else ""


def _is_param(graph: Graph, v) -> bool:
    return v is None or (isinstance(v, torch.fx.Node) and v.op == "placeholder"
                         and _source(graph, v).startswith(("param:", "buffer:")))


def _chain_at(graph: Graph, conv: torch.fx.Node, claimed: set[str] = frozenset()) -> ConvChain | None:
    got = _conv_params(conv)
    if got is None:
        return None
    x, w, cbias, stride, padding, dilation, groups = got
    bn = _only_user(conv)
    parsed = _bn(bn) if bn is not None else None
    if parsed is None or parsed[0] is not conv:
        return None
    _, bw, bb, mean, var, eps = parsed
    if not all(_is_param(graph, v) for v in (w, cbias, bw, bb, mean, var)):
        return None  # weights computed in the graph (or given as inputs) cannot be folded at build time
    members = [conv, bn]
    last = bn
    if isinstance(bn.meta.get("val"), (tuple, list)) or opclass.base_name(op_name(bn)) != "batch_norm":
        sel = [u for u in bn.users]
        if len(sel) != 1 or op_name(sel[0]) != "getitem" or sel[0].args[1] != 0:
            return None
        members.append(sel[0])
        last = sel[0]
    residual = False
    nxt = _only_user(last)
    if nxt is not None and nxt.name not in claimed and opclass.base_name(op_name(nxt)) == "add" \
            and op_name(nxt).endswith("Tensor") and len(nxt.args) == 2 and nxt.kwargs.get("alpha", 1) == 1:
        other = nxt.args[1] if nxt.args[0] is last else nxt.args[0]
        ospec, lspec = (other.meta.get("forge_spec") if isinstance(other, torch.fx.Node) else None,
                        last.meta.get("forge_spec"))
        if ospec is not None and lspec is not None and tuple(ospec.shape) == tuple(lspec.shape) \
                and ospec.dtype == lspec.dtype and other is not last and other is not x:
            # (`bn(conv(x)) + x` reads x twice: one input of two roles, so the chain stops at the batch_norm)
            members.append(nxt)
            last, residual = nxt, True
            nxt = _only_user(last)
    activation = ""
    if nxt is not None and nxt.name not in claimed and opclass.base_name(op_name(nxt)) in ACTIVATIONS \
            and len(nxt.all_input_nodes) == 1:
        act = opclass.base_name(op_name(nxt))
        approx = nxt.kwargs.get("approximate", nxt.args[1] if len(nxt.args) > 1 else "none")
        if act != "gelu" or approx in ("none", "tanh"):
            activation = "gelu_tanh" if act == "gelu" and approx == "tanh" else act
            members.append(nxt)
            last = nxt
    return _build(graph, members, stride, padding, dilation, groups, eps, activation, residual,
                  {"x": x, "weight": w, "conv_bias": cbias, "bn_weight": bw, "bn_bias": bb, "running_mean": mean,
                   "running_var": var})


def _build(graph: Graph, members: list, stride, padding, dilation, groups, eps, activation, residual,
           named: dict) -> ConvChain | None:
    inside = set(members)
    specs: dict = {}
    for n in members:
        for a in n.all_input_nodes:
            if a not in inside:
                spec = a.meta.get("forge_spec")
                if spec is None:
                    return None
                specs[a] = spec.to_json()
    body, inputs = canonical.form(members, specs)
    order = canonical.canonical_order(members)
    role_of = {v: k for k, v in named.items() if isinstance(v, torch.fx.Node)}
    roles = tuple(role_of.get(a, "residual") for a in inputs)
    if roles.count("residual") > (1 if residual else 0):
        return None  # an input of no known role: not a chain this module folds
    out_spec = order[-1].meta.get("forge_spec")
    conv_spec = members[0].meta.get("forge_spec")
    if out_spec is None or conv_spec is None:
        return None
    digest = canonical.digest(body)
    labels = ["conv", "batch_norm"] + (["add"] if residual else []) + ([activation] if activation else [])
    pattern = "+".join(labels)
    nodes = [graph.nodes[n.name] for n in order]
    time_us = sum(x.time_us for x in nodes)
    total = graph.total_us
    sources = {x.time_source for x in nodes if x.time_source}
    region = Region(
        name=f"{pattern.replace('+', '_')}_{digest[:10]}", kind="conv", pattern=pattern,
        nodes=tuple(n.name for n in order), ops=tuple(op_name(n) for n in order), inputs=tuple(a.name for a in inputs),
        input_specs=tuple(a.meta["forge_spec"] for a in inputs), output_spec=out_spec, form=body,
        key=canonical.key(body), digest=digest, time_us=time_us, time_share=time_us / total if total > 0 else 0.0,
        time_source="+".join(sorted(sources)) if sources else "estimate",
        module=graph.nodes[members[0].name].module, device=graph.device)
    return ConvChain(region, roles, tuple(_source(graph, a) for a in inputs), stride, padding, dilation, groups, eps,
                     activation, residual, conv_spec, graph.nodes[members[0].name].time_us)


# --- the epilogue: the pointwise region the search generates a kernel for ----------------------------

def epilogue_perm(chain: ConvChain) -> list[int]:
    """The conv output's dims in memory order (``conv_fold.memory_perm``): the order the epilogue runs in."""
    return conv_fold.memory_perm(chain.conv_output.strides)


def _permuted(spec: TensorSpec, perm: list[int]) -> dict:
    return {"dtype": spec.dtype, "shape": [spec.shape[d] for d in perm], "strides": [spec.strides[d] for d in perm]}


def epilogue_graph(chain: ConvChain) -> tuple[torch.fx.Graph, list[torch.fx.Node], dict]:
    """The epilogue as an ATen graph over the conv output in memory order (``epilogue_perm``: NCHW as it is,
    channels_last as [N, H, W, C]): act(y + b [+ r]) in float32 with the folded bias broadcast along the
    channel, cast once to the chain's dtype. Returns (graph, its op nodes, {placeholder: spec json})."""
    out = chain.region.output_spec
    perm = epilogue_perm(chain)
    c = chain.conv_output.shape[1]
    nb = len(perm) - 1 - perm.index(1)  # dims after the channel in memory order: the bias's trailing 1s
    g = torch.fx.Graph()
    y = g.placeholder("y")
    b = g.placeholder("b")
    bias_dtype = "float64" if out.dtype == "float64" else "float32"  # conv_fold.fold's bias
    # no view op inside: the activation is the form's first input and the kernel iterates in its order
    specs = {y: _permuted(chain.conv_output, perm),
             b: {"dtype": bias_dtype, "shape": [c] + [1] * nb, "strides": [1] * (nb + 1)}}
    ops = [g.call_function(torch.ops.aten.add.Tensor, (y, b))]
    if chain.residual:
        r = g.placeholder("r")
        specs[r] = _permuted(chain.region.input_specs[chain.index("residual")], perm)
        ops.append(g.call_function(torch.ops.aten.add.Tensor, (ops[-1], r)))
    if chain.activation == "relu":
        ops.append(g.call_function(torch.ops.aten.relu.default, (ops[-1],)))
    elif chain.activation == "silu":
        ops.append(g.call_function(torch.ops.aten.silu.default, (ops[-1],)))
    elif chain.activation in ("gelu", "gelu_tanh"):
        kw = {"approximate": "tanh"} if chain.activation == "gelu_tanh" else {}
        ops.append(g.call_function(torch.ops.aten.gelu.default, (ops[-1],), kw))
    if out.dtype != bias_dtype:
        ops.append(g.call_function(torch.ops.aten._to_copy.default, (ops[-1],), {"dtype": getattr(torch, out.dtype)}))
    g.output(ops[-1])
    return g, ops, specs


def epilogue_region(chain: ConvChain) -> Region:
    """The chain's epilogue as a pointwise ``Region`` (inputs y, b[, r] in form order): a search target of
    its own, whose kernel the conv region's op calls after the folded convolution."""
    g, ops, specs = epilogue_graph(chain)
    body, inputs = canonical.form(ops, specs)
    digest = canonical.digest(body)
    pattern = "conv_epilogue" + ("+add" if chain.residual else "") + (f"+{chain.activation}" if chain.activation else "")
    in_specs = tuple(TensorSpec.from_json(specs[a]) for a in inputs)
    # the output's layout: what torch makes of these inputs (the activation's layout, as for the chain)
    with torch.device("meta"):
        vals = [torch.empty_strided(s.shape, s.strides, dtype=getattr(torch, s.dtype)) for s in in_specs]
        res = canonical.rebuild(body, "meta")(*vals)
    out = TensorSpec(str(res.dtype).replace("torch.", ""), tuple(res.shape), tuple(res.stride()))
    # the epilogue kernel stands for the chain's ops after the convolution: their time, not the conv's
    time_us = max(chain.region.time_us - chain.conv_us, 0.0)
    share = chain.region.time_share * (time_us / chain.region.time_us if chain.region.time_us > 0 else 0.0)
    return Region(
        name=f"{pattern.replace('+', '_')}_{digest[:10]}", kind="pointwise", pattern=pattern,
        nodes=tuple(n.name for n in canonical.canonical_order(ops)),
        ops=tuple(canonical.op_name(n) for n in canonical.canonical_order(ops)),
        inputs=tuple(a.name for a in inputs), input_specs=in_specs, output_spec=out, form=body,
        key=canonical.key(body), digest=digest, time_us=time_us, time_share=share,
        time_source=chain.region.time_source, module=chain.region.module, device=chain.region.device)
