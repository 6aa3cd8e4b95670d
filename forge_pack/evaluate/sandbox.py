"""The judge's side of a CPU candidate: its native code runs in a runner process, never here.

``RemoteCpuModule`` has the interface of ``launch.CpuModule`` (``bind(plan, tensors) -> run``,
``run.retarget(name, tensor)``, ``close()``), so verification and timing do not know where the
code runs. One fresh runner (``forge_pack.evaluate.runner``) per module, i.e. per candidate, in the
worker's process group; ``close()`` kills it.

Memory: a memfd arena mapped by both processes. ``run()`` copies the bound tensors into their
arena slots, sends GO, waits for DONE and copies every slot back (outputs and inputs, so an input
the kernel wrote shows up in the judge's tensor and the verifier's input checks see it). Each
slot starts page-aligned behind a page whose last ``CANARY_BYTES`` and the ``CANARY_BYTES`` after
the tensor hold a canary; a touched canary is an ``out_of_bounds`` write. With a guard
(``bind(..., guard="end"|"start")``) the runner instead makes the page after (before) the tensor
inaccessible and places the tensor flush against it: its last byte ends less than 16 bytes
before the guard page (the start keeps 16-byte alignment), or its first byte starts right after
it. A fault during a guarded launch is ``out_of_bounds``.

Timing: ``run.last_elapsed_s`` is measured by the judge around GO..DONE (the staging copies are
outside it): the smaller of the wall time and the runner's CPU time (all its threads) over that
interval. Both come from the kernel's clocks, out of the candidate's reach. The wall time alone
also counts the two wake-ups a round trip needs (runner, then judge): on the loaded 2-core CI box
(load 4.4) that put a 0.75 ms in-process softmax at 4.6 ms median. CPU time leaves out time spent
waiting to be scheduled but not any work: every thread the runner has, and the page faults they
take, count, and work before or after the call is ``work_after_return``. A kernel on several
threads uses more CPU than wall time, so the wall time is what counts for it.
``run.stage()`` does the copies ahead of the timed part; ``retarget(name, tensor, fresh=True)`` marks the tensor as newly allocated: it is
not copied in, and a slot of at least ``FRESH_MIN_BYTES`` gets never-touched pages (holes punched
in the memfd), so each timed call's output costs its first touch exactly when a freshly
allocated tensor does in eager PyTorch.

Work after return: the runner must be idle between DONE and the next GO. The judge reads the
runner's CPU time (all threads, alive or exited) at each answer (DONE, ACK) and again before the
next staging, before each setup command and in ``settle()``; growth beyond ``IDLE_CPU_NS`` raises
``LaunchError(reason="work_after_return")``. The runner has the kernel account its own thread's
CPU time before each answer (``runner._account``): Linux sums another process's threads as last
accounted, so a runner still on a CPU when the judge reads would otherwise show up to a tick
(4 ms at HZ=250) of its call late, as idle time.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from typing import Any

from forge_pack.evaluate import runner as proto
from forge_pack.evaluate.launch import LaunchError, Plan
from forge_pack.evaluate.worker import _signal_name

PAGE = mmap.PAGESIZE
WINDOW = 1 << 40  # address space reserved for the arena in both processes (pages exist only when used)
CANARY = 0xA5
CANARY_BYTES = 512
START_TIMEOUT_S = 30.0  # interpreter start and dlopen on a loaded machine
# An idle runner between DONE and the next GO only finishes its loop (write, back into read) and
# its OpenMP threads fall asleep: 500 calls on the loaded 2-core CI box grew by 22 us median,
# 152 us at most (2 threads). 2 ms is >10x the worst, and far below the CPU time a useful deferred
# share of a kernel takes on the sizes forge-pack targets.
IDLE_CPU_NS = 2_000_000
# A new tensor of this size or more gets never-touched pages from glibc (its largest dynamic mmap
# threshold on 64-bit); smaller ones reuse freed, already-faulted heap memory. torch's CPU
# allocator is malloc, so this is what an eager call's output costs, and what a fresh slot mirrors.
# Measured (torch.empty + fill, 20 allocations each): 2 MiB and 16 MiB took 179 minor faults per
# allocation (of 512 / 4096 pages), 40 MiB took 10241 (of 10240). Punching every output regardless
# doubled a 2 MiB group_norm's time (1.1 -> 2.4 ms) for a cost eager does not pay.
FRESH_MIN_BYTES = 32 << 20
THREAD_ALLOWANCE = 72 << 20  # per OpenMP thread: an 8 MiB stack and glibc's 64 MiB malloc arena
FALLOC_PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_warned_unfiltered = [False]


def default_memory_cap(signature_bytes: int) -> int:
    """Bytes a candidate may allocate beyond the arena: 2 GiB, or 8x the bytes its op moves."""
    return max(2 << 30, 8 * signature_bytes)


def _round(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _span_bytes(t) -> int:
    """Bytes from the tensor's first element to the end of its last (strides are non-negative)."""
    if t.numel() == 0:
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))) * t.element_size()


def _signal_text(code: int | None) -> str:
    """``worker._signal_name`` worded for "the candidate's process ... while ..."."""
    if code is None:
        return "stopped answering"
    return ("was " if code < 0 else "") + _signal_name(code)


class _Slot:
    __slots__ = ("start", "length", "data", "nbytes", "guard")

    def __init__(self, start: int, length: int, data: int, nbytes: int, guard: str | None):
        self.start, self.length, self.data, self.nbytes, self.guard = start, length, data, nbytes, guard


class RemoteCpuModule:
    """A candidate's shared object, loaded and run in its own locked-down runner process."""

    supports_guard = True

    def __init__(self, so_path: str, names: list[str], memory_cap: int | None = None):
        import torch

        self._torch = torch
        self.names = list(dict.fromkeys(names))
        self.memory_cap = memory_cap if memory_cap is not None else default_memory_cap(0)
        self.dead: LaunchError | None = None
        self.filtered = False
        self._seq = 0
        self._programs = 0
        self._cpu_done: int | None = None
        self._guarded = False  # the launch in flight runs on guarded slots
        self._free: list[tuple[int, int]] = []  # (start, length), sorted, coalesced
        self._size = 0
        self._fd = os.memfd_create("forge-arena")  # close-on-exec; pass_fds hands it to the runner alone
        base = _libc.mmap(None, WINDOW, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, self._fd, 0)
        if base is None or base == ctypes.c_void_p(-1).value:
            os.close(self._fd)
            raise LaunchError(f"cannot reserve the arena window: {os.strerror(ctypes.get_errno())}")
        self._base = base
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
        cap = self.memory_cap + threads * THREAD_ALLOWANCE
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")  # sleeping, not spinning, once a region ends
        cmd = [sys.executable, "-S", "-E", "-s", proto.__file__, str(theirs.fileno()), str(self._fd), str(WINDOW),
               str(os.getpid()), str(cap), so_path, *self.names]
        self._log = tempfile.TemporaryFile(prefix="forge-runner-")  # its stdout/stderr (capped at 1 MiB)
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(), self._fd), stdin=subprocess.DEVNULL,
                                         stdout=self._log, stderr=subprocess.STDOUT, env=env)
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self._clock = ((~self.pid) << 3) | 2  # the process's CPU-time clock (CPUCLOCK_SCHED): every thread
        try:
            self._hello()
        except LaunchError:
            self.close()  # the window and the memfd too
            raise

    def _hello(self) -> None:
        kind, _, value = self._receive(START_TIMEOUT_S, "starting")
        index = value & 0xFFFFFFFF
        if kind == proto.R_ERROR and value >> 32 == proto.E_SYMBOL and index < len(self.names):
            raise LaunchError(f"function {self.names[index]!r} not found in the shared object; declare it "
                              f"extern \"C\"")
        if kind != proto.R_HELLO:
            raise LaunchError(f"the candidate's runner failed to start (message {kind}, {value:#x})")
        self.filtered = bool(value & proto.FILTERED)
        if not self.filtered and not _warned_unfiltered[0]:
            _warned_unfiltered[0] = True
            print("forge-pack: no seccomp filter on this platform; CPU candidates run in their own process "
                  "without system-call restrictions", file=sys.stderr, flush=True)
        self._cpu_done = self._cpu_ns()

    # ---------------------------------------------------------------- channel

    def _receive(self, timeout: float | None, what: str) -> tuple[int, int, int]:
        if timeout is not None:
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if not ready:
                self._die(f"the candidate's runner did not answer within {timeout:.0f} s while {what}")
        try:
            data = self._sock.recv(64)
        except OSError:
            data = b""
        if not data:
            self._died(what)
        if len(data) != proto.REPLY.size:
            self._die(f"the runner's channel carried a {len(data)}-byte message (the candidate wrote to it)")
        return proto.REPLY.unpack(data)

    def _send(self, op: int, a: int = 0, b: int = 0, c: int = 0, payload: bytes = b"") -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        try:
            self._sock.send(proto.HEADER.pack(op, self._seq, a, b, c) + payload)
        except OSError:
            self._died("receiving a command")
        return self._seq

    def _request(self, op: int, a: int = 0, b: int = 0, c: int = 0, payload: bytes = b"") -> int:
        self._check_idle(self._cpu_ns())  # the stretch since the last answer, before the reset below
        seq = self._send(op, a, b, c, payload)
        kind, rseq, value = self._receive(None, "setting up")
        self._cpu_done = self._cpu_ns()  # the runner's own work for the command is not the candidate's
        if kind != proto.R_ACK or rseq != seq:
            self._die(f"the runner answered {kind}/{rseq} to command {op}/{seq}")
        return value

    def _died(self, what: str) -> None:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        text = f"the candidate's process {_signal_text(code)} while {what}"
        sig = -code if code is not None and code < 0 else 0
        if self._guarded and sig in (signal.SIGSEGV, signal.SIGBUS):
            self._die(text + ": it touched memory outside its tensors (guard page)", "out_of_bounds")
        if sig == signal.SIGKILL:
            text += f" (killed from outside, or out of memory; the cap is {self.memory_cap >> 20} MiB)"
        elif sig == signal.SIGABRT:
            text += f" (aborted: an uncaught exception, e.g. std::bad_alloc at the {self.memory_cap >> 20} MiB cap)"
        said = self.output_tail()
        self._die(text + (f"\nits output:\n{said}" if said else ""), "crash")

    def output_tail(self, chars: int = 2000) -> str:
        """The end of what the runner printed (text for the verdict detail, never parsed)."""
        try:
            size = os.fstat(self._log.fileno()).st_size
            self._log.seek(max(0, size - chars))
            return self._log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def _die(self, message: str, reason: str = "launch_error") -> None:
        self.dead = LaunchError(message, reason=reason)
        self._kill()
        raise self.dead

    def _alive(self) -> None:
        if self.dead is not None:
            raise LaunchError(str(self.dead), reason=self.dead.reason)

    # ---------------------------------------------------------------- idleness

    def _cpu_ns(self) -> int:
        try:
            return time.clock_gettime_ns(self._clock)
        except OSError:
            return 0

    def settle(self) -> None:
        """Raise if the runner did anything since its last DONE (work after return, or a message the
        runner did not send). Called before each staging and by the evaluator at the end."""
        self._alive()
        self._check_idle(self._cpu_ns())
        if select.select([self._sock], [], [], 0)[0]:
            self._receive(0, "idle")  # EOF: died while idle
            self._die("the runner's channel carried a message between calls (the candidate wrote to it)")

    def _check_idle(self, now: int) -> None:
        """The runner's CPU time must not have grown since its last answer (work after return)."""
        if self._cpu_done is not None and now - self._cpu_done > IDLE_CPU_NS:
            self._die(f"the candidate kept running after its call returned: {(now - self._cpu_done) / 1e6:.1f} ms "
                      f"of CPU time between the end of one call and the next (allowed: {IDLE_CPU_NS / 1e6:g} ms)",
                      "work_after_return")

    # ---------------------------------------------------------------- arena

    def _grow(self, end: int) -> None:
        if end > self._size:
            if end > WINDOW:
                raise LaunchError(f"the arena would need {end >> 20} MiB, more than its {WINDOW >> 30} GiB window")
            os.ftruncate(self._fd, end)
            self._size = end

    def _alloc(self, length: int) -> int:
        for i, (start, size) in enumerate(self._free):
            if size >= length:
                if size == length:
                    del self._free[i]
                else:
                    self._free[i] = (start + length, size - length)
                return start
        start = self._size
        self._grow(start + length)
        return start

    def _release(self, slots: list[_Slot]) -> None:
        if self._fd < 0:
            return
        for s in slots:
            if s.guard is not None:
                continue  # its guard pages stay inaccessible in the runner: never reused
            self._punch(s.start, s.length)  # gives the memory back
            self._free.append((s.start, s.length))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for start, size in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((start, size))
        self._free = merged

    def _punch(self, start: int, length: int) -> None:
        if length and _libc.fallocate(self._fd, FALLOC_PUNCH_HOLE, start, length) != 0:
            raise LaunchError(f"fallocate(PUNCH_HOLE) failed: {os.strerror(ctypes.get_errno())}")

    def _slot(self, nbytes: int, guard: str | None) -> _Slot:
        if guard == "end":
            body = _round(_round(nbytes, 16), PAGE)
            start = self._alloc(body + PAGE)
            slot = _Slot(start, body + PAGE, start + body - _round(nbytes, 16), nbytes, guard)
            self._request(proto.OP_PROTECT, start + body, PAGE, 0)
        elif guard == "start":
            body = _round(max(nbytes, 1), PAGE)
            start = self._alloc(PAGE + body)
            slot = _Slot(start, PAGE + body, start + PAGE, nbytes, guard)
            self._request(proto.OP_PROTECT, start, PAGE, 0)
        else:
            body = _round(nbytes + CANARY_BYTES, PAGE)
            start = self._alloc(PAGE + body)
            slot = _Slot(start, PAGE + body, start + PAGE, nbytes, None)
        return slot

    def _bytes(self, offset: int, nbytes: int):
        arr = (ctypes.c_uint8 * max(nbytes, 1)).from_address(self._base + offset)
        return self._torch.frombuffer(arr, dtype=self._torch.uint8)[:nbytes]

    def _view(self, slot: _Slot, t):
        """A tensor over the slot with t's dtype, shape and strides."""
        raw = self._bytes(slot.data, max(slot.nbytes, t.element_size()))
        return raw.view(t.dtype).as_strided(t.shape, t.stride())

    # ---------------------------------------------------------------- bind

    def bind(self, plan_: Plan, tensors: dict[str, Any], guard: str | None = None):
        """A no-argument callable running every launch of the plan in the runner on copies of the
        tensors (see the module docstring); ``run.retarget(name, tensor, fresh=False)`` swaps the
        judge tensor a slot mirrors (same dtype, shape and strides)."""
        if guard not in (None, "end", "start"):
            raise ValueError(f"guard must be None, 'end' or 'start', not {guard!r}")
        self._alive()
        names = [v for l in plan_.launches for k, v in l.args if k == "ptr" and tensors.get(v) is not None]
        names = list(dict.fromkeys(names))
        slots = {n: self._slot(_span_bytes(tensors[n]), guard) for n in names}
        payload = []
        for launch in plan_.launches:
            try:
                index = self.names.index(launch.name)
            except ValueError:
                raise LaunchError(f"kernel {launch.name!r} was not loaded")
            payload.append(proto.LAUNCH.pack(index, len(launch.args)))
            for kind, value in launch.args:
                payload.append(_arg(kind, value, slots))
        self._programs += 1
        pid = self._programs
        self._request(proto.OP_PROGRAM, pid, payload=b"".join(payload))
        run = _Bound(self, pid, slots, {n: tensors[n] for n in names}, guard).callable()
        weakref.finalize(run, self._release, list(slots.values()))  # the slots are free once run is dropped
        return run

    # ---------------------------------------------------------------- close

    def _kill(self) -> None:
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.dead is None:  # a run kept past close() must not touch the unmapped arena
            self.dead = LaunchError("the candidate's module was closed")
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            try:
                self._sock.send(proto.HEADER.pack(proto.OP_EXIT, 0, 0, 0, 0))
            except OSError:
                pass
        self._kill()  # whatever the candidate started inside it goes with it
        self._sock.close()
        self._log.close()
        if self._fd >= 0:
            _libc.munmap(self._base, WINDOW)
            os.close(self._fd)
            self._fd = -1


def _arg(kind: str, value: Any, slots: dict[str, _Slot]) -> bytes:
    if kind == "ptr":
        slot = slots.get(value)
        return proto.ARG.pack(0, 0, slot.data if slot is not None else proto.NULL_OFFSET)
    if kind in ("i32", "i64"):
        return proto.ARG.pack(1 if kind == "i32" else 2, 0, int(value) & proto.NULL_OFFSET)
    bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
    return proto.ARG.pack(3, 0, bits)


class _Bound:
    """One bound plan: its slots, the judge tensors they mirror, the stage/go/collect cycle."""

    def __init__(self, module: RemoteCpuModule, program: int, slots: dict[str, _Slot], tensors: dict[str, Any],
                 guard: str | None):
        self.m, self.program, self.slots, self.tensors, self.guard = module, program, slots, tensors, guard
        self.views = {n: module._view(slots[n], t) for n, t in tensors.items()}
        self.fresh: set[str] = set()
        self.staged = False
        self.last_elapsed_s: float | None = None
        self.last_wall_s: float | None = None
        self.last_cpu_s: float | None = None

    def callable(self):
        """The run function handed out (it holds the bound state; the state never holds it, so
        dropping it frees the slots at once)."""
        bound = self

        def run() -> None:
            bound.go()

        def retarget(name: str, tensor: Any, fresh: bool = False) -> None:
            bound.retarget(name, tensor, fresh)

        run.retarget = retarget  # type: ignore[attr-defined]
        run.stage = bound.stage  # type: ignore[attr-defined]
        run.elapsed_s = lambda: bound.last_elapsed_s  # type: ignore[attr-defined]
        run.bound = bound  # type: ignore[attr-defined]
        return run

    def retarget(self, name: str, tensor: Any, fresh: bool) -> None:
        old = self.tensors.get(name)
        if old is None:
            return
        if tensor.shape != old.shape or tensor.stride() != old.stride() or tensor.dtype != old.dtype:
            raise LaunchError(f"retarget({name!r}): a tensor of another layout than the one bound")
        self.tensors[name] = tensor
        if fresh:
            self.fresh.add(name)
        self.staged = False

    def stage(self) -> None:
        """Copy the judge's tensors into the arena (fresh slots: new pages instead)."""
        m = self.m
        m.settle()
        for name, t in self.tensors.items():
            slot, view = self.slots[name], self.views[name]
            if name in self.fresh:  # a new tensor: its content is whatever new memory holds
                if slot.nbytes >= FRESH_MIN_BYTES:
                    lo = slot.data // PAGE * PAGE
                    m._punch(lo, _round(slot.data + slot.nbytes, PAGE) - lo)
            else:
                view.copy_(t)
            if slot.guard is None:
                m._bytes(slot.data - CANARY_BYTES, CANARY_BYTES).fill_(CANARY)
                m._bytes(slot.data + slot.nbytes, CANARY_BYTES).fill_(CANARY)
        self.fresh.clear()
        self.staged = True

    def go(self) -> None:
        if not self.staged:
            self.stage()
        m = self.m
        nonce = secrets.randbits(63)
        c0 = m._cpu_ns()
        m._check_idle(c0)  # covers the staging too: the whole stretch from the last DONE to this GO
        m._guarded = self.guard is not None
        try:
            t0 = time.perf_counter_ns()
            seq = m._send(proto.OP_GO, self.program, nonce)
            kind, rseq, value = m._receive(None, "running the kernel")
            t1 = time.perf_counter_ns()
            m._cpu_done = c1 = m._cpu_ns()
        finally:
            m._guarded = False
            self.staged = False
        if kind != proto.R_DONE or rseq != seq or value != nonce:
            m._die("the runner's channel carried a message the runner did not send (the candidate wrote to it)")
        self.last_wall_s = (t1 - t0) / 1e9
        self.last_cpu_s = (c1 - c0) / 1e9 if c0 and c1 else None
        self.last_elapsed_s = min(self.last_wall_s, self.last_cpu_s) if self.last_cpu_s else self.last_wall_s
        for name, t in self.tensors.items():
            t.copy_(self.views[name])
        for name, slot in self.slots.items():
            if slot.guard is not None:
                continue
            for where, offset in (("before the start", slot.data - CANARY_BYTES),
                                  ("after the end", slot.data + slot.nbytes)):
                if not bool((m._bytes(offset, CANARY_BYTES) == CANARY).all()):
                    m._die(f"the kernel wrote {where} of `{name}` (the canary bytes there changed)", "out_of_bounds")
