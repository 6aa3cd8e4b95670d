"""Shared bits of the bench scripts: output path handling and result writing."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def out_path(default_name: str) -> Path:
    """The path given on the command line, else $OUT/<default_name>, else bench/results/<default_name>."""
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        p = Path(sys.argv[1])
    elif os.environ.get("OUT"):
        p = Path(os.environ["OUT"]) / default_name
    else:
        p = ROOT / "bench" / "results" / default_name
    if p.suffix in (".md", ".json"):
        p = p.with_suffix("")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def commit() -> str | None:
    """The checkout's commit, with "+ uncommitted changes to N files" where tracked files differ from it:
    the device machine runs a copy of the working tree whose git HEAD can be older than what it runs."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=ROOT, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    changed = [ln for ln in status.stdout.splitlines() if ln.strip()] if status.returncode == 0 else []
    return head.stdout.strip() + (f" + uncommitted changes to {len(changed)} files" if changed else "")


def environment() -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "host": platform.node()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}")
    return env


def write(base: Path, doc: dict, markdown: str) -> None:
    """Writes <base>.json and <base>.md and prints the markdown."""
    base.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    base.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"written: {base.with_suffix('.md')} and .json")


def stats(xs: list[float]) -> dict:
    import statistics

    xs = sorted(xs)
    return {"n": len(xs), "median": statistics.median(xs), "p90": xs[int(0.9 * (len(xs) - 1))], "max": xs[-1],
            "min": xs[0]}
