"""The built candidate checked, not only its source: what the compiled CPU shared object imports,
contains and runs on its own.

The source-text check (static_check) sees what a kernel spells; this module sees what g++ built,
so hand-written prototypes, asm labels (``__asm__("system")``), function pointers and inline asm
no longer hide anything. Four checks, on the ELF file alone (a small ELF64 reader here: no
binutils needed for the verdict, no new dependency), before any worker loads the object:

1. every undefined dynamic symbol (weak ones too: a weak reference binds to a definition whenever
   one is loaded, and libc's always is) is on the allow-list below: libm math, OpenMP, the
   memory builtins, heap allocation and the C++ runtime that ``std::vector`` needs;
2. no system-call bytes (``syscall`` 0f 05, ``sysenter`` 0f 34, ``int 0x80`` cd 80) anywhere in an
   executable segment, at an instruction boundary or inside another instruction (a jump into the
   middle reaches those too), except where ``x86_listing`` (binutils' objdump) shows them strictly
   inside an instruction that is no system call, in an object none of whose direct jumps, calls or
   RIP-relative addresses lands inside an instruction: g++ emits such bytes in ordinary vector code
   (``vpblendvb`` with ymm8: c4 e3 75 4c cd 80), and only a jump target computed at run time, the
   class left to process isolation below, could reach them; no writable+executable segment, text
   relocations, executable stack;
3. no code that runs outside a call: no constructors or destructors beyond the toolchain's own
   (the baseline is an empty translation unit built with the same flags), nothing added to
   ``_init``/``_fini``, no IFUNC resolvers (they run while the object is loaded), no thread-local
   storage;
4. only the toolchain's libraries as DT_NEEDED.

A kernel that computes the address of another library's function at run time (walking memory
from an allowed function) is beyond a static check; process isolation is the backstop there.

CUDA candidates are compiled device-only, so a cubin holds no host code: the check confirms the
artifact is a CUDA ELF. NVRTC rejects host code in the source; ``nvcc -cubin`` (the fallback) drops
it, but the package build would compile it, so a fallback build's host side is checked too
(``check_build``).
"""

from __future__ import annotations

import hashlib
import re
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from forge_pack.core.verdict import Verdict
from forge_pack.evaluate import x86_listing

POLICY = 2  # bump when the rules change: cached decisions are keyed by it

# ---------------------------------------------------------------- the allow-list

# libm: real functions the compiler calls for std::exp, std::sqrt, ... (plus the f / l variants).
_MATH = {
    "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "logb", "pow", "sqrt", "cbrt", "hypot",
    "sin", "cos", "tan", "sincos", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "erf", "erfc", "tgamma", "lgamma", "fmax", "fmin", "fabs", "fdim", "fma", "fmod", "remainder",
    "remquo", "floor", "ceil", "round", "trunc", "rint", "nearbyint", "lrint", "llrint", "lround", "llround",
    "ldexp", "frexp", "modf", "scalbn", "scalbln", "ilogb", "copysign", "nextafter", "nexttoward", "nan",
}
MATH = {n + s for n in _MATH for s in ("", "f", "l")}
# glibc's -ffast-math entry points (older glibc) for the same functions.
_FINITE = re.compile(r"^__(\w+?)_finite$")
# x86-64 vector-function ABI: _ZGV<isa b/c/d/e><mask N/M><lanes><params>_<scalar name> (libmvec),
# emitted for `#pragma omp simd` loops calling a math function glibc declares `simd`.
_VECTOR_ABI = re.compile(r"^_ZGV[bcde][NM]\d+[a-zA-Z\d]*?_(\w+)$")

MEMORY = {"memcpy", "memmove", "memset", "memcmp", "__memcpy_chk", "__memmove_chk", "__memset_chk"}

HEAP = {
    # operator new / delete in every standard form (plain, array, sized, aligned, nothrow): the
    # built-in templates keep per-call scratch in std::vector.
    "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t", "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t",
    # the C heap: the same capability as operator new
    "malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign",
}

CXX_RUNTIME = {
    "_Unwind_Resume", "__gxx_personality_v0",  # cleanup while an exception unwinds (std::vector's paths)
    "__cxa_begin_catch", "__cxa_end_catch", "__cxa_rethrow", "_ZSt9terminatev",  # catch / noexcept
    "__cxa_guard_acquire", "__cxa_guard_release", "__cxa_guard_abort",  # function-local statics, set up inside a call
    "__stack_chk_fail",  # -fstack-protector (distribution defaults): aborts on a smashed stack
    "__assert_fail", "abort",  # assert(): ends the process, which the worker reports as a crash
    "__cpu_model", "__cpu_features2", "__cpu_indicator_init",  # __builtin_cpu_supports
}
# std::__throw_length_error and friends (a std::vector growing past max_size): they throw, which ends
# the process through ctypes, a crash.
_THROW = re.compile(r"^_ZSt\d+__throw_\w+$")
# libgcc arithmetic helpers (128-bit integers, _Float16/__bf16 conversions, complex multiply/divide,
# __builtin_powi): pure functions of their arguments.
_LIBGCC = re.compile(r"^__(u?(div|mod)|mul|neg|ashl|ashr|lshr|u?cmp|clz|ctz|ffs|popcount|parity|bswap|fix|fixuns|"
                     r"float|floatun|extend|trunc|powi|mulo|addv|subv|mulv|negv|absv)[a-z]{2,4}\d?$")

# Not GOMP_parallel_start / GOMP_parallel_*_start (the pre-GCC-4.9 ABI): a kernel that starts a team
# that way and returns without GOMP_parallel_end leaves the team running after the call.
OPENMP = {
    "GOMP_parallel", "GOMP_parallel_reductions",
    "GOMP_barrier", "GOMP_barrier_cancel", "GOMP_cancel", "GOMP_cancellation_point",
    "GOMP_critical_start", "GOMP_critical_end", "GOMP_critical_name_start", "GOMP_critical_name_end",
    "GOMP_atomic_start", "GOMP_atomic_end", "GOMP_single_start", "GOMP_single_copy_start",
    "GOMP_single_copy_end", "GOMP_ordered_start", "GOMP_ordered_end", "GOMP_doacross_post", "GOMP_doacross_wait",
    "GOMP_doacross_ull_post", "GOMP_doacross_ull_wait",
    # tasks end at their parallel region's closing barrier (or run at once outside one)
    "GOMP_task", "GOMP_taskloop", "GOMP_taskloop_ull", "GOMP_taskwait", "GOMP_taskwait_depend", "GOMP_taskyield",
    "GOMP_taskgroup_start", "GOMP_taskgroup_end", "GOMP_taskgroup_reduction_register",
    "GOMP_taskgroup_reduction_unregister", "GOMP_task_reduction_remap", "GOMP_workshare_task_reduction_unregister",
    # the runtime's read-only queries and locks scoped to the call
    "omp_get_thread_num", "omp_get_num_threads", "omp_get_max_threads", "omp_get_num_procs", "omp_in_parallel",
    "omp_get_level", "omp_get_active_level", "omp_get_ancestor_thread_num", "omp_get_team_size",
    "omp_get_thread_limit", "omp_get_dynamic", "omp_get_nested", "omp_get_schedule", "omp_in_final",
    "omp_get_cancellation", "omp_get_max_active_levels", "omp_get_proc_bind",
    "omp_init_lock", "omp_destroy_lock", "omp_set_lock", "omp_unset_lock", "omp_test_lock",
    "omp_init_nest_lock", "omp_destroy_nest_lock", "omp_set_nest_lock", "omp_unset_nest_lock", "omp_test_nest_lock",
}
# every worksharing loop and sections entry point: GOMP_loop_static_start, GOMP_loop_end_nowait,
# GOMP_parallel_loop_dynamic, GOMP_loop_ull_guided_next, GOMP_sections_start, ...
_OPENMP_WORKSHARE = re.compile(r"^GOMP_(parallel_(?!\w*_start$))?(loop|sections)(_\w+)?$")

# the libraries g++ -fopenmp links a plain C++ object against
ALLOWED_NEEDED = {"libstdc++.so.6", "libm.so.6", "libmvec.so.1", "libgomp.so.1", "libgcc_s.so.1", "libc.so.6",
                  "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


def allowed_symbol(name: str) -> bool:
    """True when an undefined dynamic symbol of a CPU kernel may stay undefined (see the groups above)."""
    if name in MATH or name in MEMORY or name in HEAP or name in CXX_RUNTIME or name in OPENMP:
        return True
    if _THROW.match(name) or _LIBGCC.match(name) or _OPENMP_WORKSHARE.match(name):
        return True
    m = _FINITE.match(name) or _VECTOR_ABI.match(name)
    return bool(m and m.group(1) in MATH)


# ---------------------------------------------------------------- a small ELF64 reader

EM_X86_64, EM_AARCH64, EM_CUDA = 62, 183, 190
PT_LOAD, PT_DYNAMIC, PT_TLS, PT_GNU_STACK = 1, 2, 7, 0x6474E551
PF_X, PF_W = 1, 2
SHT_SYMTAB, SHT_RELA, SHT_DYNSYM = 2, 4, 11
SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY = 14, 15, 16
SHF_EXECINSTR, SHF_TLS = 4, 0x400
STB_WEAK, STT_FUNC, STT_SECTION, STT_FILE, STT_GNU_IFUNC = 2, 2, 3, 4, 10
DT_NEEDED, DT_INIT, DT_FINI, DT_TEXTREL, DT_FLAGS = 1, 12, 13, 22, 30
DT_INIT_ARRAY, DT_FINI_ARRAY, DT_INIT_ARRAYSZ, DT_FINI_ARRAYSZ = 25, 26, 27, 28
DT_PREINIT_ARRAYSZ, DT_STRTAB, DT_STRSZ = 33, 5, 10
DF_TEXTREL, DF_STATIC_TLS = 0x4, 0x10
R_IRELATIVE = {EM_X86_64: 37, EM_AARCH64: 1032}
R_RELATIVE = {EM_X86_64: 8, EM_AARCH64: 1027}


class ElfError(ValueError):
    pass


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    bind: int
    type: int
    shndx: int


@dataclass(frozen=True)
class Segment:
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass
class Elf:
    data: bytes
    machine: int
    segments: list[Segment] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)

    @staticmethod
    def parse(data: bytes) -> "Elf":
        if data[:4] != b"\x7fELF":
            raise ElfError("not an ELF file")
        if data[4] != 2 or data[5] != 1:
            raise ElfError("not a little-endian 64-bit ELF file")
        (_, _, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
         shstrndx) = _unpack("<16sHHIQQQIHHHHHH", data, 0)
        elf = Elf(data, machine)
        for i in range(phnum):
            p_type, p_flags, off, vaddr, _, filesz, memsz, _ = _unpack("<IIQQQQQQ", data, phoff + i * phentsize)
            elf.segments.append(Segment(p_type, p_flags, off, vaddr, filesz, memsz))
        raw = [_unpack("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx] if 0 < shstrndx < len(raw) else None
        for sh_name, sh_type, flags, addr, off, size, link, _, _, entsize in raw:
            name = _cstr(data, names[4] + sh_name) if names else ""
            elf.sections.append(Section(name, sh_type, flags, addr, off, size, link, entsize))
        return elf

    def bytes_of(self, sec: Section) -> bytes:
        if sec.offset + sec.size > len(self.data):
            raise ElfError(f"section {sec.name} runs past the end of the file")
        return self.data[sec.offset:sec.offset + sec.size]

    def symbols(self, sh_type: int) -> list[Symbol]:
        out = []
        for sec in self.sections:
            if sec.type != sh_type or not sec.entsize:
                continue
            strtab = self.sections[sec.link]
            body = self.bytes_of(sec)
            for off in range(0, len(body) - sec.entsize + 1, sec.entsize):
                st_name, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", body, off)
                out.append(Symbol(_cstr(self.data, strtab.offset + st_name), value, size, info >> 4, info & 0xF,
                                  shndx))
        return out

    def dynamic(self) -> list[tuple[int, int]]:
        seg = next((s for s in self.segments if s.type == PT_DYNAMIC), None)
        if seg is None:
            return []
        out = []
        for off in range(seg.offset, seg.offset + seg.filesz - 15, 16):
            tag, val = _unpack("<qQ", self.data, off)
            if tag == 0:
                break
            out.append((tag, val))
        return out

    def relocations(self) -> list[tuple[int, int, int, int]]:
        """(offset, type, symbol index, addend) of every RELA entry."""
        out = []
        for sec in self.sections:
            if sec.type == SHT_RELA and sec.entsize:
                body = self.bytes_of(sec)
                for off in range(0, len(body) - sec.entsize + 1, sec.entsize):
                    r_off, info, addend = struct.unpack_from("<QQq", body, off)
                    out.append((r_off, info & 0xFFFFFFFF, info >> 32, addend))
        return out

    def section_at(self, addr: int) -> Section | None:
        return next((s for s in self.sections if s.addr and s.addr <= addr < s.addr + s.size), None)

    def string(self, dyn: dict, offset: int) -> str:
        """A string from the dynamic string table (DT_STRTAB is an address)."""
        sec = self.section_at(dyn.get(DT_STRTAB, 0))
        return _cstr(self.data, sec.offset + (dyn[DT_STRTAB] - sec.addr) + offset) if sec else f"<{offset}>"


def _unpack(fmt: str, data: bytes, off: int) -> tuple:
    try:
        return struct.unpack_from(fmt, data, off)
    except struct.error as e:
        raise ElfError(f"truncated ELF file ({e})") from None


def _cstr(data: bytes, off: int) -> str:
    end = data.find(b"\0", off)
    return data[off:end if end >= 0 else len(data)].decode("utf-8", "replace")


# ---------------------------------------------------------------- the baseline: an empty translation unit


@dataclass(frozen=True)
class Baseline:
    init_array: int  # entries the toolchain itself puts in .init_array (frame_dummy)
    fini_array: int  # ... and in .fini_array (__do_global_dtors_aux)
    init_size: int  # bytes of the section holding _init
    fini_size: int
    weak: frozenset  # weak undefined symbols crtstuff references (__gmon_start__, _ITM_*, __cxa_finalize)


_baseline_lock = threading.Lock()
_baselines: dict[tuple, Baseline] = {}


def baseline(flags: tuple[str, ...] | None = None) -> Baseline:
    """What g++ puts into an object whose source is empty, with the candidates' flags (once per process)."""
    from forge_pack.evaluate.compile import CPU_FLAGS

    flags = tuple(flags or CPU_FLAGS)
    with _baseline_lock:
        if flags not in _baselines:
            with tempfile.TemporaryDirectory(prefix="forge-objcheck-") as tmp:
                src, out = Path(tmp) / "empty.cpp", Path(tmp) / "empty.so"
                src.write_text("// an empty translation unit: the toolchain's own startup code only\n")
                res = subprocess.run(["g++", *flags, "-o", str(out), str(src)], capture_output=True, text=True,
                                     timeout=120)
                if res.returncode != 0 or not out.is_file():
                    raise RuntimeError(f"g++ could not build an empty shared object: {res.stderr[-1000:]}")
                elf = Elf.parse(out.read_bytes())
            dyn = dict(elf.dynamic())
            init = elf.section_at(dyn.get(DT_INIT, 0)) if DT_INIT in dyn else None
            fini = elf.section_at(dyn.get(DT_FINI, 0)) if DT_FINI in dyn else None
            weak = frozenset(s.name for s in elf.symbols(SHT_DYNSYM) if s.name and s.shndx == 0 and s.bind == STB_WEAK)
            _baselines[flags] = Baseline(dyn.get(DT_INIT_ARRAYSZ, 0) // 8, dyn.get(DT_FINI_ARRAYSZ, 0) // 8,
                                         init.size if init else 0, fini.size if fini else 0, weak)
        return _baselines[flags]


# ---------------------------------------------------------------- the checks

SYSCALL_BYTES = {
    EM_X86_64: [(b"\x0f\x05", "syscall"), (b"\x0f\x34", "sysenter"), (b"\xcd\x80", "int 0x80")],
}


def problems(data: bytes, base: Baseline) -> list[str]:
    """Every reason the CPU shared object ``data`` may not be loaded, for a kernel author."""
    elf = Elf.parse(data)
    if elf.machine not in SYSCALL_BYTES and elf.machine != EM_AARCH64:
        return [f"machine type {elf.machine} is not one the object check knows (x86-64, AArch64)"]
    found: list[str] = []
    if not any(sec.type == SHT_DYNSYM for sec in elf.sections):
        return ["it has no dynamic symbol table, so its imports cannot be checked"]
    dynsyms = elf.symbols(SHT_DYNSYM)
    symtab = elf.symbols(SHT_SYMTAB) or dynsyms
    funcs = [s for s in symtab if s.type in (STT_FUNC, STT_GNU_IFUNC) and s.name]

    def where(addr: int) -> str:
        for f in funcs:
            if f.value <= addr < f.value + f.size:
                return f"{f.name}+{addr - f.value:#x}"
        for f in funcs:  # crtstuff's functions carry no size
            if f.value == addr:
                return f.name
        sec = elf.section_at(addr)
        return f"{sec.name if sec else '?'}@{addr:#x}"

    # 1. what the object needs from outside
    denied = sorted({s.name for s in dynsyms if s.name and s.shndx == 0
                     and not (s.bind == STB_WEAK and s.name in base.weak) and not allowed_symbol(s.name)})
    if denied:
        found.append(f"it uses functions or data from outside the kernel runtime: {', '.join(denied)} "
                     f"(a CPU kernel may use libm math, OpenMP, memcpy/memset/memmove, new/delete and "
                     f"std::vector; nothing else, however it is declared or named)")
    dyn_list = elf.dynamic()
    dyn = dict(dyn_list)
    needed = [elf.string(dyn, v) for t, v in dyn_list if t == DT_NEEDED]
    extra = [n for n in needed if n not in ALLOWED_NEEDED]
    if extra:
        found.append(f"it links libraries beyond the compiler's runtime: {', '.join(extra)}")

    # 2. system calls and code that could change
    for seg in elf.segments:
        if seg.type != PT_LOAD or not seg.flags & PF_X:
            continue
        if seg.flags & PF_W:
            found.append(f"segment at {seg.vaddr:#x} is writable and executable (self-modifying code)")
        body = elf.data[seg.offset:seg.offset + seg.filesz]
        hits = {(pattern, name): [seg.vaddr + h for h in _find_all(body, pattern)]
                for pattern, name in SYSCALL_BYTES.get(elf.machine, [])}
        if any(hits.values()):
            harmless, why = x86_listing.inside_instructions(
                data, [h for hs in hits.values() for h in hs],
                [(sec.addr, sec.addr + sec.size) for sec in elf.sections if sec.flags & SHF_EXECINSTR and sec.addr])
            for (pattern, name), found_at in hits.items():
                left = [h for h in found_at if h not in harmless]
                if left:
                    places = ", ".join(where(h) for h in left[:6]) + (
                        f" and {len(left) - 6} more" if len(left) > 6 else "")
                    found.append(f"system-call bytes {pattern.hex(' ')} (`{name}`) at {places}: a kernel makes no "
                                 f"system calls (inline asm) ({why})")
        if elf.machine == EM_AARCH64:
            svc = [i for i in range(0, len(body) - 3, 4)
                   if struct.unpack_from("<I", body, i)[0] & 0xFFE0001F == 0xD4000001]
            if svc:
                found.append(f"`svc` (system call) at {', '.join(where(seg.vaddr + i) for i in svc[:6])}: a kernel "
                             f"makes no system calls")
    stack = [s for s in elf.segments if s.type == PT_GNU_STACK]
    if not stack or stack[0].flags & PF_X:
        found.append("it asks for an executable stack (a GNU-stack note marked executable, or none)")
    if DT_TEXTREL in dyn or dyn.get(DT_FLAGS, 0) & DF_TEXTREL:
        found.append("it has text relocations (code patched at load time)")

    # 3. code that runs outside a call
    if any(s.type == PT_TLS for s in elf.segments) or dyn.get(DT_FLAGS, 0) & DF_STATIC_TLS:
        found.append("it has thread-local storage (`thread_local`, `__thread`, `threadprivate`): per-thread state "
                     "outlives the call and its destructors run after return; keep per-thread scratch on the stack")
    extra_init = dyn.get(DT_INIT_ARRAYSZ, 0) // 8 - base.init_array
    extra_fini = dyn.get(DT_FINI_ARRAYSZ, 0) // 8 - base.fini_array
    if extra_init > 0 or extra_fini > 0 or dyn.get(DT_PREINIT_ARRAYSZ, 0):
        names = _array_targets(elf, dyn, where)
        found.append(f"it runs code when loaded or unloaded, outside any call: {names or 'extra init/fini entries'} "
                     f"(`__attribute__((constructor/destructor))`, a global object with a constructor or "
                     f"destructor, __builtin_cpu_supports); compute tables inside the call or make them constexpr")
    for tag, size, what in ((DT_INIT, base.init_size, "_init"), (DT_FINI, base.fini_size, "_fini")):
        sec = elf.section_at(dyn[tag]) if tag in dyn else None
        if sec is not None and sec.size != size:
            found.append(f"code was added to {what} ({sec.name} is {sec.size} bytes, the toolchain's own is {size})")
    ifunc = sorted({s.name for s in symtab + dynsyms if s.type == STT_GNU_IFUNC})
    irel = [r for r in elf.relocations() if r[1] == R_IRELATIVE.get(elf.machine)]
    if ifunc or irel:
        found.append(f"it has IFUNC resolvers ({', '.join(ifunc) or f'{len(irel)} IRELATIVE relocations'}; "
                     f"target_clones / ifunc attributes), which run while the object loads")
    odd = sorted({s.name for s in elf.sections if s.name in (".ctors", ".dtors", ".preinit_array")})
    if odd:
        found.append(f"it has constructor sections {', '.join(odd)}")
    return found


def _demangle(text: str) -> str:
    """C++ names in a verdict's detail as the author wrote them (c++filt, part of binutils like g++'s
    own assembler and linker); the mangled text when it is missing."""
    if "_Z" not in text:
        return text
    try:
        res = subprocess.run(["c++filt"], input=text, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return text
    return res.stdout.rstrip("\n") if res.returncode == 0 and res.stdout.strip() else text


def _find_all(body: bytes, pattern: bytes) -> list[int]:
    out, i = [], body.find(pattern)
    while i >= 0:
        out.append(i)
        i = body.find(pattern, i + 1)
    return out


def _array_targets(elf: Elf, dyn: dict, where) -> str:
    """The functions named by .init_array / .fini_array entries, the toolchain's own left out."""
    relative = R_RELATIVE.get(elf.machine)
    relocs = {r[0]: r[3] for r in elf.relocations() if r[1] == relative}
    names = []
    for arr, size in ((DT_INIT_ARRAY, DT_INIT_ARRAYSZ), (DT_FINI_ARRAY, DT_FINI_ARRAYSZ)):
        for i in range(dyn.get(size, 0) // 8):
            target = relocs.get(dyn.get(arr, 0) + 8 * i)
            if target is not None:
                name = where(target).split("+")[0]
                if name not in ("frame_dummy", "__do_global_dtors_aux"):
                    names.append(name)
    return ", ".join(dict.fromkeys(names))


# ---------------------------------------------------------------- CUDA: the host side of an nvcc build

# NVRTC rejects host code outright ("host functions are not allowed in JIT mode"), but `nvcc -cubin`
# (the fallback without NVRTC) drops it silently, and the package build compiles the same source with
# nvcc, host side included. So with the fallback, the source's host object is built and held to the
# rules above; the baseline is the host object of a one-kernel file (its fat-binary registration).
_HOST_BASELINE_SOURCE = 'extern "C" __global__ void forge_pack_baseline(float* p) { p[0] = 1.0f; }\n'


@dataclass(frozen=True)
class HostObject:
    undefined: frozenset
    init_bytes: int  # .init_array / .ctors, summed over sections of the relocatable object
    fini_bytes: int
    tls: bool
    ifunc: tuple
    syscalls: tuple  # "bytes (`name`) at function+offset"


def _nvcc_host_object(source: str, arch: str) -> HostObject:
    import shutil

    from forge_pack.evaluate.compile import NVCC_FLAGS

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not on PATH")
    flags = [f for f in NVCC_FLAGS if f not in ("-Xptxas", "-v")]
    with tempfile.TemporaryDirectory(prefix="forge-objcheck-") as tmp:
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.o"
        src.write_text(source)
        res = subprocess.run([nvcc, "-c", f"-arch={arch}", *flags, "-o", str(out), str(src)], capture_output=True,
                             text=True, timeout=300)
        if res.returncode != 0 or not out.is_file():
            raise RuntimeError(f"nvcc -c failed: {(res.stdout + res.stderr)[-1500:]}")
        elf = Elf.parse(out.read_bytes())
    syms = elf.symbols(SHT_SYMTAB)
    funcs = [s for s in syms if s.type == STT_FUNC and s.name]
    hits = []
    for idx, sec in enumerate(elf.sections):
        if not sec.flags & SHF_EXECINSTR:
            continue
        body = elf.bytes_of(sec)
        for pattern, name in SYSCALL_BYTES.get(elf.machine, []):
            for h in _find_all(body, pattern):
                f = next((f for f in funcs if f.shndx == idx and f.value <= h < f.value + max(f.size, 1)), None)
                hits.append(f"{pattern.hex(' ')} (`{name}`) at " + (f"{f.name}+{h - f.value:#x}" if f else sec.name))

    def array_bytes(kind: int, names: tuple) -> int:
        return sum(s.size for s in elf.sections if s.type == kind or s.name.startswith(names))

    return HostObject(
        frozenset(s.name for s in syms if s.shndx == 0 and s.name and s.type not in (STT_SECTION, STT_FILE)),
        array_bytes(SHT_INIT_ARRAY, (".ctors", ".init_array")) + array_bytes(SHT_PREINIT_ARRAY, (".preinit_array",)),
        array_bytes(SHT_FINI_ARRAY, (".dtors", ".fini_array")),
        any(s.flags & SHF_TLS for s in elf.sections),
        tuple(sorted({s.name for s in syms if s.type == STT_GNU_IFUNC})), tuple(hits))


_host_baselines: dict[str, HostObject] = {}


def cuda_host_problems(source: str, arch: str) -> list[str]:
    """Why the host side of a CUDA source (as nvcc builds it for the package) may not ship."""
    with _baseline_lock:
        if arch not in _host_baselines:
            _host_baselines[arch] = _nvcc_host_object(_HOST_BASELINE_SOURCE, arch)
        base = _host_baselines[arch]
    obj = _nvcc_host_object(source, arch)
    found = []
    denied = sorted(n for n in obj.undefined - base.undefined if not allowed_symbol(n))
    if denied:
        found.append(f"its host code calls or references {', '.join(denied)} (a CUDA candidate is device code: "
                     f"no host functions, no host globals with initialisers)")
    if obj.init_bytes > base.init_bytes or obj.fini_bytes > base.fini_bytes:
        found.append("its host code runs when the package loads or unloads (a global object with a constructor or "
                     "destructor, `__attribute__((constructor))`): a CUDA candidate is device code")
    if obj.tls:
        found.append("its host code has thread-local storage")
    if obj.ifunc:
        found.append(f"its host code has IFUNC resolvers ({', '.join(obj.ifunc)})")
    if obj.syscalls:
        found.append(f"its host code holds system-call bytes {', '.join(obj.syscalls[:6])}")
    return found


def check_build(build) -> Verdict | None:
    """``check_object`` for a ``compile.Build``; for a CUDA build made by ``nvcc -cubin`` (no NVRTC) the
    source's host side, which the package build would compile, is checked too."""
    verdict = check_object(build.path, build.backend)
    if verdict is not None or build.backend != "cuda" or build.cmd.startswith("nvrtc("):
        return verdict
    src = Path(build.path).with_name("kernel.cu")  # written next to the cubin by the nvcc path
    try:
        source = src.read_text()
    except OSError as e:
        return Verdict(False, "static_check", f"built object: the source of an nvcc build cannot be read ({e})")
    key = f"{POLICY}:cuda-host:{build.arch}:{hashlib.sha256(source.encode()).hexdigest()}"
    return _cached(key, lambda: _decide_host(source, build.arch))


def _decide_host(source: str, arch: str) -> Verdict | None:
    try:
        found = cuda_host_problems(source, arch)
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ElfError, IndexError) as e:
        return Verdict(False, "static_check", f"built object: the host side of this CUDA source could not be "
                                              f"built for checking: {e}")
    return Verdict(False, "static_check", "built object: " + "; ".join(_demangle(f) for f in found)) if found else None


# ---------------------------------------------------------------- entry points

_decisions_lock = threading.Lock()
_decisions: dict[str, Verdict | None] = {}


def check_object(path: str | Path, backend: str = "cpu") -> Verdict | None:
    """None when the built artifact may be loaded, else a rejecting ``static_check`` verdict whose
    detail starts with "built object:". Decisions are cached by the artifact's content hash."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return Verdict(False, "static_check", f"built object: cannot be read ({e})")
    key = f"{POLICY}:{backend}:{hashlib.sha256(data).hexdigest()}"
    return _cached(key, lambda: _decide(data, backend))


def _cached(key: str, decide) -> Verdict | None:
    """One decision per key (policy version + content hash), computed outside the lock."""
    with _decisions_lock:
        if key in _decisions:
            return _decisions[key]
    verdict = decide()
    with _decisions_lock:
        _decisions[key] = verdict
    return verdict


def _decide(data: bytes, backend: str) -> Verdict | None:
    try:
        if backend == "cuda":
            # device code only: NVRTC and `nvcc -cubin` never emit host code; the header says it is a cubin
            # (e_machine sits at byte 18 in 32- and 64-bit ELF alike)
            if data[:4] != b"\x7fELF":
                raise ElfError("not an ELF file")
            machine = _unpack("<H", data, 18)[0]
            if machine != EM_CUDA:
                return Verdict(False, "static_check", f"built object: expected a cubin (CUDA ELF), found machine "
                                                      f"type {machine}")
            return None
        try:
            base = baseline()
        except (OSError, RuntimeError, subprocess.TimeoutExpired, ElfError) as e:
            return Verdict(False, "static_check", f"built object: the toolchain baseline (an empty translation "
                                                  f"unit) could not be built, so the object cannot be judged: {e}")
        found = problems(data, base)
    except (ElfError, IndexError) as e:
        return Verdict(False, "static_check", f"built object: not a readable ELF64 object ({e})")
    if not found:
        return None
    return Verdict(False, "static_check", "built object: " + "; ".join(_demangle(f) for f in found))
