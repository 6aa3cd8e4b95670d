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
