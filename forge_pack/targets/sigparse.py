"""Parse a signature written by hand: ``x: bf16[1,8,2048,2048], dim=-1, dtype=float32``.

The inverse of ``Signature.pretty()`` (the ``op(...)`` wrapper and ``-> dtype`` suffix are
accepted too), for ``forge-pack check``. Tensors are ``name: dtype[shape]`` with an optional
``{channels_last}`` or ``{strides=a,b,...}``; the first tensor may omit ``x:``. Parameters are
``key=value`` with the names of the functional call (``dim``, ``dtype``, ``num_groups``, ``eps``,
``normalized_shape``, ``output_size``, ...). Arguments are normalised exactly like a captured call
(``ops.normalize_call``) and the output spec comes from running the op on meta tensors.
"""

from __future__ import annotations

import re
from typing import Any

from forge_pack.targets import dtypes, registry
from forge_pack.targets.abi import TARGET_OPS
from forge_pack.core.errors import ForgeError
from forge_pack.core.signature import Signature, channels_last_strides, contiguous_strides

TENSOR_NAMES = {s.name: s.tensors for s in registry.SPECS.values()}
PARAMS = {s.name: s.params for s in registry.SPECS.values()}
EXAMPLE = "x: bf16[1,8,2048,2048], dim=-1, dtype=float32"
_TENSOR = re.compile(r"^(?:(\w+)\s*:\s*)?(\w+)\[([\d,\s]*)\]\s*(?:\{([^}]*)\})?$")


def _split(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _value(text: str) -> Any:
    t = text.strip()
    low = t.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    if dtypes.canonical(low) is not None:
        return dtypes.canonical(low)
    if t[:1] in "([" and t[-1:] in ")]":
        return [_value(v) for v in _split(t[1:-1])]
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        raise ForgeError(f"cannot read the value {text!r}", "values are numbers, (tuples), None, true/false or dtypes")


def parse_signature(op: str | None, text: str, dtype: str | None = None) -> Signature:
    """A Signature (with its output spec) from the pretty text; ForgeError on anything malformed."""
    body = text.strip()
    m = re.match(r"^(\w+)\s*\((.*)\)\s*(?:->\s*\w+)?$", body, flags=re.S)
    if m and m.group(1) in TARGET_OPS:
        if op and op != m.group(1):
            raise ForgeError(f"--op {op} but the signature is for {m.group(1)}", "drop --op or make them agree")
        op, body = m.group(1), m.group(2)
    if not op:
        raise ForgeError("no op given", f"pass --op (one of {', '.join(TARGET_OPS)}) or write op(...)")
    if op not in TARGET_OPS:
        raise ForgeError(f"unknown op {op!r}", f"known ops: {', '.join(TARGET_OPS)}")
    tensors: dict = {}
    params: dict[str, Any] = {}
    for i, item in enumerate(_split(body)):
        tm = _TENSOR.match(item)
        if tm:
            name = tm.group(1) or ("x" if not tensors else None)
            if name not in TENSOR_NAMES[op]:
                raise ForgeError(f"{op} has no tensor argument {name!r}",
                                 f"tensor arguments of {op}: {', '.join(TENSOR_NAMES[op])}")
            tensors[name] = _meta_tensor(item, tm, dtype)
            continue
        if "=" not in item:
            raise ForgeError(f"cannot read {item!r} in the signature",
                             f"write tensors as name: dtype[shape] and parameters as key=value, e.g. {EXAMPLE!r}")
        key, _, raw = item.partition("=")
        key = key.strip()
        if key not in PARAMS[op]:
            raise ForgeError(f"{op} has no parameter {key!r}", f"parameters of {op}: {', '.join(PARAMS[op])}")
        params[key] = _value(raw)
    if "x" not in tensors:
        raise ForgeError("the signature names no input tensor", f"e.g. {EXAMPLE!r}")
    return _build(op, tensors, params)


def _meta_tensor(item: str, tm: re.Match, dtype_override: str | None):
    import torch

    given = dtype_override or tm.group(2)
    dtype = dtypes.canonical(given)
    if dtype is None:
        where = "--dtype" if dtype_override else repr(item)
        raise ForgeError(f"unknown dtype {given!r} in {where}", "use f32, f16, bf16 or f64")
    try:
        shape = tuple(int(s) for s in tm.group(3).replace(" ", "").split(",") if s)
    except ValueError:
        raise ForgeError(f"cannot read the shape in {item!r}", "e.g. bf16[1,8,2048,2048]")
    layout = (tm.group(4) or "").strip()
    if not layout:
        strides = contiguous_strides(shape)
    elif layout == "channels_last":
        if len(shape) != 4:
            raise ForgeError(f"channels_last needs a 4-d shape: {item!r}", "e.g. f32[256,2048,7,7]{channels_last}")
        strides = channels_last_strides(shape)
    elif layout.startswith("strides="):
        strides = tuple(int(s) for s in layout[len("strides="):].split(","))
        if len(strides) != len(shape):
            raise ForgeError(f"strides and shape differ in length: {item!r}", "one stride per dimension")
    else:
        raise ForgeError(f"unknown layout {{{layout}}} in {item!r}", "use {channels_last} or {strides=...}")
    return torch.empty_strided(shape, strides, dtype=dtypes.torch_dtype(dtype), device="meta")


def _build(op: str, tensors: dict, params: dict) -> Signature:
    from forge_pack.targets import ops

    spec = registry.get(op)
    x = tensors["x"]
    kwargs: dict[str, Any] = {"input": x}
    for name in spec.tensors[1:]:
        kwargs[name] = tensors.get(name)
    extra = {}
    for key, value in params.items():
        if key == "dtype" and value is not None:
            value = dtypes.torch_dtype(value)
        if key in spec.own_params:
            extra[key] = value
            continue
        kwargs[key] = value
    problem = spec.complete(kwargs) if spec.complete is not None else None  # defaults filled in place
    if problem is not None:
        raise ForgeError(*problem)
    try:
        named, norm_params = ops.normalize_call(op, "F", (), kwargs)
    except ops.Unsupported:
        raise ForgeError(f"forge-pack does not target this call, or cannot read its {op} arguments",
                         f"see the supported ops in the README; e.g. {EXAMPLE!r}")
    except (TypeError, ValueError) as e:
        raise ForgeError(f"cannot read the {op} arguments: {e}", f"e.g. {EXAMPLE!r}")
    norm_params.update(extra)
    sig = ops.make_signature(op, named, norm_params)
    try:
        return ops.with_output(sig)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        raise ForgeError(f"PyTorch rejects {sig.pretty()}: {str(e).splitlines()[0]}",
                         "check shapes, dims and parameters against the op's documentation")
