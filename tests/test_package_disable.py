"""FORGE_PACK_DISABLE in an emitted package (issue 17 item 9): only a yes (1, true, yes, on, any
case) turns it off; a no (0, false, no, off, empty) leaves it on; anything else leaves it on and
says so once."""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.pack.packager import pack  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "package" / "_patch.py"


@pytest.fixture(scope="module")
def patch_mod():
    spec = importlib.util.spec_from_file_location("_forge_test_patch_disable", TEMPLATE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("disable")
    run = helpers.make_cpu_run(root / "run")
    assert pack(run, root / "out", "dis_pkg", confirm=False).written
    return json.loads((root / "out" / "dis_pkg" / "manifest.json").read_text())


def _apply(patch_mod, manifest, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("FORGE_PACK_DISABLE", raising=False)
    else:
        monkeypatch.setenv("FORGE_PACK_DISABLE", value)
    loads = []
    p = patch_mod.Patcher(manifest, "dis_pkg", lambda: loads.append(1))
    monkeypatch.setattr(p, "_bind_ops", lambda: None)  # no extension is built here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        applied = p.apply()
        p.apply()
    p.revert()
    return applied, loads, [str(w.message) for w in caught], p


@pytest.mark.parametrize("value", [None, "", "0", "false", "False", "no", "NO", "off", " off "])
def test_a_no_leaves_the_package_on(patch_mod, manifest, monkeypatch, value):
    applied, loads, warned, p = _apply(patch_mod, manifest, monkeypatch, value)
    assert applied is True and loads == [1], warned
    assert warned == []
    assert p.status()["disabled"] is False


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", " On "])
def test_a_yes_turns_the_package_off(patch_mod, manifest, monkeypatch, value):
    applied, loads, warned, p = _apply(patch_mod, manifest, monkeypatch, value)
    assert applied is False and loads == []
    assert warned == [f"dis_pkg: disabled by FORGE_PACK_DISABLE={value}; nothing is patched"]
    assert p.status()["disabled"] is True


def test_anything_else_leaves_it_on_and_warns_once(patch_mod, manifest, monkeypatch):
    applied, loads, warned, _ = _apply(patch_mod, manifest, monkeypatch, "perhaps")
    assert applied is True and loads == [1]
    assert warned == ["dis_pkg: FORGE_PACK_DISABLE='perhaps' is neither a yes (1, true, yes, on) nor a no "
                      "('', '0', 'false', 'no', 'off'); the package stays on"]
