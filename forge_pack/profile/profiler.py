"""Profile a Target: which target-op call signatures take the forward's time, with real tensors.

Three phases on the user's own inputs:
1. capture: one forward under a TorchFunctionMode that recognises every call path of every
   target op (``forge_pack.targets.ops``) plus module composites (RMSNorm written as eager ops), and
   saves the exact tensors each signature received, and its output, as safetensors; model-code
   functions that compute a kind as eager ops (HF's eager_attention_forward) are wrapped for the
   duration, found by name in the Python modules of the model's classes;
2. warm-up forwards;
3. profiled forwards (torch.profiler): each target call runs inside a ``forge::sig:<n>`` range,
   each forward inside ``forge::forward``; device time (CPU time on cpu) is attributed to the
   ranges, and what is left is named by aten op, so users see what else is hot.
"""

from __future__ import annotations

import functools

import contextlib
import copy
import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, record_function

from forge_pack.targets import abi, ops
from forge_pack.targets.rms_norm import module_eps
from forge_pack.profile.capture import save_capture
from forge_pack.profile.composite_functions import composite_functions, composite_mismatch
from forge_pack.core.errors import ForgeError
from forge_pack.core.hotspot import Hotspot
from forge_pack.profile.load import Target, run_forward
from forge_pack.core.signature import Signature

RANGE_PREFIX = "forge::sig:"
FORWARD_RANGE = "forge::forward"


@dataclass(frozen=True)
class ProfileConfig:
    warmup: int = 2  # forwards before timing: allocator, cuDNN autotune and lazy init settle
    iterations: int = 3  # profiled forwards; times are averaged over them
    captures_per_signature: int = 2  # real calls saved per signature
    capture_bytes_per_signature: int = 1 << 30  # 1 GiB: a VAE group_norm call is 0.5 GiB in+out
    capture_bytes_total: int = 4 << 30  # 4 GiB per run dir


@dataclass
class OtherOp:
    name: str
    total_us: float
    share: float

    def to_json(self) -> dict:
        return {"name": self.name, "total_us": self.total_us, "share": self.share}


@dataclass
class Profile:
    model_path: str
    device: str
    dtype: str | None
    iterations: int
    forward_us: float  # device time per forward (CPU time on cpu)
    wall_us: float  # wall-clock time per forward, synchronised, without instrumentation
    hotspots: list[Hotspot]
    other_share: float
    other_ops: list[OtherOp]
    run_dir: str
    capture_bytes: int
    captured_calls: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"model_path": self.model_path, "device": self.device, "dtype": self.dtype,
                "iterations": self.iterations, "forward_us": self.forward_us, "wall_us": self.wall_us,
                "hotspots": [h.to_json() for h in self.hotspots], "other_share": self.other_share,
                "other_ops": [o.to_json() for o in self.other_ops], "run_dir": self.run_dir,
                "capture_bytes": self.capture_bytes, "captured_calls": self.captured_calls, "notes": self.notes}


def _progress(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[profile] {msg}", file=sys.stderr, flush=True)


def _is_composite_rms(module: torch.nn.Module) -> bool:
    if "rmsnorm" not in type(module).__name__.lower():
        return False
    if hasattr(torch.nn, "RMSNorm") and isinstance(module, torch.nn.RMSNorm):
        return False
    if any(True for _ in module.children()):
        return False
    w = getattr(module, "weight", None)
    if w is not None and (not isinstance(w, torch.Tensor) or w.dim() != 1):
        return False
    return module_eps(module) is not None


def _rms_other_state(module: torch.nn.Module) -> str:
    """Why a composite RMSNorm holds more than the kernel takes (x and `weight`), else "". A gain
    named scale/g/gamma, or a bias added after, would be dropped: the package would run the bare
    normalisation on the trained model."""
    names = [n for n, _ in module.named_parameters(recurse=False) if n != "weight"]
    names += [n for n, _ in module.named_buffers(recurse=False) if n != "weight"]
    names += [n for n, v in vars(module).items() if isinstance(v, torch.Tensor) and n != "weight"]  # plain tensors
    if not names:
        return ""
    return (f"this RMSNorm module holds state other than `weight` ({', '.join(sorted(set(names)))}), "
            "which the rms_norm kernel would leave out")


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)  # the device_type form: torch >= 2.4
    except (RuntimeError, TypeError):  # a device type autocast does not know (meta, ...): never on
        return False


# The emitted package runs the original op whenever autocast is on (templates/package/_patch.py,
# _autocast_on): a call profiled under autocast could never reach a kernel.
AUTOCAST_REASON = "called under torch.autocast (the package runs the original op there)"


def _module_eps(module: torch.nn.Module) -> float:
    """The epsilon of a module ``_is_composite_rms`` accepted (the package binds it the same way)."""
    eps = module_eps(module)
    if eps is None:
        raise AttributeError("eps")
    return eps


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def code_fingerprint(cls: type) -> str:
    """16 hex digits over the bytecode of every function the class and its bases up to nn.Module
    define: the emitted package patches instances found by class NAME only when their code is the
    code that was profiled (another library's class of the same name may compute something else).
    One implementation: the package runtime's own (templates/package/_patch.py), which computes it
    again where the package is applied."""
    return _package_runtime().code_fingerprint(cls)


@functools.lru_cache(maxsize=1)
def _package_runtime():
    import importlib.util

    from forge_pack.evaluate.compile import templates_dir

    spec = importlib.util.spec_from_file_location("_forge_pack_package_runtime",
                                                  templates_dir() / "package" / "_patch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class _SigStats:
    sig: Signature
    paths: set = field(default_factory=set)
    count: int = 0
    captures: list = field(default_factory=list)
    capture_bytes: int = 0
    module_class: str = ""
    module_code: str = ""
    unsupported: str = ""


class _Recorder(TorchFunctionMode):
    """Recognises target calls on every path; captures tensors or opens profiler ranges."""

    def __init__(self, run_dir: Path, config: ProfileConfig, stats: dict[str, _SigStats], capture: bool,
                 annotate: bool, functions: tuple = ()):
        super().__init__()
        self.functions = functions  # (Python module, name, kind spec): composite functions to wrap
        self.saved_functions: list[tuple[Any, str, Any]] = []
        self.table = ops.function_table()
        self.run_dir = run_dir
        self.config = config
        self.stats = stats
        self.capture = capture
        self.annotate = annotate
        self.module_stack: list[torch.nn.Module] = []
        self.composite_depth = 0
        self.pending: list[Any] = []  # per open composite: (x clone, range) or None
        self.offsets: dict[int, float | None] = {}  # id(module) -> weight offset of its RMSNorm formula
        self.total_capture_bytes = 0
        self.index: dict[str, int] = {key: i for i, key in enumerate(stats)}
        self.hooks: list[Any] = []
        self.probing = False  # running a module copy to find its formula: not the model's own calls

    # ---- module hooks (global, removed on exit)
    def __enter__(self):
        reg = torch.nn.modules.module
        self.hooks = [reg.register_module_forward_pre_hook(self._pre),
                      reg.register_module_forward_hook(self._post)]
        for pymod, name, spec in self.functions:
            original = getattr(pymod, name)
            self.saved_functions.append((pymod, name, original))
            setattr(pymod, name, self._composite_function(pymod, name, spec, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        while self.saved_functions:
            pymod, name, original = self.saved_functions.pop()
            setattr(pymod, name, original)
        return super().__exit__(*exc)

    # ---- composite functions (HF's eager_attention_forward): the model's own function, timed and captured
    def _composite_function(self, pymod, name: str, spec, original):
        recorder = self

        def wrapper(*args, **kwargs):
            if recorder.probing or recorder.composite_depth:
                return original(*args, **kwargs)
            bound = spec.bind_module(original, args, kwargs)
            if bound is None or not ops.is_target(bound[0]):
                return original(*args, **kwargs)
            tensors, params = bound
            saved = None
            if recorder.capture:
                saved = {n: (t.detach().to("cpu", copy=True) if t is not None else None) for n, t in tensors.items()}
            recorder.composite_depth += 1  # its softmax & co. are part of it, not targets of their own
            try:
                if recorder.annotate:
                    key = ops.make_signature(spec.name, tensors, params).key()
                    with record_function(RANGE_PREFIX + str(recorder._idx(key))):
                        result = original(*args, **kwargs)
                else:
                    result = original(*args, **kwargs)
            finally:
                recorder.composite_depth -= 1
            out = spec.composite_output(result) if spec.composite_output is not None else result
            if isinstance(out, torch.Tensor):
                recorder._record_composite(spec, pymod, name, original, tensors, params, out, saved)
            return result

        return wrapper

    def _record_composite(self, spec, pymod, name: str, original, tensors: dict, params: dict, out, saved) -> None:
        sig = ops.make_signature(spec.name, tensors, params, out)
        st = self._stats(sig, f"function:{name}")
        st.module_class = f"{pymod.__name__}:{name}"
        st.module_code = code_fingerprint(original)
        x = tensors["x"]
        if _autocast_on(x.device.type):
            st.unsupported = AUTOCAST_REASON
        elif self.capture and st.count == 1:
            self.probing = True  # the reference's own torch calls are not the model's
            try:
                st.unsupported = composite_mismatch(spec, name, tensors, params, out)
            finally:
                self.probing = False
        if self.capture and saved is not None:
            self._save(st, saved, out)

    def _pre(self, module, args):
        if self.probing:
            return
        self.module_stack.append(module)
        if self.composite_depth == 0 and _is_composite_rms(module) and args and isinstance(args[0], torch.Tensor):
            self.composite_depth += 1
            x = args[0]
            key_sig = self._composite_signature(module, x, None)
            rng = None
            if self.annotate and key_sig is not None:
                rng = record_function(RANGE_PREFIX + str(self._idx(key_sig.key())))
                rng.__enter__()
            clone = x.detach().to("cpu", copy=True) if self.capture else None
            self.pending.append((module, clone, rng))
        elif self.composite_depth:
            self.composite_depth += 1
            self.pending.append(None)

    def _post(self, module, args, output):
        if self.probing:
            return
        if self.module_stack and self.module_stack[-1] is module:
            self.module_stack.pop()
        if not self.composite_depth:
            return
        self.composite_depth -= 1
        entry = self.pending.pop()
        if entry is None:
            return
        _, clone, rng = entry
        if rng is not None:
            rng.__exit__(None, None, None)
        if not isinstance(output, torch.Tensor):
            return
        x = args[0]
        if self.capture and module is not None and id(module) not in self.offsets:
            self.offsets[id(module)] = self._probe_offset(module, x)
        sig = self._composite_signature(module, x, output)
        if sig is None:
            return
        st = self._stats(sig, "module:" + type(module).__name__)
        st.module_class = _class_path(type(module))
        st.module_code = code_fingerprint(type(module))
        other = _rms_other_state(module)
        if other:
            st.unsupported = other
        elif _autocast_on(x.device.type):  # before the formula: under autocast the probe's dtypes differ
            st.unsupported = AUTOCAST_REASON
        elif self.offsets.get(id(module), 0.0) is None:
            st.unsupported = "this RMSNorm module's formula is not x*rsqrt(mean(x^2)+eps)*(w+offset)"
        if self.capture:
            self._save(st, {"x": clone, "weight": getattr(module, "weight", None)}, output)

    def _probe_offset(self, module, x: torch.Tensor) -> float | None:
        """_detect_offset on a copy of the module, with this recorder's hooks and mode standing aside."""
        self.probing = True
        try:
            return _detect_offset(module, x)
        finally:
            self.probing = False

    def _composite_signature(self, module, x: torch.Tensor, output: torch.Tensor | None) -> Signature | None:
        offset = self.offsets.get(id(module), 0.0)
        w = getattr(module, "weight", None)
        params = {"normalized_shape": [int(x.shape[-1])], "eps": _module_eps(module),
                  "weight_offset": float(offset or 0.0), "composite": True}
        return ops.make_signature("rms_norm", {"x": x, "weight": w}, params, output)

    # ---- function calls
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            hit = self.table.get(func)
        except TypeError:  # unhashable callable
            hit = None
        if hit is None or self.composite_depth or self.probing:
            return func(*args, **kwargs)
        op, path = hit
        try:
            tensors, params = ops.normalize_call(op, path.style, args, kwargs)
        except Exception:  # ops.Unsupported, or arguments we do not understand: not a target call
            return func(*args, **kwargs)
        if not ops.is_target(tensors):
            return func(*args, **kwargs)
        label = path.label
        if self.module_stack and path.style == "F":
            mod_entry = ops.MODULE_TYPES.get(type(self.module_stack[-1]))
            if mod_entry and mod_entry[0] == op:
                label = mod_entry[1]
        key = ops.make_signature(op, tensors, params).key()
        saved = None
        if self.capture:
            saved = {n: (t.detach().to("cpu", copy=True) if t is not None else None) for n, t in tensors.items()}
        if self.annotate:
            with record_function(RANGE_PREFIX + str(self._idx(key))):
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            sig = ops.make_signature(op, tensors, params, out)
            st = self._stats(sig, label)
            x = tensors.get("x")
            if isinstance(x, torch.Tensor) and _autocast_on(x.device.type):
                st.unsupported = AUTOCAST_REASON
            if self.capture and saved is not None:
                self._save(st, saved, out)
        return out

    # ---- bookkeeping
    def _idx(self, key: str) -> int:
        if key not in self.index:
            self.index[key] = len(self.index)
        return self.index[key]

    def _stats(self, sig: Signature, label: str) -> _SigStats:
        key = sig.key()
        st = self.stats.get(key)
        if st is None:
            st = self.stats[key] = _SigStats(sig)
            self._idx(key)
        st.paths.add(label)
        st.count += 1
        return st

    def _save(self, st: _SigStats, tensors: dict, out: torch.Tensor) -> None:
        cfg = self.config
        if len(st.captures) >= cfg.captures_per_signature:
            return
        size = sum(t.numel() * t.element_size() for t in tensors.values() if t is not None)
        size += out.numel() * out.element_size()
        if st.capture_bytes + size > cfg.capture_bytes_per_signature or \
                self.total_capture_bytes + size > cfg.capture_bytes_total:
            return
        rel = f"inputs/{st.sig.slug()}_{len(st.captures)}.safetensors"
        save_capture(self.run_dir / rel, st.sig, tensors, out)
        st.captures.append(rel)
        st.capture_bytes += size
        self.total_capture_bytes += size


def _detect_offset(module, x: torch.Tensor) -> float | None:
    """Which (w + offset) the module's RMSNorm formula uses, None for neither: the output of the
    module with a random weight (1 + 0.5 randn, seeded), compared in float64 with both. Not the
    module's own weight: fresh from init it is all ones or zeros, where w and 1 + w, w and w*w, or a
    weight applied before the normalisation give the same output and the trained model would not.
    The probe runs on a copy; a module that cannot be copied gets the random weight in place, put
    back afterwards."""
    try:
        probe = copy.deepcopy(module)
    except Exception:  # noqa: BLE001 - a lock, a handle, a tensor subclass: probe the module itself
        probe = None
    target = probe if probe is not None else module
    w = getattr(target, "weight", None)
    w = w if isinstance(w, torch.Tensor) else None
    saved = w.detach().clone() if w is not None and probe is None else None
    try:
        with torch.no_grad():
            if w is not None:
                gen = torch.Generator().manual_seed(0)
                w.copy_(1.0 + 0.5 * torch.randn(w.shape, generator=gen))
            output = target(x)
            w_used = w.detach().clone() if w is not None else None
    except Exception:  # noqa: BLE001 - a module we cannot rerun: its formula stays unknown
        return None
    finally:
        if saved is not None:
            with torch.no_grad():
                w.copy_(saved)
    w = w_used
    if not isinstance(output, torch.Tensor) or output.shape != x.shape:
        return None
    eps = _module_eps(module)
    x64 = x.detach().double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    ref_scale = output.detach().double().abs().max().clamp_min(1e-6)
    best, best_err = None, float("inf")
    for off in ((0.0, 1.0) if w is not None else (0.0,)):
        ref = y if w is None else y * (w.detach().double() + off)
        err = ((ref - output.detach().double()).abs().max() / ref_scale).item()
        if err < best_err:
            best, best_err = off, err
    # Within bf16 rounding of the output (a few ulps relative to the largest value).
    return best if best_err < 3e-2 else None


def profile(target: Target, run_dir: str | Path, config: ProfileConfig = ProfileConfig(),
            quiet: bool = False) -> Profile:
    run_path = Path(run_dir)
    run_path.mkdir(parents=True, exist_ok=True)
    cuda = target.device == "cuda"
    stats: dict[str, _SigStats] = {}

    _progress(f"capture pass on {target.device} (real inputs of every target call)", quiet)
    functions = composite_functions(target.module)
    recorder = _Recorder(run_path, config, stats, capture=True, annotate=False, functions=functions)
    with recorder:
        run_forward(target)
    if cuda:
        torch.cuda.synchronize()
    for i in range(config.warmup):
        _progress(f"warm-up {i + 1}/{config.warmup}", quiet)
        run_forward(target)

    wall_us = _wall_time_us(target, cuda, config.iterations)

    _progress(f"profiled forwards: {config.iterations}", quiet)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    annotator = _Recorder(run_path, config, {k: _SigStats(v.sig) for k, v in stats.items()}, capture=False,
                          annotate=True, functions=functions)
    annotator.offsets = recorder.offsets
    with _filtered_native_stderr(), torch.profiler.profile(activities=activities) as prof:
        for _ in range(config.iterations):
            with record_function(FORWARD_RANGE):
                with annotator:
                    run_forward(target)
            if cuda:
                torch.cuda.synchronize()
    index_to_key = {i: k for k, i in annotator.index.items()}
    events = prof.events()
    timer = (lambda e: e.device_time_total) if cuda else (lambda e: e.cpu_time_total)

    forward_total = 0.0
    per_key: dict[str, float] = defaultdict(float)
    other: dict[str, float] = defaultdict(float)
    for e in events:
        if e.device_type != DeviceType.CPU:
            continue  # a range's GPU-side annotation repeats the device time its CPU event already sums
        if e.name == FORWARD_RANGE:
            forward_total += timer(e)
            for child in e.cpu_children:
                if child.name.startswith(RANGE_PREFIX):
                    continue
                _collect_other(child, timer, other)
        elif e.name.startswith(RANGE_PREFIX):
            key = index_to_key.get(int(e.name[len(RANGE_PREFIX):]))
            if key is not None:
                per_key[key] += timer(e)
    iters = config.iterations
    forward_us = forward_total / iters
    if forward_us <= 0:
        raise ForgeError("the profiler recorded no time for the forward pass",
                         "the model may do no work on this device; check get_inputs()")

    hotspots = []
    for key, st in stats.items():
        total = per_key.get(key, 0.0) / iters
        calls = annotator.stats[key].count / iters if key in annotator.stats else st.count
        calls = calls or st.count
        unsupported = st.unsupported or (abi.supports(st.sig) or "")
        hotspots.append(Hotspot(
            signature=st.sig, call_paths=tuple(sorted(st.paths)), calls_per_forward=calls,
            total_us=total, per_call_us=total / calls if calls else 0.0,
            time_share=min(max(total / forward_us, 0.0), 1.0), captures=tuple(st.captures), device=target.device,
            module_class=st.module_class, unsupported=unsupported, module_code=st.module_code))
    hotspots.sort(key=lambda h: -h.total_us)
    target_share = sum(h.time_share for h in hotspots)
    if target_share > 1.0:  # rounding across ranges; shares must sum to at most 1
        hotspots = [_scaled(h, 1.0 / target_share) for h in hotspots]
        target_share = 1.0
    other_ops = sorted((OtherOp(n, t / iters, min(t / iters / forward_us, 1.0)) for n, t in other.items()),
                       key=lambda o: -o.total_us)
    prof_result = Profile(
        model_path=target.path, device=target.device, dtype=target.dtype, iterations=iters,
        forward_us=forward_us, wall_us=wall_us, hotspots=hotspots,
        other_share=max(0.0, 1.0 - target_share), other_ops=other_ops[:10], run_dir=str(run_path),
        capture_bytes=recorder.total_capture_bytes, captured_calls=sum(len(s.captures) for s in stats.values()))
    (run_path / "profile.json").write_text(json.dumps(prof_result.to_json(), indent=2))
    return prof_result


# Kineto's own start/stop chatter, and its complaint when a CUDA build of torch runs without a GPU.
_NOISE = re.compile(r"(profiler_start|profiler_stop|gpuGetDeviceCount failed|SyncActivityProfilerHandler)")


@contextlib.contextmanager
def _filtered_native_stderr():
    """Route native stderr through a file while the profiler runs; re-emit all but Kineto's noise."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode(errors="replace").splitlines():
                if not _NOISE.search(line):
                    print(line, file=sys.stderr)


def _scaled(h: Hotspot, factor: float) -> Hotspot:
    from dataclasses import replace

    return replace(h, time_share=h.time_share * factor)


def _collect_other(event, timer, other: dict[str, float]) -> None:
    """Attribute a non-target child of the forward; look inside wrappers that hold a target range."""
    if any(c.name.startswith(RANGE_PREFIX) for c in event.cpu_children):
        inner = sum(timer(c) for c in event.cpu_children)
        own = timer(event) - inner
        if own > 0:
            other[event.name] += own
        for c in event.cpu_children:
            if not c.name.startswith(RANGE_PREFIX):
                _collect_other(c, timer, other)
        return
    t = timer(event)
    if t > 0:
        other[event.name] += t


def _wall_time_us(target: Target, cuda: bool, iterations: int) -> float:
    times = []
    for _ in range(max(iterations, 1)):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_forward(target)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return times[len(times) // 2]
