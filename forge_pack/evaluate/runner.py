"""The process a CPU candidate's native code runs in: it holds nothing the verdict depends on.

Started by ``forge_pack.evaluate.sandbox`` (the judge, inside a worker) once per candidate; standard
library only, no torch, so it starts in tens of milliseconds. It maps the judge's shared arena
(a memfd), loads the candidate's shared object, locks itself down, then runs launches on
command. The references, the tolerance, the comparison and the timer stay in the judge.

Lock-down, in order (x86_64):
1. PR_SET_PDEATHSIG(SIGKILL): dies with the worker that started it.
2. RLIMIT_CORE = 0.
3. PR_SET_NO_NEW_PRIVS + a first seccomp filter: no process creation, exec, sockets, ptrace,
   other processes' memory or signals; files may still be opened (the dynamic loader needs
   them, and the object's constructors, if any, run inside ``dlopen``).
4. ``dlopen`` of the candidate and lookup of its functions.
5. RLIMIT_AS = the address space now + the memory cap (the arena window is already mapped, so
   the cap counts only what the candidate allocates); RLIMIT_FSIZE = 1 MiB (its output file).
6. A second filter: no opening files, no executable mappings, no signal handlers, no limits
   changed. Both filters stay; the stricter answer wins.
Every denied call fails with EPERM rather than killing the process, so a candidate that tries
shows up as a wrong result or a crash. On other architectures the filters are skipped (the
judge is told through the hello message and logs it once): there the candidate runs with the
worker's rights, in its own process.

Protocol on a SOCK_SEQPACKET pair (one message per packet, little-endian):
  judge -> runner: header ``<IIQQQ`` (op, seq, a, b, c) + payload
    PROGRAM a=id, payload = launches: ``<II`` (function index, argument count), then per
      argument ``<IIQ`` (kind, 0, value); kinds: 0 arena offset (all ones: NULL), 1 int32,
      2 int64, 3 float32 bits
    GO a=id b=nonce   -> DONE value=nonce, after every launch of the program returned
    PROTECT a=offset b=length c=prot (mprotect of the arena window, guard pages) -> ACK
    EXIT
  runner -> judge: ``<IIQ`` (kind, seq, value) only: HELLO (value: 1 when filtered), DONE,
    ACK, ERROR (value: code << 32 | detail). Never a pickle: the judge parses 16 bytes.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.path and sys.path[0].endswith("forge_pack"):
    del sys.path[0]  # started as a script: forge_pack's own module names must not shadow the stdlib

import ctypes
import os
import platform
import resource
import signal
import struct
import time

HEADER = struct.Struct("<IIQQQ")
REPLY = struct.Struct("<IIQ")
LAUNCH = struct.Struct("<II")
ARG = struct.Struct("<IIQ")
OP_PROGRAM, OP_GO, OP_PROTECT, OP_EXIT = 1, 2, 3, 4
R_HELLO, R_DONE, R_ACK, R_ERROR = 1, 2, 3, 4
E_SYMBOL, E_MESSAGE, E_MAP = 1, 2, 3
NULL_OFFSET = (1 << 64) - 1
MAX_MESSAGE = 1 << 20
FILTERED = 1
OUTPUT_CAP = 1 << 20

# ---------------------------------------------------------------- seccomp-BPF (x86_64)

PR_SET_NAME, PR_GET_NAME, PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 15, 16, 1, 22, 38
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38
CLONE_THREAD = 0x00010000
PROT_EXEC = 0x4
MADV_PRIVILEGED = 100  # MADV_HWPOISON and above

# BPF opcodes
LD_ABS_W = 0x20
JEQ, JGE, JSET = 0x15, 0x35, 0x45
RET_K = 0x06

# x86_64 system call numbers
NR = dict(
    read=0, write=1, close=3, stat=4, fstat=5, lstat=6, poll=7, lseek=8, mmap=9, mprotect=10, munmap=11,
    brk=12, rt_sigaction=13, rt_sigprocmask=14, rt_sigreturn=15, pread64=17, pwrite64=18, readv=19,
    writev=20, access=21, sched_yield=24, mremap=25, msync=26, mincore=27, madvise=28, nanosleep=35,
    getpid=39, clone=56, exit=60, kill=62, uname=63, fcntl=72, getcwd=79, readlink=89, gettimeofday=96,
    getrlimit=97, getrusage=98, sysinfo=99, times=100, getuid=102, getgid=104, geteuid=107, getegid=108,
    getppid=110, sigaltstack=131, sched_getparam=143, sched_getscheduler=145, sched_get_priority_max=146,
    sched_get_priority_min=147, prctl=157, gettid=186, time=201, futex=202, sched_setaffinity=203,
    sched_getaffinity=204, set_tid_address=218, restart_syscall=219, clock_gettime=228, clock_getres=229,
    clock_nanosleep=230, exit_group=231, tgkill=234, openat=257, newfstatat=262, ppoll=271,
    set_robust_list=273, prlimit64=302, getcpu=309, sched_getattr=315, getrandom=318, membarrier=324,
    pkey_mprotect=329, statx=332, rseq=334, clone3=435, futex_waitv=449, open=2,
)

# Calls a running kernel, its OpenMP threads and this loop make; nothing here reaches a file,
# another process or the network.
ALWAYS = ("read", "write", "close", "fstat", "lseek", "munmap", "brk", "rt_sigprocmask", "rt_sigreturn",
          "pread64", "pwrite64", "readv", "writev", "sched_yield", "mremap", "msync", "mincore",
          "nanosleep", "getpid", "exit", "uname", "gettimeofday", "getrlimit", "getrusage", "sysinfo", "times",
          "getuid", "getgid", "geteuid", "getegid", "getppid", "sigaltstack", "sched_getparam",
          "sched_getscheduler", "sched_get_priority_max", "sched_get_priority_min", "gettid", "time", "futex",
          "sched_setaffinity", "sched_getaffinity", "set_tid_address", "restart_syscall", "clock_gettime",
          "clock_getres", "clock_nanosleep", "exit_group", "newfstatat", "statx", "poll", "ppoll",
          "set_robust_list", "getcpu", "sched_getattr", "getrandom", "membarrier", "rseq", "futex_waitv")
# What the dynamic loader (and a constructor) needs while the object loads; dropped afterwards.
LOADING = ("open", "openat", "stat", "lstat", "access", "readlink", "getcwd", "fcntl", "rt_sigaction")


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _arg_low(i: int) -> int:
    return 16 + 8 * i  # seccomp_data.args[i], low 32 bits (little-endian)


def build_filter(pid: int, loading: bool) -> bytes:
    """A classic-BPF program over ``struct seccomp_data``. Default: EPERM."""
    deny, allow = RET_ERRNO | EPERM, RET_ALLOW
    rules: list[tuple[int, list[bytes]]] = []
    names = ALWAYS + (LOADING if loading else ())
    for name in names:
        rules.append((NR[name], [_ins(RET_K, allow)]))
    # threads only: clone must carry CLONE_THREAD (fork-like clones are processes)
    rules.append((NR["clone"], [_ins(LD_ABS_W, _arg_low(0)), _ins(JSET, CLONE_THREAD, 0, 1),
                                _ins(RET_K, allow), _ins(RET_K, deny)]))
    # clone3 passes its flags in memory BPF cannot read: ENOSYS makes glibc fall back to clone
    rules.append((NR["clone3"], [_ins(RET_K, RET_ERRNO | ENOSYS)]))
    if not loading:  # no new executable memory once the object is mapped
        for name, prot_arg in (("mmap", 2), ("mprotect", 2), ("pkey_mprotect", 2)):
            rules.append((NR[name], [_ins(LD_ABS_W, _arg_low(prot_arg)), _ins(JSET, PROT_EXEC, 0, 1),
                                     _ins(RET_K, deny), _ins(RET_K, allow)]))
    else:
        for name in ("mmap", "mprotect", "pkey_mprotect"):
            rules.append((NR[name], [_ins(RET_K, allow)]))
    # madvise: the ordinary advice values (below 100); MADV_HWPOISON / MADV_SOFT_OFFLINE (100, 101)
    # would let a process running as root damage the physical pages it shares with the judge
    rules.append((NR["madvise"], [_ins(LD_ABS_W, _arg_low(2)), _ins(JGE, MADV_PRIVILEGED, 0, 1),
                                  _ins(RET_K, deny), _ins(RET_K, allow)]))
    # signals to this process only (abort() raises SIGABRT at itself)
    for name in ("kill", "tgkill"):
        rules.append((NR[name], [_ins(LD_ABS_W, _arg_low(0)), _ins(JEQ, pid, 0, 1),
                                 _ins(RET_K, allow), _ins(RET_K, deny)]))
    # prlimit64: reading only (new_limit == NULL), except while loading: the memory cap is set
    # after the object's constructors, so whatever they set is overridden
    if loading:
        rules.append((NR["prlimit64"], [_ins(RET_K, allow)]))
    rules.append((NR["prlimit64"], [_ins(LD_ABS_W, _arg_low(2)), _ins(JEQ, 0, 0, 3),
                                    _ins(LD_ABS_W, _arg_low(2) + 4), _ins(JEQ, 0, 0, 1),
                                    _ins(RET_K, allow), _ins(RET_K, deny)]))
    # prctl: thread names; while loading also the second filter's installation
    options = [PR_SET_NAME, PR_GET_NAME] + ([PR_SET_SECCOMP] if loading else [])
    block = [_ins(LD_ABS_W, _arg_low(0))]
    for i, opt in enumerate(options):
        block.append(_ins(JEQ, opt, len(options) - i, 0))
    block += [_ins(RET_K, deny), _ins(RET_K, allow)]
    rules.append((NR["prctl"], block))

    prog = [_ins(LD_ABS_W, 4), _ins(JEQ, AUDIT_ARCH_X86_64, 1, 0), _ins(RET_K, deny),  # another ABI: nothing
            _ins(LD_ABS_W, 0), _ins(JGE, X32_SYSCALL_BIT, 0, 1), _ins(RET_K, deny)]  # x32 calls
    for nr, body in rules:
        prog.append(_ins(JEQ, nr, 0, len(body)))
        prog.extend(body)
    prog.append(_ins(RET_K, deny))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter(libc, program: bytes) -> None:
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def filtering_supported() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


# ---------------------------------------------------------------- the runner


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _account() -> None:
    """Bring this thread's CPU time up to date in the kernel before a reply wakes the judge.

    The judge reads the runner's process CPU clock from outside, and Linux (since 4.8) sums each
    thread's runtime as last accounted, leaving out what a thread still on a CPU has run since its
    last tick (4 ms at HZ=250) or context switch. Read right after DONE, the clock would miss up
    to a whole call: that time would show between DONE and the next call (work_after_return for
    an honest kernel) and be missing from the call's own CPU time. Reading its own thread clock
    makes the kernel account the pending time (task_sched_runtime -> update_curr)."""
    time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID)


def _send(fd: int, kind: int, seq: int, value: int) -> None:
    _account()
    os.write(fd, REPLY.pack(kind, seq, value & NULL_OFFSET))


def _args(payload: bytes, funcs: list, base: int) -> list:
    """Decode a PROGRAM payload into (function, ctypes arguments) pairs."""
    calls, pos = [], 0
    while pos < len(payload):
        index, nargs = LAUNCH.unpack_from(payload, pos)
        pos += LAUNCH.size
        values = []
        for _ in range(nargs):
            kind, _, value = ARG.unpack_from(payload, pos)
            pos += ARG.size
            if kind == 0:
                values.append(ctypes.c_void_p(None if value == NULL_OFFSET else base + value))
            elif kind == 1:
                values.append(ctypes.c_int32(value - (1 << 64) if value >> 63 else value))
            elif kind == 2:
                values.append(ctypes.c_int64(value - (1 << 64) if value >> 63 else value))
            else:
                values.append(ctypes.c_float(struct.unpack("<f", struct.pack("<I", value & 0xFFFFFFFF))[0]))
        calls.append((funcs[index], values))
    return calls


def main(argv: list[str]) -> int:
    ctrl, arena_fd, window = int(argv[0]), int(argv[1]), int(argv[2])
    parent, cap, so_path, names = int(argv[3]), int(argv[4]), argv[5], argv[6:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the worker died before the line above took effect
        return 3
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    base = libc.mmap(None, window, 0x1 | 0x2, 0x01, arena_fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
    if base in (None, ctypes.c_void_p(-1).value):
        _send(ctrl, R_ERROR, 0, E_MAP << 32)
        return 2
    os.close(arena_fd)  # the judge alone resizes the arena
    filtered = filtering_supported()
    pid = os.getpid()
    if filtered:
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        install_filter(libc, build_filter(pid, loading=True))
    lib = ctypes.CDLL(so_path)
    funcs = []
    for i, name in enumerate(names):
        try:
            f = getattr(lib, name)
        except AttributeError:
            _send(ctrl, R_ERROR, 0, E_SYMBOL << 32 | i)
            return 2
        f.restype = None
        funcs.append(f)
    if cap > 0:
        limit = _vm_size() + cap
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # stdout/stderr go to a file the judge reads on a crash: 1 MiB of it is plenty (Python ignores
    # SIGXFSZ, so writes past it just fail)
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_CAP, OUTPUT_CAP))
    if filtered:
        install_filter(libc, build_filter(pid, loading=False))
    _send(ctrl, R_HELLO, 0, FILTERED if filtered else 0)
    return serve(ctrl, funcs, base, libc)


def serve(ctrl: int, funcs: list, base: int, libc) -> int:
    programs: dict[int, list] = {}
    read, unpack = os.read, HEADER.unpack_from
    while True:
        msg = read(ctrl, MAX_MESSAGE)
        if len(msg) < HEADER.size:
            return 0  # the judge closed the channel
        op, seq, a, b, c = unpack(msg)
        if op == OP_GO:
            calls = programs.get(a)
            if calls is None:
                _send(ctrl, R_ERROR, seq, E_MESSAGE << 32)
                continue
            for f, values in calls:
                f(*values)
            _send(ctrl, R_DONE, seq, b)
        elif op == OP_PROGRAM:
            programs[a] = _args(msg[HEADER.size:], funcs, base)
            _send(ctrl, R_ACK, seq, a)
        elif op == OP_PROTECT:
            ok = libc.mprotect(base + a, b, c) == 0
            _send(ctrl, R_ACK if ok else R_ERROR, seq, 0 if ok else E_MAP << 32)
        elif op == OP_EXIT:
            return 0
        else:
            _send(ctrl, R_ERROR, seq, E_MESSAGE << 32)


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
