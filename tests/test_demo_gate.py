"""`make demo` (forge_pack.cli.demo) shows the whole-model gate's verdict; when the gate wrote no
package it says so and why, installs nothing and exits 0."""

from __future__ import annotations

import subprocess

import pytest

from forge_pack.cli import build as build_mod
from forge_pack.cli import demo
from forge_pack.pack.packager import PackResult


def _timed(eager_ms: float, patched_ms: float) -> dict:
    def t(ms):
        return {"median_us": ms * 1e3, "iqr_us": 100.0, "n": 30, "min_us": ms * 1e3, "clock": "monotonic"}

    return {"eager": t(eager_ms), "patched": t(patched_ms), "speedup": eager_ms / patched_ms}


@pytest.fixture
def no_install(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the demo installs nothing when no package was written")

    monkeypatch.setattr(subprocess, "run", refuse)


def test_demo_without_a_gain_says_no_package_and_exits_zero(monkeypatch, capsys, no_install, tmp_path):
    slow = PackResult(False, "no whole-model gain: no package written (the patched model is not faster: ...).",
                      model_result=_timed(13.753, 16.269))
    monkeypatch.setattr(build_mod, "build_command", lambda *a, **k: slow)
    assert demo.main(["m.py", "--out", str(tmp_path / "pkg")]) == 0
    out = capsys.readouterr().out
    assert ("demo: the whole-model gate wrote no package: the patched model is not faster: 13.753 ms eager "
            "(IQR 0.100, n=30) -> 16.269 ms patched (IQR 0.100, n=30), 0.85x") in out
    assert "demo: nothing to install; the model stays as it is" in out and "pip install" not in out


def test_demo_without_a_winner_says_why(monkeypatch, capsys, no_install, tmp_path):
    none = PackResult(False, "No faster kernel to pack, so no package was written (softmax: 0.90x).")
    monkeypatch.setattr(build_mod, "build_command", lambda *a, **k: none)
    assert demo.main(["m.py", "--out", str(tmp_path / "pkg")]) == 0
    out = capsys.readouterr().out
    assert "demo: no package written: No faster kernel to pack, so no package was written (softmax: 0.90x)." in out


def test_demo_with_a_gain_shows_the_gate_passed(monkeypatch, capsys, tmp_path):
    ran = []
    written = PackResult(True, "Wrote it.", out_dir=str(tmp_path / "pkg"), package="m_forge",
                         model_result=_timed(10.0, 8.0))
    monkeypatch.setattr(build_mod, "build_command", lambda *a, **k: written)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert demo.main(["m.py", "--out", str(tmp_path / "pkg")]) == 0
    out = capsys.readouterr().out
    assert "demo: the whole-model gate passed: the patched model is faster by more than the measurement noise" in out
    assert [c[2:4] for c in ran] == [["pip", "install"], ["forge_pack.cli.demo", "show"]]


def test_show_says_when_the_installed_package_gives_no_gain(capsys):
    r = {"package": "p", "model": "m.py", "device": "cpu", "applied": True, "kernel_calls": {"t0": 1},
         "before": [], "after": [], "max_abs_diff": 0.0, "within_tolerance": True, "bitwise_after_revert": True,
         "eager_ms": 13.753, "patched_ms": 14.6, **_timed(13.753, 14.6)}
    demo.print_show(r)
    assert "latency: 13.753 ms eager -> 14.600 ms patched (0.94x): no gain here (the patched model is not faster" \
        in capsys.readouterr().out
