"""Elapsed-time progress on long steps (forge_pack.core.progress_line), captured as a user sees it."""

from __future__ import annotations

import io
import re
import time

import pytest

from forge_pack.core.progress_line import step


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_short_step_prints_nothing():
    out = io.StringIO()
    with step("confirming", stream=out, show_after_s=5.0, tick_s=0.01):
        time.sleep(0.05)
    assert out.getvalue() == ""


def test_a_long_step_logs_elapsed_time_and_its_duration():
    out = io.StringIO()
    with step("whole-model check", stream=out, show_after_s=0.05, log_every_s=0.1, tick_s=0.02):
        time.sleep(0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(l.startswith("  whole-model check: ") for l in lines), lines
    assert all(l.endswith(" s so far") for l in lines[:-1]) and lines[-1].startswith("  whole-model check: done in ")
    took = float(lines[-1].split("done in ")[1].split()[0])
    assert 0.5 <= took < 5.0


def test_a_terminal_gets_a_redrawn_spinner_cleared_before_other_lines():
    out = Tty()
    with step("pip wheel", stream=out, show_after_s=0.05, tick_s=0.02) as s:
        time.sleep(0.2)
        s.say("  dropped t1: slower")
        time.sleep(0.2)
    text = out.getvalue()
    assert "\r  pip wheel | " in text or "\r  pip wheel / " in text
    # the redrawn line is erased ("\r\x1b[K") right before a said line and before the closing line
    assert "\r\x1b[K  dropped t1: slower\n" in text
    assert re.search(r"\r\x1b\[K  pip wheel: done in \d+\.\d s\n$", text), repr(text[-80:])


def test_a_failing_step_says_how_long_it_ran():
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with step("compile-mode check", stream=out, show_after_s=0.0, tick_s=0.01):
            raise RuntimeError("boom")
    assert out.getvalue().startswith("  compile-mode check: failed after ")
