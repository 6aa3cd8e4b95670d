"""Shared helpers for the evaluator tests: fixture kernels in tests/kernels and small hotspots."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from forge_pack.core.candidate import load_candidate_files
from forge_pack.core.hotspot import Hotspot
from forge_pack.targets.sigparse import parse_signature

KERNELS = Path(__file__).resolve().parent / "kernels"
CPU_SIGNATURE = "x: f32[64,1000], dim=-1"
CUDA_SIGNATURE = "x: f32[512,2048], dim=-1"


def fixture_files(prefix: str) -> list[Path]:
    return sorted(KERNELS.glob(prefix + "*"))


def expected_reasons(path: Path) -> set[str]:
    m = re.search(r"^// expect: (.+)$", path.read_text(), flags=re.M)
    assert m, f"{path.name} lacks an '// expect: reason' line"
    return set(m.group(1).split())


def fixture_modes(path: Path) -> set[str]:
    """``// mode: bounds``: evaluate with the guard-page runs (Evaluator.evaluate(bounds=True))."""
    m = re.search(r"^// mode: (.+)$", path.read_text(), flags=re.M)
    return set(m.group(1).split()) if m else set()


def fixture_signature(path: Path, default: str) -> str:
    m = re.search(r"^// signature: (.+)$", path.read_text(), flags=re.M)
    return m.group(1).strip() if m else default


def fixture_final(path: Path) -> bool:
    """``// final: true``: evaluate as the final confirmation does (the out-of-bounds run included)."""
    m = re.search(r"^// final: (\w+)$", path.read_text(), flags=re.M)
    return bool(m) and m.group(1).lower() == "true"


def load_fixture(path: Path, op: str = "softmax"):
    backend = "cuda" if path.suffix == ".cu" else "cpu"
    return load_candidate_files(str(path), None, op, backend)


def hotspot(op: str, text: str, captures: tuple[str, ...] = (), device: str = "cpu") -> Hotspot:
    sig = parse_signature(op, text)
    return Hotspot(sig, ("test",), 1.0, 100.0, 100.0, 0.5, captures, device)


@contextlib.contextmanager
def one_thread_cpu_evaluator(tmp_path_factory, timeout_s: float, timing, cache: bool = False, **evaluator_kw):
    """A single-worker CPU evaluator with FORGE_PACK_CPU_THREADS=1 while it lives (timings on a shared
    2-core CI box are steadier), closed and the variable restored afterwards; ``cache``: its own build
    cache directory; ``evaluator_kw``: further Evaluator arguments (seed, run_dir)."""
    from forge_pack.evaluate.evaluator import Evaluator

    old = os.environ.get("FORGE_PACK_CPU_THREADS")
    os.environ["FORGE_PACK_CPU_THREADS"] = "1"
    if cache:
        evaluator_kw["cache_dir"] = tmp_path_factory.mktemp("builds")
    ev = Evaluator("cpu", workers=1, timeout_s=timeout_s, timing=timing, log_dir=tmp_path_factory.mktemp("workers"),
                   **evaluator_kw)
    try:
        yield ev
    finally:
        ev.close()
        if old is None:
            os.environ.pop("FORGE_PACK_CPU_THREADS", None)
        else:
            os.environ["FORGE_PACK_CPU_THREADS"] = old
