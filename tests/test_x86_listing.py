"""objdump's listing read for the object check (forge_pack/evaluate/x86_listing.py): instruction starts, the code
addresses instructions name, and which system-call byte hits only a computed jump could reach."""

from __future__ import annotations

from forge_pack.evaluate import x86_listing as xl

LISTING = """
k.so:     file format elf64-x86-64

Disassembly of section .text:

0000000000001100 <k>:
    1100:\tb8 0f 05 00 00       \tmov    $0x50f,%eax
    1105:\t66 0f 05             \tdata16 syscall
    1108:\tcd 80                \tint    $0x80
    110a:\teb f5                \tjmp    1101 <k+0x1>
    110c:\t3e ff e0             \tnotrack jmp *%rax
    110f:\te8 ec ff ff ff       \tcall   1100 <k>
    1114:\t48 8d 0d e6 ff ff ff \tlea    -0x1a(%rip),%rcx        # 1101 <k+0x1>
    111b:\t48 8b 05 de 2e 00 00 \tmov    0x2ede(%rip),%rax        # 4000 <table>
    1122:\tc4 e3 75 4c cd 80    \tvpblendvb %ymm8,%ymm5,%ymm1,%ymm1
    1128:\t06                   \t(bad)
"""


# the listing without its jump into an instruction (110a), its lea of one (1114) and its undecodable byte (1128)
CLEAN = "\n".join(line for line in LISTING.splitlines() if not line.startswith(("    110a", "    1114", "    1128")))


def test_instructions_their_lengths_and_mnemonics_past_prefixes():
    lst = xl.parse(LISTING)
    assert lst.starts == [0x1100, 0x1105, 0x1108, 0x110A, 0x110C, 0x110F, 0x1114, 0x111B, 0x1122, 0x1128]
    assert lst.lengths[0x1122] == 6 and lst.lengths[0x1114] == 7
    assert xl.mnemonic(lst.texts[0x1105]) == "syscall" and xl.mnemonic(lst.texts[0x110C]) == "jmp"
    assert xl.mnemonic("rex.W data16 cs nopw 0x0(%rax,%rax,1)") == "nopw"
    assert lst.containing(0x1103) == 0x1100 and lst.containing(0x1127) == 0x1122
    assert lst.containing(0x1129) is None and lst.containing(0x10FF) is None
    assert lst.undecodable == [0x1128]


def test_direct_targets_and_rip_relative_addresses_are_references_indirect_jumps_are_not():
    lst = xl.parse(LISTING)
    assert lst.references == [(0x110A, 0x1101), (0x110F, 0x1100), (0x1114, 0x1101), (0x111B, 0x4000)]


def _judge(monkeypatch, text: str, hits: list[int], code=((0x1100, 0x1200),)):
    monkeypatch.setattr(xl, "listing", lambda data: xl.parse(text))
    return xl.inside_instructions(b"", hits, list(code))


def test_hits_inside_ordinary_instructions_only_a_computed_jump_could_reach(monkeypatch):
    assert _judge(monkeypatch, CLEAN, [0x1101, 0x1126]) == ({0x1101, 0x1126}, "")
    # a reference to data (0x4000, outside the code ranges) names no instruction
    assert _judge(monkeypatch, CLEAN, [0x1101], code=((0x1100, 0x1130),))[0] == {0x1101}


def test_a_system_call_instruction_holding_the_bytes_is_never_excused(monkeypatch):
    harmless, why = _judge(monkeypatch, CLEAN, [0x1106, 0x1108, 0x1101])
    assert harmless == {0x1101} and why == "the instruction at 0x1105 is `data16 syscall`"
    harmless, why = _judge(monkeypatch, CLEAN, [0x1108])
    assert harmless == set() and why == "the instruction at 0x1108 is `int    $0x80`"


def test_a_jump_or_an_address_inside_an_instruction_excuses_nothing(monkeypatch):
    no_bad = "\n".join(line for line in LISTING.splitlines() if not line.startswith("    1128"))
    harmless, why = _judge(monkeypatch, no_bad, [0x1101])
    assert harmless == set() and why == "the instruction at 0x110a jumps to or names 0x1101, inside another instruction"
    only_lea = "\n".join(line for line in no_bad.splitlines() if not line.startswith("    110a"))
    assert _judge(monkeypatch, only_lea, [0x1101])[1].startswith("the instruction at 0x1114 jumps to or names 0x1101")


def test_an_undecodable_byte_or_an_unlisted_hit_excuses_nothing(monkeypatch):
    assert _judge(monkeypatch, LISTING, [0x1126]) == (set(), "objdump cannot decode the instruction at 0x1128")
    assert _judge(monkeypatch, CLEAN, [0x1190]) == (set(), "no decoded instruction covers 0x1190")


def test_without_objdump_there_is_no_listing(monkeypatch):
    monkeypatch.setattr(xl.shutil, "which", lambda name: None)
    assert xl.listing(b"") == "objdump (binutils) is not on PATH"
    assert xl.inside_instructions(b"", [0x1101], [(0x1100, 0x1200)]) == (set(), "objdump (binutils) is not on PATH")


def test_an_object_objdump_cannot_read_gives_its_error():
    why = xl.listing(b"not an object")
    assert why.startswith("objdump failed: ") and "format not recognized" in why


def test_an_objdump_failure_without_a_message_gives_its_exit_status(monkeypatch):
    monkeypatch.setattr(xl.subprocess, "run", lambda *a, **k: xl.subprocess.CompletedProcess(a, 3, "", ""))
    assert xl.listing(b"") == "objdump failed: exit status 3"


def test_prefixed_and_wrapped_instructions_out_of_order_sections_and_odd_comments():
    """A branch behind a prefix, a target whose symbol repeats the mnemonic, the bytes of a long instruction
    wrapped onto a line of their own (objdump without -w), an undecodable byte before more code, sections listed
    out of address order, and a comment address on an instruction that is not RIP-relative (ignored)."""
    text = """
Disassembly of section .text:

0000000000002000 <late>:
    2000:\tf2 e9 fb ef ff ff    \tbnd jmp 1000 <early>
    2006:\te8 f5 ef ff ff       \tcall   1000 <recall>
    200b:\t06                   \t(bad)
    200c:\t48 b8 00 00 00 00 00 \tmovabs $0x50f000000000000,%rax
    2013:\t00 0f 05 
    2016:\t48 8b 04 25 00 40 00 00 \tmov    0x4000,%rax        # 4000
    201e:\t48 8b 05 00 00 00 00 \tmov    0x0(%rip),%rax

Disassembly of section .init:

0000000000001000 <early>:
    1000:\tc3                   \tret
"""
    lst = xl.parse(text)
    assert lst.starts == [0x1000, 0x2000, 0x2006, 0x200B, 0x200C, 0x2016, 0x201E]
    assert lst.lengths[0x200C] == 10 and lst.containing(0x2015) == 0x200C
    assert lst.references == [(0x2000, 0x1000), (0x2006, 0x1000)]
    assert lst.undecodable == [0x200B]
    assert xl.mnemonic("rex.WRB vpxor %xmm0,%xmm0,%xmm0") == "vpxor" and xl.mnemonic("") == ""


def test_a_reference_just_past_a_code_range_names_no_instruction_of_it(monkeypatch):
    """[start, end): an address at a range's end (data after the code, say) is outside it, whatever lies there."""
    lea_end = CLEAN + "\n    1130:\t48 8d 0d 00 00 00 00 \tlea    0x0(%rip),%rcx        # 1140 <end>\n"
    assert _judge(monkeypatch, lea_end, [0x1101], code=((0x1100, 0x1140),))[0] == {0x1101}
    assert _judge(monkeypatch, lea_end, [0x1101], code=((0x1100, 0x1141),))[0] == set()
    # and a range's first address is in it
    only_jump = CLEAN + "\n    1130:\teb cf                \tjmp    1101 <k+0x1>\n"
    assert _judge(monkeypatch, only_jump, [0x1101], code=((0x1101, 0x1140),))[1].startswith("the instruction at 0x1130")
