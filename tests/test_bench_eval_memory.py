"""bench/eval_memory.py's report without a GPU: the --where table with each step's seconds, and the
--profile table from a real cProfile run (the GPU measurement itself is the device's)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import eval_memory as em  # noqa: E402


def _busy(n: int) -> int:
    return sum(i * i for i in range(n))


def test_profiled_names_the_functions_that_took_the_time():
    result, top = em.profiled(lambda: _busy(200_000))
    assert result == _busy(200_000)
    assert len(top) <= em.PROFILE_TOP
    names = [f["function"] for f in top]
    busy = next(f for f in top if f["function"].endswith(" _busy"))
    assert busy["function"].startswith("test_bench_eval_memory.py:") and busy["calls"] == 1
    assert busy["cumulative_s"] > 0 and names.index(busy["function"]) <= 2  # the lambda, _busy, its genexpr


def test_markdown_shows_each_steps_memory_and_seconds_and_the_profile():
    row = {"case": "softmax_big", "family": "split_row", "data_bytes": 2e9, "evaluations": [{
        "first": True, "reason": "ok", "median_us": 100.0, "floor_us": 65.0, "peak_x_data": 3.6, "wall_s": 12.5,
        "steps_x_data": {"verify.verify": {"calls": 1, "entry": 1.5, "exit": 0.0, "inside": 3.6, "seconds": 7.25},
                         "verify.make_set": {"calls": 11, "entry": 0.5, "exit": 1.5, "inside": 1.75, "seconds": 2.5},
                         "old.step": {"calls": 2, "entry": 0.1, "exit": 0.1}},
        "profile": [{"function": "verify.py:341 verify", "calls": 1, "cumulative_s": 7.3, "own_s": 0.01}]}]}
    md = em.markdown([row], {"gpu": "H100"})
    assert "| softmax_big | split_row | 2.00 | first | ok | 100.0 | 65% | 3.60x | 12.5 |" in md
    assert "| `verify.verify` | 1 | 1.50x | 0.00x | 3.60x | 7.25 |" in md
    assert "| `verify.make_set` | 11 | 0.50x | 1.50x | 1.75x | 2.50 |" in md
    assert "| `old.step` | 2 | 0.10x | 0.10x | - | - |" in md  # a result written before the seconds and peaks were
    assert md.index("`verify.verify`") < md.index("`verify.make_set`")  # the most held at entry first
    assert "cProfile, the 25 functions with the most cumulative time" in md
    assert "| `verify.py:341 verify` | 1 | 7.30 | 0.01 |" in md


def test_every_traced_step_is_a_function_of_forge_pack():
    import importlib

    for qual in em.WHERE:
        mod_name, fn_name = qual.split(".")
        pkg = "forge_pack.targets" if mod_name == "ops" else "forge_pack.evaluate"
        assert callable(getattr(importlib.import_module(f"{pkg}.{mod_name}"), fn_name)), qual


class _Allocator:
    """torch.cuda's two counters, by hand: what is allocated now and the most since the last reset."""

    def __init__(self):
        self.now = self.high = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.high = max(self.high, self.now)

    def reset(self) -> None:
        self.high = self.now


def test_peaks_name_the_step_inside_which_the_peak_was_and_keep_the_evaluations_own():
    """A transient inside a nested step counts for it and every step around it, not for a step entered after it;
    the resets between steps do not lose the evaluation's peak (which came before any step here)."""
    a = _Allocator()
    p = em.Peaks(lambda: a.high, a.reset)
    a.alloc(50)
    a.alloc(-40)  # the evaluation's peak, 50, before any step
    p.enter()  # outer
    a.alloc(5)
    p.enter()  # inner: a transient of 20 over 15
    a.alloc(20)
    a.alloc(-20)
    inner = p.exit()
    p.enter()  # a later sibling that holds less
    a.alloc(1)
    sibling = p.exit()
    outer = p.exit()
    p.fold()
    assert (inner, sibling, outer) == (35, 16, 35)
    assert p.total == 50 and p.open == []
    p.start()  # the next evaluation starts from the 16 still held and peaks at 26: the first one's 50 is not its
    a.alloc(10)
    a.alloc(-10)
    p.fold()
    assert p.total == 26 and p.open == []
