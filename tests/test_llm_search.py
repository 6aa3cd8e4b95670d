"""`forge-pack search --llm` through the real pipeline and MCTS, against a scripted OpenAI-protocol server.

Templates are the search fakes' grid (no compiler); LLM kernels are compiled for real with g++, so
the broken kernel fails to compile and its repair compiles. The evaluator is otherwise fake (no
torch, no timing): what is under test is the LLM's path through the search and the run store.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_llm import FakeLLM, free_port_url  # noqa: E402
from pipeline_fakes import FakeEvaluator  # noqa: E402
from search_fakes import GridProposer, ListProposer  # noqa: E402

from forge_pack.cli.search import search_command  # noqa: E402
from forge_pack.core.hotspot import Hotspot  # noqa: E402
from forge_pack.search.pipeline import Toolkit, _default_proposers  # noqa: E402
from forge_pack.core.signature import Signature, TensorSpec  # noqa: E402
from forge_pack.store.run_store import open_readonly  # noqa: E402
from forge_pack.core.verdict import Evaluation, Timing, Verdict  # noqa: E402

pytestmark = pytest.mark.llm

KEY = "sk-forge-e2e-SECRET-fedcba9876543210"
REPLIES = Path(__file__).parent / "llm_replies"


def reply(name: str) -> dict:
    return {"reply": (REPLIES / f"{name}.md").read_text()}


def hotspot() -> Hotspot:
    x = TensorSpec("float32", (64, 128), (128, 1))
    return Hotspot(Signature("softmax", (("x", x),), (("dim", 1),), x), ("F.softmax",), 1, 600.0, 600.0, 0.6)


class CompilingEvaluator(FakeEvaluator):
    """The template stand-in is correct and 1.1x; LLM candidates are compiled with g++ for real."""

    def __init__(self, run_dir):
        super().__init__(run_dir, 0.0)
        self.llm_builds: list[tuple[str, bool]] = []

    def evaluate(self, cand, h, baseline):
        if cand.origin not in ("llm", "repair"):
            return Evaluation(Verdict(True, "ok"), Timing(90.0, 1.0, 30, 89.0, "monotonic"), speedup_vs_eager=1.1,
                              speedup_vs_compile=1.0, bandwidth_fraction=0.1)
        from forge_pack.evaluate.compile import compile_candidate

        build = compile_candidate(cand, cache_dir=Path(self.log).parent / "build-cache")
        self.llm_builds.append((cand.origin, build.ok))
        if not build.ok:
            return Evaluation(Verdict(False, "compile_error", build.log[:2000]), compile_log=build.log)
        return Evaluation(Verdict(True, "ok"), Timing(25.0, 1.0, 30, 24.0, "monotonic"), speedup_vs_eager=4.0,
                          speedup_vs_compile=3.6, bandwidth_fraction=0.4)


class OneTemplate(ListProposer):
    """One template starting point and no template moves after it: the LLM's moves decide the tree,
    so every kind of LLM move (and the repair of the failed new family) is reached within the budget."""

    def __init__(self):
        super().__init__([{"f": 0, "a": 3, "b": 3, "c": 1}], name="templates")


def use_templates(monkeypatch, cls) -> None:
    """pipeline._default_proposers builds [TemplateProposer(), LLM]: a stand-in for the templates."""
    fake = types.ModuleType("forge_pack.search.templates_proposer")
    fake.TemplateProposer = cls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "forge_pack.search.templates_proposer", fake)


def toolkit(evaluators: list) -> Toolkit:
    def make_evaluator(config, run_dir, backend):
        ev = CompilingEvaluator(run_dir)
        evaluators.append(ev)
        return ev

    return Toolkit(
        load=lambda model, device, dtype: SimpleNamespace(device="cpu", path=model, model_hash="h", dtype=dtype),
        profile=lambda target, run_dir, quiet: SimpleNamespace(hotspots=[hotspot()], forward_us=1000.0),
        evaluator=make_evaluator,
        proposers=_default_proposers,  # the real wiring of --llm
        roots=lambda h, backend: [],
        env=lambda device: {"host": "test"},
    )


def scripted_server():
    """new family: 429, then a kernel that does not compile; its repair: a fixed kernel; the first
    rewrite: no reply at all (client timeout); later rewrites: garbage, then (fix turn) a good kernel."""
    calls = {"new": 0, "rewrite": 0}

    def respond(body: dict) -> dict:
        user = body["messages"][-1]["content"]
        if "rejected before compiling" in user:
            return reply("good_cpu")
        if "The kernel that failed" in user:
            return reply("fixed_cpu")
        if "Write a new kernel" in user:
            calls["new"] += 1
            return {"status": 429, "body": {"error": {"message": "slow down"}}} if calls["new"] == 1 \
                else reply("broken_cpu")
        calls["rewrite"] += 1
        return {"hang": 5} if calls["rewrite"] == 1 else reply("garbage")

    return FakeLLM(responder=respond)


def assert_key_absent(run_dir: Path) -> None:
    files = [f for f in run_dir.rglob("*") if f.is_file()]
    assert files
    for f in files:
        assert KEY.encode() not in f.read_bytes(), f"the API key leaked into {f}"


def test_search_with_llm_records_every_outcome_and_keeps_the_key_out(tmp_path, monkeypatch, capsys):
    use_templates(monkeypatch, OneTemplate)
    monkeypatch.setenv("FORGE_LLM_API_KEY", KEY)
    monkeypatch.chdir(tmp_path)  # forge.toml is read from the working directory
    (tmp_path / "forge.toml").write_text("[llm]\ntimeout_s = 1.0\nbackoff_s = 0.01\nbudget_usd = 3.0\n")
    evaluators: list = []
    with scripted_server() as srv:
        monkeypatch.setenv("FORGE_LLM_BASE_URL", srv.url)
        out: list[str] = []
        summary = search_command("m.py", run_dir=tmp_path / "run", budget=12, llm="fake-model",
                                 llm_budget_usd=1.0, toolkit=toolkit(evaluators), stdout=out.append)
    run_dir = tmp_path / "run"
    (o,) = summary.outcomes
    assert o.result is not None and o.result.evaluations <= 12
    assert ("llm", False) in evaluators[0].llm_builds and ("repair", True) in evaluators[0].llm_builds
    conn = open_readonly(run_dir)
    rows = [dict(r) for r in conn.execute("SELECT purpose, outcome, cost_usd FROM llm_calls ORDER BY id")]
    kinds = {r["move_kind"] for r in conn.execute("SELECT move_kind FROM nodes")}
    conn.close()
    outcomes = [(r["purpose"], r["outcome"]) for r in rows]
    assert outcomes[0] == ("new_family", "ok")  # after a 429 and a retry
    for expected in [("rewrite", "timeout"), ("repair", "ok"), ("rewrite", "unparseable"), ("fix_reply", "ok")]:
        assert expected in outcomes, outcomes
    assert {"llm", "repair", "root"} & kinds and "repair" in kinds and "llm" in kinds
    assert sum(r["cost_usd"] for r in rows) <= 1.0  # the flag's budget beat forge.toml's
    text = out[0]
    assert "LLM fake-model:" in text and "calls" in text and "LLM kernels passed verification" in text
    assert_key_absent(run_dir)
    assert KEY not in capsys.readouterr().err


def test_search_with_llm_endpoint_down_finishes_on_templates_and_says_why(tmp_path, monkeypatch):
    """The CLI itself: `forge-pack search m.py --llm MODEL` with nothing listening exits 0 on templates."""
    from typer.testing import CliRunner

    from forge_pack.search import pipeline
    from forge_pack.cli.main import app

    use_templates(monkeypatch, GridProposer)
    monkeypatch.setattr(pipeline, "Toolkit", lambda: toolkit([]))
    monkeypatch.setenv("FORGE_LLM_API_KEY", KEY)
    monkeypatch.setenv("FORGE_LLM_BASE_URL", free_port_url())
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, ["search", "m.py", "--budget", "6", "--llm", "fake-model", "--run-dir", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert "LLM moves are off" in res.stderr and "does not answer" in res.stderr and "templates only" in res.stderr
    assert "LLM moves stopped" in res.stdout and "does not answer" in res.stdout
    conn = open_readonly(run_dir)
    assert conn.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 6
    assert conn.execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0] == 0
    conn.close()
    assert KEY not in res.output
    assert_key_absent(run_dir)
