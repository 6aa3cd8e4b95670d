"""`make test`'s xdist scheduling (tests/xdist_schedule.py): long modules first, and a worker that dies
under ``-n --dist loadscope`` costs one failed test, not the run.

tests/xdist_schedule.py replaces xdist's loadscope scheduler; without it this suite hangs in
pytest-xdist 3.8.0 (the subprocess's timeout fails the test) or reruns the crashing test.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("xdist")

TESTS = Path(__file__).resolve().parent

SUITE = {
    "test_a.py": "def test_a1(): pass\ndef test_a2(): pass\ndef test_a3(): pass\n",
    "test_b.py": "import os\ndef test_b_crash(): os._exit(1)\ndef test_b_after(): pass\n",
    "test_c.py": "def test_c1(): pass\n",
    "test_d.py": "import os\ndef test_d1(): pass\ndef test_d_crash(): os._exit(3)\n",
    "test_e.py": "import time\ndef test_e1(): time.sleep(0.3)\ndef test_e2(): pass\n",
}


def _write_suite(root: Path) -> None:
    for name, text in SUITE.items():
        (root / name).write_text(text)
    (root / "conftest.py").write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from xdist_schedule import pytest_xdist_make_scheduler
        """))
    (root / "pytest.ini").write_text("[pytest]\n")


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_crashed_workers_cost_their_test_and_the_rest_of_the_run_completes(tmp_path, workers):
    _write_suite(tmp_path)
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            "-n", str(workers), "--dist", "loadscope", "-rf"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the suite hung after a worker crash: {(e.stdout or '')[-2000:]}")
    out = r.stdout + r.stderr
    assert "INTERNALERROR" not in out, out[-4000:]
    assert r.returncode == 1, out[-4000:]
    assert "2 failed, 8 passed" in out, out[-4000:]
    failed = sorted(line.split()[1] for line in out.splitlines() if line.startswith("FAILED "))
    assert failed == ["test_b.py::test_b_crash", "test_d.py::test_d_crash"], out[-4000:]


def test_other_dist_modes_keep_xdist_s_own_scheduler():
    from xdist_schedule import pytest_xdist_make_scheduler

    class Config:
        def __init__(self, dist):
            self.dist = dist

        def getvalue(self, name):
            assert name == "dist"
            return self.dist

    assert pytest_xdist_make_scheduler(Config("load"), None) is None
    assert pytest_xdist_make_scheduler(Config("loadfile"), None) is None


class _Item:
    def __init__(self, nodeid: str, slow: bool = False, skipped: bool = False):
        self.nodeid = nodeid
        self.keywords = {"slow": True} if slow else {}
        self._markers = [pytest.mark.skip(reason="x").mark] if skipped else []

    def iter_markers(self):
        return iter(self._markers)


def test_longest_first_puts_running_slow_scopes_first_then_by_count_keeping_each_scope_together():
    from xdist_schedule import longest_first

    items = [_Item("t_a.py::a1"), _Item("t_a.py::a2"),
             _Item("t_b.py::b1"), _Item("t_b.py::b2"), _Item("t_b.py::b3"),
             _Item("t_c.py::c1", slow=True),
             _Item("t_d.py::K::d1"), _Item("t_d.py::K::d2", slow=True, skipped=True),  # a skipped slow test
             _Item("t_e.py::e1"), _Item("t_e.py::e2", slow=True)]
    longest_first(items)
    assert [i.nodeid for i in items] == ["t_e.py::e1", "t_e.py::e2", "t_c.py::c1",
                                         "t_b.py::b1", "t_b.py::b2", "t_b.py::b3",
                                         "t_a.py::a1", "t_a.py::a2", "t_d.py::K::d1", "t_d.py::K::d2"]
