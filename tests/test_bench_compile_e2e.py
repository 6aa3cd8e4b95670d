"""bench/compile_e2e.py's report, from a measured row: ratios against eager and against torch.compile of
the same mode (the .pt2 against default), and the table with what was skipped."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import compile_e2e  # noqa: E402


def _t(ms: float) -> dict:
    return {"median_us": ms * 1e3, "iqr_us": 10.0, "n": 50}


ROW = {"model": "m", "package": "m_forge", "timing": {
    "eager": _t(10.0), "compile[default]": _t(5.0), "compile+package[default]": _t(4.0),
    "compile[max-autotune]": _t(4.0), "compile+package[max-autotune]": _t(5.0), ".pt2": _t(2.5),
    "eager+package": _t(8.0)},
    "compile_s": {"compile[default]": 30.0, "compile+package[default]": 33.0}, "export_s": 60.0,
    "max_abs_diff": {".pt2": 0.001}, "used": {"regions": {"r0": 2}}, "pt2": {"regions": {"r0": 2}},
    "skipped": ["compile+package[max-autotune]"], "errors": {}, "command": "python bench/compile_e2e.py x"}


def test_ratios_compare_each_variant_with_eager_and_with_compile_of_its_mode():
    r = compile_e2e.ratios(ROW)
    assert r["compile+package[default]"] == {"vs_eager": 2.5, "vs_compile": 1.25}
    assert r["compile+package[max-autotune]"] == {"vs_eager": 2.0, "vs_compile": 0.8}
    assert r[".pt2"] == {"vs_eager": 4.0, "vs_compile": 2.0}
    assert r["compile[default]"] == {"vs_eager": 2.0, "vs_compile": None}
    assert r["eager+package"] == {"vs_eager": 1.25, "vs_compile": None}


def test_the_table_shows_each_variant_the_export_time_and_what_was_skipped():
    md = compile_e2e.markdown([{**ROW, "ratios": compile_e2e.ratios(ROW)}], "cmd", {"torch": "2.14"})
    assert "| .pt2 | 2.500 | 0.010 | 4.00x | 2.00x | 60.0 | 0.001 |" in md
    assert "| compile+package[default] | 4.000 | 0.010 | 2.50x | 1.25x | 33.0 |  |" in md
    assert "Skipped (past --budget-s): compile+package[max-autotune]" in md
    assert "Command: `python bench/compile_e2e.py x`" in md


def _proc(code: int, stderr: str = "", stdout: str = ""):
    import subprocess

    return subprocess.CompletedProcess([], code, stdout, stderr)


def test_a_dead_worker_is_reported_with_its_status_and_stage():
    r = _proc(-11, f"{compile_e2e.STAGE}compile[default]\nlog line\n{compile_e2e.STAGE}.pt2 export\nlast words\n")
    said = compile_e2e._died(r)
    assert said.startswith("the worker ended (killed by signal 11) during .pt2 export:\n")
    assert "last words" in said and compile_e2e.STAGE not in said
    assert compile_e2e._died(_proc(1, "Traceback ...")) == "the worker ended (exit status 1):\nTraceback ..."


def test_a_worker_that_dies_in_the_export_is_run_again_without_it(tmp_path, monkeypatch):
    import json

    pkg = tmp_path / "pkg"
    (pkg / "m_forge").mkdir(parents=True)
    (pkg / "m_forge" / "_patch.py").write_text("")
    calls: list = []

    def run(cmd, **kw):
        calls.append(cmd)
        if "pip" in cmd:
            return _proc(0)
        if cmd[-1]:  # the .pt2 directory given: the export takes the worker down
            return _proc(-6, f"{compile_e2e.STAGE}.pt2 export\nabort\n")
        Path(cmd[9]).write_text(json.dumps({"timing": {}, "errors": {}}))
        return _proc(0)

    monkeypatch.setattr(compile_e2e.subprocess, "run", run)
    row = compile_e2e.one(Path("m.py"), pkg, "cuda", None, ["default"], 5, tmp_path, 100.0, True, {})
    assert len(calls) == 3 and calls[2][-1] == ""
    assert "error" not in row
    assert row["errors"][".pt2"].startswith("the worker ended (killed by signal 6) during .pt2 export")
    # a worker that dies elsewhere is not run again
    calls.clear()
    monkeypatch.setattr(compile_e2e.subprocess, "run",
                        lambda cmd, **kw: calls.append(cmd) or (_proc(0) if "pip" in cmd else
                                                                 _proc(1, f"{compile_e2e.STAGE}timing\nboom")))
    row = compile_e2e.one(Path("m.py"), pkg, "cuda", None, ["default"], 5, tmp_path, 100.0, True, {})
    assert len(calls) == 2 and row["error"].startswith("the worker ended (exit status 1) during timing")
