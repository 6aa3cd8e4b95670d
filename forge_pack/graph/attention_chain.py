"""Attention regions: ``softmax(q k^T * scale [soft-capped] [+ mask]) v`` written as eager ops.

Model code that does not call SDPA (HF transformers' eager attention, hand-written blocks) computes
attention as separate ops: a matmul of the query with the transposed keys, a scaling (``* s`` or
``/ c``), optionally Gemma's soft-capping (``tanh(w / cap) * cap``), optionally an additive mask, a
softmax over the keys (usually in float32, cast back), a matmul with the values, and the
``transpose(1, 2).contiguous()`` that puts heads next to channels. Grouped-query attention repeats
each key/value head (``repeat_kv``: unsqueeze, expand, clone, reshape) before the matmuls. Under
torch.compile that chain still writes and reads the full score matrix; one flash-attention kernel
computes it without.

``find_attention_chains`` recognises the chain in a captured ATen graph (the export route's spelling:
``matmul``, ``softmax``, ``_to_copy``/``to``), from the query, the keys and values *before* any
repetition, and the mask operand of the add, to the contiguous [B, L, H, D] output. Every value
inside has exactly one reader, the next op of the chain, so one op can stand for the whole chain.
The chain is then the attention target's computation with ``composite=True`` (plain softmax: a row
whose logits are all -inf is NaN, as eager's is; the output [B, L, H, D]), with the scale, soft cap
and key/value groups read from the ops. ``check`` proves that reading on the chain's own subgraph:
the form rebuilt in float64 must equal the target's float64 reference on random inputs, or the chain
is not used.

Its canonical form (``canonical.form``) is its identity, as for every region: compile mode finds it
in Inductor's graph with ``region_match`` and calls the package's attention op in its place, the
form's inputs reordered to the op's (``abi_order``).

A chain whose mask is the causal one (``causal_mask``, decided by ``attention_hotspots`` from the
values the run captured) is read as causal attention without a mask: the kernel computes the mask and
skips the tiles above the diagonal; a sliding-window causal mask (transformers' for Gemma's and Mistral's
sliding layers) likewise, with its ``window``, and the tiles before the window are skipped too. ``check``
then feeds the chain that pattern as its mask; compile mode swaps such a chain in only where the mask is
a proven constant of the compiled graph with that pattern (``region_match.constant_causal_window``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.fx

from forge_pack.core.signature import Signature, TensorSpec
from forge_pack.graph import canonical, opclass
from forge_pack.graph.capture import Graph, op_name
from forge_pack.graph.regions import Region

MATMUL = ("matmul",)
SOFTMAX = ("softmax", "_softmax")  # plain softmax; _safe_softmax (0 for an all -inf row) is SDPA's math path
CASTS = ("_to_copy", "to")
VIEWS = ("view", "_unsafe_view", "reshape")
ABI = ("x", "k", "v", "mask")
# A float64 rebuild of the chain against the target's float64 reference: both compute the same
# exact-arithmetic function, so they differ by float64 rounding only (~1e-15 relative), far below this.
CHECK_RTOL = 1e-9


@dataclass
class AttentionChain:
    """One eager attention chain of a captured graph."""

    region: Region  # kind "attention": the chain as a region (form, key, name, specs, time)
    roles: tuple[str, ...]  # per form input: x | k | v | mask
    scale: float
    softcap: float | None
    groups: int  # query heads per key/value head
    notes: list[str] = field(default_factory=list)
    # the mask input is the causal one (``causal_mask``): the kernel computes it (causal=True), skipping the
    # masked tiles, and does not read it; compile mode proves it per match (``region_match.constant_causal_window``)
    causal_mask: bool = False
    window: int = 0  # with causal_mask: the mask's sliding window W (keys j <= i - W hidden too); 0: none

    @property
    def name(self) -> str:
        return self.region.name

    def spec(self, role: str) -> TensorSpec | None:
        return self.region.input_specs[self.roles.index(role)] if role in self.roles else None

    def kernel_roles(self) -> list[str]:
        """The op's tensor arguments, in order: x, k, v, and the mask unless the kernel computes it."""
        return [r for r in ABI if r in self.roles and not (r == "mask" and self.causal_mask)]

    def abi_order(self) -> list[int]:
        """Form-input indices in the attention op's argument order (x, k, v[, mask])."""
        return [self.roles.index(r) for r in self.kernel_roles()]

    def mask_index(self) -> int | None:
        """The form input the kernel computes as the causal mask (None: none)."""
        return self.roles.index("mask") if self.causal_mask else None

    def params(self) -> dict:
        # "window" only where there is one: the signatures of every other chain stay what they were
        window = {"window": self.window} if self.causal_mask and self.window else {}
        return {"scale": self.scale, "causal": self.causal_mask, **window, "softcap": self.softcap,
                "enable_gqa": self.groups > 1, "composite": True}

    def signature(self) -> Signature:
        """The attention target's signature of this chain (what the search, verify and the package see)."""
        kept = self.kernel_roles()
        inputs = tuple((r, self.spec(r) if r in kept else None) for r in ABI)
        return Signature("attention", inputs, tuple(sorted(self.params().items())), self.region.output_spec)

    def to_json(self) -> dict:
        return {"name": self.name, "roles": list(self.roles), "scale": self.scale, "softcap": self.softcap,
                "groups": self.groups, "causal_mask": self.causal_mask, "window": self.window,
                "abi_order": self.abi_order(),
                "region": self.region.to_json(), "notes": self.notes}


def causal_pattern(spec: TensorSpec, dtype: torch.dtype = torch.float64, window: int = 0) -> torch.Tensor:
    """A causal additive mask of the spec's shape: 0 where key j <= query i (and, with a window W, i - W < j),
    finfo.min of the spec's dtype elsewhere (HF's fill), in `dtype`."""
    rows, cols = spec.shape[-2], spec.shape[-1]
    fill = torch.finfo(getattr(torch, spec.dtype)).min
    i, j = torch.arange(rows)[:, None], torch.arange(cols)[None, :]
    hidden = (j > i) | ((i - j) >= window) if window else j > i
    base = torch.zeros(rows, cols, dtype=dtype).masked_fill(hidden, fill)
    t = torch.empty_strided(tuple(spec.shape), tuple(spec.strides), dtype=dtype)
    t.copy_(base.expand(tuple(spec.shape)))
    return t


def find_attention_chains(graph: Graph) -> list[AttentionChain]:
    """Every eager attention chain of the graph, in graph order of their outputs."""
    out = []
    for n in graph.gm.graph.nodes:
        if n.op == "call_function" and _base(n) in (*MATMUL, "einsum"):
            chain = _chain_at(graph, n)
            if chain is not None:
                out.append(chain)
    return out


def _base(n) -> str:
    return opclass.base_name(op_name(n)) if isinstance(n, torch.fx.Node) and n.op == "call_function" else ""


def _only_user(n: torch.fx.Node) -> torch.fx.Node | None:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _val(n) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _number(a) -> float | None:
    return float(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else None


def _cast_dtype(n: torch.fx.Node):
    """The dtype a pure dtype cast converts to (None for any other op or a cast that also moves or
    changes layout)."""
    if _base(n) not in CASTS:
        return None
    kw = dict(n.kwargs)
    if _base(n) == "to" and len(n.args) >= 2 and isinstance(n.args[1], torch.dtype):
        kw.setdefault("dtype", n.args[1])
    elif len(n.args) != 1:
        return None
    if set(kw) - {"dtype", "copy", "non_blocking", "layout", "device"} or kw.get("memory_format") is not None:
        return None
    v, src = _val(n), _val(n.args[0])
    if v is None or src is None or v.device != src.device or v.stride() != src.stride():
        return None
    return kw.get("dtype")


def _same_copy(n: torch.fx.Node) -> bool:
    """Whether a clone copies its input to the same strides (its values and layout unchanged)."""
    v, src = _val(n), _val(n.args[0]) if n.args else None
    return (v is not None and src is not None and set(n.kwargs) <= {"memory_format"}
            and v.dtype == src.dtype and v.shape == src.shape and v.stride() == src.stride())


def _is_dim(d, ndim: int, want: int) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d % ndim == want


def _transpose_last2(n: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor whose last two dims `n` swaps (transpose(-2, -1) or (2, 3) of a 4-d tensor)."""
    if _base(n) != "transpose" or len(n.args) != 3 or not isinstance(n.args[0], torch.fx.Node):
        return None
    dims = {a % 4 for a in n.args[1:] if isinstance(a, int)}
    return n.args[0] if dims == {2, 3} and _val(n) is not None and _val(n).dim() == 4 else None


def _swaps_heads_and_rows(n: torch.fx.Node) -> bool:
    """Whether `n` is transpose(1, 2) or permute(0, 2, 1, 3) of a 4-d tensor (negative dims too)."""
    if _base(n) == "transpose" and len(n.args) == 3:
        return {a % 4 for a in n.args[1:] if isinstance(a, int) and not isinstance(a, bool)} == {1, 2}
    if _base(n) == "permute" and len(n.args) == 2 and isinstance(n.args[1], (list, tuple)) and len(n.args[1]) == 4:
        dims = n.args[1]
        return all(isinstance(a, int) and not isinstance(a, bool) for a in dims) and [a % 4 for a in dims] == [0, 2, 1, 3]
    return False


def _unrepeat(n: torch.fx.Node, members: list) -> tuple[torch.fx.Node, int]:
    """(the key/value heads before ``repeat_kv``, the repetition) of a [B, H, S, D] operand; the
    repetition's ops join `members`. An operand that is not repeated is itself, once."""
    view = n
    if _base(view) not in VIEWS or _only_user(view) is None:
        return n, 1
    inner = view.args[0]
    chain = [view]
    if _base(inner) == "clone" and _only_user(inner) is view:
        chain.append(inner)
        inner = inner.args[0]
    if _base(inner) != "expand" or _only_user(inner) is not chain[-1]:
        return n, 1
    expand = inner
    chain.append(expand)
    unsq = expand.args[0]
    if _base(unsq) != "unsqueeze" or _only_user(unsq) is not expand or not _is_dim(unsq.args[1], 5, 2):
        return n, 1
    chain.append(unsq)
    src, e, out = unsq.args[0], _val(expand), _val(view)
    s = _val(src)
    if s is None or e is None or out is None or s.dim() != 4 or e.dim() != 5:
        return n, 1
    b, hkv, slen, d = s.shape
    rep = e.shape[2]
    if tuple(e.shape) != (b, hkv, rep, slen, d) or tuple(out.shape) != (b, hkv * rep, slen, d):
        return n, 1
    members.extend(chain)
    return src, int(rep)


def _prescaled(n: torch.fx.Node, reader: torch.fx.Node, members: list) -> tuple[torch.fx.Node, float]:
    """(the operand before a scaling by a number, the factor) where `n` is ``x * c`` or ``x / c`` read only by
    `reader` (the scaling joins `members`); else (n, 1.0)."""
    if (_base(n) in ("mul", "div") and _only_user(n) is reader and len(n.args) == 2 and not n.kwargs
            and isinstance(n.args[0], torch.fx.Node) and _number(n.args[1])):
        c = _number(n.args[1])
        members.append(n)
        return n.args[0], (c if _base(n) == "mul" else 1.0 / c)
    return n, 1.0


def _einsum(n: torch.fx.Node) -> tuple[str, str, str, list] | None:
    """(a, b, out subscripts, [a, b] operands) of a two-operand einsum over 4-d tensors (spaces dropped)."""
    if _base(n) != "einsum" or len(n.args) != 2 or n.kwargs:
        return None
    eq, operands = n.args
    if not isinstance(eq, str) or not isinstance(operands, (list, tuple)) or len(operands) != 2:
        return None
    if not all(isinstance(o, torch.fx.Node) for o in operands):
        return None
    eq = eq.replace(" ", "")
    if eq.count("->") != 1 or "." in eq:
        return None
    lhs, out = eq.split("->")
    parts = lhs.split(",")
    if len(parts) != 2 or any(len(p) != 4 for p in (*parts, out)) or len(set(parts[0] + parts[1])) != 5:
        return None
    return parts[0], parts[1], out, list(operands)


def _product(n: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, tuple[str, str, str] | None] | None:
    """(a, b, the einsum's subscripts or None for a matmul) of a two-operand product node."""
    if _base(n) in MATMUL:
        if len(n.args) == 2 and all(isinstance(a, torch.fx.Node) for a in n.args):
            return n.args[0], n.args[1], None
        return None
    e = _einsum(n)
    return None if e is None else (e[3][0], e[3][1], e[:3])


def _qk_operands(n: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, bool] | None:
    """(query, key operand, whether the key operand is the transposed keys) of the logits' product:
    ``matmul(q, k^T)`` (the operand is k^T), or ``einsum("bhid,bhjd->bhij", q, k)`` (any letters)."""
    got = _product(n)
    if got is None or got[2] is None:
        return None if got is None else (got[0], got[1], True)
    a, b, out = got[2]
    batch, head, i, d = a
    if b != batch + head + b[2] + d or out != batch + head + i + b[2]:
        return None
    return got[0], got[1], False


def _pv_operands(n: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(probabilities, values) of the output's product: ``matmul(p, v)`` or ``einsum("bhij,bhjd->bhid", p, v)``."""
    got = _product(n)
    if got is None or got[2] is None:
        return None if got is None else (got[0], got[1])
    a, b, out = got[2]
    batch, head, i, j = a
    if b != batch + head + j + b[3] or out != batch + head + i + b[3]:
        return None
    return got[0], got[1]


def _chain_at(graph: Graph, m2: torch.fx.Node) -> AttentionChain | None:
    """The chain whose value product is `m2` (None when the ops around it are not one)."""
    pv = _pv_operands(m2)
    if pv is None:
        return None
    out2 = _val(m2)
    if out2 is None or out2.dim() != 4:
        return None
    # the end: transpose(1, 2) (or permute(0, 2, 1, 3): einops' "b h n d -> b n h d") then a contiguous copy,
    # the composite's [B, L, H, D]; a view to the product's own shape and strides before it is read through
    # (Falcon's `attn_output.view(batch, heads, length, head_dim)`)
    t, same = _only_user(m2), []
    while (t is not None and _base(t) in VIEWS and _val(t) is not None and tuple(_val(t).shape) == tuple(out2.shape)
           and _val(t).stride() == out2.stride()):
        same.append(t)
        t = _only_user(t)
    if t is None or not _swaps_heads_and_rows(t):
        return None
    end = _only_user(t)
    if end is None or _base(end) not in ("clone", "contiguous") or end.kwargs.get("memory_format") not in (
            None, torch.contiguous_format) or _val(end) is None or not _val(end).is_contiguous():
        return None
    members = [end, t, *reversed(same), m2]
    probs, vrep = pv
    # probabilities: softmax over the keys, then casts (back to the input dtype) and eval dropout (an
    # aten.dropout with train False, or, as torch 2.11's export writes it, a clone of the same strides)
    n = probs
    while _base(n) in (*CASTS, "dropout", "alias", "clone") and _only_user(n) is not None:
        if _base(n) == "dropout" and not (len(n.args) >= 3 and n.args[2] is False):
            return None  # dropout in training draws a mask: not this computation
        if _base(n) in CASTS and _cast_dtype(n) is None:
            return None
        if _base(n) == "clone" and not _same_copy(n):
            return None
        members.append(n)
        n = n.args[0]
    if _base(n) not in SOFTMAX or _only_user(n) is None or not _is_dim(n.args[1], 4, 3):
        return None
    softmax = n
    members.append(softmax)
    n = softmax.args[0]
    if _base(n) in CASTS and _only_user(n) is softmax and _cast_dtype(n) is not None:
        members.append(n)
        n = n.args[0]
    mask = None
    if _base(n) == "add" and _only_user(n) is not None and len(n.args) == 2 and not n.kwargs:
        a, b = n.args
        if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)):
            return None
        members.append(n)
        mask, n = b, a
    softcap = None
    if (_base(n) == "mul" and _only_user(n) is not None and _number(n.args[1]) is not None
            and _base(n.args[0]) == "tanh" and _only_user(n.args[0]) is n
            and _base(n.args[0].args[0]) == "div" and _only_user(n.args[0].args[0]) is n.args[0]
            and _number(n.args[0].args[0].args[1]) == _number(n.args[1])):
        tanh, div = n.args[0], n.args[0].args[0]
        softcap = _number(n.args[1])
        members.extend([n, tanh, div])
        n = div.args[0]
    scale = 1.0
    if _base(n) in ("mul", "div") and _only_user(n) is not None and len(n.args) == 2 and _number(n.args[1]):
        c = _number(n.args[1])
        scale = c if _base(n) == "mul" else 1.0 / c
        members.append(n)
        n = n.args[0]
    qk = _qk_operands(n)
    if qk is None or _only_user(n) is None:
        return None
    m1 = n
    members.append(m1)
    q, kx, transposed = qk
    if transposed and _only_user(kx) is not m1:
        return None
    # the scale may come before the product instead, on the queries, the keys (either side of their
    # transpose) or both (q * d^-0.25 and k * d^-0.25): a scalar factor of the logits all the same
    q, s_q = _prescaled(q, m1, members)
    kx, s_k = _prescaled(kx, m1, members)
    s_kt = 1.0
    if transposed:  # matmul's operand is k^T; einsum's is k itself
        krep = _transpose_last2(kx)
        if krep is None or (kx is not qk[1] and _only_user(kx) is None):
            return None
        members.append(kx)
        krep, s_kt = _prescaled(krep, kx, members)
    else:
        krep = kx
    scale *= s_q * s_k * s_kt
    k, gk = _unrepeat(krep, members)
    v, gv = _unrepeat(vrep, members) if vrep is not krep else (None, 0)
    if v is None or gk != gv:
        return None
    return _build(graph, members, q, k, v, mask, scale, softcap, gk)


def _build(graph: Graph, members: list, q, k, v, mask, scale: float, softcap: float | None,
           groups: int) -> AttentionChain | None:
    vals = [_val(x) for x in (q, k, v)]
    if any(x is None or x.dim() != 4 for x in vals):
        return None
    qv, kv, vv = vals
    if not (qv.dtype == kv.dtype == vv.dtype) or qv.shape[1] != kv.shape[1] * groups or kv.shape != vv.shape:
        return None
    if mask is not None and (_val(mask) is None or not _val(mask).is_floating_point()):
        return None
    inside = set(members)
    if len({q, k, v, mask}) != 4 or {q, k, v, mask} & inside:
        return None  # one tensor in two roles (keys that are the queries): the ABI takes four tensors
    if len(inside) != len(members):
        return None
    for m in members[1:]:  # every value but the output is read inside the chain only
        if any(u not in inside for u in m.users):
            return None
    specs: dict[torch.fx.Node, dict] = {}
    for m in members:
        for a in m.all_input_nodes:
            if a not in inside and a not in specs:
                spec = a.meta.get("forge_spec")
                if spec is None:
                    return None
                specs[a] = spec.to_json()
    role_of = {q: "x", k: "k", v: "v"}
    if mask is not None:
        role_of[mask] = "mask"
    if set(specs) != set(role_of):
        return None  # the chain reads something else: not this computation
    order = canonical.canonical_order(members)
    body, inputs = canonical.form(order, specs)
    digest = canonical.digest(body)
    labels = ["attention"] + (["softcap"] if softcap else []) + (["mask"] if mask is not None else []) + (
        [f"gqa{groups}"] if groups > 1 else [])
    pattern = "+".join(labels)
    nodes = [graph.nodes[n.name] for n in order]
    time_us = sum(x.time_us for x in nodes)
    total = graph.total_us
    sources = {x.time_source for x in nodes if x.time_source}
    end = members[0]
    region = Region(
        name=f"{pattern.replace('+', '_')}_{digest[:10]}", kind="attention", pattern=pattern,
        nodes=tuple(n.name for n in order), ops=tuple(op_name(n) for n in order), inputs=tuple(a.name for a in inputs),
        input_specs=tuple(a.meta["forge_spec"] for a in inputs), output_spec=end.meta.get("forge_spec"), form=body,
        key=canonical.key(body), digest=digest, time_us=time_us, time_share=time_us / total if total > 0 else 0.0,
        time_source="+".join(sorted(sources)) if sources else "estimate",
        module=graph.nodes[end.name].module, device=graph.device)
    return AttentionChain(region, tuple(role_of[a] for a in inputs), float(scale), softcap, int(groups))


def check(chain: AttentionChain, device: str | None = None, seed: int = 0) -> str | None:
    """Why the chain's own subgraph is not the attention target's computation with the chain's parameters
    (None when it is): both in float64 on random inputs of the chain's shapes and strides, the mask
    random too (any additive values), compared element by element; with a mask, once more with its first
    query row all -inf, where both must give NaN (plain softmax, the composite's semantics) at the same
    places. A chain read with a causal mask (``causal_mask``) gets the causal pattern (with its window) as its
    mask and is compared with the reference's causal attention, which has no mask."""
    dev = device or chain.region.device
    gen = torch.Generator().manual_seed(seed)
    for masked_row in (False, True) if "mask" in chain.roles and not chain.causal_mask else (False,):
        why = _compare(chain, _draw(chain, gen, masked_row), dev)
        if why:
            return why + (" (a mask row all -inf)" if masked_row else "")
    return None


def _draw(chain: AttentionChain, gen: torch.Generator, masked_row: bool) -> list:
    tensors = []
    for role, s in zip(chain.roles, chain.region.input_specs):
        t = torch.empty_strided(tuple(s.shape), tuple(s.strides), dtype=torch.float64)
        t.copy_(torch.randn(s.numel, generator=gen, dtype=torch.float64).reshape(tuple(s.shape)))
        if role == "mask" and masked_row:
            t[..., 0, :] = float("-inf")
        if role == "mask" and chain.causal_mask:
            # the mask the kernel computes: the subgraph reads it, the reference is causal
            t = causal_pattern(s, window=chain.window)
        tensors.append(t)
    return tensors


def _compare(chain: AttentionChain, tensors: list, dev: str) -> str | None:
    from forge_pack.targets import registry

    tensors = [t.to(dev) for t in tensors]
    try:
        got = chain.region.reference_f64(dev)(*tensors)
        sig = chain.signature()
        named = {r: tensors[chain.roles.index(r)] for r in chain.kernel_roles()}
        want = registry.spec_for(sig).reference64(dict(sig.params), named)
    except Exception as e:  # noqa: BLE001 - a chain that cannot be rebuilt or referenced is not used
        return f"the chain could not be checked against the attention reference: {type(e).__name__}: {e}"
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        return f"the chain computes a {tuple(getattr(got, 'shape', ()))} tensor, not the attention's {tuple(want.shape)}"
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    if not torch.equal(nan_got, nan_want):
        return (f"the chain's NaNs ({int(nan_got.sum())}) are not the attention's ({int(nan_want.sum())}): "
                f"another softmax semantics for fully masked rows")
    err = (got - want).masked_fill(nan_got, 0).abs().max().item()
    bound = CHECK_RTOL * max(want.masked_fill(nan_want, 0).abs().max().item(), 1.0)
    if not math.isfinite(err) or err > bound:
        return f"the chain differs from softmax(q k^T * {chain.scale:g} ...) v by {err:.3g} in float64"
    return None
