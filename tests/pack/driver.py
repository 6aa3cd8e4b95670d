"""Runs one scenario against an installed package in a fresh process; prints one JSON document.

    python driver.py PACKAGE SCENARIO

The package is imported the way a user would (from the --target dir on PYTHONPATH); the model
is tests/pack/tiny_model.py imported under its own name (not forge-pack's private one), so
module composites are found by walking the model.
"""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_model  # noqa: E402

PKG = importlib.import_module(sys.argv[1])
SCENARIO = sys.argv[2]
PATCH = sys.modules[f"{sys.argv[1]}._patch"]


def snapshot(model=None) -> dict:
    """Identity of every patchable object: functions, Tensor methods, module forwards."""
    snap = {}
    for paths in PATCH.CALL_PATHS.values():
        for owner, attr, _ in paths:
            obj = PATCH.OWNERS[owner]
            snap[f"{owner}.{attr}"] = [id(getattr(obj, attr, None)), attr in vars(obj)]
    if model is not None:
        for name, m in model.named_modules():
            snap[f"module:{name}"] = ["forward" in vars(m), id(type(m).forward)]
    return snap


def target(op: str, composite: bool = False) -> dict:
    return next(t for t in PKG.manifest["targets"] if t["op"] == op
                and bool(dict(t["signature"]["params"]).get("composite")) == composite)


def kcalls(tid: str) -> int:
    return PKG.status()["kernel_calls"].get(tid, 0)


def used(tid: str, fn) -> tuple[bool, torch.Tensor]:
    before = kcalls(tid)
    out = fn()
    return kcalls(tid) > before, out


def close(a, b, atol=1e-5, rtol=1e-4) -> bool:
    return bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol, equal_nan=True))


def scenario_roundtrip() -> dict:
    m = tiny_model.get_model().eval()
    x = tiny_model.get_inputs()
    before = snapshot(m)
    with torch.inference_mode():
        ref = m(*x)
        applied = PKG.apply(m)
        mid = snapshot(m)
        got = m(*x)
        calls = dict(PKG.status()["kernel_calls"])
        PKG.revert()
        after = snapshot(m)
        back = m(*x)
    tol = [t["tolerance"] for t in PKG.manifest["targets"]]
    atol, rtol = 10 * max(t["atol"] for t in tol), 10 * max(t["rtol"] for t in tol)  # errors compound over layers
    op_of = {t["id"]: t["op"] for t in PKG.manifest["targets"]}
    return {"applied": applied, "kernel_calls": {op_of[k]: v for k, v in calls.items()}, "changed": mid != before,
            "identity_restored": after == before,
            "max_diff": max(float((a - b).abs().max()) for a, b in zip(ref, got)),
            "within_tolerance": all(close(a, b, atol, rtol) for a, b in zip(ref, got)),
            "bitwise_after_revert": all(torch.equal(a, c) for a, c in zip(ref, back)),
            "status_after_revert": PKG.status()["applied"]}


def scenario_paths() -> dict:
    """Every call path of each target op reaches the kernel, and agrees with the original op."""
    torch.manual_seed(0)
    res = {}
    sm, ln, gn, pool = target("softmax"), target("layer_norm"), target("group_norm"), target("adaptive_avg_pool2d")
    x = torch.randn(4, 16, 64)
    x4 = torch.randn(4, 16, 8, 8)
    w, b = torch.randn(64), torch.randn(64)
    orig_sm = PATCH.ORIGINALS[("torch", "softmax")]
    layer = torch.nn.LayerNorm(64)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    rms = tiny_model.TinyRMSNorm(64)
    holder = torch.nn.Sequential(rms)
    PKG.apply(holder)
    ref_ln = PATCH.ORIGINALS[("torch.nn.functional", "layer_norm")](x, (64,), w, b, 1e-5)
    ref_gn = PATCH.ORIGINALS[("torch.nn.functional", "group_norm")](x4, 4)
    ref_pool = PATCH.ORIGINALS[("torch.nn.functional", "adaptive_avg_pool2d")](x4, 1)
    cases = {
        "F.softmax": (sm, lambda: F.softmax(x, dim=-1), orig_sm(x, -1)),
        "torch.softmax": (sm, lambda: torch.softmax(x, -1), orig_sm(x, -1)),
        "Tensor.softmax": (sm, lambda: x.softmax(-1), orig_sm(x, -1)),
        "nn.Softmax": (sm, lambda: torch.nn.Softmax(dim=-1)(x), orig_sm(x, -1)),
        "F.softmax(implicit _stacklevel)": (sm, lambda: F.softmax(x, 2, 3), orig_sm(x, -1)),
        "F.layer_norm": (ln, lambda: F.layer_norm(x, (64,), w, b), ref_ln),
        "torch.layer_norm": (ln, lambda: torch.layer_norm(x, [64], w, b, 1e-5), ref_ln),
        "nn.LayerNorm": (ln, lambda: layer(x), ref_ln),
        "F.group_norm": (gn, lambda: F.group_norm(x4, 4), ref_gn),
        "torch.group_norm": (gn, lambda: torch.group_norm(x4, 4), ref_gn),
        "nn.GroupNorm": (gn, lambda: torch.nn.GroupNorm(4, 16, affine=False)(x4), ref_gn),
        "F.adaptive_avg_pool2d": (pool, lambda: F.adaptive_avg_pool2d(x4, 1), ref_pool),
        "F.adaptive_avg_pool2d(tuple)": (pool, lambda: F.adaptive_avg_pool2d(x4, (1, 1)), ref_pool),
        "nn.AdaptiveAvgPool2d": (pool, lambda: torch.nn.AdaptiveAvgPool2d((1, 1))(x4), ref_pool),
        "module:TinyRMSNorm": (target("rms_norm", composite=True), lambda: rms(x),
                               PATCH.ORIGINALS[("torch.nn.functional", "rms_norm")](x, (64,), rms.weight, 1e-6)),
    }
    with torch.inference_mode():
        for label, (t, fn, ref) in cases.items():
            hit, out = used(t["id"], fn)
            res[label] = {"kernel": hit, "close": close(out, ref)}
    PKG.revert()
    return res


class MyTensor(torch.Tensor):
    pass


def scenario_guards() -> dict:
    """Every call outside what was verified runs the original op (bitwise the same result)."""
    torch.manual_seed(0)
    sm, ln, rms_t = target("softmax"), target("layer_norm"), target("rms_norm", composite=True)
    orig_sm = PATCH.ORIGINALS[("torch", "softmax")]
    orig_ln = PATCH.ORIGINALS[("torch.nn.functional", "layer_norm")]
    x = torch.randn(4, 16, 64)
    w, b = torch.randn(64), torch.randn(64)
    rms = tiny_model.TinyRMSNorm(64)
    other_eps = tiny_model.TinyRMSNorm(64, eps=1e-5)
    other_dim = tiny_model.TinyRMSNorm(32)
    model = torch.nn.Sequential(rms, other_eps, other_dim)
    PKG.apply(model)
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # same shape, other strides
    cases = {
        "dtype": (sm, lambda: F.softmax(x.double(), -1), lambda: orig_sm(x.double(), -1)),
        "shape": (sm, lambda: F.softmax(x[:, :, :32].contiguous(), -1), lambda: orig_sm(x[:, :, :32].contiguous(), -1)),
        "strides": (sm, lambda: F.softmax(strided, -1), lambda: orig_sm(strided, -1)),
        "kwarg dim": (sm, lambda: F.softmax(x, dim=1), lambda: orig_sm(x, 1)),
        "kwarg dtype": (sm, lambda: F.softmax(x, dim=-1, dtype=torch.float32),
                        lambda: orig_sm(x, -1, dtype=torch.float32)),
        "kwarg eps": (ln, lambda: F.layer_norm(x, (64,), w, b, eps=1e-3), lambda: orig_ln(x, (64,), w, b, 1e-3)),
        "optional input absent": (ln, lambda: F.layer_norm(x, (64,), w, None), lambda: orig_ln(x, (64,), w, None)),
        "device meta": (sm, lambda: F.softmax(x.to("meta"), -1), None),
        "subclass": (sm, lambda: F.softmax(x.as_subclass(MyTensor), -1), lambda: orig_sm(x, -1)),
        "composite eps": (rms_t, lambda: other_eps(x), None),
        "composite weight shape": (rms_t, lambda: other_dim(x[..., :32].contiguous()), None),
        "composite extra argument": (rms_t, lambda: rms(hidden_states=x), None),
    }
    res = {}
    with torch.inference_mode():
        for label, (t, fn, ref) in cases.items():
            hit, out = used(t["id"], fn)
            same = True if ref is None else bool(torch.equal(out.as_subclass(torch.Tensor), ref()))
            res[label] = {"kernel": hit, "same_as_original": same}
    # autograd: a graph is needed -> original op (and backward works); under no_grad -> kernel
    xg = x.clone().requires_grad_()
    hit, out = used(sm["id"], lambda: F.softmax(xg, -1))
    out.sum().backward()
    res["requires_grad"] = {"kernel": hit, "same_as_original": xg.grad is not None}
    with torch.no_grad():
        hit, _ = used(sm["id"], lambda: F.softmax(xg, -1))
    res["requires_grad under no_grad"] = {"kernel": hit, "same_as_original": True}
    hit, _ = used(rms_t["id"], lambda: rms(x))  # the weight is a Parameter: grad mode on -> original
    res["composite with grad"] = {"kernel": hit, "same_as_original": True}
    PKG.revert()
    return res


def scenario_apply_fails() -> dict:
    """Disabled or failing package: apply() says False, warns once, patches nothing."""
    m = tiny_model.get_model().eval()
    x = tiny_model.get_inputs()
    before = snapshot(m)
    with torch.inference_mode():
        ref = m(*x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = PKG.apply(m), PKG.apply(m)
    with torch.inference_mode():
        out = m(*x)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return {"applied": [first, second], "warnings": msgs, "identity_unchanged": snapshot(m) == before,
            "same_output": all(torch.equal(a, b) for a, b in zip(ref, out)), "status": PKG.status()}


def scenario_compile() -> dict:
    """torch.compile of a patched model: the kernels land in the graph as custom ops; it runs correctly."""
    from torch._dynamo.backends.common import aot_autograd

    m = tiny_model.get_model().eval()
    x = tiny_model.get_inputs()
    graphs: list = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    backend = aot_autograd(fw_compiler=record, inference_compiler=record)
    ns = PKG.manifest["package"]["namespace"]
    with torch.inference_mode():
        PKG.apply(m)
        patched = m(*x)
        traced = torch.compile(m, backend=backend, fullgraph=True)(*x)
        torch._dynamo.reset()
        inductor = torch.compile(m)(*x)
        PKG.revert()
        ref = m(*x)
    ops = sorted({str(n.target) for g in graphs for n in g.graph.nodes if ns in str(n.target)})
    return {"custom_ops_in_graph": ops,
            "traced_matches_patched": all(torch.equal(a, b) for a, b in zip(patched, traced)),
            "inductor_close_to_original": all(close(a, b, 1e-4, 1e-3) for a, b in zip(inductor, ref))}


def scenario_op_checks() -> dict:
    """The C++ op re-checks the signature: another shape is an error, not a wrong answer."""
    PKG.load()
    sm = target("softmax")
    op = getattr(getattr(torch.ops, PKG.manifest["package"]["namespace"]), sm["id"])
    try:
        op(torch.randn(3, 5))
        return {"raised": False}
    except RuntimeError as e:
        return {"raised": True, "message": str(e).splitlines()[0]}


def scenario_op_relayout() -> dict:
    """An input of the verified shape in another layout (as torch.compile may pass one) is copied into
    the verified layout, with a warning on stderr: the verified layout's result, not an error."""
    PKG.load()
    sm = target("softmax")
    op = getattr(getattr(torch.ops, PKG.manifest["package"]["namespace"]), sm["id"])
    shape = sm["signature"]["inputs"][0][1]["shape"]
    x = torch.randn(*shape)
    other = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values and shape, other strides
    got = op(other)
    again = op(other)  # the warning is once per process
    return {"strides_differ": other.stride() != x.stride(),
            "equal": bool(torch.equal(got, op(x))) and bool(torch.equal(again, got))}


def scenario_op_misaligned() -> dict:
    """An input of the verified dtype, shape and strides whose data starts at an odd element offset
    is copied (the kernels were verified on aligned allocations only), with a warning on stderr."""
    PKG.load()
    sm = target("softmax")
    op = getattr(getattr(torch.ops, PKG.manifest["package"]["namespace"]), sm["id"])
    shape = sm["signature"]["inputs"][0][1]["shape"]
    x = torch.randn(*shape)
    odd = torch.empty(x.numel() + 1)[1:].view(x.shape).copy_(x)
    return {"misaligned": odd.data_ptr() % 16 != 0, "equal": bool(torch.equal(op(odd), op(x)))}


if __name__ == "__main__":
    print(json.dumps(globals()[f"scenario_{SCENARIO}"]()))
