"""The whole-model gain gate of `build`/`pack` ("no whole-model gain: no package written", exit 0, or
--allow-no-gain) and `build --from-run RUN_DIR` (reuse a search: pack a finished one, continue an
unfinished one, refuse a run of another model file). Fast: the confirmation and the whole-model check
are replaced by fixed results, the search by the fake toolkit."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers  # noqa: E402
from pipeline_fakes import fake_toolkit  # noqa: E402

from forge_pack.cli import build as build_mod  # noqa: E402
from forge_pack.cli.main import app  # noqa: E402
from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.evaluate import confirm  # noqa: E402
from forge_pack.evaluate.model_gain import judge_gain  # noqa: E402
from forge_pack.pack.packager import PackResult  # noqa: E402
from forge_pack.search.config import save_config  # noqa: E402
from forge_pack.search.pipeline import RunConfig  # noqa: E402
from forge_pack.store.run_store import Store  # noqa: E402


def _model_result(eager_ms: float, patched_ms: float, iqr_ms: float = 0.1, n: int = 30) -> dict:
    def t(ms):
        return {"median_us": ms * 1e3, "iqr_us": iqr_ms * 1e3, "n": n, "min_us": ms * 1e3, "clock": "monotonic"}

    return {"eager": t(eager_ms), "patched": t(patched_ms), "speedup": eager_ms / patched_ms, "max_abs_diff": 1e-7,
            "output_kind": "tensor", "argmax_agreement": None, "within_tolerance": True, "kernel_calls": {"t0": 1},
            "fallback_calls": {}, "accuracy": {"basis": "element-wise against eager"}}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return helpers.make_cpu_run(tmp_path_factory.mktemp("run") / "run")


def _compiled(used: list[str], plain_ms: float = 10.0, with_ms: float = 8.0) -> dict:
    """What the compile gate's subprocess returns (compile_gate.measure): `used` faster compiled."""
    def t(ms):
        return {"median_us": ms * 1e3, "iqr_us": 10.0, "n": 30, "min_us": ms * 1e3, "clock": "monotonic"}

    return {"targets": {tid: {"use": True, "reason": "faster compiled", "compiled_ms": plain_ms,
                              "compiled_with_ms": with_ms} for tid in used},
            "used": used, "compile_s": 1.0, "mode": "default", "compiled_max_abs_diff": 0.0,
            "compiled": t(plain_ms), "compiled_with": t(with_ms) if used else None,
            "compile_with_s": 1.1 if used else None, "max_abs_diff": 0.0 if used else None,
            "within_tolerance": True if used else None}


@pytest.fixture
def gated(monkeypatch):
    """Confirmation keeps every winner; the whole-model check passes on accuracy and reports the
    timing the test sets (``gated["result"]``); the compiled check reports ``gated["compiled"]`` (by
    default: no kernel faster compiled)."""
    from forge_pack.evaluate import compile_gate

    state = {"result": _model_result(13.753, 16.269), "checks": 0, "compiled": _compiled([])}
    monkeypatch.setattr(confirm, "confirm_kernels", lambda info, winners, say=None: {})

    def check_model(stage, name, info, only=None):
        state["checks"] += 1
        return state["result"]

    monkeypatch.setattr(confirm, "check_model", check_model)
    real_gate = compile_gate.run_compile_gate
    monkeypatch.setattr(compile_gate, "run_compile_gate", lambda stage, info, doc, say=None, modes=None: real_gate(
        stage, info, doc, check=lambda package_dir, info: state["compiled"]))
    return state


# ------------------------------------------------------------------ the gain rule


def test_gain_needs_a_difference_beyond_two_standard_errors():
    assert judge_gain(_model_result(10.0, 8.0)).gain  # 2 ms apart, noise 2 * 0.93 * 0.1 * sqrt(2/30) ms
    slower = judge_gain(_model_result(13.753, 16.269))
    assert not slower.gain and slower.reason.startswith("the patched model is not faster: 13.753 ms eager (IQR 0.100, "
                                                        "n=30) -> 16.269 ms patched (IQR 0.100, n=30), 0.85x")
    # 0.04 ms faster, noise 2 * sqrt(2) * 0.93 * 0.5 / sqrt(30) = 0.240 ms
    noisy = judge_gain(_model_result(10.04, 10.0, iqr_ms=0.5))
    assert not noisy.gain and "faster by less than the measurement noise (0.240 ms)" in noisy.reason
    assert judge_gain(None).reason == "the whole model was not timed"


# ------------------------------------------------------------------ build / pack with no gain


def test_pack_writes_no_package_when_the_whole_model_is_slower(cpu_run, tmp_path, gated):
    out = []
    r = build_mod.pack_command(cpu_run, tmp_path / "out", name="tiny_pkg", stdout=out.append)
    assert not r.written and not (tmp_path / "out").exists()
    text = out[0]
    assert text.splitlines() == [
        "no whole-model gain: no package written (eager: the patched model is not faster: 13.753 ms eager (IQR "
        "0.100, n=30) -> 16.269 ms patched (IQR 0.100, n=30), 0.85x; compiled: no kernel is faster inside "
        "torch.compile's graph than Inductor's own code).", "  --allow-no-gain writes the package anyway"]
    assert r.model_result["speedup"] == pytest.approx(13.753 / 16.269)


def test_allow_no_gain_writes_the_package_and_says_so(cpu_run, tmp_path, gated):
    out = []
    r = build_mod.pack_command(cpu_run, tmp_path / "out", name="tiny_pkg", allow_no_gain=True, stdout=out.append)
    assert r.written and (tmp_path / "out" / "tiny_pkg" / "manifest.json").is_file()
    assert "gate: no whole-model gain: the patched model is not faster" in out[0]
    assert "note: written because --allow-no-gain was given" in out[0]


def test_a_measured_gain_writes_the_package(cpu_run, tmp_path, gated):
    gated["result"] = _model_result(10.0, 8.0)
    out = []
    r = build_mod.pack_command(cpu_run, tmp_path / "out", name="tiny_pkg", stdout=out.append)
    assert r.written and "gate: whole-model gain: the patched model is faster by more than the measurement noise" \
        in out[0]
    assert "written because" not in out[0]


def test_a_compile_mode_gain_writes_the_package_without_an_eager_gain(cpu_run, tmp_path, gated):
    """Regions run only compiled, and a kernel can lose to eager's dispatch yet win inside Inductor's
    graph: a package whose compile mode is faster than torch.compile is written, and says which mode."""
    tid = "t0"  # the first target's id (packager: t0, t1, ... in the manifest)
    gated["compiled"] = _compiled([tid])
    out = []
    r = build_mod.pack_command(cpu_run, tmp_path / "out", name="tiny_pkg", stdout=out.append)
    assert r.written and (tmp_path / "out" / "tiny_pkg" / "manifest.json").is_file()
    assert "gate: no whole-model gain: the patched model is not faster" in out[0]
    assert (f"  written for compile mode: torch.compile 10.000 ms -> 8.000 ms with {tid} (1.25x, faster by more "
            f"than the measurement noise); eager `apply()` gains nothing measurable here, use "
            f"`tiny_pkg.compile(model)`") in out[0].splitlines()
    assert "written because" not in out[0]
    import json

    doc = json.loads((tmp_path / "out" / "tiny_pkg" / "manifest.json").read_text())
    assert [t["compile"]["use"] for t in doc["targets"] if t["id"] == tid] == [True]
    assert doc["compile_result"]["used"] == [tid]


def test_judge_compile_gain_reads_the_compile_gates_summary():
    from forge_pack.evaluate.compile_gate import record
    from forge_pack.evaluate.model_gain import judge_compile_gain

    def summary(result):
        return record({"targets": [{"id": "t0"}], "regions": []}, result)

    gain = judge_compile_gain(summary(_compiled(["t0"], 10.0, 8.0)))
    assert gain.gain and gain.speedup == pytest.approx(1.25)
    none = judge_compile_gain(summary(_compiled([])))
    assert not none.gain and none.reason == "no kernel is faster inside torch.compile's graph than Inductor's own code"
    err = judge_compile_gain(summary({"error": "torch.compile failed: Unsupported\nmore"}))
    assert not err.gain and err.reason == "compile mode unavailable: torch.compile failed: Unsupported"
    assert judge_compile_gain(None).reason == "the model was not checked compiled"


def test_cli_no_gain_exits_zero_and_allow_no_gain_writes(cpu_run, tmp_path, gated):
    runner = CliRunner()
    r = runner.invoke(app, ["pack", str(cpu_run), "--out", str(tmp_path / "a"), "--name", "tiny_pkg"])
    assert r.exit_code == 0, r.output
    assert "no whole-model gain: no package written" in r.output and not (tmp_path / "a").exists()
    r = runner.invoke(app, ["pack", str(cpu_run), "--out", str(tmp_path / "b"), "--name", "tiny_pkg",
                            "--allow-no-gain"])
    assert r.exit_code == 0, r.output
    assert "written because --allow-no-gain was given" in r.output and (tmp_path / "b" / "tiny_pkg").is_dir()


# ------------------------------------------------------------------ build --from-run


def _finished_run(cpu_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(cpu_run, run)
    save_config(run, RunConfig(model=str(helpers.TINY_MODEL), device="cpu", budget=4, run_dir=str(run)))
    return run


def test_from_run_packs_a_finished_run_without_searching(cpu_run, tmp_path, gated, monkeypatch):
    import forge_pack.search.pipeline as pipeline

    def no_search(*a, **k):
        raise AssertionError("a finished run is packed as it is, not searched again")

    monkeypatch.setattr(pipeline, "run", no_search)
    run = _finished_run(cpu_run, tmp_path)
    gated["result"] = _model_result(10.0, 8.0)
    out = []
    r = build_mod.build_command(str(helpers.TINY_MODEL), tmp_path / "out", name="tiny_pkg", from_run=run,
                                stdout=out.append)
    assert r.written and gated["checks"] == 1 and (tmp_path / "out" / "tiny_pkg").is_dir()
    assert "gate: whole-model gain" in out[-1]


def test_from_run_goes_through_the_gain_gate(cpu_run, tmp_path, gated):
    run = _finished_run(cpu_run, tmp_path)
    out = []
    r = build_mod.build_command(str(helpers.TINY_MODEL), tmp_path / "out", name="tiny_pkg", from_run=run,
                                stdout=out.append)
    assert not r.written and out[-1].startswith("no whole-model gain: no package written")


def test_from_run_refuses_a_run_of_another_model_file(cpu_run, tmp_path, gated):
    run = _finished_run(cpu_run, tmp_path)
    with pytest.raises(ForgeError) as e:
        build_mod.build_command(str(helpers.E2E_MODEL), tmp_path / "out", from_run=run)
    assert e.value.message == (f"the run in {run} searched another model file ({helpers.TINY_MODEL}), "
                               f"not {helpers.E2E_MODEL}")
    assert f"forge-pack build {helpers.TINY_MODEL} --from-run {run}" in e.value.hint
    assert not (tmp_path / "out").exists() and gated["checks"] == 0


def test_from_run_refuses_a_model_changed_since_the_run(cpu_run, tmp_path, gated):
    model = tmp_path / "m.py"
    shutil.copy(helpers.TINY_MODEL, model)
    run = _finished_run(cpu_run, tmp_path)
    with Store(run) as s:
        s.execute("UPDATE runs SET model_path=?", (str(model),))
    model.write_text(model.read_text() + "\n# edited\n")
    with pytest.raises(ForgeError) as e:
        build_mod.build_command(str(model), tmp_path / "out", from_run=run)
    assert e.value.message.startswith(f"{model} changed since the run in {run} profiled it")


def test_from_run_refuses_search_choices_and_a_second_run_dir(tmp_path):
    with pytest.raises(ForgeError, match="cannot change with --from-run"):
        build_mod.build_command(str(helpers.TINY_MODEL), tmp_path / "out", from_run=tmp_path, top=2)
    with pytest.raises(ForgeError, match="--regions cannot change with --from-run"):  # the run chose op or region targets
        build_mod.build_command(str(helpers.TINY_MODEL), tmp_path / "out", from_run=tmp_path, regions=True)
    with pytest.raises(ForgeError, match="--from-run reuses the run in its own directory"):
        build_mod.build_command(str(helpers.TINY_MODEL), tmp_path / "out", from_run=tmp_path, run_dir=tmp_path / "x")


def test_from_run_continues_an_interrupted_search_then_packs(tmp_path, monkeypatch):
    import forge_pack.search.pipeline as pipeline
    from forge_pack.cli.search import search_command

    run = tmp_path / "r"
    search_command("m.py", run_dir=run, budget=2, toolkit=fake_toolkit(), stdout=lambda s: None)
    with Store(run) as s:
        s.execute("UPDATE runs SET status='interrupted'")
    resumed, packed = [], []
    real_run = pipeline.run
    monkeypatch.setattr(pipeline, "run", lambda config, **k: resumed.append(k["resume"]) or real_run(config, **k))
    monkeypatch.setattr(build_mod, "check_run_model", lambda run_dir, model: None)  # the fake run has no real file
    monkeypatch.setattr(build_mod, "pack", lambda rd, out, name, **k: packed.append((rd, k["require_gain"])) or
                        PackResult(False, "no whole-model gain: no package written (test)."))
    out = []
    build_mod.build_command("m.py", tmp_path / "out", name="m_forge", from_run=run, toolkit=fake_toolkit(),
                            stdout=out.append)
    assert resumed == [True] and packed == [(str(run), True)]
    assert "Projected whole-model speedup" in out[0]


def test_from_run_with_a_larger_budget_searches_on(tmp_path, monkeypatch):
    from forge_pack.cli.search import search_command

    run = tmp_path / "r"
    search_command("m.py", run_dir=run, budget=2, toolkit=fake_toolkit(), stdout=lambda s: None)
    before = (run / "calls.log").read_text().count("\n")
    monkeypatch.setattr(build_mod, "check_run_model", lambda run_dir, model: None)
    monkeypatch.setattr(build_mod, "pack", lambda rd, out, name, **k: PackResult(False, "test"))
    build_mod.build_command("m.py", tmp_path / "out", name="m_forge", from_run=run, budget=4, toolkit=fake_toolkit(),
                            stdout=lambda s: None)
    assert (run / "calls.log").read_text().count("\n") > before


# ------------------------------------------------------------------ the real thing, on the CPU


@pytest.mark.slow
def test_cli_search_then_build_from_run_packs_without_searching_again(tmp_path, cli_env, forge_cmd):
    import json
    import subprocess

    model = Path(__file__).resolve().parent / "models" / "norm_head.py"
    run, out = tmp_path / "run", tmp_path / "pkg"
    r = subprocess.run([*forge_cmd, "search", str(model), "--device", "cpu", "--budget", "3", "--top", "1",
                        "--run-dir", str(run)], capture_output=True, text=True, env=cli_env, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    r = subprocess.run([*forge_cmd, "build", str(helpers.E2E_MODEL), "--from-run", str(run), "--out", str(out)],
                       capture_output=True, text=True, env=cli_env, timeout=900)
    assert r.returncode == 1 and r.stderr.startswith(f"error: the run in {run} searched another model file")
    r = subprocess.run([*forge_cmd, "build", str(model), "--from-run", str(run), "--out", str(out), "--name", "nh",
                        "--allow-no-gain", "--json"], capture_output=True, text=True, env=cli_env, timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"reusing the finished search in {run} (no new search)" in r.stderr
    assert not any(line.startswith(("timing eager", "[profile]", "[1/1]")) for line in r.stderr.splitlines())
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["run_dir"] == str(run) and doc["search"]["hotspots"]
    if not doc["pack"]["written"]:  # a busy CPU may find nothing faster in 3 evaluations: said plainly
        assert doc["pack"]["message"].startswith("No faster kernel") and not out.exists()
        pytest.skip("no kernel beat eager on this machine: " + doc["pack"]["message"])
    assert (out / "nh" / "manifest.json").is_file() and doc["pack"]["model_result"]["within_tolerance"]
    assert "confirming 1 winning kernel on unseen inputs" in r.stderr
