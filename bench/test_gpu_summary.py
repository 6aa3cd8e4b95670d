"""Combine the parts of a GPU suite run (bench/test_gpu.sh with PART=...) into one test-gpu.md.

    python bench/test_gpu_summary.py DIR [OUT_MD]

DIR holds test-gpu-<part>.md files; the result lists each part's pytest summary line and the total
as "N passed, N failed, N skipped" (the form `make test-gpu` writes for a single run).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def counts(md: str) -> tuple[int, int, int]:
    m = re.search(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", md, re.M)
    if not m:
        raise ValueError("no 'N passed, N failed, N skipped' line")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def combine(parts: dict[str, str]) -> str:
    total = [0, 0, 0]
    lines = []
    header = []
    for name, md in sorted(parts.items()):
        p, f, s = counts(md)
        total = [total[0] + p, total[1] + f, total[2] + s]
        summary = [ln for ln in md.splitlines() if re.search(r" in [0-9.]+s", ln)]
        tests = [ln for ln in md.splitlines() if ln.startswith("- tests:")]
        lines.append(f"- part `{name}` ({tests[0][9:] if tests else '?'}): {summary[0] if summary else '?'}")
        if not header:
            header = [ln for ln in md.splitlines() if ln.startswith("- python") or ln.startswith("- GPU")
                      or "written by bench/test_gpu.sh" in ln]
    return "\n".join(["# make test-gpu", "",
                      "Every `gpu` test with FORGE_PACK_REQUIRE_GPU=1 (a skipped gpu test fails), the CUDA anti-cheat",
                      "fixtures first, run in parts (one device call each); " + (header[0] if header else ""), "",
                      *[h for h in header[1:]], "", *lines, "", "```",
                      f"{total[0]} passed, {total[1]} failed, {total[2]} skipped", "```", ""])


def main() -> int:
    d = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else d / "test-gpu.md"
    parts = {p.stem[len("test-gpu-"):]: p.read_text() for p in sorted(d.glob("test-gpu-*.md"))}
    if not parts:
        print(f"error: no test-gpu-<part>.md in {d}", file=sys.stderr)
        return 1
    text = combine(parts)
    out.write_text(text)
    print(text)
    return 0 if counts(text)[1] == 0 and counts(text)[2] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
