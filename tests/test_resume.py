"""The run store makes a search resumable: kill -9 in the middle loses nothing, --resume finishes the budget."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_fakes import fake_toolkit  # noqa: E402

from forge_pack.search import pipeline, run_lock  # noqa: E402
from forge_pack.search.control import write_control  # noqa: E402
from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.store.run_store import open_readonly  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parent
BUDGET = 10  # per hotspot; the fake profile has 2 searchable hotspots


def _fake_search(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "pipeline_fakes.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _count(run_dir: Path, sql: str) -> int:
    try:
        conn = open_readonly(run_dir)
        try:
            return conn.execute(sql).fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:  # not created yet
        return 0


def _calls(run_dir: Path) -> list[tuple[str, str]]:
    path = run_dir / "calls.log"
    return [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_kill_9_mid_search_loses_nothing_and_resume_finishes_the_budget(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(HERE / "pipeline_fakes.py"), "model.py", "--run-dir", str(run_dir),
                             "--budget", str(BUDGET), "--sleep", "0.15"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while _count(run_dir, "SELECT COUNT(*) FROM evaluations") < 6:  # mid-way through the first hotspot
            assert proc.poll() is None, "the search ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    conn = open_readonly(run_dir)
    committed = {(r["hotspot_id"], r["cand_hash"]) for r in conn.execute(
        "SELECT e.hotspot_id, n.cand_hash FROM evaluations e JOIN nodes n ON n.id=e.node_id")}
    in_flight = conn.execute("SELECT COUNT(*) FROM nodes WHERE status!='done'").fetchone()[0]
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "running"  # died: never marked finished
    conn.close()
    calls_before = _calls(run_dir)
    assert len(committed) >= 6
    # Every evaluation that started either committed or was the one in flight (parallel=1): nothing lost.
    assert len(calls_before) - len(committed) == in_flight <= 1
    assert set(calls_before) - committed == set() or in_flight == 1

    r = _fake_search("--resume", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # exactly one JSON document on stdout
    assert doc["status"] == "finished"
    assert "resuming" in r.stderr

    calls_after = _calls(run_dir)[len(calls_before):]
    assert not committed & set(calls_after), "a committed evaluation was redone"
    conn = open_readonly(run_dir)
    per_hotspot = dict(conn.execute("SELECT hotspot_id, COUNT(*) FROM evaluations GROUP BY hotspot_id").fetchall())
    hashes = conn.execute("SELECT hotspot_id, cand_hash FROM nodes").fetchall()
    assert conn.execute("SELECT COUNT(*) FROM nodes WHERE status!='done'").fetchone()[0] == 0
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "finished"
    stats = conn.execute("SELECT COUNT(*) FROM node_stats").fetchone()[0]
    conn.close()
    assert sorted(per_hotspot.values()) == [BUDGET, BUDGET]  # the same total budget, exactly
    assert max(Counter(map(tuple, hashes)).values()) == 1  # no candidate twice in a tree
    assert len(calls_before) + len(calls_after) == 2 * BUDGET + in_flight
    assert stats == 2 * BUDGET
    assert [h["search"]["evaluations"] for h in doc["hotspots"] if not h["skipped"]] == [BUDGET, BUDGET]


def test_resume_with_a_larger_budget_continues_and_reports(tmp_path):
    run_dir = tmp_path / "run"
    pipeline.run(pipeline.RunConfig(model="m.py", budget=6, run_dir=str(run_dir)), toolkit=fake_toolkit(),
                 say=lambda s: None)
    first = _calls(run_dir)
    assert len(first) == 12
    config = pipeline.with_overrides(pipeline.load_config(run_dir), budget=9)
    s = pipeline.run(config, resume=True, toolkit=fake_toolkit(), say=lambda s: None)
    again = _calls(run_dir)[len(first):]
    assert len(again) == 6 and not set(first) & set(again)
    assert [o.result.evaluations for o in s.searched] == [9, 9]
    assert [o.result.new_evaluations for o in s.searched] == [3, 3]


def test_store_records_everything_the_dashboard_reads(tmp_path):
    run_dir = tmp_path / "run"
    s = pipeline.run(pipeline.RunConfig(model="m.py", budget=5, run_dir=str(run_dir)), toolkit=fake_toolkit(),
                     say=lambda s: None)
    conn = open_readonly(run_dir)
    kinds = Counter(r[0] for r in conn.execute("SELECT kind FROM events"))
    assert kinds["eval_done"] == 10 and kinds["node_added"] == 10 and kinds["eval_start"] == 10
    assert kinds["run_start"] == 1 and kinds["run_end"] == 1
    rows = {r["id"]: r for r in conn.execute("SELECT * FROM hotspots")}
    assert sorted(r["status"] for r in rows.values()) == ["done", "done", "skipped", "skipped"]
    for o in s.searched:
        assert rows[o.hotspot.id]["best_node_id"] == o.best.id
        assert json.loads(rows[o.hotspot.id]["baseline_json"])["eager"]["median_us"] == 100.0
    assert conn.execute("SELECT heartbeat_at FROM runs").fetchone()[0] is not None
    config = json.loads((run_dir / "config.json").read_text())
    assert config["budget"] == 5 and config["search"]["exploration"] == pytest.approx(0.3)
    run_cfg = json.loads(conn.execute("SELECT config_json FROM runs").fetchone()[0])
    assert run_cfg == config
    conn.close()


def test_config_json_redacts_secrets():
    d = pipeline.redact({"llm": {"api_key": "sk-123", "model": "m"}, "token": "t", "budget": 5, "key_env": ""})
    assert d == {"llm": {"api_key": "<redacted>", "model": "m"}, "token": "<redacted>", "budget": 5, "key_env": ""}


def _stopping_after_three_evaluations():
    """The fake toolkit whose evaluator asks the run to stop (control file) at its third evaluation."""
    tk = fake_toolkit()
    inner = tk.evaluator

    def evaluator(config, rd, backend):
        ev = inner(config, rd, backend)
        orig, n = ev.evaluate, {"calls": 0}

        def evaluate(c, h, b):
            n["calls"] += 1
            if n["calls"] == 3:
                write_control(rd, "stop")
            return orig(c, h, b)

        ev.evaluate = evaluate
        return ev

    tk.evaluator = evaluator
    return tk


def test_control_file_stop_ends_the_run_cleanly_and_resume_continues(tmp_path):
    run_dir = tmp_path / "run"
    tk = _stopping_after_three_evaluations()
    s = pipeline.run(pipeline.RunConfig(model="m.py", budget=8, run_dir=str(run_dir)), toolkit=tk,
                     say=lambda s: None)
    assert s.status == "interrupted"
    assert s.searched[0].result.evaluations == 3 and s.searched[0].result.stop_reason == "stopped"
    assert s.searched[1].result is None and "stopped" in s.searched[1].note
    conn = open_readonly(run_dir)
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    conn.close()
    # A stale stop request (older than the resumed search) is ignored.
    s2 = pipeline.run(pipeline.load_config(run_dir), resume=True, toolkit=fake_toolkit(), say=lambda s: None)
    assert s2.status == "finished" and [o.result.evaluations for o in s2.searched] == [8, 8]


def test_control_file_pause_waits(tmp_path):
    run_dir = tmp_path / "run"
    tk = fake_toolkit()
    inner = tk.evaluator

    def evaluator(config, rd, backend):
        ev = inner(config, rd, backend)
        orig = ev.evaluate
        n = {"calls": 0}

        def evaluate(c, h, b):
            n["calls"] += 1
            if n["calls"] == 2:
                write_control(rd, "pause")
                # the dashboard resumes it a little later
                import threading

                threading.Timer(0.8, lambda: write_control(rd, "resume")).start()
            return orig(c, h, b)

        ev.evaluate = evaluate
        return ev

    tk.evaluator = evaluator
    t = time.monotonic()
    s = pipeline.run(pipeline.RunConfig(model="m.py", budget=4, top=1, run_dir=str(run_dir)), toolkit=tk,
                     say=lambda s: None)
    assert time.monotonic() - t >= 0.8
    assert s.status == "finished" and s.searched[0].result.evaluations == 4
    conn = open_readonly(run_dir)
    actions = [json.loads(r[0])["action"] for r in conn.execute("SELECT payload_json FROM events WHERE kind='control'")]
    conn.close()
    assert actions[:2] == ["pause", "run"]


def test_an_existing_run_dir_is_not_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    pipeline.run(pipeline.RunConfig(model="m.py", budget=2, run_dir=str(run_dir)), toolkit=fake_toolkit(),
                 say=lambda s: None)
    with pytest.raises(ForgeError, match="already holds a run"):
        pipeline.run(pipeline.RunConfig(model="m.py", budget=2, run_dir=str(run_dir)), toolkit=fake_toolkit(),
                     say=lambda s: None)
    with pytest.raises(ForgeError, match="not a forge-pack run directory"):
        pipeline.load_config(tmp_path / "nothing")


def _wait_for_evaluations(proc, run_dir: Path, n: int) -> None:
    deadline = time.monotonic() + 60
    while _count(run_dir, "SELECT COUNT(*) FROM evaluations") < n:
        assert proc.poll() is None, "the search ended too early"
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.slow
def test_a_run_still_going_cannot_be_resumed_by_a_second_process(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(HERE / "pipeline_fakes.py"), "model.py", "--run-dir", str(run_dir),
                             "--budget", str(BUDGET), "--sleep", "0.2"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_evaluations(proc, run_dir, 2)
        r = _fake_search("--resume", str(run_dir))
        assert r.returncode == 1
        assert "error: another forge-pack process" in r.stderr and "hint: " in r.stderr, r.stderr
        assert str(proc.pid) in r.stderr  # the holder is named
        with pytest.raises(ForgeError, match="another forge-pack process"):
            pipeline.run(pipeline.load_config(run_dir), resume=True, toolkit=fake_toolkit(), say=lambda s: None)
        assert proc.poll() is None  # the refusals touched nothing of the running search
        os.kill(proc.pid, signal.SIGKILL)  # the OS drops the lock of a killed process
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    s = pipeline.run(pipeline.load_config(run_dir), resume=True, toolkit=fake_toolkit(), say=lambda s: None)
    assert s.status == "finished" and [o.result.evaluations for o in s.searched] == [BUDGET, BUDGET]


def test_resume_of_a_finished_run_searches_nothing_again_and_keeps_the_time_limit(tmp_path):
    run_dir = tmp_path / "run"
    cfg = pipeline.RunConfig(model="m.py", budget=50, time_limit_s=0.3, run_dir=str(run_dir))
    s1 = pipeline.run(cfg, toolkit=fake_toolkit(sleep_s=0.03), say=lambda s: None)
    assert [o.result.stop_reason for o in s1.searched] == ["time_limit", "time_limit"]
    before = _calls(run_dir)
    said = []
    s2 = pipeline.run(pipeline.load_config(run_dir), resume=True, toolkit=fake_toolkit(sleep_s=0.03), say=said.append)
    assert _calls(run_dir) == before  # the time limit does not start over
    assert [(o.result.evaluations, o.result.stop_reason) for o in s2.searched] == \
        [(o.result.evaluations, "time_limit") for o in s1.searched]
    assert [o.best.id for o in s2.searched] == [o.best.id for o in s1.searched]
    assert any("0 hotspots to search, 2 already finished" in line for line in said), said
    # a larger --time-limit gives the hotspots more time (only what the new limit leaves)
    s3 = pipeline.run(pipeline.with_overrides(pipeline.load_config(run_dir), time_limit_s=0.6), resume=True,
                      toolkit=fake_toolkit(sleep_s=0.03), say=lambda s: None)
    # each hotspot searched on, the new evaluations added to what it had, until the new limit
    assert [(o.result.stop_reason, o.result.evaluations) for o in s3.searched] == \
        [("time_limit", o1.result.evaluations + o3.result.new_evaluations) for o1, o3 in zip(s1.searched, s3.searched)]
    assert all(o.result.new_evaluations > 0 for o in s3.searched)


def test_resume_gives_an_interrupted_hotspot_only_the_time_it_has_left(tmp_path):
    run_dir = tmp_path / "run"
    tk = _stopping_after_three_evaluations()
    s = pipeline.run(pipeline.RunConfig(model="m.py", budget=8, time_limit_s=30.0, run_dir=str(run_dir)),
                     toolkit=tk, say=lambda s: None)
    first = s.searched[0].hotspot.id
    conn = sqlite3.connect(run_dir / "run.db")
    row = conn.execute("SELECT stop_reason, search_s FROM hotspots WHERE id=?", (first,)).fetchone()
    assert row[0] == "stopped" and row[1] > 0  # how it ended and the time it used are stored
    conn.execute("UPDATE hotspots SET search_s=30.0 WHERE id=?", (first,))  # as if it had used all its time
    conn.commit()
    conn.close()
    s2 = pipeline.run(pipeline.load_config(run_dir), resume=True, toolkit=fake_toolkit(), say=lambda s: None)
    one, two = s2.searched
    assert one.result.stop_reason == "time_limit" and one.result.new_evaluations == 0
    assert two.result.stop_reason == "budget" and two.result.evaluations == 8  # never started: all its time


def test_a_run_dir_with_url_characters_opens_read_only(tmp_path):
    run_dir = tmp_path / "we#ird?dir%20x"
    pipeline.run(pipeline.RunConfig(model="m.py", budget=2, top=1, run_dir=str(run_dir)), toolkit=fake_toolkit(),
                 say=lambda s: None)
    assert _count(run_dir, "SELECT COUNT(*) FROM evaluations") == 2
    conn = open_readonly(run_dir)
    try:
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("DELETE FROM events")  # still read-only
    finally:
        conn.close()


def test_a_cuda_run_resumed_without_a_gpu_is_one_error_before_any_evaluation(tmp_path, monkeypatch):
    import dataclasses
    from types import SimpleNamespace

    import torch

    run_dir = tmp_path / "run"
    tk = fake_toolkit()
    on_gpu = dataclasses.replace(tk, load=lambda model, device, dtype: SimpleNamespace(
        device="cuda", path=model, model_hash="fakehash", dtype=dtype), check_device=lambda device: None)
    pipeline.run(pipeline.RunConfig(model="m.py", budget=2, run_dir=str(run_dir)), toolkit=on_gpu,
                 say=lambda s: None)
    before = len(_calls(run_dir))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = pipeline.with_overrides(pipeline.load_config(run_dir), budget=4)
    with pytest.raises(ForgeError, match="CUDA kernels, but") as e:
        pipeline.run(config, resume=True, toolkit=tk, say=lambda s: None)  # the default device check
    assert "GPU" in e.value.hint
    assert len(_calls(run_dir)) == before


def test_resume_with_new_proposers_reopens_hotspots_whose_proposers_ran_dry(tmp_path):
    import dataclasses

    from search_fakes import GridProposer, ListProposer

    one = {"f": 0, "a": 1, "b": 1, "c": 0}

    def proposers(config, backend, store):  # the LLM stands in as a second proposer
        dry = ListProposer([one], name="list")
        return [dry, GridProposer()] if config.llm_model else [dry]

    tk = dataclasses.replace(fake_toolkit(), proposers=proposers)
    run_dir = tmp_path / "run"
    s1 = pipeline.run(pipeline.RunConfig(model="m.py", budget=10, run_dir=str(run_dir)), toolkit=tk,
                      say=lambda s: None)
    assert [o.result.stop_reason for o in s1.searched] == ["exhausted", "exhausted"]
    same = pipeline.run(pipeline.load_config(run_dir), resume=True, toolkit=tk, say=lambda s: None)
    assert [o.result.new_evaluations for o in same.searched] == [0, 0]  # nothing new to propose
    llm = pipeline.with_overrides(pipeline.load_config(run_dir), llm_model="gpt-x")
    s2 = pipeline.run(llm, resume=True, toolkit=tk, say=lambda s: None)
    # the grid proposer fills the rest of the budget: 10 evaluations, 1 of them from before
    assert [(o.result.new_evaluations, o.result.evaluations, o.result.stop_reason) for o in s2.searched] == \
        [(9, 10, "budget"), (9, 10, "budget")]


def test_a_filesystem_without_flock_runs_unlocked_with_a_warning(tmp_path, monkeypatch):
    import errno

    if run_lock.fcntl is None:
        pytest.skip("no fcntl")

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    with pytest.warns(RuntimeWarning, match="cannot lock"):
        s = pipeline.run(pipeline.RunConfig(model="m.py", budget=2, run_dir=str(tmp_path / "run")),
                         toolkit=fake_toolkit(), say=lambda s: None)
    assert all(o.result.evaluations == 2 for o in s.searched)
