"""object_check's decisions and its ELF helpers in process, with exact verdicts: the cubin header
check, a toolchain baseline that cannot be built, an unreadable object, the joined findings, the
file read, C strings, section lookups and demangling. No compiler runs (the baseline and the
findings are stood in for where a decision needs them)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from forge_pack.evaluate import object_check as oc
from forge_pack.core.verdict import Verdict


@pytest.fixture(autouse=True)
def fresh_decisions(monkeypatch):
    monkeypatch.setattr(oc, "_decisions", {})


def test_cstr_reads_up_to_the_nul_or_the_end():
    assert oc._cstr(b"abc\0def", 0) == "abc"
    assert oc._cstr(b"abc\0def", 4) == "def"
    assert oc._cstr(b"\0abc", 0) == ""
    assert oc._cstr(b"x\0abc", 1) == ""


def test_cstr_replaces_bytes_that_are_not_utf8():
    assert oc._cstr(b"a\xffb\0", 0) == "a\ufffdb"


def header(machine: int) -> bytes:
    data = bytearray(64)
    data[:4] = b"\x7fELF"
    data[18:20] = machine.to_bytes(2, "little")
    return bytes(data)


def test_a_cuda_artifact_must_be_an_elf_file():
    assert oc._decide(b"MZ\x90\x00" + bytes(60), "cuda") == Verdict(
        False, "static_check", "built object: not a readable ELF64 object (not an ELF file)")


def test_a_cuda_artifact_must_be_a_cubin():
    assert oc._decide(header(62), "cuda") == Verdict(
        False, "static_check", "built object: expected a cubin (CUDA ELF), found machine type 62")
    assert oc._decide(header(0xFFFF), "cuda") == Verdict(
        False, "static_check", "built object: expected a cubin (CUDA ELF), found machine type 65535")
    assert oc._decide(header(oc.EM_CUDA), "cuda") is None


def test_a_truncated_cuda_header_is_unreadable():
    v = oc._decide(b"\x7fELF" + bytes(10), "cuda")
    assert (v.ok, v.reason) == (False, "static_check")
    assert v.detail.startswith("built object: not a readable ELF64 object (truncated ELF file (")


def test_a_baseline_that_cannot_be_built_rejects_the_object(monkeypatch):
    def broken():
        raise RuntimeError("g++ not found")

    monkeypatch.setattr(oc, "baseline", broken)
    assert oc._decide(header(62), "cpu") == Verdict(
        False, "static_check", "built object: the toolchain baseline (an empty translation unit) could not be "
                               "built, so the object cannot be judged: g++ not found")


def _base():
    return oc.Baseline(init_array=1, fini_array=1, init_size=0, fini_size=0, weak=frozenset())


def test_an_unreadable_cpu_object_is_rejected(monkeypatch):
    monkeypatch.setattr(oc, "baseline", _base)
    assert oc._decide(b"not an elf at all", "cpu") == Verdict(
        False, "static_check", "built object: not a readable ELF64 object (not an ELF file)")


def test_findings_are_joined_and_demangled(monkeypatch):
    monkeypatch.setattr(oc, "baseline", _base)
    monkeypatch.setattr(oc, "problems", lambda data, base: ["calls system", "defines _Z3foov"])
    assert oc._decide(b"x", "cpu") == Verdict(False, "static_check", "built object: calls system; defines foo()")
    monkeypatch.setattr(oc, "problems", lambda data, base: [])
    assert oc._decide(b"x", "cpu") is None


def test_check_object_reads_the_file_and_judges_it_as_cpu_by_default(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(oc, "_decide", lambda data, backend: seen.append((data, backend)) or None)
    (tmp_path / "k.so").write_bytes(b"abc")
    assert oc.check_object(tmp_path / "k.so") is None
    assert oc.check_object(tmp_path / "k.so", "cuda") is None
    assert seen == [(b"abc", "cpu"), (b"abc", "cuda")]


def test_check_object_rejects_a_file_it_cannot_read(tmp_path):
    v = oc.check_object(tmp_path / "missing.so")
    assert (v.ok, v.reason) == (False, "static_check")
    assert v.detail.startswith("built object: cannot be read ([Errno 2] No such file or directory")


def test_unpack_names_a_truncated_file():
    with pytest.raises(oc.ElfError, match=r"^truncated ELF file \(unpack_from requires"):
        oc._unpack("<I", b"ab", 0)


def test_find_all_finds_overlapping_matches():
    assert oc._find_all(b"aaaa", b"aa") == [0, 1, 2]
    assert oc._find_all(b"xyz", b"q") == []


def test_demangle_keeps_the_text_when_cfilt_fails_or_says_nothing(monkeypatch):
    assert oc._demangle("plain name") == "plain name"
    assert oc._demangle("_Z3barv") == "bar()"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=1, stdout="noise\n"))
    assert oc._demangle("_Z3barv") == "_Z3barv"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0, stdout="  \n"))
    assert oc._demangle("_Z3barv") == "_Z3barv"


def _elf(data: bytes, sections=()):
    return oc.Elf(data, 62, sections=list(sections))


def test_bytes_of_a_section_must_lie_inside_the_file():
    sec = SimpleNamespace(offset=2, size=3, name=".text")
    assert _elf(b"abcde").bytes_of(sec) == b"cde"
    with pytest.raises(oc.ElfError, match=r"^section \.text runs past the end of the file$"):
        _elf(b"abcd").bytes_of(sec)


def test_section_at_finds_the_section_holding_an_address_or_none():
    a = SimpleNamespace(addr=0x100, size=0x10, name="a")
    b = SimpleNamespace(addr=0, size=0x1000, name="unmapped")
    e = _elf(b"", [b, a])
    assert e.section_at(0x100) is a and e.section_at(0x10F) is a
    assert e.section_at(0x110) is None and e.section_at(0x50) is None


# ---------------------------------------------------------------- exact findings of built objects

from test_object_check import detail  # noqa: E402  (g++ objects kept by content hash)


def test_an_executable_stack_finding_reads_in_full(tmp_path):
    d = detail(tmp_path, 'asm(".section .note.GNU-stack,\\"x\\",@progbits\\n.previous");\n'
                         'extern "C" void k(float* out) { out[0] = 1; }')
    assert d == "built object: it asks for an executable stack (a GNU-stack note marked executable, or none)"


def test_a_text_relocation_finding_reads_in_full(tmp_path):
    d = detail(tmp_path, 'int g;\nasm(".text\\n.quad g\\n");\nextern "C" void k(float* out) { out[0] = g; }')
    assert "; it has text relocations (code patched at load time)" in d or \
        d.endswith("it has text relocations (code patched at load time)")


def test_a_thread_local_finding_reads_in_full(tmp_path):
    d = detail(tmp_path, 'static thread_local int calls;\nextern "C" void k(float* out) { out[0] = ++calls; }')
    assert d.endswith("; it has thread-local storage (`thread_local`, `__thread`, `threadprivate`): "
                      "per-thread state outlives the call and its destructors run after return; keep per-thread "
                      "scratch on the stack")


def test_a_baseline_gxx_rejects_names_the_last_1000_characters_of_its_errors(monkeypatch):
    monkeypatch.setattr(oc, "_baselines", {})
    flags = tuple(f"-fno-such-option-{i}" for i in range(40))
    with pytest.raises(RuntimeError) as e:
        oc.baseline(flags)
    msg = str(e.value)
    head = "g++ could not build an empty shared object: "
    assert msg.startswith(head) and len(msg) == len(head) + 1000
    assert "-fno-such-option-39" in msg and not msg[len(head):].startswith("b'")


def test_a_baseline_build_that_writes_no_object_is_an_error(monkeypatch):
    monkeypatch.setattr(oc, "_baselines", {})
    with pytest.raises(RuntimeError, match="^g\\+\\+ could not build an empty shared object: "):
        oc.baseline(("-fsyntax-only",))  # g++ succeeds and writes nothing


def test_only_little_endian_64_bit_elf_files_are_read():
    for cls, order in ((1, 1), (2, 2), (1, 2)):
        data = bytearray(header(62))
        data[4], data[5], data[6] = cls, order, 1
        with pytest.raises(oc.ElfError) as e:
            oc.Elf.parse(bytes(data))
        assert str(e.value) == "not a little-endian 64-bit ELF file", (cls, order)


def test_an_object_without_a_dynamic_segment_has_no_dynamic_entries():
    assert list(oc.Elf(b"", 62).dynamic()) == []


def test_sections_are_nameless_when_the_name_table_index_is_not_a_section(tmp_path):
    data = bytearray(build(tmp_path, 'extern "C" void k(float* out) { out[0] = 1; }').read_bytes())
    named = oc.Elf.parse(bytes(data)).sections
    assert ".text" in [s.name for s in named]
    data[62:64] = (0).to_bytes(2, "little")  # e_shstrndx: SHN_UNDEF
    nameless = oc.Elf.parse(bytes(data)).sections
    assert len(nameless) == len(named) and {s.name for s in nameless} == {""}
    data[62:64] = len(named).to_bytes(2, "little")  # one past the last section
    past = oc.Elf.parse(bytes(data)).sections
    assert len(past) == len(named) and {s.name for s in past} == {""}


from test_object_check import build  # noqa: E402
