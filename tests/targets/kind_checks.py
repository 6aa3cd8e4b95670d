"""Checks every target kind's test file runs on its own cases (tests/targets/test_<kind>.py).

A case is one call as user code writes it: (call, style, tensors, params), where ``call`` makes the
call. ``recorded`` runs it and records the target-op calls it reaches (a module's forward reaches
its F.* function), as the profiler's TorchFunctionMode sees them. The shipped package's binders
are loaded from a real vendored copy (``package_runtime``): the files the packager writes into
``<pkg>/_targets/``, next to the package's own ``_patch.py``.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from forge_pack.core.signature import Signature
from forge_pack.evaluate import tolerance, verdict_rules
from forge_pack.targets import abi, ops, registry

ROOT = Path(__file__).resolve().parents[2]


class _Calls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.table = ops.function_table()
        self.seen: list[tuple[str, str, tuple, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            hit = self.table.get(func)
        except TypeError:
            hit = None
        if hit is not None:
            self.seen.append((hit[0], hit[1].style, args, dict(kwargs)))
        return func(*args, **kwargs)


def recorded(call: Callable[[], Any]) -> list[tuple[str, str, tuple, dict]]:
    """(kind, style, args, kwargs) of every target call ``call`` makes, outermost first."""
    with _Calls() as mode:
        call()
    return mode.seen


_RUNTIME: dict[str, Any] = {}


def package_runtime(tmp_dir: Path) -> Any:
    """A package's _patch.py beside a vendored _targets/ (written by the packager), loaded as the
    package loads it: its NORMALIZERS are the shipped binders."""
    if "patch" in _RUNTIME:
        return _RUNTIME["patch"]
    from forge_pack.pack.packager import vendor_targets

    pkg = tmp_dir / "kindpkg"
    pkg.mkdir(parents=True, exist_ok=True)
    for name in ("_patch.py", "_integrity.py"):
        shutil.copy2(ROOT / "templates" / "package" / name, pkg / name)
    vendor_targets(pkg)
    spec = importlib.util.spec_from_file_location("_kind_checks_patch", pkg / "_patch.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    assert Path(mod.TARGETS.__file__).parent == pkg / "_targets"  # the vendored copy, not the source
    _RUNTIME["patch"] = mod
    return mod


def check_binds(name: str, call: Callable[[], Any], style: str, tensors: dict, params: dict) -> None:
    """The call reaches ``name`` once, by ``style``, and binds to exactly these tensors and params
    (tensors by identity: the very objects the call passed)."""
    hits = [h for h in recorded(call) if h[0] == name]
    assert hits, f"{name} was not reached"
    kind, got_style, args, kwargs = hits[0]
    assert got_style == style
    bound = registry.get(name).bind(style, args, kwargs)
    assert bound is not None, (args, kwargs)
    got_tensors, got_params = bound
    assert got_params == params
    assert set(got_tensors) == set(tensors)
    for k, v in tensors.items():
        assert got_tensors[k] is v, k


def check_same_in_package(patch_mod: Any, name: str, call: Callable[[], Any]) -> None:
    """The package's binder (vendored copy) and the profiler's bind the call identically."""
    for kind, style, args, kwargs in recorded(call):
        if kind != name:
            continue
        mine = patch_mod.NORMALIZERS[name](style, args, kwargs)
        profiled = ops.normalize_call(name, style, args, kwargs)
        assert mine is not None
        assert mine[1] == profiled[1]
        assert set(mine[0]) == set(profiled[0]) and all(mine[0][k] is profiled[0][k] for k in profiled[0])
        return
    raise AssertionError(f"{name} was not reached")


def check_refused(patch_mod: Any, name: str, style: str, args: tuple, kwargs: dict) -> None:
    """Neither the profiler nor the package takes the call."""
    assert registry.get(name).bind(style, args, kwargs) is None
    assert patch_mod.NORMALIZERS[name](style, args, kwargs) is None
    try:
        ops.normalize_call(name, style, args, kwargs)
    except ops.Unsupported:
        return
    raise AssertionError("the profiler took a call the package refuses")


def signature(name: str, tensors: dict, params: dict) -> Signature:
    return ops.with_output(ops.make_signature(name, tensors, params))


def check_reference_matches_eager(sig: Signature, seed: int = 0) -> None:
    """On fresh inputs, eager PyTorch is within the kind's tolerance of the float64 reference, and
    the reference is float64 of the output's shape."""
    spec = registry.get(sig.op)
    t = ops.make_inputs(sig, "fresh", torch.Generator().manual_seed(seed), "cpu")
    ref = spec.reference64(dict(sig.params), t)
    out = spec.eager(dict(sig.params), sig.output.dtype)(t)
    assert ref.dtype == torch.float64 and tuple(ref.shape) == tuple(out.shape) == sig.output.shape
    check = tolerance.compare(out, ref, sig.output.dtype, sig.op)
    assert check.passed, check.first_mismatch


def check_tolerances(name: str, own: dict) -> None:
    """The kind's own rows (dtype -> (atol, rtol)) are what the rules apply; other dtypes get the
    generic table's."""
    spec = registry.get(name)
    assert {d: (r.atol, r.rtol) for d, r in spec.tolerances.items()} == own
    for dtype in verdict_rules.TABLE:
        got = tolerance.tolerance(name, dtype)
        want = own.get(dtype, (verdict_rules.TABLE[dtype].atol, verdict_rules.TABLE[dtype].rtol))
        assert (got.atol, got.rtol) == want, dtype
        assert got.reason  # every row says why


def check_abi(sig: Signature, size_vars: dict) -> None:
    """The kernel ABI: the size variables a launch may use, the tensor names in ABI order."""
    env = abi.env(sig)
    for k, v in size_vars.items():
        assert env[k] == v, k
    assert abi.tensor_names(sig) == [n for n, s in sig.inputs if s is not None] + ["out"]
