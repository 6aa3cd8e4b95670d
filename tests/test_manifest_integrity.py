"""The manifest's integrity digest (issue 17 item 9): figures edited after the build are flagged
as such by forge-pack's reader and by the package's info/bench/status, never shown as measured; a
manifest from before the digest (schema version 1) still loads, its figures "not checked"."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.pack import manifest# noqa: E402
from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.pack.packager import pack  # noqa: E402

EDITED = ("the manifest's figures were edited after the build: the speedups, timings and errors it holds are not "
          "the ones forge-pack measured")
TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "package" / "_patch.py"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    run = helpers.make_cpu_run(root / "run")
    out = root / "pkg"
    assert pack(run, out, "int_pkg", confirm=False).written
    return out


def _edited_copy(packed: Path, tmp_path: Path, edit) -> Path:
    """A copy of the package whose manifest.json was changed by `edit(doc)` and written back by hand."""
    import shutil

    dest = tmp_path / "copy"
    shutil.copytree(packed, dest)
    path = dest / "int_pkg" / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, indent=2))
    return dest


def test_a_packed_manifest_carries_a_matching_digest(packed):
    doc = manifest.load(packed / "int_pkg" / "manifest.json")
    assert doc["schema_version"] == 3 and doc["integrity"]["algorithm"] == "sha256"
    assert len(doc["integrity"]["digest"]) == 64
    assert manifest.integrity(doc)[0] == "ok"
    assert (packed / "int_pkg" / "_integrity.py").is_file()


@pytest.mark.parametrize("edit", [
    lambda d: d["targets"][0]["speedup"].update(vs_eager=d["targets"][0]["speedup"]["vs_eager"] * 3),
    lambda d: d["targets"][0]["timing"]["kernel"].update(median_us=0.5),
    lambda d: d["targets"][0].update(time_share=0.99),
    lambda d: d["targets"][0]["errors"]["captured"].update(max_abs=0.0),
    lambda d: d["dropped"].clear() if d["dropped"] else d["dropped"].append(
        {"hotspot_id": "x", "op": "softmax", "pretty": "softmax", "reason": "r"}),
])
def test_forge_packs_reader_refuses_edited_figures(packed, tmp_path, edit):
    path = _edited_copy(packed, tmp_path, edit) / "int_pkg" / "manifest.json"
    with pytest.raises(ForgeError) as e:
        manifest.load(path)
    assert e.value.message == f"manifest {path}: {EDITED}"
    assert "rebuild the package" in e.value.hint
    doc = manifest.load(path, allow_edited=True)
    assert manifest.integrity(doc) == ("edited", EDITED)


def test_a_version_1_manifest_without_a_digest_loads_not_checked(packed, tmp_path):
    def to_v1(d):
        d.pop("integrity")
        d["schema_version"] = 1

    path = _edited_copy(packed, tmp_path, to_v1) / "int_pkg" / "manifest.json"
    doc = manifest.load(path)
    state, message = manifest.integrity(doc)
    assert state == "not checked" and "no integrity digest" in message


def test_a_version_2_manifest_must_carry_its_digest(packed, tmp_path):
    path = _edited_copy(packed, tmp_path, lambda d: d.pop("integrity")) / "int_pkg" / "manifest.json"
    with pytest.raises(ForgeError, match="'integrity' is a required property"):
        manifest.load(path)


def test_the_package_warns_once_and_reports_edited_figures(packed, tmp_path):
    spec = importlib.util.spec_from_file_location("_forge_test_patch_integrity", TEMPLATE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    doc = json.loads((packed / "int_pkg" / "manifest.json").read_text())
    assert mod.integrity_status(doc)[0] == "ok"
    bad = copy.deepcopy(doc)
    bad["targets"][0]["speedup"]["vs_eager"] = 40.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = mod.Patcher(bad, "int_pkg", lambda: None)
    assert [str(w.message) for w in caught] == [f"int_pkg: {EDITED}"]
    assert p.status()["integrity"] == {"state": "edited", "message": EDITED}


def _run_info(pkg_dir: Path, *args):
    env = dict(os.environ, PYTHONPATH=str(pkg_dir))
    return subprocess.run([sys.executable, "-m", "int_pkg", "info", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=pkg_dir)


def test_info_flags_edited_figures_instead_of_showing_them(packed, tmp_path):
    def triple(d):
        d["targets"][0]["speedup"]["vs_eager"] = 31.5

    pkg = _edited_copy(packed, tmp_path, triple)
    r = _run_info(pkg)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[0] == f"WARNING: {EDITED}"
    assert f"figures: edited: {EDITED}" in r.stdout
    assert "31.50x" not in r.stdout and "speedups not shown (edited after the build)" in r.stdout
    r = _run_info(pkg, "--json")
    assert json.loads(r.stdout)["integrity"] == {"state": "edited", "message": EDITED}


def test_info_of_an_intact_package_says_the_figures_are_measured(packed):
    r = _run_info(packed)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING" not in r.stdout
    assert "figures: ok: the manifest's figures are the ones measured at build time" in r.stdout
    assert "x vs eager" in r.stdout
