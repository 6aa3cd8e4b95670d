"""`forge-pack search`: hotspot choice, Amdahl projection, the table, --json, the plain 'no winner'."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_fakes import FakeEvaluator, fake_hotspots, fake_toolkit  # noqa: E402
from search_fakes import ListProposer  # noqa: E402

from forge_pack.cli.search import ProgressBar, failed_reasons, search_command  # noqa: E402
from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.search.pipeline import amdahl, choose_hotspots  # noqa: E402
from forge_pack.search.mcts import Progress  # noqa: E402

HERE = Path(__file__).parent


def test_amdahl_per_hotspot_and_combined():
    assert amdahl([(0.5, 2.0)]) == pytest.approx(1 / 0.75)
    assert amdahl([(0.5, 2.0), (0.25, 4.0)]) == pytest.approx(1 / (0.25 + 0.25 + 0.0625))
    assert amdahl([(0.3, 1.0)]) == pytest.approx(1.0)
    assert amdahl([]) == 1.0


def test_choose_hotspots_says_why_each_is_skipped():
    hs = fake_hotspots()
    chosen = choose_hotspots(hs, top=1, min_share=0.01)
    assert chosen[0][1] == ""
    assert "beyond --top 1" in chosen[1][1]
    assert "not targeted" in chosen[2][1] and "other than the last" in chosen[2][1]
    assert "under --min-share" in chosen[3][1]
    assert [why == "" for _, why in choose_hotspots(hs, top=5, min_share=0.0)] == [True, True, False, True]


def test_table_lists_every_searched_hotspot_with_projection(tmp_path):
    out = []
    s = search_command("m.py", run_dir=tmp_path / "r", budget=8, toolkit=fake_toolkit(), stdout=out.append)
    text = out[0]
    for col in ("hotspot", "share", "eager", "compile", "best kernel", "vs eager", "vs compile", "% copy BW", "model"):
        assert col in text
    assert "softmax(x: f32[64,512], dim=1)" in text and "60.0%" in text
    assert "Projected whole-model speedup" in text
    assert ("Not searched: #3 softmax(x: f32[8,16,4], dim=0): not targeted (softmax over a dimension other than the "
            "last); #4 softmax(x: f32[4,8], dim=1): 0.50% of the forward, under --min-share 1%") in text
    # Amdahl over the two winners: 20% of the forward untouched, 60% at 1.054x, 20% at 2.031x (the fakes' speeds)
    assert s.projected == pytest.approx(1.1524614475596615, rel=1e-9)
    assert ("Projected whole-model speedup (Amdahl, from 2 winning kernels covering 80.0% of the forward): 1.152x"
            in text)


class _SlowKernels(FakeEvaluator):
    """Every correct kernel is slower than eager."""

    def evaluate(self, cand, hotspot, baseline):
        ev = super().evaluate(cand, hotspot, baseline)
        if ev.verdict.ok:
            ev = replace(ev, speedup_vs_eager=ev.speedup_vs_eager * 0.2)
        return ev


def test_no_winner_is_said_plainly_and_is_not_an_error(tmp_path):
    tk = fake_toolkit()
    tk.evaluator = lambda config, run_dir, backend: _SlowKernels(run_dir, 0.0)
    out = []
    s = search_command("m.py", run_dir=tmp_path / "r", budget=6, toolkit=tk, stdout=out.append)
    assert not s.winners and s.projected == 1.0
    assert "no winner" in out[0]
    assert "No faster kernel found" in out[0]


def test_json_prints_exactly_one_document(tmp_path):
    r = subprocess.run([sys.executable, str(HERE / "pipeline_fakes.py"), "m.py", "--run-dir", str(tmp_path / "r"),
                        "--budget", "4", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["budget"] == 4 and len(doc["hotspots"]) == 4
    searched = [h for h in doc["hotspots"] if not h["skipped"]]
    assert all(h["search"]["evaluations"] == 4 for h in searched)
    assert {"eager_us", "compile_us", "best", "projected_model_speedup", "verdict"} <= set(searched[0])
    assert "[1/2]" in r.stderr  # progress went to stderr


def test_resume_rejects_a_model_or_new_device(tmp_path):
    with pytest.raises(ForgeError, match="--resume"):
        search_command("m.py", resume=tmp_path, toolkit=fake_toolkit())
    with pytest.raises(ForgeError, match="cannot change"):
        search_command(None, resume=tmp_path, device="cuda", toolkit=fake_toolkit())
    with pytest.raises(ForgeError, match="no model file"):
        search_command(None, toolkit=fake_toolkit())
    with pytest.raises(ForgeError, match="not a forge-pack run directory"):
        search_command(None, resume=tmp_path / "missing", toolkit=fake_toolkit())


def test_progress_bar_on_a_terminal_uses_carriage_returns():
    class TTY(io.StringIO):
        def isatty(self):
            return True

    stream = TTY()
    bar = ProgressBar(stream)
    from pipeline_fakes import fake_hotspots as fh
    from forge_pack.search.pipeline import HotspotOutcome

    out = HotspotOutcome(fh()[0], 1)
    bar.hotspot(out, 1, 2)
    bar.update(out, Progress(3, 10, 1, 1.25, 1, 2.0))
    bar.update(out, Progress(4, 10, 1, 1.5, 1, 2.5))
    bar.done()
    text = stream.getvalue()
    assert text.count("\r") == 2 and "4/10" in text and "best 1.50x" in text and "failures 1" in text
    assert text.endswith("\n")


def test_cli_search_on_a_missing_file_is_one_error_line(tmp_path, cli_env, forge_cmd):
    r = subprocess.run([*forge_cmd, "search", str(tmp_path / "nope.py"), "--device", "cpu",
                        "--run-dir", str(tmp_path / "r")], capture_output=True, text=True, env=cli_env, timeout=120)
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "hint: " in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "r").exists()  # nothing written for a model that does not load


class _AllWrong(FakeEvaluator):
    def evaluate(self, cand, hotspot, baseline):
        from search_fakes import fail_eval

        return fail_eval("mismatch")


def test_no_correct_candidate_names_the_most_common_failure(tmp_path):
    tk = fake_toolkit()
    tk.evaluator = lambda config, run_dir, backend: _AllWrong(run_dir, 0.0)
    out = []
    search_command("m.py", run_dir=tmp_path / "r", budget=3, top=1, toolkit=tk, stdout=out.append)
    assert "no candidate passed verification (most common failure: mismatch, 3x: fake mismatch)" in out[0]


def test_the_progress_line_names_why_candidates_fail(tmp_path, capsys):
    """A user watching a search whose every candidate fails sees why while it runs (an H100 search of a 6 GiB
    softmax showed 'failures 10' for 200 s; the reason, out_of_memory, was only in the run store)."""
    tk = fake_toolkit()
    tk.evaluator = lambda config, run_dir, backend: _AllWrong(run_dir, 0.0)
    search_command("m.py", run_dir=tmp_path / "r", budget=3, top=1, toolkit=tk, stdout=lambda s: None)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "failures" in ln]
    assert lines and lines[-1].split("failures ", 1)[1].startswith("3 (mismatch 3)")
    assert failed_reasons((("out_of_memory", 5), ("mismatch", 2), ("crash", 1))) == (
        " (out_of_memory 5, mismatch 2, 1 more)")
    assert failed_reasons(()) == ""


class _NoBaseline(FakeEvaluator):
    def baseline(self, hotspot):
        raise RuntimeError("torch.compile exploded")


def test_a_hotspot_whose_baseline_fails_is_reported_not_fatal(tmp_path):
    tk = fake_toolkit()
    tk.evaluator = lambda config, run_dir, backend: _NoBaseline(run_dir, 0.0)
    out = []
    s = search_command("m.py", run_dir=tmp_path / "r", budget=3, toolkit=tk, stdout=out.append)
    assert all(o.result is None for o in s.searched)
    assert "baseline could not be measured (RuntimeError: torch.compile exploded)" in out[0]


def test_search_ui_serves_the_dashboard_beside_the_search(tmp_path, capfd):
    import json
    import re
    import urllib.request

    from forge_pack.cli.search import ui_options

    ui = ui_options(True, None, False)
    search_command("m.py", run_dir=tmp_path / "r", budget=4, toolkit=fake_toolkit(), stdout=lambda s: None, ui=ui)
    err = capfd.readouterr().err
    url = re.search(r"http://127\.0\.0\.1:\d+/\S*token=[\w-]+", err)  # url-safe tokens hold - and _
    assert url, err
    base = re.match(r"http://127\.0\.0\.1:\d+", url.group(0)).group(0)
    token = url.group(0).rsplit("token=", 1)[1]
    with urllib.request.urlopen(f"{base}/api/summary?token={token}", timeout=10) as r:
        summary = json.loads(r.read())
    # the run the search just wrote, read through the dashboard's read-only connection
    assert (summary["run"]["status"], summary["evaluations"], summary["budget"]) == ("finished", 8, 8)
    assert [(h["rank"], h["op"], h["evaluations"]) for h in summary["hotspots"][:2]] == [(1, "softmax", 4),
                                                                                       (2, "log_softmax", 4)]


def test_ui_port_without_ui_is_an_error():
    from forge_pack.cli.search import ui_options
    from forge_pack.core.errors import ForgeError

    with pytest.raises(ForgeError, match="need --ui"):
        ui_options(False, 9000, False)


def test_run_dir_that_is_a_file_is_a_user_error(tmp_path):
    path = tmp_path / "afile"
    path.write_text("")
    for run_dir in (path, path / "below"):
        with pytest.raises(ForgeError, match="is a file") as e:
            search_command("m.py", run_dir=run_dir, budget=2, toolkit=fake_toolkit(), stdout=lambda s: None)
        assert "--run-dir" in e.value.hint
    assert path.read_text() == ""


class _CtrlC(FakeEvaluator):
    def __init__(self, run_dir, sleep_s):
        super().__init__(run_dir, sleep_s)
        self.calls = 0

    def evaluate(self, cand, hotspot, baseline):
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return super().evaluate(cand, hotspot, baseline)


def test_the_run_directory_is_named_at_the_start_and_in_the_interrupt_hint(tmp_path, monkeypatch, capsys):
    from forge_pack.cli.search import SearchInterrupted

    monkeypatch.chdir(tmp_path)  # no --run-dir: the default runs/search-m-STAMP
    tk = fake_toolkit()
    tk.evaluator = lambda config, run_dir, backend: _CtrlC(run_dir, 0.0)
    with pytest.raises(KeyboardInterrupt) as e:
        search_command("m.py", budget=10, toolkit=tk, stdout=lambda s: None)
    (run_dir,) = (tmp_path / "runs").iterdir()
    rel = str(run_dir.relative_to(tmp_path))
    err = capsys.readouterr().err
    assert err.splitlines()[0] == f"run directory: {rel}"  # before any search output
    assert isinstance(e.value, SearchInterrupted) and f"--resume {rel}" in e.value.hint
    # the lock is gone with the process's run: the interrupted run resumes
    s = search_command(None, resume=Path(rel), toolkit=fake_toolkit(), stdout=lambda s: None)
    assert s.status == "finished"


def test_cli_interrupt_hint_names_the_run_directory(monkeypatch, capfd):
    from forge_pack.cli import main as cli, search as cmd_search

    def interrupted(*args, **kwargs):
        raise cmd_search.SearchInterrupted("runs/search-m-1")

    monkeypatch.setattr(cmd_search, "search_command", interrupted)
    monkeypatch.setattr(sys, "argv", ["forge-pack", "search", "m.py"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 130
    err = capfd.readouterr().err
    assert "error: interrupted" in err and "hint: continue the search with: forge-pack search --resume " \
        "runs/search-m-1" in err


def test_hotspots_that_were_not_searched_are_not_called_none_correct(tmp_path):
    tk = fake_toolkit()
    tk.evaluator = lambda config, run_dir, backend: _NoBaseline(run_dir, 0.0)
    out = []
    search_command("m.py", run_dir=tmp_path / "a", budget=3, toolkit=tk, stdout=out.append)
    assert "not searched" in out[0] and "none correct" not in out[0]
    assert "No faster kernel found" not in out[0] and "No hotspot could be searched" in out[0]

    class _FirstBaselineFails(_SlowKernels):
        def baseline(self, hotspot):
            if hotspot.op == "softmax":
                raise RuntimeError("torch.compile exploded")
            return super().baseline(hotspot)

    tk.evaluator = lambda config, run_dir, backend: _FirstBaselineFails(run_dir, 0.0)
    out = []
    search_command("m.py", run_dir=tmp_path / "b", budget=3, toolkit=tk, stdout=out.append)
    assert "on the 1 searched hotspot," in out[0]

    tk = fake_toolkit()
    tk.proposers = lambda config, backend, store: [ListProposer([], name="empty")]
    out = []
    search_command("m.py", run_dir=tmp_path / "c", budget=3, toolkit=tk, stdout=out.append)
    assert "no candidates" in out[0] and "none correct" not in out[0]
    assert "No faster kernel found" not in out[0]


def test_resume_applies_workers_to_parallel_as_a_fresh_run_does(tmp_path):
    run_dir = tmp_path / "r"
    s = search_command("m.py", budget=2, run_dir=run_dir, toolkit=fake_toolkit(), stdout=lambda s: None)
    assert (s.config.workers, s.config.parallel) == (1, 1)
    s = search_command(None, resume=run_dir, budget=4, workers=3, toolkit=fake_toolkit(), stdout=lambda s: None)
    assert (s.config.workers, s.config.parallel) == (3, 3)
    s = search_command(None, resume=run_dir, budget=5, workers=2, parallel=1, toolkit=fake_toolkit(),
                       stdout=lambda s: None)
    assert (s.config.workers, s.config.parallel) == (2, 1)


@pytest.mark.parametrize("flags", [dict(time_limit=0.0), dict(time_limit=-5.0), dict(time_limit=float("nan")),
                                   dict(timeout=0.0), dict(timeout=float("nan"))])
def test_time_limit_and_timeout_must_be_positive(tmp_path, flags):
    with pytest.raises(ForgeError, match="positive number of seconds") as e:
        search_command("m.py", run_dir=tmp_path / "r", budget=2, toolkit=fake_toolkit(), stdout=lambda s: None,
                       **flags)
    assert e.value.hint.startswith("e.g. --")
    assert not (tmp_path / "r").exists()


def test_progress_bar_ends_full_when_the_proposers_run_dry(tmp_path):
    """A budget of 8 with only 3 candidates to propose: the last line reads 3/3 and says why, not 3/8."""
    import dataclasses

    from forge_pack.search import pipeline
    from search_fakes import ListProposer

    points = [{"f": 0, "a": 1, "b": 1, "c": 0}, {"f": 0, "a": 2, "b": 1, "c": 0}, {"f": 0, "a": 1, "b": 2, "c": 0}]
    tk = dataclasses.replace(fake_toolkit(), proposers=lambda config, backend, store: [ListProposer(points)])
    stream = io.StringIO()
    bar = ProgressBar(stream)
    summary = pipeline.run(pipeline.RunConfig(model="m.py", budget=8, run_dir=str(tmp_path / "run")), toolkit=tk,
                           say=bar.say, on_progress=bar.update, on_hotspot=bar.hotspot)
    bar.done()
    ran = [o.result.evaluations for o in summary.searched]
    assert [o.result.stop_reason for o in summary.searched] == ["exhausted"] * len(ran)
    bars = [line for line in stream.getvalue().splitlines() if line.startswith("  [")]
    for n in ran:
        assert any(f" {n}/{n} " in b and b.endswith(f"(the proposers ran dry: {n} of a budget of 8)") for b in bars), bars
    assert bars[-1].split()[1] == f"{ran[-1]}/{ran[-1]}", bars
