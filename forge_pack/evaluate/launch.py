"""Host glue written from the launch spec: the candidate never writes host code.

Two halves:
- ``plan``: pure Python. Evaluates the spec's expressions for one signature into concrete
  launches (kernel, typed arguments, grid, block, dynamic shared memory) and workspace sizes.
  Shared by the static checks (parent process) and the launchers (worker).
- launchers: CUDA through a small ctypes binding of the driver API (``libcuda.so.1``: load a
  cubin, look up ``extern "C"`` kernels, launch on torch's current stream); CPU through
  ``forge_pack.evaluate.sandbox`` (the shared object runs in a separate, locked-down runner process).
  torch is imported lazily, only by the launchers.

Argument rules (docs/candidate-format.md): a tensor name (an ABI input, ``out`` or a workspace)
is a pointer (NULL for an absent optional input); a size variable of ``abi.env(sig)`` is int64; a
scalar of ``abi.scalars(sig)`` is float; ``i32:``/``i64:``/``f32:`` prefix any expression.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable

from forge_pack.targets import abi
from forge_pack.core.candidate import LaunchSpec, evaluate, split_typed_arg
from forge_pack.core.errors import ForgeError
from forge_pack.core.signature import Signature

GRID_MAX = (2**31 - 1, 65535, 65535)
INT32 = (-(2**31), 2**31 - 1)


class LaunchError(Exception):
    """A launch failed. ``sticky``: the CUDA context is poisoned and the process must be replaced.
    ``reason``: the verdict reason it becomes (crash, out_of_bounds, work_after_return, ...)."""

    def __init__(self, message: str, sticky: bool = False, reason: str = "launch_error"):
        super().__init__(message)
        self.sticky = sticky
        self.reason = reason


@dataclass(frozen=True)
class PlannedLaunch:
    name: str
    args: tuple[tuple[str, Any], ...]  # (kind, value): ("ptr", tensor name) | ("i32"|"i64", int) | ("f32", float)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    arg_texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    launches: tuple[PlannedLaunch, ...]
    workspaces: tuple[tuple[str, int, bool], ...]  # (name, bytes, zero)


def launch_env(sig: Signature) -> dict[str, int | float]:
    env: dict[str, int | float] = dict(abi.env(sig))
    env.update(abi.scalars(sig))
    return env


def tensor_names(spec: LaunchSpec, sig: Signature) -> tuple[str, ...]:
    """Names that bind to pointers: every ABI input (absent ones are NULL), out, the workspaces."""
    return (*abi.tensor_inputs(sig), "out", *(w.name for w in spec.workspaces))


def check_requires(spec: LaunchSpec, sig: Signature) -> str | None:
    """The first `requires` expression the signature fails, or None. ForgeError on a bad expression."""
    env = launch_env(sig)
    for text in spec.requires:
        if not evaluate(text, env):
            return text
    return None


def plan(spec: LaunchSpec, sig: Signature) -> Plan:
    """Concrete launches for one signature. ForgeError on anything that cannot be evaluated."""
    env = launch_env(sig)
    scalars = abi.scalars(sig)
    pointers = set(tensor_names(spec, sig))
    for w in spec.workspaces:
        if w.name in env or w.name in abi.tensor_inputs(sig) or w.name == "out":
            raise ForgeError(f"workspace name {w.name!r} shadows a tensor or size variable", "rename the workspace")
    launches = []
    for i, k in enumerate(spec.kernels):
        args = []
        for text in k.args:
            prefix, expr = split_typed_arg(text)
            if expr in pointers:
                if prefix is not None:
                    raise ForgeError(f"kernels[{i}] argument {text!r}: a tensor cannot take a type prefix",
                                     f"pass the tensor as {expr!r}")
                args.append(("ptr", expr))
                continue
            if prefix is None and expr in scalars:
                args.append(("f32", float(scalars[expr])))
                continue
            value = evaluate(expr, env)
            kind = prefix or ("f32" if isinstance(value, float) else ("i32" if isinstance(value, bool) else "i64"))
            if kind == "f32":
                args.append(("f32", float(value)))
                continue
            ivalue = _as_int(value, f"kernels[{i}] argument {text!r}")
            if kind == "i32" and not INT32[0] <= ivalue <= INT32[1]:
                raise ForgeError(f"kernels[{i}] argument {text!r} = {ivalue} does not fit in 32 bits",
                                 "pass it as i64 and declare the parameter `long long`")
            args.append((kind, ivalue))
        grid = tuple(_as_int(evaluate(g, env), f"kernels[{i}].grid") for g in k.grid)
        block = tuple(_as_int(evaluate(b, env), f"kernels[{i}].block") for b in k.block)
        smem = _as_int(evaluate(k.shared_mem, env), f"kernels[{i}].shared_mem")
        launches.append(PlannedLaunch(k.name, tuple(args), grid, block, smem, k.args))  # type: ignore[arg-type]
    workspaces = tuple((w.name, _as_int(evaluate(w.bytes, env), f"workspace {w.name}.bytes"), w.zero)
                       for w in spec.workspaces)
    cap = workspace_cap(sig)
    for name, nbytes, _ in workspaces:
        if nbytes < 0:
            raise ForgeError(f"workspace {name} has negative size {nbytes}", "check its bytes expression")
        if nbytes > cap:
            raise ForgeError(f"workspace {name} asks for {nbytes} bytes, more than {cap} (4x the bytes the op "
                             f"moves, at least 64 MiB)", "size the workspace from the problem; a scratch "
                                                          "buffer never needs more than a few copies of the data")
    return Plan(tuple(launches), workspaces)


def workspace_cap(sig: Signature) -> int:
    """The most workspace bytes one candidate may ask for: a few copies of the op's data. Larger
    requests are a bug or an attempt to exhaust memory, and would fail (or kill the worker) anyway."""
    return max(64 << 20, 4 * abi.bytes_moved(sig))


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, float):
        if not value.is_integer():
            raise ForgeError(f"{where} evaluates to {value}, not an integer", "use // for integer division")
        return int(value)
    return int(value)


def check_dims(launch: PlannedLaunch, backend: str) -> str | None:
    """Why a planned CUDA launch cannot start (empty or oversized grid/block), else None."""
    if backend != "cuda":
        return None
    if any(g < 1 for g in launch.grid) or any(b < 1 for b in launch.block):
        return f"kernel {launch.name}: grid {launch.grid} / block {launch.block} has a dimension < 1"
    if any(g > m for g, m in zip(launch.grid, GRID_MAX)):
        return f"kernel {launch.name}: grid {launch.grid} exceeds the limits {GRID_MAX}"
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if threads > 1024 or launch.block[2] > 64:
        return f"kernel {launch.name}: block {launch.block} has {threads} threads (at most 1024, z at most 64)"
    if launch.shared_mem < 0:
        return f"kernel {launch.name}: negative shared memory {launch.shared_mem}"
    return None


# ---------------------------------------------------------------- CUDA driver API (ctypes)

_STICKY = {700, 702, 710, 714, 715, 716, 717, 718, 719, 999}  # context-poisoning errors
FUNC_MAX_THREADS, FUNC_SHARED, FUNC_CONST, FUNC_LOCAL, FUNC_REGS = 0, 1, 2, 3, 4
FUNC_MAX_DYNAMIC_SHARED = 8
DEV_SMEM_OPTIN = 97
DEV_SM_COUNT = 16
DEV_L2 = 38
DEV_VMM_SUPPORTED = 102  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
# cuda.h enum values used by the guarded buffers
MEM_ALLOCATION_TYPE_PINNED = 1
MEM_HANDLE_TYPE_NONE = 0
MEM_LOCATION_TYPE_DEVICE = 1
MEM_ACCESS_FLAGS_PROT_READWRITE = 3
MEM_ALLOC_GRANULARITY_MINIMUM = 0

GUARDS = ("end", "start")
VECTOR_ALIGN = 16  # the widest access a kernel makes (float4, TMA): a guarded copy keeps its address modulo this

# The driver symbols behind each virtual-memory call, as cuda.h (13.0) maps the API names: none of
# these has a _v2 ABI, unlike the copy and memset (tests/test_launch_structs.py checks the header).
VMM_SYMBOLS = {
    "cuMemGetAllocationGranularity": "cuMemGetAllocationGranularity",
    "cuMemAddressReserve": "cuMemAddressReserve",
    "cuMemAddressFree": "cuMemAddressFree",
    "cuMemCreate": "cuMemCreate",
    "cuMemRelease": "cuMemRelease",
    "cuMemMap": "cuMemMap",
    "cuMemUnmap": "cuMemUnmap",
    "cuMemSetAccess": "cuMemSetAccess",
    "cuMemsetD8": "cuMemsetD8_v2",
    "cuMemcpyDtoDAsync": "cuMemcpyDtoDAsync_v2",
}


class MemLocation(ctypes.Structure):
    """CUmemLocation: {CUmemLocationType type; int id;} (enums are 4-byte ints)."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemAllocFlags(ctypes.Structure):
    """The anonymous ``allocFlags`` struct inside CUmemAllocationProp."""

    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class MemAllocationProp(ctypes.Structure):
    """CUmemAllocationProp (CUmemAllocationProp_v1 in cuda.h): 32 bytes on x86-64."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", MemAllocFlags)]


class MemAccessDesc(ctypes.Structure):
    """CUmemAccessDesc: {CUmemLocation location; CUmemAccess_flags flags;}: 12 bytes."""

    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


class GuardSetupError(Exception):
    """Guarded buffers could not be made on this machine (no virtual-memory support, out of memory):
    a fact about the machine, never about the kernel, so deliberately not a LaunchError."""


class Driver:
    """The handful of driver-API calls the launcher needs (no private torch API)."""

    _instance: "Driver | None" = None

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        P = ctypes.POINTER
        vp, ci, cu = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        u64, sz = ctypes.c_uint64, ctypes.c_size_t
        sig = {
            "cuInit": [cu], "cuCtxGetCurrent": [P(vp)], "cuCtxSetCurrent": [vp], "cuCtxGetDevice": [P(ci)],
            "cuDevicePrimaryCtxRetain": [P(vp), ci], "cuModuleLoadData": [P(vp), vp],
            "cuModuleGetFunction": [P(vp), vp, ctypes.c_char_p], "cuModuleUnload": [vp],
            "cuFuncSetAttribute": [vp, ci, ci], "cuFuncGetAttribute": [P(ci), ci, vp],
            "cuLaunchKernel": [vp, cu, cu, cu, cu, cu, cu, cu, vp, P(vp), P(vp)],
            "cuGetErrorString": [ci, P(ctypes.c_char_p)], "cuGetErrorName": [ci, P(ctypes.c_char_p)],
            "cuDeviceGetAttribute": [P(ci), ci, ci],
            "cuMemcpyDtoDAsync_v2": [u64, u64, sz, vp], "cuCtxSynchronize": [],
        }
        for name, argtypes in sig.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ci
        self.lib = lib
        self.check(lib.cuInit(0), "cuInit")
        self._guard_problem: str | None = None
        self._granularity = 0
        self.vmm: dict[str, Any] = {}  # the virtual-memory calls, bound by the first guard_problem()

    @classmethod
    def get(cls) -> "Driver":
        if cls._instance is None:
            cls._instance = Driver()
        return cls._instance

    def error_text(self, code: int) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        self.lib.cuGetErrorString(code, ctypes.byref(text))
        return f"{(name.value or b'CUDA_ERROR').decode()}: {(text.value or b'unknown error').decode()}"

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise LaunchError(f"{what} failed: {self.error_text(code)}", sticky=code in _STICKY)

    def ensure_context(self) -> None:
        """Use torch's (primary) context on this thread."""
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda")  # the runtime makes the primary context current
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = torch.cuda.current_device()
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def device_attribute(self, attr: int) -> int:
        import torch

        v = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(v), attr, torch.cuda.current_device()),
                   "cuDeviceGetAttribute")
        return v.value

    # ------------------------------------------------ virtual memory, for guarded buffers

    def guard_problem(self) -> str:
        """'' when guarded buffers work on the current device, else why not. Probed once per process:
        bind the calls, check the device attribute, then map, write and free one guarded byte."""
        if self._guard_problem is None:
            self._guard_problem = self._probe_guard()
        return self._guard_problem

    def _probe_guard(self) -> str:
        P, u64, sz, ull, ci = ctypes.POINTER, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_ulonglong, ctypes.c_int
        sig = {
            "cuMemGetAllocationGranularity": [P(sz), P(MemAllocationProp), ci],
            "cuMemAddressReserve": [P(u64), sz, sz, u64, ull], "cuMemAddressFree": [u64, sz],
            "cuMemCreate": [P(u64), sz, P(MemAllocationProp), ull], "cuMemRelease": [u64],
            "cuMemMap": [u64, sz, sz, u64, ull], "cuMemUnmap": [u64, sz],
            "cuMemSetAccess": [u64, sz, P(MemAccessDesc), sz], "cuMemsetD8": [u64, ctypes.c_ubyte, sz],
        }
        for api, argtypes in sig.items():
            try:
                fn = getattr(self.lib, VMM_SYMBOLS[api])
            except AttributeError:
                return f"the CUDA driver does not export {VMM_SYMBOLS[api]} (virtual-memory API)"
            fn.argtypes = argtypes
            fn.restype = ci
            self.vmm[api] = fn
        try:
            if not self.device_attribute(DEV_VMM_SUPPORTED):
                return "the device does not support the virtual-memory API (attribute 102 is 0)"
            buf = GuardedBuffer(self, 1, "end")
            try:
                self.check(self.vmm["cuMemsetD8"](buf.ptr, 0x5A, 1), "cuMemsetD8 into a guarded buffer")
                self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize after the guarded-buffer probe")
            finally:
                buf.free()
        except (LaunchError, GuardSetupError) as e:
            return str(e)
        return ""

    def _device(self) -> int:
        import torch

        return torch.cuda.current_device()

    def allocation_prop(self) -> MemAllocationProp:
        """Plain device memory on the current device, no export handles, no compression."""
        prop = MemAllocationProp()
        prop.type = MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = MEM_HANDLE_TYPE_NONE
        prop.location.type = MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self._device()
        return prop

    def access_desc(self) -> MemAccessDesc:
        desc = MemAccessDesc()
        desc.location.type = MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self._device()
        desc.flags = MEM_ACCESS_FLAGS_PROT_READWRITE
        return desc

    def granularity(self) -> int:
        """The smallest mappable size (2 MiB on Hopper): guarded buffers are whole multiples of it."""
        if not self._granularity:
            g = ctypes.c_size_t()
            self.check(self.vmm["cuMemGetAllocationGranularity"](ctypes.byref(g), ctypes.byref(self.allocation_prop()),
                                                                  MEM_ALLOC_GRANULARITY_MINIMUM),
                       "cuMemGetAllocationGranularity")
            self._granularity = g.value
        return self._granularity


def guard_offset(nbytes: int, mapped: int, guard: str, phase: int = 0) -> int:
    """Where a payload of ``nbytes`` starts inside a mapping of ``mapped`` bytes: as close to the
    guarded edge as an address congruent to ``phase`` modulo VECTOR_ALIGN allows. With phase 0
    (every torch allocation) and nbytes a multiple of 16, the payload touches the edge exactly;
    otherwise the gap is below 16 bytes. Needs mapped >= nbytes + phase % VECTOR_ALIGN."""
    phase %= VECTOR_ALIGN
    if guard == "start":
        return phase
    room = mapped - nbytes
    return room - (room - phase) % VECTOR_ALIGN


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class GuardedBuffer:
    """Device memory for one tensor's bytes, flush against address space that faults on access.

    One granule of reserved but unmapped virtual addresses on each side of ``mapped`` bytes of
    physical memory; the payload sits against the end of the mapping (guard="end") or its start
    (guard="start"), at an address with the original's alignment modulo 16, so the first access
    one element past the end (or before the start) of a 16-byte-multiple tensor faults
    (CUDA_ERROR_ILLEGAL_ADDRESS). ``slack``: bytes between the payload and the guarded edge
    (0 for such tensors, below 16 otherwise). Errors raise GuardSetupError."""

    def __init__(self, driver: Driver, nbytes: int, guard: str, phase: int = 0):
        if guard not in GUARDS:
            raise ValueError(f"guard must be one of {GUARDS}, not {guard!r}")
        if driver._guard_problem is None and not driver.vmm:
            driver.guard_problem()  # binds the calls (the probe itself comes here with them bound)
        if driver._guard_problem:
            raise GuardSetupError(f"guarded buffers are unavailable on this machine: {driver._guard_problem}")
        vmm = driver.vmm
        self.driver, self.nbytes, self.guard = driver, nbytes, guard
        self.base = 0
        self._mapped = False
        try:
            gran = driver.granularity()
        except LaunchError as e:
            raise GuardSetupError(str(e)) from e
        self.granularity = gran
        self.mapped = max(gran, _round_up(nbytes + phase % VECTOR_ALIGN, gran))
        self.reserved = self.mapped + 2 * gran
        self.offset = guard_offset(nbytes, self.mapped, guard, phase)
        self.slack = self.mapped - self.offset - nbytes if guard == "end" else self.offset
        base = ctypes.c_uint64()
        self._check(vmm["cuMemAddressReserve"](ctypes.byref(base), self.reserved, gran, 0, 0),
                    f"cuMemAddressReserve({self.reserved})")
        self.base = base.value
        self.start = self.base + gran  # first mapped byte; [base, start) and [start + mapped, +gran) stay unmapped
        try:
            handle = ctypes.c_uint64()
            prop = driver.allocation_prop()
            self._check(vmm["cuMemCreate"](ctypes.byref(handle), self.mapped, ctypes.byref(prop), 0),
                        f"cuMemCreate({self.mapped})")
            try:
                self._check(vmm["cuMemMap"](self.start, self.mapped, 0, handle, 0), "cuMemMap")
                self._mapped = True
            finally:
                vmm["cuMemRelease"](handle)  # the mapping holds the memory from here on
            self._check(vmm["cuMemSetAccess"](self.start, self.mapped, ctypes.byref(driver.access_desc()), 1),
                        "cuMemSetAccess")
        except BaseException:
            self.free()
            raise
        self.ptr = self.start + self.offset

    def _check(self, code: int, what: str) -> None:
        if code:
            raise GuardSetupError(f"guarded buffer of {self.nbytes} bytes: {what} failed: "
                                  f"{self.driver.error_text(code)}")

    def describe(self) -> str:
        edge = "end" if self.guard == "end" else "start"
        return f"{self.nbytes} B, {self.slack} B from the unmapped range at its {edge}"

    def free(self) -> None:
        """Unmap and release (errors ignored: after a fault the context refuses, and the process goes)."""
        if not self.base:
            return
        vmm = self.driver.vmm
        if self._mapped:
            vmm["cuMemUnmap"](self.start, self.mapped)
            self._mapped = False
        vmm["cuMemAddressFree"](self.base, self.reserved)
        self.base = 0


def span_bytes(t: Any) -> int:
    """Bytes from a tensor's first element to the end of its last (what a kernel may touch)."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size()


class GuardedRun:
    """A bound launch over guarded copies of its tensors (``CudaModule.bind(..., guard=...)``).

    Each call: copy every tensor's bytes into its guarded buffer (on the bound stream), launch,
    synchronise the device, copy every buffer back into the caller's tensor (outputs, and any write
    to an input, land where the caller looks) and synchronise again. A context-poisoning error
    during the call is raised as ``LaunchError(sticky=True)`` with ``guard`` set to the side and
    ``code`` to the CUDA error: the kernels touched memory outside their tensors. ``close()`` (or
    garbage collection) frees the buffers."""

    def __init__(self, driver: Driver, calls: list, stream: ctypes.c_void_p, buffers: dict[str, tuple],
                 guard: str, keep: list):
        self.driver, self.calls, self.stream, self.guard = driver, calls, stream, guard
        self.buffers = buffers  # name -> (GuardedBuffer, original tensor)
        self._keep = keep
        self.closed = False

    def _fail(self, code: int, what: str) -> None:
        if not code:
            return
        text = self.driver.error_text(code)
        if code not in _STICKY:
            raise LaunchError(f"{what} failed: {text}")
        placed = "; ".join(f"{n}: {b.describe()}" for n, (b, _) in self.buffers.items())
        err = LaunchError(f"{what} failed: {text}, with every tensor placed against unmapped memory at its "
                          f"{self.guard} ({placed}): an access outside the tensors", sticky=True,
                          reason="out_of_bounds")
        err.guard, err.code = self.guard, code  # type: ignore[attr-defined]
        raise err

    def _copy(self, to_guard: bool) -> None:
        copy = self.driver.lib.cuMemcpyDtoDAsync_v2
        for name, (buf, t) in self.buffers.items():
            if buf.nbytes:
                dst, src = (buf.ptr, t.data_ptr()) if to_guard else (t.data_ptr(), buf.ptr)
                self._fail(copy(dst, src, buf.nbytes, self.stream),
                           f"copying {name} {'into' if to_guard else 'out of'} its guarded buffer")

    def __call__(self) -> None:
        if self.closed:
            raise RuntimeError("this guarded run was closed")
        lib = self.driver.lib
        self._copy(True)
        for f, l, params in self.calls:
            self._fail(lib.cuLaunchKernel(f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
                                          l.shared_mem, self.stream, params, None), f"cuLaunchKernel({l.name})")
        self._fail(lib.cuCtxSynchronize(), "synchronising after the guarded launch")
        self._copy(False)
        self._fail(lib.cuCtxSynchronize(), "synchronising after copying the guarded buffers back")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.driver.lib.cuCtxSynchronize()  # nothing may still use a buffer that is unmapped
        for buf, _ in self.buffers.values():
            buf.free()
        self.buffers = {}

    def __enter__(self) -> "GuardedRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass  # interpreter shutdown: the process's address space goes anyway


class CudaModule:
    """A loaded cubin and its kernels."""

    def __init__(self, image: bytes, names: list[str]):
        self.driver = Driver.get()
        self.driver.ensure_context()
        self._image = ctypes.create_string_buffer(image, len(image))
        self.handle = ctypes.c_void_p()
        self.driver.check(self.driver.lib.cuModuleLoadData(ctypes.byref(self.handle), self._image),
                          "cuModuleLoadData")
        self.funcs: dict[str, ctypes.c_void_p] = {}
        for name in dict.fromkeys(names):
            f = ctypes.c_void_p()
            code = self.driver.lib.cuModuleGetFunction(ctypes.byref(f), self.handle, name.encode())
            if code != 0:
                raise LaunchError(f"kernel {name!r} not found in the compiled module ({self.driver.error_text(code)})"
                                  f"; declare it extern \"C\" __global__")
            self.funcs[name] = f
        self._smem_set: dict[str, int] = {}

    def attributes(self) -> dict[str, dict]:
        out = {}
        for name, f in self.funcs.items():
            vals = {}
            for key, attr in (("max_threads", FUNC_MAX_THREADS), ("static_smem_bytes", FUNC_SHARED),
                              ("local_bytes", FUNC_LOCAL), ("registers", FUNC_REGS)):
                v = ctypes.c_int()
                self.driver.lib.cuFuncGetAttribute(ctypes.byref(v), attr, f)
                vals[key] = v.value
            out[name] = vals
        return out

    def prepare(self, launch: PlannedLaunch) -> None:
        """Per-kernel limits that depend on the compiled code: threads (registers), dynamic smem."""
        f = self.funcs[launch.name]
        v = ctypes.c_int()
        self.driver.lib.cuFuncGetAttribute(ctypes.byref(v), FUNC_MAX_THREADS, f)
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        if threads > v.value:
            raise LaunchError(f"kernel {launch.name}: block of {threads} threads, but its register use allows "
                              f"at most {v.value} per block")
        if launch.shared_mem and self._smem_set.get(launch.name, 0) < launch.shared_mem:
            # the default cap is 48 KB of static plus dynamic shared memory; beyond it, opt in
            self.driver.lib.cuFuncGetAttribute(ctypes.byref(v), FUNC_SHARED, f)
            if launch.shared_mem + v.value <= 48 * 1024:
                self._smem_set[launch.name] = launch.shared_mem  # within the default: nothing to set
                return
            optin = self.driver.device_attribute(DEV_SMEM_OPTIN)
            if launch.shared_mem + v.value > optin:
                raise LaunchError(f"kernel {launch.name}: {launch.shared_mem} bytes of dynamic shared memory "
                                  f"(+{v.value} static) exceed the device limit of {optin}")
            self.driver.check(self.driver.lib.cuFuncSetAttribute(f, FUNC_MAX_DYNAMIC_SHARED, launch.shared_mem),
                              f"cuFuncSetAttribute({launch.name}, max dynamic shared memory)")
            self._smem_set[launch.name] = launch.shared_mem

    @property
    def supports_guard(self) -> bool:
        """Whether ``bind(..., guard=...)`` works here (the driver's virtual-memory API; see
        ``Driver.guard_problem()`` for why not)."""
        return not self.driver.guard_problem()

    def bind(self, plan_: Plan, tensors: dict[str, Any], guard: str | None = None) -> Callable[[], None]:
        """A no-argument callable that enqueues every launch on torch's current stream.

        ``guard`` ("end" or "start"): the launches see guarded copies of every tensor they are
        passed (GuardedBuffer), and the callable is a GuardedRun that synchronises and raises
        LaunchError(sticky=True, guard=side) when the kernels touch memory outside their tensors.
        GuardSetupError when this machine cannot make guarded buffers."""
        import torch

        if guard is not None and guard not in GUARDS:
            raise ValueError(f"guard must be None or one of {GUARDS}, not {guard!r}")
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for launch in plan_.launches:
            problem = check_dims(launch, "cuda")
            if problem:
                raise LaunchError(problem)
            self.prepare(launch)
        buffers: dict[str, tuple[GuardedBuffer, Any]] = {}
        if guard is not None:
            problem = self.driver.guard_problem()
            if problem:
                raise GuardSetupError(f"guarded buffers are unavailable on this machine: {problem}")
            try:
                for name in dict.fromkeys(v for l in plan_.launches for k, v in l.args if k == "ptr"):
                    t = tensors.get(name)
                    if t is not None:
                        buffers[name] = (GuardedBuffer(self.driver, span_bytes(t), guard, t.data_ptr()), t)
            except BaseException:
                for buf, _ in buffers.values():
                    buf.free()
                raise
        calls = []
        keep: list[Any] = []
        for launch in plan_.launches:
            values = [ctypes.c_void_p(buffers[value][0].ptr) if kind == "ptr" and value in buffers
                      else _ctype(kind, value, tensors) for kind, value in launch.args]
            params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
            keep.extend([values, params])
            calls.append((self.funcs[launch.name], launch, params))
        if guard is not None:
            return GuardedRun(self.driver, calls, stream, buffers, guard, keep)
        lib, check = self.driver.lib, self.driver.check

        def run() -> None:
            for f, l, params in calls:
                code = lib.cuLaunchKernel(f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
                                          l.shared_mem, stream, params, None)
                if code:
                    check(code, f"cuLaunchKernel({l.name})")

        run._keep = keep  # type: ignore[attr-defined]
        return run

    def close(self) -> None:
        if self.handle.value:
            self.driver.lib.cuModuleUnload(self.handle)
            self.handle = ctypes.c_void_p()


def _ctype(kind: str, value: Any, tensors: dict[str, Any]):
    if kind == "ptr":
        t = tensors.get(value)
        return ctypes.c_void_p(t.data_ptr() if t is not None else 0)
    if kind == "i32":
        return ctypes.c_int32(value)
    if kind == "i64":
        return ctypes.c_int64(value)
    return ctypes.c_float(value)


def load_module(backend: str, artifact: str, names: list[str], memory_cap: int | None = None):
    """CUDA: the cubin in this process. CPU: ``sandbox.RemoteCpuModule``, the shared object in a
    locked-down runner process of its own (``memory_cap``: bytes it may allocate)."""
    if backend == "cuda":
        with open(artifact, "rb") as f:
            return CudaModule(f.read(), names)
    from forge_pack.evaluate.sandbox import RemoteCpuModule

    return RemoteCpuModule(artifact, names, memory_cap)
