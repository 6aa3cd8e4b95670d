"""Where the instructions of an x86-64 shared object start, and where its code refers to code: from binutils'
``objdump`` (the assembler and linker g++ runs come with it), for the object check's system-call bytes.

The object check (``object_check``) rejects the bytes of ``syscall``, ``sysenter`` and ``int 0x80`` anywhere in
executable code, because a jump into the middle of another instruction would run them. g++ emits those bytes inside
ordinary instructions: ``vpblendvb %ymm8,%ymm5,%ymm1,%ymm1`` encodes as ``c4 e3 75 4c cd 80`` (the bf16 rounding
of a vectorised region kernel). ``inside_instructions`` tells such a place from a reachable one: the bytes lie
strictly inside an instruction that is not a system call itself, objdump's linear decoding of every executable
section covers them with no undecodable byte, and no direct jump or call and no RIP-relative address in the object
lands anywhere but at the start of an instruction. What remains is code that computes a jump target at run time,
the class the object check already leaves to process isolation (the CPU runner's seccomp filter).
"""

from __future__ import annotations

import bisect
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SYSTEM_CALLS = frozenset({"syscall", "sysenter", "int", "sysexit", "sysret"})
_LINE = re.compile(r"^\s*([0-9a-f]+):\t((?:[0-9a-f]{2} )+)\s*\t?(.*)$")
_DIRECT = re.compile(r"^(?:j\w*|call\w*|loop\w*|xbegin)$")
_TARGET = re.compile(r"^([0-9a-f]+) <")
_RIP_ADDRESS = re.compile(r"#\s*([0-9a-f]+)(?:\s|$)")
_PREFIXES = frozenset({"bnd", "notrack", "lock", "rep", "repz", "repnz", "repe", "repne", "data16", "addr32", "cs",
                       "ds", "es", "fs", "gs", "ss", "rex", "rex.W", "rex.R", "rex.X", "rex.B", "{vex}", "{evex}"})


@dataclass
class Listing:
    starts: list[int] = field(default_factory=list)  # instruction start addresses, ascending
    lengths: dict[int, int] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)
    references: list[tuple[int, int]] = field(default_factory=list)  # (instruction, code address it names)
    undecodable: list[int] = field(default_factory=list)

    def containing(self, addr: int) -> int | None:
        """The start of the instruction whose bytes include ``addr``; None where no decoded instruction does."""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        start = self.starts[i]
        return start if addr < start + self.lengths[start] else None


def mnemonic(text: str) -> str:
    """The instruction's own mnemonic, its prefixes (``notrack``, ``bnd``, ``data16`` ...) skipped."""
    for token in text.split():
        if token not in _PREFIXES and not token.startswith("rex."):
            return token
    return ""


def parse(text: str) -> Listing:
    """``objdump -d -w -z`` output as a ``Listing`` (instructions, direct targets, RIP-relative addresses)."""
    out = Listing()
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        addr, raw, asm = int(m.group(1), 16), m.group(2).split(), m.group(3).strip()
        if not asm and out.starts and out.starts[-1] + out.lengths[out.starts[-1]] == addr:
            out.lengths[out.starts[-1]] += len(raw)  # the rest of a long instruction's bytes, on a line of their own
            continue
        out.starts.append(addr)
        out.lengths[addr] = len(raw)
        out.texts[addr] = asm
        if "(bad)" in asm:
            out.undecodable.append(addr)
            continue
        op = mnemonic(asm)
        if _DIRECT.match(op):
            operands = asm.split(op, 1)[1].strip()
            t = _TARGET.match(operands)
            if t:
                out.references.append((addr, int(t.group(1), 16)))
        r = _RIP_ADDRESS.search(asm)
        if r and "(%rip)" in asm:
            out.references.append((addr, int(r.group(1), 16)))
    out.starts.sort()  # sections are listed in any order
    return out


def listing(data: bytes) -> Listing | str:
    """The listing of the object ``data``, or why there is none (no objdump, it failed)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return "objdump (binutils) is not on PATH"
    with tempfile.TemporaryDirectory(prefix="forge-objcheck-") as tmp:
        path = Path(tmp) / "object.so"
        path.write_bytes(data)
        try:
            res = subprocess.run([objdump, "-d", "-w", "-z", str(path)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"objdump failed: {e}"
    if res.returncode != 0:
        return f"objdump failed: {res.stderr.strip()[-300:] or f'exit status {res.returncode}'}"
    return parse(res.stdout)


def inside_instructions(data: bytes, hits: list[int], code: list[tuple[int, int]]) -> tuple[set[int], str]:
    """Of the system-call byte ``hits`` (addresses), those that only a computed jump could run: strictly inside
    an instruction that is no system call; with the reason the others are not (""). ``code``: the executable
    sections' [start, end) ranges. An object with an undecodable byte, or a direct jump, call or RIP-relative
    address landing inside an instruction of its code, has no such hits."""
    lst = listing(data)
    if isinstance(lst, str):
        return set(), lst
    if lst.undecodable:
        return set(), f"objdump cannot decode the instruction at {lst.undecodable[0]:#x}"
    for at, target in lst.references:
        if any(lo <= target < hi for lo, hi in code) and lst.containing(target) != target:
            return set(), f"the instruction at {at:#x} jumps to or names {target:#x}, inside another instruction"
    harmless, why = set(), ""
    for h in hits:
        start = lst.containing(h)
        if start is None:
            why = why or f"no decoded instruction covers {h:#x}"
        elif start == h or mnemonic(lst.texts[start]) in SYSTEM_CALLS:
            why = why or f"the instruction at {start:#x} is `{lst.texts[start]}`"
        else:
            harmless.add(h)
    return harmless, why
