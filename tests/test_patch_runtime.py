"""The package's _patch.py on its own (no extension built): argument normalisation agrees with the
profiler's (forge_pack.targets.ops), unknown arguments are refused, the GPU-architecture guard."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.targets import ops# noqa: E402
from forge_pack.pack.packager import pack  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "package" / "_patch.py"


def _load_template(name: str):
    spec = importlib.util.spec_from_file_location(name, TEMPLATE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def patch_mod():
    return _load_template("_forge_test_patch")


@pytest.fixture(scope="module")
def other_patch_mod():
    """A second package's own copy of _patch.py, as two installed packages each ship one."""
    return _load_template("_forge_test_patch_other")


x3 = torch.randn(2, 3, 8)
x4 = torch.randn(2, 4, 3, 3)
w8, b8 = torch.randn(8), torch.randn(8)
w4, b4 = torch.randn(4), torch.randn(4)
rm, rv = torch.randn(4), torch.rand(4) + 0.5

CALLS = [
    ("softmax", "F", (x3,), {"dim": -1}),
    ("softmax", "F", (x3, 1), {}),
    ("softmax", "F", (x3,), {"dim": -1, "dtype": torch.float64}),
    ("softmax", "F", (x3, -1, 3, torch.float16), {}),
    ("softmax", "method", (x3, -1), {}),
    ("softmax", "method", (x3,), {"dim": 0, "dtype": torch.float32}),
    ("softmax", "torch", (x3, -1), {}),
    ("softmax", "torch", (x3, -1, torch.float64), {}),  # torch.softmax(input, dim, dtype): dtype by position
    ("log_softmax", "torch", (x3, 1, torch.float64), {}),
    ("softmax", "F", (x3,), {}),  # implicit dim
    ("log_softmax", "F", (x3,), {"dim": 2}),
    ("layer_norm", "F", (x3, (8,), w8, b8), {}),
    ("layer_norm", "F", (x3, [8]), {"eps": 1e-3}),
    ("layer_norm", "torch", (x3, [8], w8, None, 1e-5, True), {}),
    ("rms_norm", "F", (x3, (8,), w8), {}),
    ("rms_norm", "F", (x3, [8]), {"eps": 1e-6}),
    ("group_norm", "F", (x4, 2, w4, b4), {}),
    ("group_norm", "torch", (x4, 2, w4, b4, 1e-6, True), {}),
    ("batch_norm", "F", (x4, rm, rv, w4, b4, False, 0.1, 1e-5), {}),
    ("batch_norm", "F", (x4, rm, rv), {"weight": w4}),
    ("batch_norm", "torch", (x4, w4, b4, rm, rv, False, 0.1, 1e-5, True), {}),
    ("adaptive_avg_pool2d", "F", (x4, 1), {}),
    ("adaptive_avg_pool2d", "F", (x4, (1, None)), {}),
]


@pytest.mark.parametrize("op, style, args, kwargs", CALLS)
def test_normalisation_matches_the_profiler(patch_mod, op, style, args, kwargs):
    mine = patch_mod.NORMALIZERS[op](style, args, kwargs)
    tensors, params = ops.normalize_call(op, style, args, kwargs)
    assert mine is not None
    assert mine[1] == params
    assert set(mine[0]) == set(tensors) and all(mine[0][k] is tensors[k] for k in tensors)


@pytest.mark.parametrize("op, style, args, kwargs", [
    ("softmax", "F", (x3,), {"dim": -1, "out": None}),  # an unknown keyword
    ("softmax", "F", (x3, -1), {"dim": -1}),  # a duplicate
    ("softmax", "method", (x3, -1, None, 5), {}),  # too many positionals
    ("layer_norm", "F", (x3,), {}),  # a missing required argument
    ("batch_norm", "F", (x4, rm, rv, w4, b4, True), {}),  # training mode
    ("batch_norm", "F", (x4, None, None), {}),  # no running statistics
    ("softmax", "F", (x3, "channels"), {}),  # a named dimension
])
def test_unexpected_arguments_are_left_to_the_original(patch_mod, op, style, args, kwargs):
    assert patch_mod.NORMALIZERS[op](style, args, kwargs) is None


def test_call_paths_cover_the_profilers(patch_mod):
    for op, paths in ops.CALL_PATHS.items():
        function_paths = {(p.owner, p.attr) for p in paths if p.style != "module"}
        assert function_paths == {(o, a) for o, a, _ in patch_mod.CALL_PATHS[op]}, op
        for p in paths:  # nn.* modules reach the op through the F.* path, which is patched
            assert p.style != "module" or p.via.startswith("F.")


def _packed_manifest(tmp_path_factory, make_run, name: str) -> dict:
    root = tmp_path_factory.mktemp(name)
    run = make_run(root / "run")
    assert pack(run, root / "out", name, confirm=False).written
    return json.loads((root / "out" / name / "manifest.json").read_text())


@pytest.fixture(scope="module")
def cuda_manifest(tmp_path_factory):
    return _packed_manifest(tmp_path_factory, helpers.make_cuda_run, "cuda_pkg")


def test_gpu_architecture_guard(patch_mod, cuda_manifest, monkeypatch):
    loads = []
    p = patch_mod.Patcher(cuda_manifest, "cuda_pkg", lambda: loads.append(1))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    why = p._environment_problem()
    assert "compute capability 9.0" in why and "8.0" in why
    with pytest.warns(RuntimeWarning, match="compute capability 9.0"):
        assert p.apply() is False
    assert loads == [] and F.softmax.__name__ == "softmax" and not hasattr(F.softmax, "__forge_pack__")
    q = patch_mod.Patcher(cuda_manifest, "cuda_pkg", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0) if i == 1 else (8, 0))
    assert q._environment_problem() is None  # one matching GPU is enough ...
    assert q._cap_ok(torch.device("cuda", 1)) and not q._cap_ok(torch.device("cuda", 0))  # ... per call


def test_cuda_package_without_a_visible_gpu_patches_nothing(patch_mod, cuda_manifest, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # a CUDA build (the CPU-only wheel says so instead)
    p = patch_mod.Patcher(cuda_manifest, "cuda_pkg", lambda: None)
    assert "no CUDA GPU is visible" in p._environment_problem()
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "this torch build has no CUDA" in p._environment_problem()


@pytest.fixture(scope="module")
def cpu_manifest(tmp_path_factory):
    return _packed_manifest(tmp_path_factory, helpers.make_cpu_run, "cpu_pkg")


def test_a_fall_back_through_two_patched_paths_counts_once(patch_mod, cpu_manifest, monkeypatch):
    """F.group_norm falls back through torch.group_norm and F.softmax through Tensor.softmax, both
    patched too: one call that no kernel takes is one fall-back; a call a kernel takes is none."""
    p = patch_mod.Patcher(cpu_manifest, "cpu_pkg", lambda: None)
    ran = []

    def bind():  # no extension here: each target's "kernel" records itself and copies its input
        for t in p.targets:
            t.fn = lambda *ts, t=t: ran.append(t.id) or ts[0].clone()

    monkeypatch.setattr(p, "_bind_ops", bind)
    gn = next(t for t in p.targets if t.op == "group_norm")
    sm = next(t for t in p.targets if t.op == "softmax" and not t.composite)
    shape = tuple(dict(gn.specs)["x"][1])
    assert p.apply()
    try:
        F.group_norm(torch.randn(2, 16, 3, 3), 4)  # no kernel for this shape
        F.softmax(torch.randn(3, 5), dim=-1)
        torch.softmax(torch.randn(3, 5), -1)
        assert p.fallback_calls == {"group_norm": 1, "softmax": 2}, p.fallback_calls
        F.group_norm(torch.randn(*shape), 4)  # the kernel's own signature: a kernel call, no fall-back
        F.softmax(torch.randn(*dict(sm.specs)["x"][1]), dim=-1)
        assert p.fallback_calls == {"group_norm": 1, "softmax": 2}, p.fallback_calls
        assert p.kernel_calls == {gn.id: 1, sm.id: 1} and ran == [gn.id, sm.id]
    finally:
        p.revert()



_q = torch.randn(1, 2, 4, 8)


@pytest.mark.parametrize("op, style, args, kwargs", CALLS + [
    ("attention", "F", (_q, _q.clone(), _q.clone()), {}),
    ("attention", "F", (), {"query": _q, "key": _q.clone(), "value": _q.clone(), "is_causal": True}),
])
def test_every_binders_x_is_one_of_the_calls_own_arguments(patch_mod, op, style, args, kwargs):
    """What the dispatch's first guard (_no_verified_x) rests on: the bound `x` is an argument of the
    call itself, not a view or copy of one, so a call none of whose tensor arguments has a verified
    `x` layout cannot match any target."""
    bound = patch_mod.NORMALIZERS[op](style, args, kwargs)
    assert bound is not None
    assert any(bound[0]["x"] is v for v in (*args, *kwargs.values()))


def test_rms_norm_module_binder_takes_x_from_the_call(patch_mod):
    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.ones(8)), 1e-6

    bound = patch_mod.TARGETS.get("rms_norm").bind_module(Norm(), (x3,), {})
    assert bound[0]["x"] is x3


def test_a_call_with_no_verified_x_layout_is_turned_away_before_binding(patch_mod, cpu_manifest, monkeypatch):
    """The eager wrappers' cheap first guard: a call none of whose tensors has the dtype, shape and
    strides of a target's `x` never reaches the binder (the cost of a decode step after a prefill
    the package was built on); one that has goes on to the full guards and the kernel."""
    p = _fake_patcher(patch_mod, cpu_manifest, "cpu_pkg", monkeypatch)
    sm = next(t for t in p.targets if t.op == "softmax" and not t.composite)
    dtype, shape, strides = sm.x_key
    bound = []
    real = patch_mod.NORMALIZERS["softmax"]
    monkeypatch.setitem(patch_mod.NORMALIZERS, "softmax", lambda *a: bound.append(1) or real(*a))
    assert p.apply()
    try:
        x = torch.randn(*shape, dtype=dtype)
        F.softmax(x[..., :-1], dim=-1)  # another shape
        F.softmax(x.to(torch.float64 if dtype != torch.float64 else torch.float32), dim=-1)  # another dtype
        if len(shape) > 1:
            F.softmax(x.transpose(-1, -2).contiguous().transpose(-1, -2), dim=-1)  # the shape, other strides
        assert bound == [] and p.kernel_calls == {}
        assert p.fallback_calls == {"softmax": 3 if len(shape) > 1 else 2}
        assert tuple(x.stride()) == strides
        F.softmax(x, dim=-1)
        assert bound == [1] and p.kernel_calls == {sm.id: 1}
    finally:
        p.revert()


def test_the_first_guard_leaves_traced_tensors_and_targets_without_an_x_spec_to_the_full_guards(patch_mod):
    from torch._subclasses.fake_tensor import FakeTensorMode

    keys = frozenset({(torch.float32, (2, 3), (3, 1))})
    assert patch_mod._no_verified_x(keys, (torch.randn(4, 4),), {})
    assert not patch_mod._no_verified_x(keys, (), {"input": torch.randn(2, 3)})
    assert patch_mod._no_verified_x(keys, (torch.randn(2, 3, dtype=torch.float64),), {})
    with FakeTensorMode():
        fake = torch.empty(4, 4)
    assert not patch_mod._no_verified_x(keys, (fake,), {})  # compile's fake tensors: _tensors_match decides
    assert not patch_mod._no_verified_x(None, (torch.randn(4, 4),), {})  # a target without an x spec
    assert not patch_mod._no_verified_x(keys, (torch.randn(4, 4).to_sparse(),), {})  # no strides to compare
    nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)])
    assert not patch_mod._no_verified_x(keys, (nested,), {})

    class T:
        def __init__(self, key):
            self.x_key = key

    assert patch_mod._x_keys([T((torch.float32, (2, 3), (3, 1))), T(None)]) is None
    assert patch_mod._x_keys([T((torch.float32, (2, 3), (3, 1)))]) == keys

# ------------------------------------------------------------------ runtime semantics (fake kernels)
# No extension here: each target's "kernel" records itself and returns a copy of its input, an
# answer no real op gives, so a call a kernel should not have taken shows in the result.

import copy  # noqa: E402
import io  # noqa: E402
import pickle  # noqa: E402

import torch.autograd.forward_ad as fwAD  # noqa: E402
import tiny_model  # noqa: E402


def _fake_patcher(patch_mod, manifest: dict, package: str, monkeypatch, ran: list | None = None):
    p = patch_mod.Patcher(manifest, package, lambda: None)
    ran = [] if ran is None else ran

    def bind():
        for t in p.targets:
            t.fn = lambda *ts, t=t: ran.append((package, t.id)) or ts[0].clone()

    monkeypatch.setattr(p, "_bind_ops", bind)
    return p


def _target_x(p, op: str, composite: bool = False) -> torch.Tensor:
    t = next(t for t in p.targets if t.op == op and t.composite == composite)
    return torch.randn(*dict(t.specs)["x"][1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_rms_norm_default_eps_is_pytorchs(patch_mod, dtype):
    """eps=None (nn.RMSNorm's default): PyTorch uses the eps of the dtype it computes in (float32 for
    half and bfloat16), not the input dtype's; both normalisers record the eps torch really uses."""
    x = (torch.randn(4, 64, dtype=torch.float64) * 1e-4).to(dtype)  # tiny values: the eps decides the result
    mine = patch_mod.NORMALIZERS["rms_norm"]("F", (x, (64,)), {})[1]["eps"]
    assert ops.normalize_call("rms_norm", "F", (x, (64,)), {})[1]["eps"] == mine
    assert torch.equal(F.rms_norm(x, (64,)), F.rms_norm(x, (64,), eps=mine))
    assert mine == torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def test_a_copy_or_pickle_of_a_patched_model_is_the_unpatched_model(patch_mod, cpu_manifest, monkeypatch):
    """copy.deepcopy / pickle / torch.save of a model with patched module instances: the copy is the
    model's own class, computes with its own weights, and needs no revert; saving works while applied."""
    p = _fake_patcher(patch_mod, cpu_manifest, "cpu_pkg", monkeypatch)
    m = torch.nn.Sequential(tiny_model.TinyRMSNorm(64))
    x = _target_x(p, "rms_norm", composite=True)
    assert p.apply(m)
    try:
        with torch.inference_mode():
            assert torch.equal(m(x), x), "the patched instance takes the verified call"
        m2 = copy.deepcopy(m)
        with torch.no_grad():
            m2[0].weight.mul_(3.0)
        loaded = pickle.loads(pickle.dumps(m))
        buf = io.BytesIO()
        torch.save(m, buf)
    finally:
        p.revert()
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    for copied in (m2[0], loaded[0], saved[0], m[0]):
        assert type(copied) is tiny_model.TinyRMSNorm and "forward" not in vars(copied)
    fresh = tiny_model.TinyRMSNorm(64)
    with torch.no_grad():
        fresh.weight.copy_(m2[0].weight)
    with torch.inference_mode():
        assert torch.equal(m2(x), fresh(x)), "the copy computes with its own weights"
        assert torch.equal(loaded(x), m(x)) and torch.equal(saved(x), m(x))


def test_autocast_falls_back_to_the_original(patch_mod, cpu_manifest, monkeypatch):
    """Under torch.autocast the original ops change their output dtype; the kernels were verified
    without it: every call, function or module, runs the original."""
    ran = []
    p = _fake_patcher(patch_mod, cpu_manifest, "cpu_pkg", monkeypatch, ran)
    x = _target_x(p, "softmax")
    rms = torch.nn.Sequential(tiny_model.TinyRMSNorm(64))
    xr = _target_x(p, "rms_norm", composite=True)
    assert p.apply(rms)
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            got = [F.softmax(x, -1), torch.softmax(x, -1), x.softmax(-1), rms(xr)]
        assert ran == [] and p.kernel_calls == {}
        with torch.inference_mode():
            assert torch.equal(F.softmax(x, -1), x) and len(ran) == 1, "without autocast: the kernel"
    finally:
        p.revert()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = [F.softmax(x, -1), torch.softmax(x, -1), x.softmax(-1), rms(xr)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_functorch_transforms_and_forward_ad_fall_back(patch_mod, cpu_manifest, monkeypatch):
    """vmap, jvp, grad and forward-mode dual tensors: the kernels have no batching rule and no
    derivatives (they would drop the batch dimension or the tangent); the original op runs."""
    ran = []
    p = _fake_patcher(patch_mod, cpu_manifest, "cpu_pkg", monkeypatch, ran)
    x = _target_x(p, "softmax")
    tangent = torch.randn_like(x)
    sm = patch_mod.ORIGINALS[("torch.nn.functional", "softmax")]
    assert p.apply()
    try:
        with torch.no_grad():
            batched = torch.vmap(lambda v: F.softmax(v, -1))(torch.stack([x, 2 * x]))
        _, jvp_t = torch.func.jvp(lambda v: F.softmax(v, -1), (x,), (tangent,))
        g = torch.func.grad(lambda v: F.softmax(v, -1).pow(2).sum())(x)
        with fwAD.dual_level(), torch.no_grad():
            dual_t = fwAD.unpack_dual(F.softmax(fwAD.make_dual(x, tangent), -1)).tangent
            with_level = F.softmax(x, -1)  # a plain tensor inside a dual level: still the kernel
    finally:
        p.revert()
    assert ran == [("cpu_pkg", next(t.id for t in p.targets if t.op == "softmax" and not t.composite))]
    assert torch.equal(with_level, x)
    assert torch.allclose(batched, torch.stack([sm(x, -1), sm(2 * x, -1)]))
    _, want_t = torch.func.jvp(lambda v: sm(v, -1), (x,), (tangent,))
    assert torch.allclose(jvp_t, want_t) and torch.allclose(dual_t, want_t) and want_t.abs().max() > 0
    assert torch.allclose(g, torch.func.grad(lambda v: sm(v, -1).pow(2).sum())(x))


def _identities(model) -> dict:
    """Every object either package patches here: functions, Tensor methods, the class's forward, the
    classes of the model's modules."""
    owners = {"torch.nn.functional": F, "torch": torch, "torch.Tensor": torch.Tensor}
    snap = {(o, a): getattr(owners[o], a) for o, a in [("torch.nn.functional", "softmax"), ("torch", "softmax"),
            ("torch.Tensor", "softmax"), ("torch.nn.functional", "layer_norm"), ("torch", "group_norm")]}
    snap["forward"] = vars(tiny_model.TinyRMSNorm)["forward"]
    snap["classes"] = [type(m) for m in model.modules()]
    return snap


@pytest.mark.parametrize("composite", ["instance", "class"])
@pytest.mark.parametrize("first", ["a", "b"])
def test_two_packages_revert_in_any_order(patch_mod, other_patch_mod, cpu_manifest, monkeypatch, composite, first):
    """A.apply(); B.apply(); then either reverts first: the other keeps working (its kernels take its
    calls, its module patches stay), and once both are reverted every object is the original again."""
    doc = copy.deepcopy(cpu_manifest)
    if composite == "class":  # an importable class: patched at class level, not per instance
        for t in doc["targets"]:
            if t["module_class"]:
                t["module_class"] = "tiny_model:TinyRMSNorm"
    ran = []
    pkgs = {"a": _fake_patcher(patch_mod, doc, "a", monkeypatch, ran),
            "b": _fake_patcher(other_patch_mod, doc, "b", monkeypatch, ran)}
    model = torch.nn.Sequential(tiny_model.TinyRMSNorm(64))
    x, xr = _target_x(pkgs["a"], "softmax"), _target_x(pkgs["a"], "rms_norm", composite=True)
    before = _identities(model)
    second = "b" if first == "a" else "a"
    try:
        assert pkgs["a"].apply(model) and pkgs["b"].apply(model)
        pkgs[first].revert()
        assert pkgs[second].applied and not pkgs[first].applied
        ran.clear()
        with torch.inference_mode():
            outs = [F.softmax(x, -1), torch.softmax(x, -1), x.softmax(-1), model(xr)]
        assert all(torch.equal(o, i) for o, i in zip(outs, [x, x, x, xr])), "the other package still patches"
        assert {pkg for pkg, _ in ran} == {second} and len(ran) == 4
    finally:
        pkgs[second].revert()
        pkgs[first].revert()
    assert _identities(model) == before
    ran.clear()
    with torch.inference_mode():
        F.softmax(x, -1), model(xr)
    assert ran == []


def test_revert_under_a_foreign_patch_leaves_a_pass_through(patch_mod, cpu_manifest, monkeypatch):
    """Something other than forge-pack wrapped F.softmax after apply: revert cannot unlink from under
    it, so it says so and leaves its wrapper passing every call to the original."""
    ran = []
    p = _fake_patcher(patch_mod, cpu_manifest, "cpu_pkg", monkeypatch, ran)
    x = _target_x(p, "softmax")
    original = F.softmax
    assert p.apply()
    patched = F.softmax
    F.softmax = lambda *a, **k: patched(*a, **k)
    try:
        with pytest.warns(RuntimeWarning, match="could not undo its patch of softmax"):
            p.revert()
        with torch.inference_mode():
            assert torch.equal(F.softmax(x, -1), original(x, -1)) and ran == []
        assert torch.softmax is patch_mod.ORIGINALS[("torch", "softmax")]
    finally:
        F.softmax = original


def test_code_fingerprint_tells_classes_apart_and_is_the_same_in_every_process():
    """The profiler records it in one process, the package recomputes it in another (a different
    PYTHONHASHSEED: a set of strings in a method must not change it)."""
    import subprocess

    from forge_pack.profile.profiler import code_fingerprint

    fp = code_fingerprint(tiny_model.TinyRMSNorm)
    assert fp != code_fingerprint(tiny_model.Tiny) and fp != code_fingerprint(TinyRMSNorm)
    assert patch_mod_fingerprint_in_subprocess(subprocess, "tiny_model", "TinyRMSNorm", "12345") == fp
    here = code_fingerprint(SetUser)
    assert {patch_mod_fingerprint_in_subprocess(subprocess, "test_patch_runtime", "SetUser", seed)
            for seed in ("1", "2", "3")} == {here}


class SetUser(torch.nn.Module):
    def forward(self, x, mode="a"):
        return x * 2 if mode in {"alpha", "beta", "gamma", "delta"} else x


def patch_mod_fingerprint_in_subprocess(subprocess, module: str, name: str, seed: str) -> str:
    code = (f"import sys; sys.path[:0] = {[str(Path(__file__).parent / 'pack'), str(Path(__file__).parent)]!r}; "
            f"import importlib.util as u; s = u.spec_from_file_location('p', {str(TEMPLATE)!r}); "
            f"m = u.module_from_spec(s); s.loader.exec_module(m); import {module} as t; "
            f"print(m.code_fingerprint(t.{name}))")
    env = {**os.environ, "PYTHONHASHSEED": seed}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


class TinyRMSNorm(torch.nn.Module):  # the profiled class's name, another library's formula
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        return (1.0 + self.weight) * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def test_a_class_that_only_shares_the_profiled_name_is_not_patched(patch_mod, cpu_manifest, monkeypatch):
    t = next(t for t in cpu_manifest["targets"] if t["module_class"])
    assert t["module_code"], "the profiler records the composite's code"
    ran = []
    p = _fake_patcher(patch_mod, cpu_manifest, "cpu_pkg", monkeypatch, ran)
    xr = _target_x(p, "rms_norm", composite=True)
    impostor, genuine = torch.nn.Sequential(TinyRMSNorm(64)), torch.nn.Sequential(tiny_model.TinyRMSNorm(64))
    assert p.apply(impostor)
    try:
        with torch.inference_mode():
            impostor(xr)
            assert ran == [] and type(impostor[0]) is TinyRMSNorm
            assert p.apply(genuine)
            genuine(xr)
            assert len(ran) == 1
    finally:
        p.revert()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads /proc/cpuinfo")
def test_a_native_cpu_build_from_another_cpu_is_refused_before_it_loads(patch_mod, cpu_manifest):
    here = Path("/proc/cpuinfo").read_text()
    flags = next(line.split(":", 1)[1].split() for line in here.splitlines()
                 if line.startswith(("flags", "Features")))
    loads = []
    same = patch_mod.Patcher(cpu_manifest, "cpu_pkg", lambda: loads.append(1), {"cpu_features": flags})
    assert same._environment_problem() is None
    other = patch_mod.Patcher(cpu_manifest, "cpu_pkg", lambda: loads.append(1),
                              {"cpu_features": flags + ["avx512_fake_isa", "hypervisor_quirk"]})
    why = other._environment_problem()
    assert "avx512_fake_isa" in why and "hypervisor_quirk" not in why and "reinstall" in why
    with pytest.warns(RuntimeWarning, match="another CPU"):
        assert other.apply() is False
    assert loads == []



def test_a_gpu_with_fewer_sms_runs_the_originals_of_kernels_sized_for_every_sm(patch_mod, cuda_manifest,
                                                                                monkeypatch):
    """A kernel whose grid waits on itself (min_sm_count) would stall on a GPU of the same architecture
    with fewer SMs (an H100 PCIe for an H200 search): that target falls back, with a warning; the
    package's other kernels keep running there."""
    import copy
    import types

    manifest = copy.deepcopy(cuda_manifest)
    sized = manifest["targets"][0]
    sized["kernel"]["min_sm_count"] = 132
    sms = {0: 114, 1: 132}
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i=0: types.SimpleNamespace(multi_processor_count=sms[i]))
    p = patch_mod.Patcher(manifest, "cuda_pkg", lambda: None)
    with pytest.warns(RuntimeWarning, match=f"{sized['id']} were sized for a GPU with 132 SMs"):
        assert p._environment_problem() is None
    small = torch.device("cuda", 0)
    t_sized = next(t for t in p.targets if t.id == sized["id"])
    t_other = next(t for t in p.targets if t.id != sized["id"])
    assert not p._cap_ok(small, t_sized) and p._cap_ok(small, t_other)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    q = patch_mod.Patcher(manifest, "cuda_pkg", lambda: None)
    assert q._environment_problem() is None
    q_sized = next(t for t in q.targets if t.id == sized["id"])
    assert q._cap_ok(torch.device("cuda", 1), q_sized) and not q._cap_ok(small, q_sized)

def test_a_class_of_the_profiled_name_but_other_code_is_left_alone_with_one_warning(patch_mod, cpu_manifest,
                                                                                      monkeypatch):
    ran = []
    p = _fake_patcher(patch_mod, cpu_manifest, "cpu_pkg", monkeypatch, ran)
    model = torch.nn.Sequential(TinyRMSNorm(64), TinyRMSNorm(64))
    with pytest.warns(RuntimeWarning, match="name of a profiled module but not its code") as record:
        assert p.apply(model)
    try:
        assert sum("not its code" in str(w.message) for w in record) == 1  # once per class
        assert all(type(m) is TinyRMSNorm for m in model)
    finally:
        p.revert()


def test_an_importable_class_whose_code_changed_is_not_patched_at_class_level(patch_mod, cpu_manifest,
                                                                                monkeypatch):
    import copy

    manifest = copy.deepcopy(cpu_manifest)
    for t in manifest["targets"]:
        if t["module_class"]:
            t["module_class"] = "tiny_model:TinyRMSNorm"  # importable: patched at class level
            t["module_code"] = "0" * 16  # as recorded from another version of the class
    ran = []
    p = _fake_patcher(patch_mod, manifest, "cpu_pkg", monkeypatch, ran)
    original = tiny_model.TinyRMSNorm.forward
    with pytest.warns(RuntimeWarning, match="not its code"):
        assert p.apply()
    try:
        assert tiny_model.TinyRMSNorm.forward is original
    finally:
        p.revert()
