"""Loaded by every Python process of a mutation run (bench/mutation.sh puts this folder on PYTHONPATH).

mutmut learns which tests reach a function by recording trampoline hits in the pytest process. The
evaluator's worker subprocesses (``python -m forge_pack.evaluate.worker``) run verify/evaluate/timing code
that the pytest process never calls, so their hits would be lost and those mutants reported as
"no tests". During mutmut's stats pass (MUTANT_UNDER_TEST=stats) this appends each hit of such a
process to a file under $FORGE_MUTMUT_HITS; forge_mutmut_hits.py (a pytest plugin in the pytest
process) folds them into mutmut's record at the end of each test. Inert outside a stats pass.
"""

import os

_DIR = os.environ.get("FORGE_MUTMUT_HITS")

if _DIR and os.environ.get("MUTANT_UNDER_TEST") == "stats":
    try:
        from mutmut.mutation import trampoline as _trampoline
    except ImportError:  # mutmut not installed in this interpreter: nothing to record
        _trampoline = None

    if _trampoline is not None:
        # The pytest process started before the stats pass set MUTANT_UNDER_TEST, so only the
        # subprocesses started during it (the workers) get here.
        def _record_to_file(name, caller=None):
            with open(os.path.join(_DIR, f"{os.getpid()}.hits"), "a") as f:
                f.write(name + "\n")

        _trampoline.record_trampoline_hit = _record_to_file
