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


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """mutmut forks each mutant's test run from the process that ran the stats pass. Whatever that pass cached (the
    lru_cache'd region specs and the rounding units each holds, parsed signatures, ...) would answer for the
    original code, and a mutant inside it would never run: every run of a mutant starts with forge_pack's caches
    empty."""
    if os.environ.get("MUTANT_UNDER_TEST") in (None, "", "stats", "list_all_tests"):
        return
    import sys

    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("forge_pack"):
            continue
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)) and hasattr(value, "cache_info"):
                value.cache_clear()
