"""A rerun of the same model with the same budget lands on the same winners: the search's seed fixes
what it proposes, and a later candidate replaces the best only when it is faster by more than the
measurement noise (mcts.replaces_best); where candidates cannot be told apart, the build says so."""

from __future__ import annotations

import dataclasses
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_fakes import FakeEvaluator, fake_hotspots, fake_toolkit  # noqa: E402
from search_fakes import ListProposer  # noqa: E402

from forge_pack.core.verdict import Evaluation, Timing, Verdict  # noqa: E402
from forge_pack.search import pipeline  # noqa: E402

POINTS = [{"f": 0, "a": a, "b": 1, "c": 0} for a in range(4)]


class _Jittered(FakeEvaluator):
    """Four equally fast kernels (3.00x), each timed with a run-specific jitter of 0.5%, well inside
    their 5% IQR: as two real runs time the same kernels."""

    def __init__(self, run_dir, jitter_seed: int):
        super().__init__(run_dir, 0.0)
        self.rng = random.Random(jitter_seed)

    def evaluate(self, cand, hotspot, baseline):
        us = 100.0 / 3.0 * math.exp(self.rng.gauss(0.0, 0.005))
        return Evaluation(Verdict(True, "ok"), Timing(us, 0.05 * us, 30, 0.97 * us, "monotonic"),
                          speedup_vs_eager=100.0 / us, speedup_vs_compile=90.0 / us)


def _search(run_dir: Path, jitter_seed: int):
    tk = dataclasses.replace(fake_toolkit(hotspots=fake_hotspots()[:1]),
                             proposers=lambda config, backend, store: [ListProposer(POINTS)],
                             evaluator=lambda config, run_dir, backend: _Jittered(run_dir, jitter_seed))
    s = pipeline.run(pipeline.RunConfig(model="m.py", budget=4, run_dir=str(run_dir)), toolkit=tk, say=lambda s: None)
    (out,) = s.searched
    fastest = max(out.result.nodes, key=lambda n: n.speedup or 0.0)  # what "the highest figure" would pick
    return out.result.best.candidate.content_hash, fastest.candidate.content_hash


def test_reruns_with_timings_within_noise_keep_the_same_winner(tmp_path):
    runs = [_search(tmp_path / f"r{seed}", seed) for seed in range(5)]
    assert len({best for best, _ in runs}) == 1  # the first found, every time
    assert len({fastest for _, fastest in runs}) > 1  # while the highest figure moves between reruns


def test_build_says_which_winners_are_within_noise_of_others(tmp_path):
    from forge_pack.pack.packager import collect, rerun_notes

    _search(tmp_path / "r", 0)
    winners, _ = collect(tmp_path / "r")
    (w,) = winners
    near = w.stats["within_noise"]
    assert sorted(n["node_id"] for n in near) == sorted(n for n in range(1, 5) if n != w.node_id)
    (note,) = rerun_notes(winners)
    assert note.startswith(f"{w.hotspot.signature.pretty()}: the winner #{w.node_id} "
                           f"({w.evaluation.speedup_vs_eager:.2f}x in the search) is within measurement noise")
    assert "within measurement noise (or 10%) of 3 other correct kernels" in note and "a rerun" in note


@pytest.mark.slow
def test_two_cpu_searches_of_a_tiny_model_pick_the_same_winner(tmp_path, cli_env, forge_cmd):
    """The real thing: the tiny router model searched twice on this CPU, budget 6. The same winner, or
    the build of one run names the other's winner as within its noise (the "or says why not")."""
    import sqlite3

    from forge_pack.pack.packager import RERUN_SPREAD, collect
    from forge_pack.store import run_queries

    def hotspot_id(conn):
        (hid,) = {h for (h,) in conn.execute("SELECT hotspot_id FROM evaluations")}
        return hid

    sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
    import helpers

    best, close, medians = [], [], []
    for i in range(2):
        run = tmp_path / f"r{i}"
        r = subprocess.run([*forge_cmd, "search", str(helpers.E2E_MODEL), "--device", "cpu", "--budget", "6",
                            "--top", "1", "--run-dir", str(run)], capture_output=True, text=True, env=cli_env,
                           timeout=900)
        assert r.returncode == 0, r.stderr[-4000:]
        conn = sqlite3.connect(run / "run.db")
        try:
            params = dict(conn.execute("SELECT id, params_json FROM nodes").fetchall())
            medians.append({params[n]: Evaluation.from_json(doc).timing.median_us
                            for n, doc in run_queries.ok_evaluations(conn, hotspot_id(conn))})
        finally:
            conn.close()
        winners = collect(run)[0]
        if not winners:  # a slow shared CPU may find nothing faster: nothing to compare
            pytest.skip("no kernel beat eager in one of the runs")
        (w,) = winners
        best.append(params[w.node_id])
        close.append({params[n["node_id"]] for n in w.stats["within_noise"]})
    if not (best[0] == best[1] or best[1] in close[0] or best[0] in close[1]):
        # Each run timed both winners and ordered them oppositely, by more than RERUN_SPREAD each time:
        # this machine's timings of the same two kernels did not reproduce (a shared 2-core CPU moved one
        # kernel by 28% between two runs), which no rule inside one run can foresee.
        a, b = best
        if all(a in m and b in m for m in medians) and medians[0][b] > medians[0][a] * RERUN_SPREAD \
                and medians[1][a] > medians[1][b] * RERUN_SPREAD:
            pytest.skip(f"this machine's timings did not reproduce between the runs: {a} vs {b} "
                        f"{medians[0][a]:.0f}/{medians[0][b]:.0f} us, then {medians[1][a]:.0f}/{medians[1][b]:.0f} us")
        # The search is seeded (same seed, one job at a time): two runs explore different candidates only
        # when their timings steer the tree differently. A run that never timed the other's winner cannot
        # name it; if, besides, the run that timed both ranks its own winner first beyond RERUN_SPREAD,
        # the runs disagree about timings, not about a rule.
        for mine, theirs, k in ((a, b, 0), (b, a, 1)):
            other = medians[1 - k]
            if theirs in medians[k] and mine not in other and medians[k][theirs] > medians[k][mine] * RERUN_SPREAD:
                pytest.skip(f"the runs explored different candidates: run {1 - k} never timed {mine}; run {k} timed "
                            f"{mine} at {medians[k][mine]:.0f} us and {theirs} at {medians[k][theirs]:.0f} us")
    assert best[0] == best[1] or best[1] in close[0] or best[0] in close[1], (best, close, medians)
