"""--force (issue 17 item 6): it replaces a package directory forge-pack wrote, and nothing else.
The run directory, a folder holding it, a folder of the user's: refused with error + hint, exit 1,
everything left in place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.pack.packager import PACKAGE_MARKER, check_out_dir, pack  # noqa: E402


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return helpers.make_cpu_run(tmp_path_factory.mktemp("force") / "runs" / "run")


def _snapshot(d: Path) -> dict:
    """Every file and its bytes, less SQLite's -wal/-shm (a read-only open makes them)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and not p.name.startswith("run.db-")}


def test_pack_into_the_run_directory_is_refused_even_with_force(cpu_run):
    before = _snapshot(cpu_run)
    with pytest.raises(ForgeError) as e:
        pack(cpu_run, cpu_run, "p", force=True, confirm=False)
    assert e.value.message == (f"--out {cpu_run.resolve()} is the run directory {cpu_run.resolve()}: writing the "
                               "package there would delete the run store and its captured inputs")
    assert "outside the run directory" in e.value.hint
    assert _snapshot(cpu_run) == before


def test_pack_into_a_parent_of_the_run_is_refused_even_with_force(cpu_run):
    parent = cpu_run.parent
    (parent / "notes.txt").write_text("mine")
    with pytest.raises(ForgeError, match=r"holds the run directory"):
        pack(cpu_run, parent, "p", force=True, confirm=False)
    assert (parent / "notes.txt").read_text() == "mine" and (cpu_run / "run.db").is_file()
    with pytest.raises(ForgeError, match=r"holds the run directory"):
        pack(cpu_run, parent.parent, "p", force=True, confirm=False)


def test_force_refuses_a_directory_forge_pack_did_not_write(cpu_run, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(ForgeError) as e:
        pack(cpu_run, out, "p", force=True, confirm=False)
    assert e.value.message == (f"--force replaces only a package directory forge-pack wrote, and {out} is not one "
                               f"(it has no {PACKAGE_MARKER})")
    assert e.value.hint.startswith("choose another --out")
    assert (out / "thesis.tex").read_text() == "years of work"


def test_a_marker_that_is_not_ours_does_not_count(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / PACKAGE_MARKER).write_text("hello")
    (out / "x").write_text("x")
    with pytest.raises(ForgeError, match="is not one"):
        check_out_dir(out, True)


def test_force_replaces_a_package_forge_pack_wrote_and_an_empty_directory(cpu_run, tmp_path):
    out = tmp_path / "pkg"
    assert pack(cpu_run, out, "p", confirm=False).written
    assert (out / PACKAGE_MARKER).is_file()
    (out / "stale.txt").write_text("left by an older package")
    with pytest.raises(ForgeError, match="already exists"):
        pack(cpu_run, out, "p", confirm=False)
    assert pack(cpu_run, out, "p", force=True, confirm=False).written
    assert not (out / "stale.txt").exists() and (out / "p" / "manifest.json").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert pack(cpu_run, empty, "p", force=True, confirm=False).written


def _cli(forge_cmd, cli_env, *args):
    return subprocess.run([*forge_cmd, *map(str, args)], capture_output=True, text=True, env=cli_env, timeout=120)


def test_cli_pack_run_out_run_force_exits_1_and_keeps_the_run(cpu_run, cli_env, forge_cmd):
    before = _snapshot(cpu_run)
    r = _cli(forge_cmd, cli_env, "pack", cpu_run, "--out", cpu_run, "--force", "--no-confirm")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"error: --out {cpu_run.resolve()} is the run directory" in r.stderr
    assert "hint: choose an --out outside the run directory" in r.stderr
    assert _snapshot(cpu_run) == before


@pytest.mark.parametrize("where", ["run", "parent"])
def test_cli_build_out_over_its_run_dir_is_refused_before_any_search(tmp_path, cli_env, forge_cmd, where):
    run = tmp_path / "work" / "run"
    run.mkdir(parents=True)
    (run / "keep.txt").write_text("k")
    (tmp_path / "work" / "other.txt").write_text("o")
    out = run if where == "run" else run.parent
    r = _cli(forge_cmd, cli_env, "build", helpers.TINY_MODEL, "--device", "cpu", "--run-dir", run, "--out", out,
             "--force")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    what = "is" if where == "run" else "holds"
    assert f"error: --out {out.resolve()} {what} the run directory {run.resolve()}" in r.stderr
    assert "hint: " in r.stderr
    assert (run / "keep.txt").is_file() and (tmp_path / "work" / "other.txt").is_file()
    assert not (run / "run.db").exists(), "refused before the search"


def test_cli_build_force_over_a_users_directory_is_refused(tmp_path, cli_env, forge_cmd):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "a.txt").write_text("a")
    r = _cli(forge_cmd, cli_env, "build", helpers.TINY_MODEL, "--device", "cpu", "--run-dir", tmp_path / "run",
             "--out", out, "--force")
    assert r.returncode == 1
    assert f"error: --force replaces only a package directory forge-pack wrote, and {out} is not one" in r.stderr
    assert "hint: choose another --out" in r.stderr and (out / "a.txt").is_file()
    assert not (tmp_path / "run").exists()
