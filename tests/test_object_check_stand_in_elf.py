"""object_check's scans over a parsed object, on stand-in ELF contents (no compiler): which bytes of
which sections count, how a hit is attributed to a function, the limits of the hit list, the AArch64
`svc` scan to the last word, and the nvcc host object's load-time arrays, TLS and system-call hits."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from forge_pack.evaluate import object_check as oc

SYSCALL = b"\x0f\x05"
SVC = (0xD4000001).to_bytes(4, "little")


class _Elf(oc.Elf):
    """A parsed object whose symbol tables and dynamic entries are given rather than read."""

    def __init__(self, data, machine, segments=(), sections=(), symbols=None, dynamic=(), relocations=()):
        super().__init__(data, machine, list(segments), list(sections))
        self._symbols = symbols or {}
        self._dynamic = list(dynamic)
        self._relocations = list(relocations)

    def relocations(self):
        return self._relocations

    def symbols(self, sh_type):
        return list(self._symbols.get(sh_type, []))

    def dynamic(self):
        return self._dynamic


def _sec(name, type_=1, flags=0, addr=0, offset=0, size=0):
    return oc.Section(name, type_, flags, addr, offset, size, 0, 0)


def _sym(name, value, size, type_=oc.STT_FUNC, shndx=1):
    return oc.Symbol(name, value, size, 1, type_, shndx)


def _base():
    return oc.Baseline(init_array=0, fini_array=0, init_size=0, fini_size=0, weak=frozenset())


def _problems(monkeypatch, code: bytes, machine=oc.EM_X86_64, symtab=(), text_size=None, dynamic=(),
              relocations=(), sections=(), base=None):
    """problems() of a shared object whose one executable segment (at 0x1000) holds ``code``; a
    .text section covers its first ``text_size`` bytes (all of it by default)."""
    sections = [_sec(".dynsym", oc.SHT_DYNSYM), _sec(".text", flags=oc.SHF_EXECINSTR, addr=0x1000,
                                                     size=len(code) if text_size is None else text_size),
                *sections]
    segments = [oc.Segment(oc.PT_LOAD, oc.PF_X, 0, 0x1000, len(code), len(code)),
                oc.Segment(oc.PT_GNU_STACK, 0, 0, 0, 0, 0)]
    elf = _Elf(code, machine, segments, sections, {oc.SHT_SYMTAB: list(symtab)}, dynamic, relocations)
    monkeypatch.setattr(oc.Elf, "parse", staticmethod(lambda data: elf))
    # no object file for objdump: every hit is left to the plain byte rule (x86_listing has its own tests)
    monkeypatch.setattr(oc.x86_listing, "inside_instructions", lambda data, hits, code: (set(), "stand-in"))
    return oc.problems(b"", base or _base())


def _syscall_finding(places: str) -> list[str]:
    return [f"system-call bytes 0f 05 (`syscall`) at {places}: a kernel makes no system calls (inline asm) "
            f"(stand-in)"]


def test_a_hit_inside_a_function_is_named_by_it_and_other_symbols_do_not_name_it(monkeypatch):
    code = b"\x90" * 4 + SYSCALL + b"\x90" * 2
    syms = [_sym("k", 0x1000, 4), _sym("table", 0x1004, 2, type_=1), _sym("", 0x1000, 8)]
    assert _problems(monkeypatch, code, symtab=syms) == _syscall_finding(".text@0x1004")
    syms.append(_sym("inner", 0x1002, 4))
    assert _problems(monkeypatch, code, symtab=syms) == _syscall_finding("inner+0x2")


def test_a_hit_outside_every_section_is_placed_by_address_alone(monkeypatch):
    code = b"\x90" * 4 + SYSCALL
    assert _problems(monkeypatch, code, text_size=4) == _syscall_finding("?@0x1004")


def test_the_hit_list_names_six_places_then_counts_the_rest(monkeypatch):
    six = _problems(monkeypatch, SYSCALL * 6)
    assert six == _syscall_finding(", ".join(f".text@{0x1000 + 2 * i:#x}" for i in range(6)))
    seven = _problems(monkeypatch, SYSCALL * 7)
    assert seven == _syscall_finding(", ".join(f".text@{0x1000 + 2 * i:#x}" for i in range(6)) + " and 1 more")


def test_an_aarch64_svc_in_the_last_word_of_a_segment_is_found(monkeypatch):
    got = _problems(monkeypatch, b"\x1f\x20\x03\xd5" + SVC, machine=oc.EM_AARCH64)
    assert got == ["`svc` (system call) at .text@0x1004: a kernel makes no system calls"]
    assert _problems(monkeypatch, b"\x1f\x20\x03\xd5" * 2, machine=oc.EM_AARCH64) == []


# ---------------------------------------------------------------- the nvcc host object


def _host(monkeypatch, elf, returncode=0, writes=True):
    def run(cmd, **kwargs):
        if writes:
            with open(cmd[cmd.index("-o") + 1], "wb") as f:
                f.write(b"object")
        return SimpleNamespace(returncode=returncode, stdout="", stderr="nvcc: error")

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(oc.subprocess, "run", run)
    monkeypatch.setattr(oc.Elf, "parse", staticmethod(lambda data: elf))
    return oc._nvcc_host_object("__global__ void k() {}", "sm_90")


def test_an_nvcc_that_fails_is_an_error_even_when_it_leaves_an_object(monkeypatch):
    with pytest.raises(RuntimeError, match="^nvcc -c failed: nvcc: error$"):
        _host(monkeypatch, _Elf(b"", oc.EM_X86_64), returncode=1, writes=True)


def test_the_host_objects_load_time_arrays_count_sections_by_type_or_by_name(monkeypatch):
    sections = [
        _sec("custom_init", oc.SHT_INIT_ARRAY, size=40), _sec(".ctors.1", size=16), _sec(".init_array.1", size=4),
        _sec("custom_preinit", oc.SHT_PREINIT_ARRAY, size=2), _sec(".preinit_array.1", size=1),
        _sec("custom_fini", oc.SHT_FINI_ARRAY, size=32), _sec(".dtors.1", size=8), _sec(".fini_array.1", size=64),
        _sec(".data", size=128),
    ]
    host = _host(monkeypatch, _Elf(b"", oc.EM_X86_64, sections=sections))
    assert (host.init_bytes, host.fini_bytes, host.tls, host.syscalls) == (63, 104, False, ())
    tls = _host(monkeypatch, _Elf(b"", oc.EM_X86_64, sections=[_sec(".tbss", flags=oc.SHF_TLS | 3)]))
    assert tls.tls is True and tls.init_bytes == 0 and tls.fini_bytes == 0


def test_the_host_objects_system_call_hits_name_the_function_that_holds_them(monkeypatch):
    code = b"\x90" * 4 + SYSCALL + b"\x90" * 3 + SYSCALL
    sections = [_sec(".null"), _sec(".text", flags=oc.SHF_EXECINSTR, size=len(code))]
    syms = [_sym("k", 0, 4), _sym("table", 4, 2, type_=1), _sym("z", 8, 0), _sym("", 0, 16),
            _sym("cudaLaunch", 0, 0, shndx=0), _sym("sec", 0, 0, type_=oc.STT_SECTION, shndx=0),
            _sym("pick", 0, 0, type_=oc.STT_GNU_IFUNC, shndx=1)]
    elf = _Elf(code, oc.EM_X86_64, sections=sections, symbols={oc.SHT_SYMTAB: syms})
    elf.bytes_of = lambda sec: code if sec.name == ".text" else b""
    host = _host(monkeypatch, elf)
    assert host.syscalls == ("0f 05 (`syscall`) at .text", "0f 05 (`syscall`) at .text")
    assert host.undefined == frozenset({"cudaLaunch"}) and host.ifunc == ("pick",)
    syms.append(_sym("inner", 2, 8))
    assert _host(monkeypatch, elf).syscalls == ("0f 05 (`syscall`) at inner+0x2", "0f 05 (`syscall`) at inner+0x7")


def test_a_host_object_of_a_machine_without_system_call_patterns_has_no_hits(monkeypatch):
    sections = [_sec(".text", flags=oc.SHF_EXECINSTR, size=2)]
    elf = _Elf(SYSCALL, oc.EM_AARCH64, sections=sections)
    elf.bytes_of = lambda sec: SYSCALL
    assert _host(monkeypatch, elf).syscalls == ()


LOAD_TIME = ("it runs code when loaded or unloaded, outside any call: extra init/fini entries "
             "(`__attribute__((constructor/destructor))`, a global object with a constructor or destructor, "
             "__builtin_cpu_supports); compute tables inside the call or make them constexpr")


def test_load_time_findings_are_read_from_the_dynamic_entries(monkeypatch):
    nop = b"\x90" * 4
    assert _problems(monkeypatch, nop, dynamic=[(oc.DT_FLAGS, oc.DF_TEXTREL)]) == [
        "it has text relocations (code patched at load time)"]
    assert _problems(monkeypatch, nop, dynamic=[(oc.DT_FLAGS, oc.DF_STATIC_TLS)]) == [
        "it has thread-local storage (`thread_local`, `__thread`, `threadprivate`): per-thread state outlives "
        "the call and its destructors run after return; keep per-thread scratch on the stack"]
    assert _problems(monkeypatch, nop, dynamic=[(oc.DT_PREINIT_ARRAYSZ, 8)]) == [LOAD_TIME]
    one_each = oc.Baseline(init_array=1, fini_array=1, init_size=0, fini_size=0, weak=frozenset())
    # 12 bytes are one whole 8-byte entry and a part: no entry beyond the toolchain's own
    assert _problems(monkeypatch, nop, dynamic=[(oc.DT_INIT_ARRAYSZ, 12), (oc.DT_FINI_ARRAYSZ, 12)],
                     base=one_each) == []
    assert _problems(monkeypatch, nop, dynamic=[(oc.DT_FINI_ARRAYSZ, 16)], base=one_each) == [LOAD_TIME]


def test_code_added_to_init_or_fini_names_the_section_and_both_sizes(monkeypatch):
    sections = [_sec(".init", addr=0x2000, size=27), _sec(".fini", addr=0x3000, size=13)]
    got = _problems(monkeypatch, b"\x90", dynamic=[(oc.DT_INIT, 0x2000), (oc.DT_FINI, 0x3000)], sections=sections)
    assert got == ["code was added to _init (.init is 27 bytes, the toolchain's own is 0)",
                   "code was added to _fini (.fini is 13 bytes, the toolchain's own is 0)"]


def test_ifunc_resolvers_are_named_or_counted_by_their_relocations(monkeypatch):
    tail = "; target_clones / ifunc attributes), which run while the object loads"
    irel = [(0x4000, 37, 0, 0x1000)]
    assert _problems(monkeypatch, b"\x90", relocations=irel) == [f"it has IFUNC resolvers (1 IRELATIVE relocations{tail}"]
    assert _problems(monkeypatch, b"\x90", relocations=[(0x4000, 0, 37, 0x1000)]) == []
    syms = [_sym("pick_b", 0x1000, 1, type_=oc.STT_GNU_IFUNC), _sym("pick_a", 0x1000, 1, type_=oc.STT_GNU_IFUNC)]
    assert _problems(monkeypatch, b"\x90", symtab=syms) == [f"it has IFUNC resolvers (pick_a, pick_b{tail}"]


def test_constructor_sections_are_named(monkeypatch):
    sections = [_sec(".preinit_array"), _sec(".dtors"), _sec(".ctors"), _sec(".ctors.1")]
    assert _problems(monkeypatch, b"\x90", sections=sections) == [
        "it has constructor sections .ctors, .dtors, .preinit_array"]


def test_the_svc_list_names_six_places(monkeypatch):
    got = _problems(monkeypatch, SVC * 7, machine=oc.EM_AARCH64)
    places = ", ".join(f".text@{0x1000 + 4 * i:#x}" for i in range(6))
    assert got == [f"`svc` (system call) at {places}: a kernel makes no system calls"]


def _baseline(monkeypatch, elf):
    def run(cmd, **kwargs):
        assert open(cmd[-1]).read().startswith("// an empty translation unit")  # the source it wrote
        with open(cmd[cmd.index("-o") + 1], "wb") as f:
            f.write(b"object")
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(oc, "_baselines", {})
    monkeypatch.setattr(oc.subprocess, "run", run)
    monkeypatch.setattr(oc.Elf, "parse", staticmethod(lambda data: elf))
    return oc.baseline(("-shared",))


def test_the_toolchain_baseline_reads_its_arrays_init_fini_and_weak_imports(monkeypatch):
    at_zero = [_sec(".note", addr=0, size=64)]
    dynsyms = [oc.Symbol("__gmon_start__", 0, 0, oc.STB_WEAK, 0, 0), oc.Symbol("memcpy", 0, 0, 1, oc.STT_FUNC, 0),
               oc.Symbol("defined_weak", 0x10, 4, oc.STB_WEAK, oc.STT_FUNC, 5), oc.Symbol("", 0, 0, oc.STB_WEAK, 0, 0)]
    bare = _baseline(monkeypatch, _Elf(b"", oc.EM_X86_64, sections=at_zero, symbols={oc.SHT_DYNSYM: dynsyms}))
    assert bare == oc.Baseline(0, 0, 0, 0, frozenset({"__gmon_start__"}))
    sections = at_zero + [_sec(".init", addr=0x2000, size=27), _sec(".fini", addr=0x3000, size=13)]
    dyn = [(oc.DT_INIT, 0x2000), (oc.DT_FINI, 0x3000), (oc.DT_INIT_ARRAYSZ, 8), (oc.DT_FINI_ARRAYSZ, 16)]
    full = _baseline(monkeypatch, _Elf(b"", oc.EM_X86_64, sections=sections, dynamic=dyn))
    assert full == oc.Baseline(1, 2, 27, 13, frozenset())
