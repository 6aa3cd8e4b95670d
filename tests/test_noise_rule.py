"""The one "faster beyond measurement noise" rule (core.winner) and every caller's decision at its
boundaries: just faster, just within the noise, tiny n, zero IQR. The noise of two medians is two
standard errors of their difference, each 0.93 * IQR / sqrt(n):
IQR 10 µs and n=4 on both sides -> 2 * sqrt(2) * 4.65 = 13.1522 µs; n=4 against n=9 -> 11.1772 µs;
n=1 on both sides (n=0 counts as 1) -> 26.3044 µs; IQR 0 -> 0."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from forge_pack.core.verdict import Baseline, Evaluation, Timing, Verdict
from forge_pack.core.winner import clearly_faster, noise_us
from forge_pack.evaluate import compile_gate, confirm
from forge_pack.evaluate.model_gain import judge_gain
from forge_pack.search.mcts import replaces_best


def _t(median: float, iqr: float = 10.0, n: int = 4) -> Timing:
    return Timing(median, iqr, n, median, "monotonic")


def _d(median: float, iqr: float = 10.0, n: int = 4) -> dict:
    return {"median_us": median, "iqr_us": iqr, "n": n, "min_us": median, "clock": "monotonic"}


# ------------------------------------------------------------------ the rule itself


@pytest.mark.parametrize("a, b, noise", [
    (_t(0.0), _t(0.0), 13.152186),
    (_t(0.0, n=4), _t(0.0, n=9), 11.177209),
    (_t(0.0, n=1), _t(0.0, n=1), 26.304372),
    (_t(0.0, n=0), _t(0.0, n=1), 26.304372),
    (_t(0.0, iqr=0.0), _t(0.0, iqr=0.0), 0.0),
])
def test_noise_of_two_medians_is_two_standard_errors_of_their_difference(a, b, noise):
    assert noise_us(a, b) == pytest.approx(noise, abs=1e-6)


def test_noise_reads_timing_json_as_well_as_timings():
    assert noise_us(_d(0.0), _d(0.0, n=9)) == noise_us(_t(0.0), _t(0.0, n=9))
    assert noise_us({"median_us": 1.0}, {"median_us": 2.0}) == 0.0  # no IQR recorded: no noise known


@pytest.mark.parametrize("a, b, faster", [
    (_t(100.0), _t(113.16), True),  # 13.16 > 13.1522
    (_t(100.0), _t(113.15), False),  # 13.15 within the noise
    (_t(100.0, n=9), _t(111.18), True),  # 11.18 > 11.1772
    (_t(100.0, n=9), _t(111.17), False),
    (_t(100.0, n=1), _t(126.31, n=1), True),  # 26.31 > 26.3044
    (_t(100.0, n=1), _t(126.30, n=1), False),
    (_t(100.0, n=0), _t(126.30, n=0), False),  # n=0 is n=1
    (_t(100.0, iqr=0.0), _t(100.001, iqr=0.0), True),  # no spread: any difference counts
    (_t(100.0, iqr=0.0), _t(100.0, iqr=0.0), False),  # equal is never faster
    (_t(113.16), _t(100.0), False),  # slower is never faster
])
def test_clearly_faster_at_the_noise_boundary(a, b, faster):
    assert clearly_faster(a, b) is faster
    assert clearly_faster(_d(a.median_us, a.iqr_us, a.n), _d(b.median_us, b.iqr_us, b.n)) is faster


# ------------------------------------------------------------------ confirm.judge: kernel against eager


def _confirm(kernel: Timing, eager: Timing) -> tuple[bool, str]:
    return confirm.judge(Evaluation(Verdict(True, "ok"), kernel), Baseline(eager, None))


def test_confirm_drops_a_kernel_slower_beyond_the_noise():
    kept, why = _confirm(_t(113.16), _t(100.0))
    assert not kept and why.startswith("the speedup did not hold: 0.88x eager in a fresh process (kernel 113.2 µs")


def test_confirm_drops_a_kernel_slower_within_the_noise():
    kept, why = _confirm(_t(113.15), _t(100.0))
    assert not kept and why.startswith("slower than eager (within measurement noise, but not faster), so not "
                                       "shipped: 0.88x eager")


def test_confirm_keeps_a_kernel_as_fast_as_eager():
    kept, why = _confirm(_t(100.0), _t(100.0))
    assert kept and why.startswith("1.00x eager in a fresh process")


@pytest.mark.parametrize("kernel, eager, reason", [
    (_t(126.31, n=1), _t(100.0, n=1), "the speedup did not hold"),
    (_t(126.30, n=0), _t(100.0, n=0), "slower than eager (within measurement noise"),
    (_t(100.001, iqr=0.0), _t(100.0, iqr=0.0), "the speedup did not hold"),
    (_t(99.999, iqr=0.0), _t(100.0, iqr=0.0), "1.00x eager in a fresh process"),
])
def test_confirm_with_tiny_n_and_zero_iqr(kernel, eager, reason):
    assert _confirm(kernel, eager)[1].startswith(reason)


# ------------------------------------------------------------------ compile_gate.judge: with the package against plain compiled


@pytest.mark.parametrize("with_, reason", [
    (_t(113.16), "makes the compiled model slower"),
    (_t(113.15), "not faster compiled (within measurement noise)"),
    (_t(100.0), "not faster compiled (within measurement noise)"),  # equal is not faster
    (_t(99.99), "faster compiled"),  # strictly faster, even within the noise
])
def test_compile_gate_at_the_noise_boundary(with_, reason):
    ok, why = compile_gate.judge(_t(100.0), with_)
    assert why.startswith(reason) and ok is (reason == "faster compiled")


def test_compile_gate_with_zero_iqr():
    assert compile_gate.judge(_t(100.0, iqr=0.0), _t(100.001, iqr=0.0))[1].startswith("makes the compiled model slower")


# ------------------------------------------------------------------ model_gain.judge_gain: patched model against eager


def _gain(eager: dict, patched: dict):
    return judge_gain({"eager": eager, "patched": patched})


def test_model_gain_just_beyond_the_noise():
    v = _gain(_d(113.16), _d(100.0))
    assert v.gain and v.reason.startswith("the patched model is faster by more than the measurement noise (0.013 ms)")


def test_model_gain_just_within_the_noise():
    v = _gain(_d(113.15), _d(100.0))
    assert not v.gain and v.reason.startswith("the patched model is faster by less than the measurement noise "
                                              "(0.013 ms)")


@pytest.mark.parametrize("eager, patched, reason", [
    (_d(100.0), _d(100.0), "the patched model is not faster"),
    (_d(126.31, n=1), _d(100.0, n=1), "the patched model is faster by more than the measurement noise (0.026 ms)"),
    (_d(126.30, n=0), _d(100.0, n=0), "the patched model is faster by less than the measurement noise (0.026 ms)"),
    (_d(100.001, iqr=0.0), _d(100.0, iqr=0.0), "the patched model is faster by more than the measurement noise "
                                               "(0.000 ms)"),
    (_d(100.0, iqr=0.0), _d(100.0, iqr=0.0), "the patched model is not faster"),
])
def test_model_gain_with_tiny_n_and_zero_iqr(eager, patched, reason):
    assert _gain(eager, patched).reason.startswith(reason)


# ------------------------------------------------------------------ mcts.replaces_best: the search's best so far


def _node(speedup: float, timing: Timing | None):
    return SimpleNamespace(speedup=speedup, evaluation=SimpleNamespace(timing=timing))


@pytest.mark.parametrize("new, best, replaces", [
    (_node(1.1316, _t(100.0)), _node(1.0, _t(113.16)), True),
    (_node(1.1315, _t(100.0)), _node(1.0, _t(113.15)), False),  # faster, but within the noise
    (_node(1.0, _t(100.0, iqr=0.0)), _node(0.99, _t(100.001, iqr=0.0)), True),
    (_node(1.0, _t(100.0)), _node(1.0, _t(200.0)), False),  # the speedup decides first
    (_node(1.2, None), _node(1.0, _t(100.0)), True),  # no timing: the higher speedup
])
def test_replaces_best_at_the_noise_boundary(new, best, replaces):
    assert replaces_best(new, best) is replaces
