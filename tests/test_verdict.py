"""The verdict records round-trip through JSON exactly: the run store, the dashboard and the package
read what the evaluator wrote, so a dropped or renamed field changes what a user is told."""

import json

import pytest

from forge_pack.core.verdict import REASONS, Baseline, Check, Evaluation, Timing, Verdict

CHECK = Check("fresh[0]", 0.5, 0.25, 3, 1e-5, 1e-4, "index (1,): got 2.5, expected 2", 1, 2, passed=False,
              nonfinite_mismatches=1)
VERDICT = Verdict(False, "mismatch", "3 elements off", 0.5, 0.25, (CHECK,))
TIMING = Timing(12.5, 0.75, 30, 11.0, "monotonic")


def _through_json(d: dict) -> dict:
    return json.loads(json.dumps(d))


def test_a_verdict_with_its_checks_round_trips_through_json():
    d = VERDICT.to_json()
    assert d == {"ok": False, "reason": "mismatch", "detail": "3 elements off", "max_abs_err": 0.5,
                 "max_rel_err": 0.25, "checks": [{
                     "input_kind": "fresh[0]", "max_abs_err": 0.5, "max_rel_err": 0.25, "mismatches": 3, "atol": 1e-5,
                     "rtol": 1e-4, "first_mismatch": "index (1,): got 2.5, expected 2", "nan_count": 1,
                     "inf_count": 2, "passed": False, "nonfinite_mismatches": 1}]}
    assert Verdict.from_json(_through_json(d)) == VERDICT


def test_a_minimal_verdict_reads_back_with_its_defaults():
    assert Verdict.from_json({"ok": True, "reason": "ok"}) == Verdict(True, "ok", "", None, None, ())


def test_an_unknown_reason_is_refused():
    with pytest.raises(ValueError, match="unknown verdict reason 'fast'"):
        Verdict(True, "fast")
    assert all(Verdict(r == "ok", r).reason == r for r in REASONS)


def test_timing_and_baseline_round_trip_and_none_stays_none():
    assert TIMING.to_json() == {"median_us": 12.5, "iqr_us": 0.75, "n": 30, "min_us": 11.0, "clock": "monotonic"}
    assert Timing.from_json(_through_json(TIMING.to_json())) == TIMING
    assert Timing.from_json(None) is None and Timing.from_json({}) is None
    base = Baseline(TIMING, None, "RuntimeError: no compiler", 4.0, 250.0)
    assert base.to_json() == {"eager": TIMING.to_json(), "compiled": None, "compile_error": "RuntimeError: no compiler",
                              "floor_us": 4.0, "copy_bandwidth_gbs": 250.0}
    assert Baseline.from_json(_through_json(base.to_json())) == base
    both = Baseline(TIMING, Timing(10.0, 0.5, 30), "", 4.0, 250.0)
    assert Baseline.from_json(_through_json(both.to_json())) == both
    assert Baseline.from_json({"eager": TIMING.to_json()}) == Baseline(TIMING, None, "", 0.0, 0.0)


def test_an_evaluation_round_trips_every_field():
    e = Evaluation(VERDICT, TIMING, 1.5, "log", "g++ -O3", 2.5, 1.25, 0.75, 0.5, {"cached_build": True})
    d = e.to_json()
    assert set(d) == {"verdict", "timing", "compile_s", "compile_log", "compile_cmd", "eval_s", "speedup_vs_eager",
                      "speedup_vs_compile", "bandwidth_fraction", "extra"}
    assert Evaluation.from_json(_through_json(d)) == e
    bare = Evaluation(Verdict(False, "compile_error", "x"))
    assert bare.to_json()["timing"] is None
    assert Evaluation.from_json({"verdict": bare.verdict.to_json()}) == bare
