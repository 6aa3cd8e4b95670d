"""pytest plugin for mutation runs: credit the current test with the functions its worker
subprocesses ran (their hits, written by sitecustomize.py in this folder) during mutmut's stats pass."""

import os
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    hits_dir = os.environ.get("FORGE_MUTMUT_HITS")
    if not hits_dir or os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    from mutmut.state import state

    # Hits a worker writes during a module fixture's teardown (after this) are credited to the
    # next test, which reuses or restarts that worker anyway.
    for f in Path(hits_dir).glob("*.hits"):
        try:
            names = f.read_text().split()
            f.unlink()
        except OSError:
            continue
        state()._stats.update(names)
