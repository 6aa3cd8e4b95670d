"""A hotspot whose own input sets do not fit the device's memory ends its search at the first such
verdict (stop reason ``out_of_memory``, in the search table and the dashboard); an out_of_memory
caused by one candidate's workspace (or a CPU candidate's own allocation) does not end it, since other
candidates may fit. CPU, fakes only."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_fakes import FakeEvaluator, fake_toolkit  # noqa: E402
from search_fakes import Landscape, ListProposer  # noqa: E402

from forge_pack.cli.search import search_command  # noqa: E402
from forge_pack.core.verdict import Evaluation, Verdict  # noqa: E402
from forge_pack.evaluate import memory_plan  # noqa: E402
from forge_pack.search.mcts import SearchConfig, search  # noqa: E402
from forge_pack.store.run_store import open_readonly  # noqa: E402
from forge_pack.store.vocabulary import StopReason  # noqa: E402
from forge_pack.ui import data as ui_data  # noqa: E402
from pipeline_fakes import _sig  # noqa: E402

SIG = _sig("softmax", (64, 512), (("dim", 1),))
GIB = 1 << 30


def _oom(why: str) -> Evaluation:
    return Evaluation(Verdict(False, "out_of_memory", why))


def _sets_do_not_fit() -> str:
    return memory_plan.fits(SIG, memory_plan.estimate_peak(SIG) // 2)


def _workspace_does_not_fit() -> str:
    need = memory_plan.estimate_peak(SIG)
    return memory_plan.fits(SIG, 2 * need, workspace_bytes=2 * GIB)


# ------------------------------------------------------------------ the verdict says which


def test_out_of_memory_names_the_signature_when_its_sets_alone_do_not_fit():
    why = _sets_do_not_fit()
    assert why.endswith(": the signature's own sets do not fit, whatever the kernel")
    assert memory_plan.sets_do_not_fit(Verdict(False, "out_of_memory", why))


def test_out_of_memory_names_the_workspace_when_only_the_candidate_is_too_big():
    why = _workspace_does_not_fit()
    assert why.endswith(": this candidate's 2.00 GiB of workspace is what does not fit")
    assert not memory_plan.sets_do_not_fit(Verdict(False, "out_of_memory", why))


def test_an_allocation_failure_despite_the_estimate_does_not_end_the_search():
    v = Verdict(False, "out_of_memory", "an allocation failed while evaluating softmax(...): CUDA out of memory")
    assert not memory_plan.sets_do_not_fit(v)
    assert not memory_plan.sets_do_not_fit(Verdict(False, "mismatch", memory_plan.SETS_DO_NOT_FIT))


def test_a_failed_allocation_ends_the_search_only_where_the_candidate_allocates_nothing():
    err = RuntimeError("CUDA out of memory. Tried to allocate 12.00 GiB")
    gpu = memory_plan.allocation_failed(SIG, err, "cuda", 0)
    assert "Tried to allocate 12.00 GiB" in gpu
    assert memory_plan.sets_do_not_fit(Verdict(False, "out_of_memory", gpu))
    for backend, workspace in (("cuda", 1 << 20), ("cpu", 0)):  # its workspace, or host memory its code takes
        why = memory_plan.allocation_failed(SIG, err, backend, workspace)
        assert "Tried to allocate 12.00 GiB" in why
        assert not memory_plan.sets_do_not_fit(Verdict(False, "out_of_memory", why))


# ------------------------------------------------------------------ the search loop

POINTS = [{"f": 0, "a": a, "b": 0, "c": 0} for a in range(6)]


def test_search_stops_at_the_first_verdict_that_the_sets_do_not_fit():
    calls = []

    def evaluate(cand):
        calls.append(cand.content_hash)
        return _oom(_sets_do_not_fit())

    r = search(ListProposer(POINTS), evaluate, SearchConfig(budget=50))
    assert r.stop_reason == StopReason.OUT_OF_MEMORY == "out_of_memory"
    assert r.evaluations == len(calls) == 1
    assert r.verdicts == {"out_of_memory": 1}


def test_search_goes_on_after_a_candidate_whose_workspace_does_not_fit():
    land = Landscape(2)
    first = []

    def evaluate(cand):
        if not first:
            first.append(cand)
            return _oom(_workspace_does_not_fit())
        return land.evaluate(cand)

    r = search(ListProposer(POINTS), evaluate, SearchConfig(budget=50))
    assert r.stop_reason == "exhausted" and r.evaluations == 6
    assert r.verdicts["out_of_memory"] == 1


# ------------------------------------------------------------------ the pipeline, the table, the dashboard


class _TooLargeSoftmax(FakeEvaluator):
    """The 64x512 softmax hotspot's sets do not fit; the other hotspot evaluates as usual."""

    def evaluate(self, cand, hotspot, baseline):
        if hotspot.signature.op == "softmax":
            return _oom(_sets_do_not_fit())
        return super().evaluate(cand, hotspot, baseline)


def test_pipeline_ends_that_hotspot_only_and_says_why(tmp_path):
    tk = fake_toolkit()
    tk.evaluator = lambda config, run_dir, backend: _TooLargeSoftmax(run_dir, 0.0)
    out = []
    s = search_command("m.py", run_dir=tmp_path / "r", budget=8, toolkit=tk, stdout=out.append)
    by_op = {o.hotspot.signature.op: o for o in s.searched}
    soft, log = by_op["softmax"].result, by_op["log_softmax"].result
    assert soft.stop_reason == "out_of_memory" and soft.evaluations == 1
    assert log.stop_reason == "budget" and log.evaluations == 8
    assert ("no winner: nothing beat eager by 2% in 1 evaluations; no candidate passed verification"
            in out[0])
    assert ("(stopped after 1 of 8 evaluations: the signature's input sets do not fit the device's memory)"
            in out[0])
    conn = open_readonly(tmp_path / "r")
    try:
        rows = {h["pretty"]: h for h in ui_data.summary(conn)["hotspots"]}
    finally:
        conn.close()
    soft_row = rows["softmax(x: f32[64,512], dim=1)"]
    assert soft_row["stop_reason"] == "out_of_memory"
    assert soft_row["budget"] == 1 and soft_row["planned_budget"] == 8  # ended short, shown as 1 / 1



def _raise_oom():
    raise RuntimeError("CUDA out of memory. Tried to allocate 12.00 GiB")


def test_a_failed_allocation_outside_forge_pack_names_no_place():
    try:
        _raise_oom()
    except RuntimeError as e:
        assert memory_plan.failed_at(e) == ""  # this test file is not forge_pack's code
        assert "[in " not in memory_plan.allocation_failed(SIG, e, "cuda", 0)
