"""bench/_common.commit: the commit a result was measured at says when the tree differed from it (the device
machine runs a copy of the working tree whose git HEAD can be older)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import _common  # noqa: E402


@pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")
def test_commit_names_head_and_counts_the_files_that_differ_from_it(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("a = 1\n")
    (tmp_path / "b.py").write_text("b = 1\n")
    git("add", "a.py", "b.py")
    git("commit", "-qm", "first")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    monkeypatch.setattr(_common, "ROOT", tmp_path)
    (tmp_path / "untracked.py").write_text("")  # untracked files are not the measured code's difference
    assert _common.commit() == head
    (tmp_path / "a.py").write_text("a = 2\n")
    (tmp_path / "b.py").write_text("b = 2\n")
    assert _common.commit() == f"{head} + uncommitted changes to 2 files"
    monkeypatch.setattr(_common, "ROOT", tmp_path / "nowhere")
    assert _common.commit() is None
