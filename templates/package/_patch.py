"""Manifest-driven patching. Generic: this same file ships, unchanged, in every forge-pack package.

The manifest lists targets: an op (softmax, layer_norm, ...) called with one exact signature
(dtypes, shapes, strides, parameters) on one device kind, and the torch op of the package that
computes it. What each kind's call paths are and how a call's arguments bind is the target
registry shipped beside this file as ``_targets/`` (forge-pack's own ``forge_pack/targets``,
copied verbatim: the profiler bound the model's calls with the same code). ``Patcher.apply`` replaces every call path of each target op (``F.softmax``,
``torch.softmax``, ``Tensor.softmax``; ``nn.Softmax`` goes through ``F.softmax``) and, for module
composites (an RMSNorm written as eager ops), the module class's ``forward`` and matching
instances in a given model; for function composites (HF's eager_attention_forward), the function
at its module-level name. Each replacement checks the call against the verified signatures
(device, GPU architecture, dtypes, shapes, strides, parameters, unknown keywords, whether
autograd needs a graph, autocast, functorch transforms and forward-mode AD) and calls the original
for anything else. ``revert`` puts every patched object back exactly, in any order across several
packages. ``FORGE_PACK_DISABLE=1`` (or true, yes, on) turns the package off; an extension that
cannot be loaded leaves everything untouched and says why once.
"""

from __future__ import annotations

import contextlib
import copyreg
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.autograd.forward_ad as _fwAD
import torch.nn.functional as F

DISABLE_ENV = "FORGE_PACK_DISABLE"
# Spellings of FORGE_PACK_DISABLE: only a yes turns the package off ("false" or "0" must not).
DISABLE_YES = ("1", "true", "yes", "on")
DISABLE_NO = ("", "0", "false", "no", "off")
_MISS = object()

# Per thread: whether a patched path below the innermost fall-back in progress took the call (a
# kernel, or a fall-back of its own). F.group_norm falls back through torch.group_norm, which is
# patched too: the call is one fall-back, counted where it finally reaches torch.
_BELOW = threading.local()


def _compiling() -> bool:
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return is_compiling is not None and is_compiling()


def _autocast_on(device_type: str) -> bool:
    """torch.autocast changes what softmax, layer_norm, rms_norm, group_norm ... return (their dtype);
    the kernels were verified without it, so under autocast the original op runs."""
    return torch.is_autocast_enabled(device_type)  # the device_type form: torch >= 2.4


# functorch transforms (vmap, grad, jvp) wrap tensors; a kernel has no batching rule and no
# derivatives, so it would drop the batch dimension or the tangent silently. Private API: guarded.
_IS_WRAPPED: Callable | None = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)


def _transformed(v: torch.Tensor) -> bool:
    """A functorch-wrapped tensor, or a forward-mode AD dual tensor (its tangent would be dropped)."""
    if _IS_WRAPPED is not None and _IS_WRAPPED(v):
        return True
    # no dual level entered (the usual case): no tensor has a tangent, skip the unpack
    return getattr(_fwAD, "_current_level", 0) >= 0 and _fwAD.unpack_dual(v).tangent is not None


class ManifestError(ValueError):
    """The manifest is missing, not JSON, or does not match its schema."""


# ------------------------------------------------------------------ call paths and arguments

def _load_registry() -> Any:
    """The target registry: ``<package>._targets`` in an installed package. This file run from
    forge-pack's source tree (templates/package/, in forge-pack's tests) has no copy beside it and
    loads the source it is copied from, forge_pack/targets, under a private name."""
    here = Path(__file__).resolve().parent
    if __package__ and (here / "_targets" / "__init__.py").is_file():
        return importlib.import_module(f"{__package__}._targets.registry")
    src = here / "_targets" if (here / "_targets").is_dir() else here.parent.parent / "forge_pack" / "targets"
    name = f"{__name__}_targets"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, src / "__init__.py", submodule_search_locations=[str(src)])
        if spec is None or spec.loader is None or not (src / "__init__.py").is_file():
            raise ImportError(f"the target registry is missing beside {Path(__file__).name} (no _targets/): the "
                              "package is incomplete; reinstall it or rebuild it with forge-pack")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return importlib.import_module(f"{name}.registry")


TARGETS = _load_registry()
DTYPES = {name: TARGETS.dtypes.torch_dtype(name) for name in TARGETS.dtypes.CANONICAL}
OWNERS: dict[str, Any] = {"torch.nn.functional": F, "torch": torch, "torch.Tensor": torch.Tensor}

# (owner, attribute, argument style) for every function path that reaches a kind; nn.Softmax,
# nn.LayerNorm, nn.GroupNorm, nn.BatchNorm*d, nn.AdaptiveAvgPool2d, nn.RMSNorm call the F.* path.
CALL_PATHS: dict[str, tuple[tuple[str, str, str], ...]] = {
    spec.name: tuple((p.owner, p.attr, p.style) for p in spec.call_paths if p.style != "module")
    for spec in TARGETS.SPECS.values() if spec.bind is not None
}

# The functions as they were when this module was imported: the reference for verify and bench.
ORIGINALS: dict[tuple[str, str], Any] = {
    (owner, attr): getattr(OWNERS[owner], attr)
    for paths in CALL_PATHS.values() for owner, attr, _ in paths if hasattr(OWNERS[owner], attr)
}

# kind -> binder: (style, args, kwargs) -> (tensors by ABI name, params), or None for a call it
# does not recognise exactly (the original then runs)
NORMALIZERS: dict[str, Callable] = {name: spec.bind for name, spec in TARGETS.SPECS.items() if spec.bind is not None}


# ------------------------------------------------------------------ manifest


def disable_setting() -> tuple[bool, str | None]:
    """(whether FORGE_PACK_DISABLE turns the package off, a warning for a value that is neither a yes
    nor a no): any other value leaves the package on, the way an unset variable does."""
    raw = os.environ.get(DISABLE_ENV)
    value = (raw or "").strip().lower()
    if value in DISABLE_YES:
        return True, None
    if value in DISABLE_NO:
        return False, None
    return False, (f"{DISABLE_ENV}={raw!r} is neither a yes ({', '.join(DISABLE_YES)}) nor a no "
                   f"({', '.join(repr(v) for v in DISABLE_NO)}); the package stays on")


def integrity_status(doc: dict) -> tuple[str, str]:
    """("ok" | "not checked" | "edited", a sentence): whether the manifest's figures are the ones
    measured at build time, by the digest _integrity.py (beside this file) recomputes."""
    path = Path(__file__).with_name("_integrity.py")
    spec = importlib.util.spec_from_file_location(f"{__name__}_integrity", path)
    if spec is None or spec.loader is None or not path.is_file():
        return "not checked", f"{path.name} is missing beside {Path(__file__).name}, so the figures are not checked"
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.status(doc)


def load_manifest(directory: str | Path) -> dict:
    """Read and validate <package>/manifest.json against the schema shipped beside it."""
    d = Path(directory)
    path = d / "manifest.json"
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ManifestError(f"cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                            "the package is corrupted: reinstall it or rebuild it with forge-pack") from None
    try:
        schema = json.loads((d / "manifest.schema.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ManifestError(f"the manifest schema next to {path} is missing or unreadable: {e}") from None
    try:
        import jsonschema
    except ImportError:  # declared as a dependency; without it, check the parts this module relies on
        if not isinstance(doc, dict) or doc.get("schema_version") not in (1, 2, 3) \
                or not isinstance(doc.get("targets"), list):
            raise ManifestError(f"{path} is not a version-1, -2 or -3 forge-pack manifest") from None
        return doc
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise ManifestError(f"{path} does not match its schema at {where}: {first.message}{more}; "
                            "the package is corrupted: reinstall it or rebuild it with forge-pack")
    return doc


def _capability_set(text: str | None) -> set[tuple[int, int]]:
    caps = set()
    for item in (text or "").replace(";", " ").split():
        major, _, minor = item.rstrip("a").partition(".")
        if major.isdigit() and minor.isdigit():
            caps.add((int(major), int(minor)))
    return caps


# ------------------------------------------------------------------ the patcher


class _Link:
    """What one patch replaced (the value and whether the owner held it itself), read by the patch's
    wrapper at call time. Another package patched on top of ours, whose own patch is reverted first,
    re-points our link past its own: so packages can be reverted in any order, each ending with its
    original and none dropping another still applied."""

    __slots__ = ("previous", "had", "live")

    def __init__(self, previous: Any, had: bool):
        self.previous = previous
        self.had = had
        self.live = True  # False once reverted: a patch left in place (see _unpatch) only passes through


class _Patch:
    """One installed patch: owner.attr (or an instance's __class__) set to value."""

    __slots__ = ("owner", "attr", "value", "link")

    def __init__(self, owner: Any, attr: str, value: Any, link: _Link):
        self.owner, self.attr, self.value, self.link = owner, attr, value, link

    def current(self) -> Any:
        if self.attr == "__class__":
            return type(self.owner)
        return vars(self.owner).get(self.attr, _MISS)

    def restore(self) -> None:
        if self.attr == "__class__":
            self.owner.__class__ = self.link.previous
        elif self.link.had:
            setattr(self.owner, self.attr, self.link.previous)
        else:
            delattr(self.owner, self.attr)


def _link_of(value: Any) -> _Link | None:
    """The link of a forge-pack wrapper or module subclass (of any package), else None. Its own
    __dict__ only: a subclass must not answer with the link of the class it derives from."""
    d = getattr(value, "__dict__", None)
    link = d.get("__forge_pack_link__") if d is not None else None
    return link if type(link).__name__ == "_Link" else None  # another package's _Link is another class


def _unpatched_class(cls: type) -> type:
    """The model's own class under any forge-pack module subclasses (of this or another package)."""
    return next(c for c in cls.__mro__ if _link_of(c) is None)


def _reduce_unpatched(module: Any, protocol: int) -> Any:
    """__reduce_ex__ of a patched module: copy.deepcopy, copy.copy, pickle and torch.save see the
    module's own class, so a copy is of the unpatched module (apply(copy) patches it) and a saved
    model loads where this package is not installed."""
    cls = type(module)
    base = _unpatched_class(cls)
    rv = base.__reduce_ex__(module, protocol)
    if not (isinstance(rv, tuple) and len(rv) > 1 and isinstance(rv[1], tuple)):
        return rv
    func, args = rv[0], tuple(base if a is cls else a for a in rv[1])
    if func is copyreg.__newobj__:  # pickle refuses __newobj__ for a class other than the object's own
        func, args = base.__new__, args  # what __newobj__ calls: base.__new__(base, *args)
    return (func, args) + rv[2:]


class _Target:
    """One manifest target, prepared for fast guard checks."""

    def __init__(self, t: dict, backend: str):
        sig = t["signature"]
        self.id: str = t["id"]
        self.op: str = t["op"]
        self.torch_op: str = t["torch_op"]
        self.backend = backend
        self.specs = tuple((name, None if s is None else (DTYPES[s["dtype"]], tuple(s["shape"]), tuple(s["strides"])))
                           for name, s in sig["inputs"])
        self.present = tuple(name for name, s in self.specs if s is not None)
        self.params = {k: v for k, v in sig["params"]}
        self.composite = bool(self.params.get("composite"))
        self.module_class: str = t.get("module_class") or ""
        self.module_code: str = t.get("module_code") or ""  # code_fingerprint of the profiled class
        self.min_sms: int = int(t["kernel"].get("min_sm_count") or 0)  # grids sized to every SM
        out = sig["output"]
        self.out = (DTYPES[out["dtype"]], tuple(out["shape"]), tuple(out["strides"]))
        self.x_key = dict(self.specs).get("x")  # (dtype, shape, strides) of the input `x`; None: no spec for it
        self.fn: Callable | None = None


def _x_keys(targets: Iterable[_Target]) -> frozenset | None:
    """The layouts (dtype, shape, strides) some target verified its `x` for; None where a target has
    no spec for `x` (then any `x` may match it and no call is turned away early)."""
    keys = [t.x_key for t in targets]
    return None if any(k is None for k in keys) else frozenset(keys)


def _no_verified_x(keys: frozenset | None, args: tuple, kwargs: dict) -> bool:
    """True when no tensor argument of the call has the dtype, shape and strides of a verified `x`,
    so no target can take it: every binder's `x` is one of the call's own arguments (the input, a
    module's argument, attention's query), and `_tensors_match` wants it exactly. The cheap first
    guard of a call the package was not built for (a decode step after the prefill it was built on):
    without it such a call paid for binding and matching (the demo's model cut to one row: 1.7x its
    eager time patched, bench/results/eager_miss_overhead.md). A traced or subclassed tensor, and one
    without strides (sparse, nested), goes to the full guards."""
    if keys is None:
        return False
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            if (type(v) is not torch.Tensor and type(v) is not torch.nn.Parameter) or v.layout is not torch.strided \
                    or v.is_nested:
                return False
            if (v.dtype, v.shape, v.stride()) in keys:
                return False
    return True


class Patcher:
    """Patches the call paths of the manifest's targets; one per package per process."""

    def __init__(self, manifest: dict, package: str, load_extension: Callable[[], None],
                 build_info: dict | None = None):
        self.manifest = manifest
        self.package = package
        self.namespace = manifest["package"]["namespace"]
        self.backend = manifest["backend"]
        self.targets = [_Target(t, self.backend) for t in manifest["targets"]]
        self.by_op: dict[str, tuple[_Target, ...]] = {}
        for t in self.targets:
            if not t.composite and t.op != "region":  # a region is a subgraph: only compile mode swaps it
                self.by_op[t.op] = self.by_op.get(t.op, ()) + (t,)
        self.composites: dict[str, tuple[_Target, ...]] = {}
        for t in self.targets:
            if t.composite and t.module_class:
                self.composites[t.module_class] = self.composites.get(t.module_class, ()) + (t,)
        self._x_keys = {op: _x_keys(ts) for op, ts in self.by_op.items()}  # dispatch's first guard, per op
        self.allowed_caps = _capability_set(manifest["build"].get("cuda_arch_list"))
        # figures edited after the build: said once here (import time), and by info/bench/status
        self.integrity = integrity_status(manifest)
        if self.integrity[0] == "edited":
            warnings.warn(f"{package}: {self.integrity[1]}", RuntimeWarning, stacklevel=2)
        self._load_extension = load_extension
        self.build_info = build_info or {}
        self.load_error: str | None = None
        self._loaded: bool | None = None
        self._caps: dict[int, bool] = {}
        self._sms: dict[int, int] = {}  # SMs per visible GPU
        self._code_warned: set = set()  # classes of a profiled name but other code, warned about once
        self._patches: list[_Patch] = []
        self._patched_ids: set[int] = set()
        self._subclasses: dict[type, type] = {}
        self._patched_classes: set[type] = set()
        self._functions_patched = False
        self._active = False
        self._warned: set[str] = set()
        self._lock = threading.RLock()
        self.kernel_calls: dict[str, int] = {}
        self.fallback_calls: dict[str, int] = {}

    # ---- loading
    def _environment_problem(self) -> str | None:
        built = self.build_info.get("torch")
        if built and built != torch.__version__:  # torch's C++ ABI is not stable across builds
            return (f"the extension was built against torch {built} but this is torch {torch.__version__}; "
                    f"reinstall the package: pip install --no-build-isolation --force-reinstall <package dir>")
        if self.backend != "cuda":
            return _missing_cpu_features(self.build_info.get("cpu_features"), self.build_info.get("cpu_isa") or "native")
        if torch.version.cuda is None:
            return "the kernels are CUDA kernels but this torch build has no CUDA"
        if not torch.cuda.is_available():
            return "the kernels are CUDA kernels but no CUDA GPU is visible"
        need_sms = any(t.min_sms for t in self.targets)
        for i in range(torch.cuda.device_count()):
            self._caps[i] = torch.cuda.get_device_capability(i) in self.allowed_caps
            if need_sms:
                self._sms[i] = torch.cuda.get_device_properties(i).multi_processor_count
        if not any(self._caps.values()):
            have = sorted({"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
            want = sorted("%d.%d" % c for c in self.allowed_caps)
            return (f"the kernels were built and verified for compute capability {', '.join(want)}; "
                    f"the visible GPUs have {', '.join(have)}")
        # kernels whose grid waits on itself were sized to every SM of the search GPU: on fewer SMs
        # they would stall (correct, far slower than the original op), so those targets fall back
        most = max(self._sms.values(), default=0)
        short = [t.id for t in self.targets if t.min_sms and t.min_sms > most]
        if short:
            warnings.warn(f"{self.package}: kernels {', '.join(short)} were sized for a GPU with "
                          f"{max(t.min_sms for t in self.targets)} SMs; the visible GPUs have at most {most}: "
                          "those calls run the original ops (run forge-pack build on this GPU)",
                          RuntimeWarning, stacklevel=3)
        return None

    def load(self) -> bool:
        """Load the compiled extension once; on failure remember why (and patch nothing)."""
        with self._lock:
            if self._loaded is not None:
                return self._loaded
            reason = self._environment_problem()
            if reason is None:
                try:
                    self._load_extension()
                except Exception as e:  # ImportError, OSError (undefined symbol), RuntimeError
                    reason = f"its compiled extension failed to load: {type(e).__name__}: {e}"
            if reason is None:
                try:
                    self._bind_ops()
                except Exception as e:
                    reason = f"its ops are not registered as expected: {type(e).__name__}: {e}"
            self.load_error = reason
            self._loaded = reason is None
            return self._loaded

    def _bind_ops(self) -> None:
        ns = getattr(torch.ops, self.namespace)
        for t in self.targets:
            t.fn = getattr(ns, t.id).default
            qualname = f"{self.namespace}::{t.id}"
            try:
                torch.library.register_fake(qualname)(_fake(t.out))
            except RuntimeError as e:  # registered already (a second Patcher in this process): keep it
                if "already" not in str(e):
                    raise

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"{self.package}: {message}", RuntimeWarning, stacklevel=3)

    # ---- guards
    def _cap_ok(self, device: torch.device, t: "_Target | None" = None) -> bool:
        idx = device.index if device.index is not None else 0
        if t is not None and t.min_sms and self._sms.get(idx, 0) < t.min_sms:
            return False
        return bool(self._caps.get(idx))

    def _tensors_match(self, t: _Target, tensors: dict) -> bool:
        x = tensors.get("x")
        if not isinstance(x, torch.Tensor):
            return False
        dev = x.device
        if dev.type != t.backend or (t.backend == "cuda" and not self._cap_ok(dev, t)):
            return False
        grad = torch.is_grad_enabled()
        transforms = not _compiling()  # Dynamo traces the wrapper: it has no functorch state to ask
        for name, spec in t.specs:
            v = tensors.get(name)
            if spec is None:
                if v is not None:
                    return False
                continue
            if not isinstance(v, torch.Tensor) or (type(v) is not torch.Tensor and type(v) is not torch.nn.Parameter
                                                   and not isinstance(v, _tracing_types())):
                return False  # tensor subclasses (DTensor, quantized, ...) keep their own semantics
            if v.dtype != spec[0] or tuple(v.shape) != spec[1] or tuple(v.stride()) != spec[2] or v.device != dev:
                return False
            if grad and v.requires_grad:
                return False  # autograd needs a graph: the kernels have no backward
            if transforms and type(v) in _PLAIN and _transformed(v):
                return False  # vmap / grad / jvp / forward AD: the kernels have no rules for them
        return True

    def _count(self, table: dict, key: str) -> None:
        if _compiling():
            return
        table[key] = table.get(key, 0) + 1
        _BELOW.taken = True

    def fall_back(self, key: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        """The original's result for a call no kernel took, counted once: here only when no patched
        path below (reached from inside the original) took it, kernel or fall-back."""
        if _compiling() or not self._active:
            return original(*args, **kwargs)
        _BELOW.taken = False
        try:
            return original(*args, **kwargs)
        finally:
            if not _BELOW.taken:
                self._count(self.fallback_calls, key)
            _BELOW.taken = True

    def dispatch(self, op: str, style: str, args: tuple, kwargs: dict) -> Any:
        """The kernel's output for a call it was verified for, else the _MISS marker."""
        if not self._active or _no_verified_x(self._x_keys.get(op), args, kwargs) or _autocast_on(self.backend):
            return _MISS
        norm = NORMALIZERS[op](style, args, kwargs)
        if norm is not None:
            tensors, params = norm
            for t in self.by_op.get(op, ()):
                if params == t.params and self._tensors_match(t, tensors):
                    self._count(self.kernel_calls, t.id)
                    return t.fn(*[tensors[n] for n in t.present])
        return _MISS

    def verified_call(self, op: str, style: str, args: tuple, kwargs: dict) -> tuple | None:
        """(target, its input tensors in the op's order) when a kernel was verified for this call, else
        None; the guards of dispatch, without apply(), counting or calling. Compile mode (_compile.py)
        asks it about each call Dynamo traced, with the traced (fake) tensors as arguments."""
        norm = NORMALIZERS[op](style, args, kwargs)
        if norm is None:
            return None
        tensors, params = norm
        for t in self.by_op.get(op, ()):
            if params == t.params and self._tensors_match(t, tensors):
                return t, [tensors[n] for n in t.present]
        return None

    def dispatch_module(self, targets: tuple, keys: frozenset | None, module: Any, args: tuple, kwargs: dict) -> Any:
        """The kernel's output for a composite module's call it was verified for, else _MISS. The
        kind's module binder reads the call (an RMSNorm: forward(x), its eps and weight); ``keys``:
        ``_x_keys(targets)``, made once with the wrapper."""
        if not self._active or _no_verified_x(keys, args, kwargs) or _autocast_on(self.backend):
            return _MISS
        bound: dict[str, Any] = {}
        for t in targets:
            if t.op not in bound:
                bind = TARGETS.get(t.op).bind_module
                bound[t.op] = bind(module, args, kwargs) if bind is not None else None
            b = bound[t.op]
            if b is not None and all(t.params.get(k) == v for k, v in b[1].items()) and self._tensors_match(t, b[0]):
                self._count(self.kernel_calls, t.id)
                return t.fn(*[b[0][n] for n in t.present])
        return _MISS

    # ---- wrappers: each reads what it replaced from its link at call time (see _Link)
    def _function_wrapper(self, op: str, style: str, link: _Link) -> Callable:
        patcher = self

        def wrapper(*args, **kwargs):
            if not link.live:
                return link.previous(*args, **kwargs)
            out = patcher.dispatch(op, style, args, kwargs)
            if out is _MISS:
                return patcher.fall_back(op, link.previous, args, kwargs)
            return out

        return wrapper

    def _composite_function(self, targets: tuple, original: Callable, link: _Link) -> Callable:
        """A model-code function that computes a kind as eager ops (HF's eager_attention_forward),
        replaced at its module-level name: the kind's binder reads the call by the original's
        parameters, and its ``composite_return`` shapes the kernel's output as the function returns it."""
        patcher, keys = self, _x_keys(targets)
        shape = TARGETS.get(targets[0].op).composite_return

        def wrapper(*args, **kwargs):
            if not link.live:
                return link.previous(*args, **kwargs)
            out = patcher.dispatch_module(targets, keys, original, args, kwargs)
            if out is _MISS:
                return patcher.fall_back("function", link.previous, args, kwargs)
            return shape(out) if shape is not None else out

        return wrapper

    def _patch_function(self, path: str, targets: tuple) -> None:
        """Patch the composite function at ``path`` ('pkg.module:name') where it is importable and its
        code is the profiled code."""
        owner, name = _import_function(path)
        if owner is None:
            return
        fn = vars(owner)[name]
        original = _unwrapped(fn) or fn
        if original in self._patched_classes:
            return
        targets = self._same_code(original, targets)
        if targets:
            self._install(owner, name, lambda link: self._composite_function(targets, original, link))
            self._patched_classes.add(original)

    def _class_forward(self, targets: tuple, link: _Link) -> Callable:
        patcher, keys = self, _x_keys(targets)

        def forward(module, *args, **kwargs):
            if not link.live:
                return link.previous(module, *args, **kwargs)
            out = patcher.dispatch_module(targets, keys, module, args, kwargs)
            if out is _MISS:
                return patcher.fall_back("module", link.previous, (module, *args), kwargs)
            return out

        return forward

    def _instance_class(self, base: type, targets: tuple) -> type:
        """A subclass of `base` whose forward takes the verified calls, swapped into a module's __class__.
        Not a closure in the instance's __dict__: copy.deepcopy copies that one still bound to the
        original module (the copy computes with the original's weights) and pickle cannot save it. The
        subclass holds nothing per instance, falls back to the base class's forward as it is at call
        time, and copies and pickles as the base class (_reduce_unpatched)."""
        sub = self._subclasses.get(base)
        if sub is not None:
            return sub
        patcher, keys = self, _x_keys(targets)
        link = _Link(base, True)

        def forward(module, *args, **kwargs):
            if not link.live:
                return link.previous.forward(module, *args, **kwargs)
            out = patcher.dispatch_module(targets, keys, module, args, kwargs)
            if out is _MISS:
                return patcher.fall_back("module", link.previous.forward, (module, *args), kwargs)
            return out

        _describe(forward, base.forward, self.package, link)
        sub = type(base.__name__, (base,), {
            "forward": forward, "__reduce_ex__": _reduce_unpatched, "__forge_pack_link__": link,
            "__module__": base.__module__, "__qualname__": base.__qualname__, "__doc__": base.__doc__})
        self._subclasses[base] = sub
        return sub

    def _install(self, owner: Any, attr: str, make: Callable[[_Link], Callable]) -> None:
        """owner.attr = make(link), a wrapper of the current value, recorded for revert."""
        had = attr in vars(owner)
        previous = getattr(owner, attr)
        link = _Link(previous, had)
        value = make(link)
        _describe(value, previous, self.package, link)
        setattr(owner, attr, value)
        self._patches.append(_Patch(owner, attr, value, link))

    def _unpatch(self, p: _Patch) -> None:
        """Undo one patch. When another package patched the same attribute on top of ours, unlink ours
        from under it (its link now leads to what ours replaced) instead of restoring over it."""
        p.link.live = False
        current = p.current()
        if current is p.value:
            p.restore()
            return
        link = _link_of(current)
        for _ in range(256):  # down the chain of forge-pack patches on top of ours; bounded, never a hang
            if link is None:
                break
            if link.previous is p.value:
                link.previous, link.had = p.link.previous, p.link.had
                return
            link = _link_of(link.previous)
        self._warn_once(f"could not undo its patch of {p.attr} on {_name(p.owner)}: something other than a "
                        "forge-pack package replaced it since; the patch stays but only passes calls through")

    # ---- public
    @property
    def applied(self) -> bool:
        return self._active

    def apply(self, model: Any = None) -> bool:
        """Patch every call path of the targets (and composites in `model`); False when nothing was patched."""
        off, odd = disable_setting()
        if odd:
            self._warn_once(odd)
        if off:
            self._warn_once(f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}; nothing is patched")
            return False
        if not self.load():
            self._warn_once(f"not applied, the model runs unchanged: {self.load_error}")
            return False
        with self._lock:
            if not self._functions_patched:
                _settle_dynamo()
                _tracing_types()
                for op in self.by_op:
                    for owner_name, attr, style in CALL_PATHS[op]:
                        owner = OWNERS[owner_name]
                        if hasattr(owner, attr):
                            self._install(owner, attr, lambda link, op=op, style=style:
                                          self._function_wrapper(op, style, link))
                for class_path, targets in self.composites.items():
                    cls = _import_class(class_path)
                    if cls is None:  # a function, not a module class (eager_attention_forward)
                        self._patch_function(class_path, targets)
                    elif cls not in self._patched_classes and "forward" in vars(cls):
                        targets = self._same_code(cls, targets)  # another version of the library may differ
                        if targets:
                            self._install(cls, "forward",
                                          lambda link, targets=targets: self._class_forward(targets, link))
                            self._patched_classes.add(cls)
                self._functions_patched = True
            if model is not None:
                self._patch_instances(model)
            self._active = True
        return True

    def _patch_instances(self, model: Any) -> None:
        if not self.composites or not hasattr(model, "modules"):
            return
        by_name = {}
        for class_path, targets in self.composites.items():
            by_name[class_path.partition(":")[2]] = by_name.get(class_path.partition(":")[2], ()) + targets
        for m in model.modules():
            cls = type(m)
            targets = by_name.get(cls.__qualname__)
            if not targets or cls in self._patched_classes or id(m) in self._patched_ids:
                continue
            targets = self._same_code(_unpatched_class(cls), targets)  # not another library's class
            if not targets:
                continue
            sub = self._instance_class(cls, targets)
            try:
                m.__class__ = sub
            except TypeError:  # a class whose instances' layout a subclass cannot take (__slots__ etc.)
                continue
            self._patches.append(_Patch(m, "__class__", sub, _link_of(sub)))
            self._patched_ids.add(id(m))

    def _same_code(self, cls: type, targets: tuple) -> tuple:
        """The targets whose recorded code fingerprint is cls's (all of them for manifests without one).
        A class of the profiled name whose code differs (another library, another version of it, or
        another Python: the fingerprint hashes bytecode) is left alone, and said so once."""
        if not any(t.module_code for t in targets):
            return targets
        code = code_fingerprint(cls)
        kept = tuple(t for t in targets if not t.module_code or t.module_code == code)
        if len(kept) < len(targets) and cls not in self._code_warned:
            self._code_warned.add(cls)
            warnings.warn(f"{self.package}: {cls.__module__}.{cls.__qualname__} has the name of a profiled module "
                          f"but not its code (another library or version of it, or another Python than the "
                          f"package was built with): left unpatched", RuntimeWarning, stacklevel=4)
        return kept

    def revert(self) -> None:
        """Restore every patched function, class and instance to the very object it was (another
        package's patches applied on top of this one's stay, and keep working)."""
        with self._lock:
            while self._patches:
                self._unpatch(self._patches.pop())
            self._subclasses.clear()
            self._patched_ids.clear()
            self._patched_classes.clear()
            self._functions_patched = False
            self._active = False

    @contextlib.contextmanager
    def patched(self, model: Any = None):
        was = self._active
        applied = self.apply(model)
        try:
            yield applied
        finally:
            if not was:
                self.revert()

    def status(self) -> dict:
        return {"package": self.package, "backend": self.backend, "applied": self._active,
                "disabled": disable_setting()[0],
                "loaded": self._loaded, "load_error": self.load_error,
                "patched_objects": len(self._patches), "targets": [t.id for t in self.targets],
                "kernel_calls": dict(self.kernel_calls), "fallback_calls": dict(self.fallback_calls),
                "integrity": {"state": self.integrity[0], "message": self.integrity[1]}}


_TRACING: tuple | None = None
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # the types functorch wraps and forward AD makes duals of


# Instruction-set flags of /proc/cpuinfo (x86 "flags", Arm "Features") that a -march=native build
# may use; the rest (hypervisor, tsc quirks, ...) differ between machines without mattering.
_ISA = re.compile(r"^(sse|ssse|avx|fma|f16c|bmi|popcnt|movbe|aes|vaes|pclmul|vpclmul|gfni|sha|adx|abm|lzcnt|"
                  r"amx|xsave|rdrand|rdseed|clflushopt|clwb|prefetchw|asimd|sve|fp|atomics|crc32|dotprod|"
                  r"i8mm|bf16|fphp)")


def _missing_cpu_features(built: list | None, isa: str = "native") -> str | None:
    """Why an extension compiled for instruction set `isa` (-march=native: the build CPU's; x86-64-v3,
    ...: that level's) cannot run here (it would die on an illegal instruction rather than fall back),
    else None."""
    if not built:
        return None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None  # nothing to compare with: trust the build
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, flags=re.M)
    if not m:
        return None
    missing = sorted(f for f in set(built) - set(m.group(1).split()) if _ISA.match(f))
    if not missing:
        return None
    return (f"the extension was compiled for another CPU (-march={isa}) with instructions this CPU lacks "
            f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}); reinstall the package from its "
            f"sources on this machine: pip install --no-build-isolation --force-reinstall <package dir>")


def code_fingerprint(cls: Any) -> str:
    """16 hex digits over the bytecode of every function the class and its bases up to nn.Module
    define, or of a composite function and the module-level functions it calls (repeat_kv);
    forge_pack.profile.profiler.code_fingerprint computes the same at profile time."""
    h = hashlib.sha256()
    if not isinstance(cls, type):
        fn = _unwrapped(cls) or cls
        code = getattr(fn, "__code__", None)
        if code is not None:
            _hash_code(h, code)
            helpers = getattr(fn, "__globals__", {})
            for name in code.co_names:
                callee = helpers.get(name)
                if inspect.isfunction(callee):
                    h.update(name.encode())
                    _hash_code(h, callee.__code__)
        return h.hexdigest()[:16]
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass is object:
            break
        for name in sorted(vars(klass)):
            fn = _unwrapped(vars(klass)[name])
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if code is not None:
                h.update(name.encode())
                _hash_code(h, code)
    return h.hexdigest()[:16]


def _unwrapped(value: Any) -> Any:
    """The function a forge-pack wrapper (of any package, stacked) stands in for: a class whose
    forward another package patched still has its own code."""
    link = _link_of(value)
    while link is not None:
        if not link.had:  # the class did not define it before the patch: it is not its code
            return None
        value = link.previous
        link = _link_of(value)
    return value


def _hash_code(h: Any, code: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            _hash_code(h, c)
        elif isinstance(c, frozenset):  # iteration order of a set of strings varies per process
            h.update(repr(sorted(repr(v) for v in c)).encode())
        else:
            h.update(repr(c).encode())


def _tracing_types() -> tuple:
    """FakeTensor and FunctionalTensor: what torch.compile (AOTAutograd) traces a graph with. A call
    seen while tracing a compiled graph becomes the package's custom op (via its fake kernel)."""
    global _TRACING
    if _TRACING is None:
        found = []
        for module, name in (("torch._subclasses.fake_tensor", "FakeTensor"),
                             ("torch._subclasses.functional_tensor", "FunctionalTensor")):
            try:  # private torch modules: guarded, a missing one only means that path is not traced
                found.append(getattr(importlib.import_module(module), name))
            except (ImportError, AttributeError):
                pass
        _TRACING = tuple(found)
    return _TRACING


def _settle_dynamo() -> None:
    """torch.compile (Dynamo) keeps a cached map from torch functions to how it traces them, built
    from whatever torch.nn.functional.softmax & co. are when first needed. Build it before patching,
    so Dynamo traces into the wrappers (guards included) instead of taking them for torch's own.
    Imported here even when nothing imported it yet: a torch.compile after apply() would otherwise
    build the map from the wrappers, and compiling after revert() would not know torch's own functions."""
    try:
        import torch._dynamo  # noqa: F401
        from torch._dynamo import trace_rules

        trace_rules.get_torch_obj_rule_map()
    except Exception:  # private API that may move between torch versions: best effort only
        pass


def _describe(wrapper: Callable, original: Callable, package: str, link: _Link) -> None:
    """Name and document the wrapper like the original, but keep its own __module__/__qualname__:
    torch.compile recognises torch functions by qualified name, and must trace into the wrapper
    (so its guards and the package's custom op land in the graph) rather than treat it as the op."""
    wrapper.__name__ = getattr(original, "__name__", wrapper.__name__)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__forge_pack__ = package  # type: ignore[attr-defined]
    wrapper.__forge_pack_link__ = link  # type: ignore[attr-defined]  # what it replaced, for revert


def _name(owner: Any) -> str:
    if isinstance(owner, type) or hasattr(owner, "__name__"):
        return getattr(owner, "__qualname__", None) or owner.__name__
    return f"a {type(owner).__qualname__} module"


def _fake(out: tuple) -> Callable:
    dtype, shape, strides = out

    def fake(*tensors):
        return torch.empty_strided(shape, strides, dtype=dtype, device=tensors[0].device)

    return fake


def _import_class(class_path: str) -> type | None:
    """'pkg.module:Outer.Class' -> the class, if that module imports; None otherwise."""
    module_name, _, qualname = class_path.partition(":")
    if not module_name or not qualname:
        return None
    try:
        obj: Any = sys.modules.get(module_name) or importlib.import_module(module_name)
    except Exception:  # not importable here (e.g. a model file forge-pack loaded under a private name)
        return None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) else None


def _import_function(path: str) -> tuple[Any, str] | tuple[None, None]:
    """'pkg.module:name' -> (the module, name) when it holds a plain function there, else (None, None)."""
    module_name, _, name = path.partition(":")
    if not module_name or not name or "." in name:
        return None, None
    try:
        owner: Any = sys.modules.get(module_name) or importlib.import_module(module_name)
    except Exception:  # not importable here
        return None, None
    fn = vars(owner).get(name)
    return (owner, name) if inspect.isfunction(fn) or _link_of(fn) is not None else (None, None)


def for_package(package: str, directory: str | Path) -> Patcher:
    """The Patcher of an installed package: manifest beside this file, extension ``<package>._C``."""
    d = Path(directory)
    manifest = load_manifest(d)
    try:
        build_info = json.loads((d / "_build_info.json").read_text())
    except (OSError, json.JSONDecodeError):
        build_info = {}
    return Patcher(manifest, package, lambda: importlib.import_module(f"{package}._C"), build_info)
