"""The CLI contract for every command: a user's problem is `error: ...` + `hint: ...` and exit 1, Ctrl-C
says it was interrupted (exit 130), never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FORGE = [sys.executable, "-m", "forge_pack"]
ROOT = Path(__file__).resolve().parent.parent

SLOW_MODEL = '''
import time
from pathlib import Path

import torch


class Model(torch.nn.Module):
    def forward(self, x):
        Path(__file__).with_suffix(".in_forward").touch()  # the test interrupts only once this exists
        time.sleep(60)  # long enough to be interrupted
        return torch.softmax(x, -1)


def get_inputs():
    return [torch.randn(4, 8)]
'''


def test_a_run_dir_under_a_file_is_an_error_not_a_traceback(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    r = subprocess.run([*FORGE, "profile", str(ROOT / "tests" / "models" / "llm_block.py"), "--device", "cpu",
                        "--run-dir", str(blocker / "run")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "error:" in r.stderr and "hint:" in r.stderr


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT")
def test_ctrl_c_in_any_command_says_interrupted(tmp_path):
    model = tmp_path / "slow.py"
    model.write_text(SLOW_MODEL)
    p = subprocess.Popen([*FORGE, "profile", str(model), "--device", "cpu", "--run-dir", str(tmp_path / "run")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    # inside the model's forward, however long a loaded machine takes to import torch and get there
    deadline = time.time() + 300
    while time.time() < deadline and not model.with_suffix(".in_forward").exists() and p.poll() is None:
        time.sleep(0.2)
    assert p.poll() is None and model.with_suffix(".in_forward").exists(), p.communicate()[1][-3000:]
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    assert "error: interrupted" in err and "Traceback" not in err, err[-3000:]


@pytest.mark.slow  # > 10 s on 2 cores
def test_check_refuses_bad_input_up_front(tmp_path):
    binary = tmp_path / "k.cpp"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    kernel = ROOT / "tests" / "kernels" / "cpu_low_precision.cpp"
    cases = [
        (["check", str(binary), "--op", "softmax", "--signature", "x: f32[4,8], dim=-1"], "not UTF-8"),
        (["check", str(kernel), "--op", "softmax", "--signature", "x: f32[4,8], dim=-1", "--timeout", "0"],
         "positive number of seconds"),
        (["check", str(kernel), "--op", "softmax", "--signature", "x: f32[4,8], dim=-1", "--dtype", "int8"],
         "'int8' in --dtype"),
        (["check", str(kernel), "--op", "softmax", "--signature", "x: f32[0,8], dim=-1"], "empty tensor"),
    ]
    for args, expect in cases:
        r = subprocess.run([*FORGE, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 1 and expect in r.stderr and "hint:" in r.stderr, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr


def test_build_and_pack_refuse_an_unknown_compile_mode_before_any_work(tmp_path):
    model = ROOT / "tests" / "models" / "llm_block.py"
    cases = [(["build", str(model), "--out", str(tmp_path / "o"), "--device", "cpu", "--compile-modes", "default,fast"],
              "unknown torch.compile mode 'fast'"),
             (["pack", str(tmp_path / "no_run"), "--out", str(tmp_path / "o"), "--compile-modes", "reduce-overhead"],
              "--compile-modes must include default")]
    for args, expect in cases:
        r = subprocess.run([*FORGE, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 1 and expect in r.stderr and "hint:" in r.stderr, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and not (tmp_path / "o").exists() and not (tmp_path / "runs").exists()
