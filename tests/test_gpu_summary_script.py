"""bench/test_gpu_summary.py: the parts of a GPU suite run add up to one test-gpu.md."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "test_gpu_summary.py"


def _load():
    spec = importlib.util.spec_from_file_location("test_gpu_summary", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _part(passed, failed, skipped, tests):
    return (f"# make test-gpu\n\nfixtures first; written by bench/test_gpu.sh (2026-12-04T10:00Z, commit abc).\n\n"
            f"- python 3.12.3, torch 2.11.0, CUDA 13.0\n- GPU: NVIDIA H200\n- pytest exit status: 0\n\n```\n"
            f"{passed} passed in 12.0s\n{passed} passed, {failed} failed, {skipped} skipped\n```\n- tests: {tests}\n")


def test_parts_add_up_and_a_failure_or_skip_in_any_part_fails_the_whole():
    m = _load()
    text = m.combine({"a": _part(60, 0, 0, "x"), "b": _part(6, 0, 0, "y")})
    assert "66 passed, 0 failed, 0 skipped" in text and "- GPU: NVIDIA H200" in text
    assert m.counts(text) == (66, 0, 0)
    assert m.counts(m.combine({"a": _part(60, 0, 0, "x"), "b": _part(5, 0, 1, "y")})) == (65, 0, 1)
    assert m.counts(m.combine({"a": _part(59, 1, 0, "x")})) == (59, 1, 0)
    with pytest.raises(ValueError):
        m.counts("no summary here")
