"""CI's guard on the mutation scores: re-run mutmut on the trust-core modules whose tests are fast
in-process unit tests (core/verdict.py and evaluate/{tolerance,static_check,model_gate,verify,timing}.py:
CHECK_MODULES in bench/mutation.sh) on a daily-rotating fifth of their mutants and fail on a survivor
that bench/results/mutation.json does not list.

Minutes on 2 cores (docs/testing.md), so marked slow (the `-m "not slow"` path skips it; `make test`
and CI run it). The other measured modules (verdict_rules: 1500+ mutants; object_check: compiles,
needs nvcc; evaluate and the package's verify: slower per mutant) are measured by `make mutation`.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the subprocess's own limit is 1200 s
def test_mutation_scores_of_the_fast_trust_core_modules_do_not_drop():
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or shutil.which("mutmut")
    if mutmut is None:
        if os.environ.get("CI"):
            pytest.fail("mutmut is not installed: CI installs the `dev` extra (make test)")
        pytest.skip("mutmut is not installed (pip install -e .[dev])")
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("bench/mutation.sh copies the tree with git ls-files: needs a git checkout")
    # A fifth of the mutants (numbers ending in two digits that rotate daily, so five days cover every
    # one): each must be killed, equivalent or a survivor bench/results/mutation.json already lists.
    # `make mutation-check` runs them all.
    k = time.gmtime().tm_yday
    digits = "".join(sorted({str(k % 5), str(k % 5 + 5)}))
    env = dict(os.environ, PYTHON=sys.executable, MUTMUT=mutmut, MUTATION_SAMPLE=os.environ.get("MUTATION_SAMPLE", digits))
    r = subprocess.run(["bash", str(ROOT / "bench" / "mutation.sh"), "--check"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
    print(r.stdout[-4000:])
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    for path in ("core/verdict", "evaluate/tolerance", "evaluate/static_check", "evaluate/model_gate",
                 "evaluate/verify", "evaluate/timing"):
        assert f"forge_pack/{path}.py: " in r.stdout, r.stdout
    assert "DROPPED" not in r.stdout
