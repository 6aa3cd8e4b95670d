"""A damaged run store (issue 17 item 8): every command that opens one says so (error + hint, exit
1), and none of them starts a fresh run over the file that is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.search.pipeline import RunConfig  # noqa: E402
from forge_pack.store.run_store import Store, check_store  # noqa: E402

HINT = "start a new run with another --run-dir"


def _valid_run(run_dir: Path) -> bytes:
    """A real run store with enough rows that cutting it short loses pages; its bytes."""
    with Store(run_dir) as s:
        s.start_run("model.py", "h", "cpu", "", {}, {})
        for i in range(300):
            s.event("note", payload={"text": f"{i} " + "x" * 400})
    (run_dir / "config.json").write_text(json.dumps(RunConfig(model="model.py", run_dir=str(run_dir)).to_json()))
    return (run_dir / "run.db").read_bytes()


def _damage(run_dir: Path, kind: str) -> str:
    """Damage the store; the words the error must use."""
    data = _valid_run(run_dir)
    db = run_dir / "run.db"
    if kind == "empty":
        db.write_bytes(b"")
        return "is empty (0 bytes)"
    if kind == "truncated":
        db.write_bytes(data[: len(data) // 3])
        return "is corrupted (database disk image is malformed)"
    db.write_bytes(b"not a database, only words " * 200)
    return "is not a SQLite database (its first bytes are not SQLite's header)"


KINDS = ("empty", "truncated", "garbage")


@pytest.mark.parametrize("kind", KINDS)
def test_check_store_names_the_damage(tmp_path, kind):
    words = _damage(tmp_path, kind)
    with pytest.raises(ForgeError) as e:
        check_store(tmp_path)
    assert e.value.message == f"the run store {tmp_path / 'run.db'} {words}"
    assert HINT in e.value.hint


def test_an_intact_store_passes(tmp_path):
    _valid_run(tmp_path)
    check_store(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_resume_refuses_a_damaged_store_and_leaves_it_alone(tmp_path, kind):
    from pipeline_fakes import fake_toolkit

    from forge_pack.cli.search import search_command

    words = _damage(tmp_path, kind)
    before = (tmp_path / "run.db").read_bytes()
    with pytest.raises(ForgeError, match="the run store .* " + words.split(" (")[0]):
        search_command(None, resume=tmp_path, toolkit=fake_toolkit(), stdout=lambda s: None)
    assert (tmp_path / "run.db").read_bytes() == before, "never started over"
    assert not (tmp_path / "calls.log").exists()


def test_the_writer_never_opens_an_emptied_store_as_new(tmp_path):
    (tmp_path / "run.db").write_bytes(b"")
    with pytest.raises(ForgeError, match="is empty"):
        Store(tmp_path)
    assert (tmp_path / "run.db").stat().st_size == 0


@pytest.mark.parametrize("kind", KINDS)
def test_pack_check_and_ui_refuse_a_damaged_store(tmp_path, kind):
    from forge_pack.cli.check import hotspot_from_run
    from forge_pack.pack.packager import pack
    from forge_pack.ui.server import make_server

    words = _damage(tmp_path / "run", kind)
    for call in (lambda: pack(tmp_path / "run", tmp_path / "out", "p", confirm=False),
                 lambda: hotspot_from_run(tmp_path / "run", "1"),
                 lambda: make_server(tmp_path / "run", port=0)):
        with pytest.raises(ForgeError) as e:
            call()
        assert words.split(" (")[0] in e.value.message and HINT in e.value.hint
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_cli_search_resume_and_pack_exit_1_with_error_and_hint(tmp_path, kind, cli_env, forge_cmd):
    run = tmp_path / "run"
    words = _damage(run, kind)
    for args in (["search", "--resume", str(run)], ["pack", str(run), "--out", str(tmp_path / "o")],
                 ["ui", str(run), "--port", "0"]):
        r = subprocess.run([*forge_cmd, *args], capture_output=True, text=True, env=cli_env, timeout=120)
        assert r.returncode == 1, (args, r.stderr)
        assert f"error: the run store {run / 'run.db'} {words}" in r.stderr, r.stderr
        assert f"hint: it cannot be read or continued: {HINT}" in r.stderr
        assert "Traceback" not in r.stderr
