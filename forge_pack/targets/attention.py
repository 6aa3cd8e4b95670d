"""attention: out = softmax(q k^T * scale [softcapped] + mask) v, per batch and query head.

Two ways a model reaches it:
- ``F.scaled_dot_product_attention`` (composite=False): an additive float mask or ``is_causal``,
  ``scale``, ``enable_gqa``; dropout must be 0. PyTorch gives 0 (not NaN) for a row whose logits
  are all -inf (its "safe softmax", and the flash kernels alike), and so does the reference here.
- the eager attention of HF transformers, a module-level function ``eager_attention_forward``
  (composite=True): ``repeat_kv``, matmul, ``* scaling``, Gemma's soft-capping
  (``tanh(s / cap) * cap``), the additive mask (sliced to the key length), softmax in fp32 cast back,
  dropout (eval), matmul, ``transpose(1, 2).contiguous()``. A fully -inf row is NaN there (plain
  softmax); a row masked with finfo.min is uniform (all its logits round to the same value), on
  both paths. The function returns ``(out, weights)``; the kernel gives ``(out, None)``, what HF's
  own SDPA and flash paths return for the weights.

ABI: ``x`` is the query [B, H, L, D], ``k`` and ``v`` are [B, HKV, S, D] (H a multiple of HKV: query
head h reads key/value head h // (H / HKV), as repeat_kv and enable_gqa do), ``mask`` an optional
additive mask broadcastable to [B, H, L, S]. Any strides with the last dim contiguous; the kernel
gets every stride as a size variable (a broadcast dim has stride 0).

``causal`` is top-left aligned (key j visible to query row i when j <= i); ``window`` W > 0 (only with
``causal``, only for the eager composite: an attention chain whose mask the graph builds as transformers'
sliding-window causal mask) also hides the keys j <= i - W. The kernel gets both as size variables.
"""

from __future__ import annotations

import functools
import inspect
import math

from .call_args import bind, is_number, is_tensor
from .dtypes import torch_dtype
from .lazy_torch import torch
from .spec import CallPath, Draw, TargetSpec, Tolerance

PARAMS = ("scale", "causal", "window", "softcap", "enable_gqa", "composite")
# Query rows per float64 reference chunk: bounds the [.., rows, S] score temporaries (a 16384-key
# VAE mid-block would otherwise hold 2 GB per float64 copy).
REF_ROWS = 1024


# ---------------------------------------------------------------- binding


def _floatish(t) -> bool:
    return is_tensor(t) and t.is_floating_point()


def _shapes_ok(q, k, v, mask) -> bool:
    if not (_floatish(q) and _floatish(k) and _floatish(v)) or q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    if mask is not None and (not is_tensor(mask) or mask.dim() > 4):
        return False
    return True


def _sdpa_binder(style: str, args: tuple, kwargs: dict):
    if len(args) > 6:  # scale and enable_gqa are keyword-only
        return None
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    b = bind(names, {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False},
             args, kwargs)
    if b is None:
        return None
    q, k, v, mask = b["query"], b["key"], b["value"], b["attn_mask"]
    if not _shapes_ok(q, k, v, mask) or b["dropout_p"] != 0 or not isinstance(b["is_causal"], bool):
        return None
    if not isinstance(b["enable_gqa"], bool) or (b["scale"] is not None and not is_number(b["scale"])):
        return None
    if b["is_causal"] and mask is not None:  # PyTorch refuses the pair: its error must stay its own
        return None
    scale = float(b["scale"]) if b["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    return ({"x": q, "k": k, "v": v, "mask": mask},
            {"scale": scale, "causal": b["is_causal"], "softcap": None, "enable_gqa": b["enable_gqa"],
             "composite": False})


@functools.lru_cache(maxsize=64)
def _parameters(fn) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _eager_binder(fn, args: tuple, kwargs: dict):
    """HF's ``eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
    ...)`` (Gemma's adds ``softcap``): (tensors, every param), or None for a call it does not read
    exactly. ``fn`` is the function called (its parameter names bind the arguments)."""
    sig = _parameters(fn)
    if sig is None or "query" not in sig.parameters:
        return None
    try:
        ba = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    ba.apply_defaults()
    a = ba.arguments
    module, q, k, v, mask = a.get("module"), a.get("query"), a.get("key"), a.get("value"), a.get("attention_mask")
    scale, dropout, softcap = a.get("scaling"), a.get("dropout", 0.0), a.get("softcap")
    if scale is None and module is not None and is_number(getattr(module, "head_dim", None)):
        scale = float(module.head_dim) ** -0.5  # Gemma's eager attention does the same for scaling=None
    groups = getattr(module, "num_key_value_groups", None)
    if not _shapes_ok(q, k, v, mask) or not is_number(scale) or not isinstance(groups, int):
        return None
    if softcap is not None and not is_number(softcap):
        return None
    if dropout and getattr(module, "training", False):  # dropout only applies in training
        return None
    if q.shape[1] != k.shape[1] * groups:
        return None
    if mask is not None:
        if mask.dim() != 4:
            return None
        mask = mask[:, :, :, : k.shape[-2]]  # what the function itself does
    return ({"x": q, "k": k, "v": v, "mask": mask},
            {"scale": float(scale), "causal": False, "softcap": float(softcap) if softcap is not None else None,
             "enable_gqa": groups > 1, "composite": True})


# ---------------------------------------------------------------- sizes and applicability


def _mask4(spec) -> tuple[tuple, tuple]:
    """A broadcastable mask's shape and strides padded to 4 dims, stride 0 where it broadcasts."""
    shape = (1,) * (4 - len(spec.shape)) + tuple(spec.shape)
    strides = (0,) * (4 - len(spec.strides)) + tuple(spec.strides)
    return shape, tuple(0 if n == 1 else s for n, s in zip(shape, strides))


def _out_layout(sig) -> tuple[int, int, int]:
    """Strides of the output's (batch, head, query row): the eager composite writes [B, L, H, D]."""
    b, h, l_, d = sig.x.shape
    eager = bool(sig.param("composite"))
    if sig.output is not None and len(sig.output.shape) == 4:
        s = sig.output.strides
        return (s[0], s[2], s[1]) if eager else (s[0], s[1], s[2])
    return (l_ * h * d, d, h * d) if eager else (h * l_ * d, l_ * d, d)


def _window(params) -> int:
    """The sliding window W of a causal call (keys j <= i - W hidden too); 0: none."""
    return int(params.get("window") or 0) if params.get("causal") else 0


def _size_vars(sig) -> dict:
    q, k = sig.x, sig.input("k")
    v = sig.input("v")
    b, h, l_, d = q.shape
    e = {"B": b, "H": h, "HKV": k.shape[1], "L": l_, "S": k.shape[2], "D": d, "G": h // max(k.shape[1], 1),
         "causal": int(bool(sig.param("causal"))), "window": _window(dict(sig.params))}
    for name, spec in (("q", q), ("k", k), ("v", v)):
        e[f"{name}_sb"], e[f"{name}_sh"], e[f"{name}_sl"] = spec.strides[:3]
    e["o_sb"], e["o_sh"], e["o_sl"] = _out_layout(sig)
    mask = sig.input("mask")
    if mask is not None:
        _, ms = _mask4(mask)
        e["m_sb"], e["m_sh"], e["m_sl"] = ms[:3]
    else:
        e["m_sb"] = e["m_sh"] = e["m_sl"] = 0
    return e


def _supports(sig) -> str | None:
    q, k, v, mask = sig.x, sig.input("k"), sig.input("v"), sig.input("mask")
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return "attention on tensors that are not 4-d [batch, heads, length, head_dim]"
    if not (q.dtype == k.dtype == v.dtype):
        return "query, key and value of different dtypes"
    if k.shape != v.shape or v.shape[-1] != q.shape[-1]:
        return "a value head_dim other than the query's, or keys and values of different shapes"
    if k.shape[0] != q.shape[0] or q.shape[1] % k.shape[1]:
        return "query heads not a multiple of key/value heads"
    if q.shape[1] != k.shape[1] and not sig.param("enable_gqa") and not sig.param("composite"):
        return "fewer key/value heads than query heads without enable_gqa (SDPA refuses the call)"
    if k.shape[2] == 0 or q.shape[2] == 0:
        return "empty attention"
    window = sig.param("window")
    if window and (not sig.param("causal") or not sig.param("composite") or int(window) < 0):
        return "a sliding window without the causal mask, or on an SDPA call (which has none)"
    if any(s.strides[-1] != 1 and s.shape[-1] > 1 for s in (q, k, v)):
        return "query, key or value with a non-contiguous last dim"
    if mask is not None:
        if mask.dtype != q.dtype:
            return f"a {mask.dtype} mask with {q.dtype} attention (boolean masks are not targeted)"
        shape, _ = _mask4(mask)
        want = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        if any(m not in (1, w) for m, w in zip(shape, want)) or shape[2:] != want[2:]:
            return f"a mask of shape {list(mask.shape)} that is not [B|1, H|1, L, S]"
        if mask.strides[-1] != 1 and shape[-1] > 1:
            return "a mask with a non-contiguous last dim"
    if sig.output is not None and sig.output.strides[-1] != 1:
        return "an output with a non-contiguous last dim"
    return None


# ---------------------------------------------------------------- meaning


def _scores64(params, q, k, mask, rows: slice):
    """Logits of query rows ``rows`` in float64, masked as the call masks them."""
    g = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(g, dim=1) if g > 1 else k
    s = torch.matmul(q[:, :, rows], kk.transpose(-1, -2)) * params["scale"]
    cap = params.get("softcap")
    if cap:
        s = torch.tanh(s / cap) * cap
    if mask is not None:
        m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        s = s + m[:, :, rows]
    if params.get("causal"):
        i = torch.arange(q.shape[2], device=q.device)[rows][:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        s = s.masked_fill(_hidden(i, j, _window(params)), float("-inf"))  # top-left aligned, as is_causal is
    return s


def _hidden(i, j, window: int):
    """Keys j a causal query row i does not see: j > i, and with a window W, j <= i - W too."""
    return (j > i) | ((i - j) >= window) if window else j > i


def _probs64(params, s):
    p = torch.softmax(s, dim=-1)
    if not params.get("composite"):  # SDPA's safe softmax: an all -inf row attends to nothing
        p = torch.where(torch.isneginf(s).all(dim=-1, keepdim=True), torch.zeros_like(p), p)
    return p


def _expand_v(q, v):
    g = q.shape[1] // v.shape[1]
    return v.repeat_interleave(g, dim=1) if g > 1 else v


def _layout(params, out):
    return out.transpose(1, 2).contiguous() if params.get("composite") else out


def _reference(params, t, lookup):
    q, k, v, mask = t["x"], t["k"], t["v"], t.get("mask")
    vv = _expand_v(q, v)
    parts = []
    for start in range(0, q.shape[2], REF_ROWS):
        rows = slice(start, min(start + REF_ROWS, q.shape[2]))
        parts.append(torch.matmul(_probs64(params, _scores64(params, q, k, mask, rows)), vv))
    return _layout(params, torch.cat(parts, dim=2))


def _magnitude(t):
    """max |v| over the keys and heads of each (batch, channel): the largest term an output element
    of that batch and channel is a weighted mean of. Values of both signs cancel (an output near 0
    from terms near 1), and probabilities rounded to 16 bits before the P.V product err in
    proportion to those terms, not to the small result. Batch is the output's first dim and the
    channel its last on both layouts ([B, H, L, D] and the composite's [B, L, H, D]), so the key
    needs no parameters."""
    q, v = t["x"], t["v"]
    peak = v.double().abs().amax(dim=(1, 2), keepdim=True)  # [B, 1, 1, D]
    return peak.expand(q.shape[0], q.shape[1], q.shape[2], v.shape[-1])


def eager_attention(q, k, v, mask, scale: float, softcap: float | None, out_dtype=None, causal: bool = False,
                    window: int = 0):
    """HF transformers' eager attention, op for op: repeat_kv, matmul in the input dtype, scaling,
    soft-capping, mask, softmax in fp32 cast back, matmul, [B, L, H, D]. ``causal``: the causal mask HF
    builds (finfo.min above the diagonal, top-left; with ``window`` W, also where j <= i - W: its
    sliding-window mask) added as the mask is (an eager attention chain whose mask the kernel computes,
    graph/attention_chain)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    if softcap is not None:
        w = torch.tanh(w / softcap) * softcap
    if mask is not None:
        w = w + mask
    if causal:
        i = torch.arange(w.shape[-2], device=w.device)[:, None]
        j = torch.arange(w.shape[-1], device=w.device)[None, :]
        hide = torch.zeros(w.shape[-2:], dtype=w.dtype, device=w.device)
        w = w + hide.masked_fill(_hidden(i, j, window), torch.finfo(w.dtype).min)
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v).transpose(1, 2).contiguous().to(out_dtype or q.dtype)


def _eager(params, out_dtype, lookup):
    scale, cap = params["scale"], params.get("softcap")
    if params.get("composite"):
        dt = torch_dtype(out_dtype) if out_dtype else None
        causal, window = bool(params.get("causal")), _window(params)
        return lambda t: eager_attention(t["x"], t["k"], t["v"], t.get("mask"), scale, cap, dt, causal, window)
    fn = lookup("torch.nn.functional", "scaled_dot_product_attention")
    causal, gqa = bool(params.get("causal")), bool(params.get("enable_gqa"))
    if gqa:
        return lambda t: fn(t["x"], t["k"], t["v"], attn_mask=t.get("mask"), is_causal=causal, scale=scale,
                            enable_gqa=True)
    return lambda t: fn(t["x"], t["k"], t["v"], attn_mask=t.get("mask"), is_causal=causal, scale=scale)


# ---------------------------------------------------------------- verification inputs


def _rows(params, xf):
    """A query vector is what a row-wise transform scales or flips (its logits scale with it)."""
    shape = tuple(xf.shape)
    return xf.reshape(-1, shape[-1]), lambda r: r.reshape(shape)


def _permute(params, xf, others, gen):
    # query rows in any order (each still attends over every key); head_dim order is kept
    rows, back = _rows(params, xf)
    return back(rows[torch.randperm(rows.shape[0], generator=gen).to(rows.device)])


def _odd_shapes(sig) -> list:
    """Odd query lengths (the key length stays: it is k's and v's shape); with a mask of the query
    length, none (the mask would no longer fit)."""
    b, h, l_, d = sig.x.shape
    if sig.input("mask") is not None:
        return []
    return [((b, h, n, d), False) for n in (37, max(l_ - 1, 1)) if n != l_]


def _complete(kwargs: dict):
    """A hand-written signature (ABI names x, k, v, mask, causal) as the SDPA call's keywords."""
    for abi_name, arg in (("input", "query"), ("k", "key"), ("v", "value"), ("mask", "attn_mask"),
                          ("causal", "is_causal")):
        if abi_name in kwargs:
            kwargs[arg] = kwargs.pop(abi_name)
    q, k = kwargs.get("query"), kwargs.get("key")
    if q is None or k is None or q.dim() != 4 or k.dim() != 4:
        return "attention takes 4-d x (the query) and k", "e.g. x: bf16[1,8,2048,128], k: bf16[1,8,2048,128], ..."
    if q.shape[1] % k.shape[1]:
        return (f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key heads",
                "give k and v a head count dividing the query's, and enable_gqa=True")
    return None


def composite_output(result):
    """eager_attention_forward returns (out, weights): the kernel computes out."""
    return result[0] if isinstance(result, tuple) else result


def composite_return(out):
    """What eager_attention_forward's caller receives from the kernel: no weights (as HF's SDPA path)."""
    return out, None


ATTENTION = TargetSpec(
    name="attention", tensors=("x", "k", "v", "mask"), scalars=("scale", "softcap"), params=PARAMS,
    own_params=("softcap", "composite", "window"),
    doc="out[b, h, i, :] = sum_j p[i, j] v[b, h // G, j, :], p = softmax_j(s), s[i, j] = x[b, h, i, :] . "
        "k[b, h // G, j, :] * scale, then tanh(s / softcap) * softcap where softcap > 0, + mask[b, h, i, j] "
        "(broadcast; strides m_sb, m_sh, m_sl, 0 where it broadcasts) where present, -inf where causal and j > "
        "i, or where causal with window > 0 and j <= i - window; x is the query [B, H, L, D], k and v "
        "[B, HKV, S, D], G = H / HKV; every tensor's (batch, head, row) "
        "strides are size variables (q_*, k_*, v_*, o_*), the last dim contiguous; fp32 logits, softmax and "
        "accumulation. A row whose logits are all -inf is 0 for an SDPA call and NaN for the eager composite "
        "(composite=True, whose out is [B, L, H, D]).",
    size_vars=_size_vars, supports=_supports, float64_reference=_reference, eager_call=_eager,
    tolerances={
        "bfloat16": Tolerance(4e-3, 1.6e-2, "two bf16 ulps of the output; atol: probabilities rounded to bf16 "
                                            "for the tensor-core P.V product err by 2^-9 of sum p|v| (~1 for "
                                            "unit values) on outputs that cancel to near 0"),
        "float16": Tolerance(1e-3, 2e-3, "two fp16 ulps of the output; atol: fp16 probabilities err by 2^-11 "
                                         "of sum p|v| on outputs that cancel to near 0"),
    },
    draws={"mask": Draw(scale=2.0)}, adversarial=("large", "masked_rows"),
    rows=_rows, permute=_permute, odd_shapes=_odd_shapes,
    call_paths=(CallPath("F.scaled_dot_product_attention", "torch.nn.functional", "scaled_dot_product_attention",
                         "F"),),
    bind=_sdpa_binder, bind_module=_eager_binder, magnitude=_magnitude, complete=_complete,
    composite_functions=("eager_attention_forward",), composite_output=composite_output,
    composite_return=composite_return)

SPECS = (ATTENTION,)
