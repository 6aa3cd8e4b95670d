"""The package's _patch.py on its own (no extension built): argument normalisation agrees with the
profiler's (forge_pack.ops), unknown arguments are refused, the GPU-architecture guard."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack import ops  # noqa: E402
from forge_pack.pack import pack  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "package" / "_patch.py"


@pytest.fixture(scope="module")
def patch_mod():
    spec = importlib.util.spec_from_file_location("_forge_test_patch", TEMPLATE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


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
    p = patch_mod.Patcher(cuda_manifest, "cuda_pkg", lambda: None)
    assert "no CUDA GPU is visible" in p._environment_problem()


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
