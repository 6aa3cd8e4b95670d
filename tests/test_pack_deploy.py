"""The deployment choices of a package, without building it: the CPU instruction set (--cpu-isa),
what a kernel that tests instruction-set macros does under a portable ISA, and no model path."""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.pack import packager  # noqa: E402

x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="the ISA names checked are x86-64's")


@x86
def test_default_cpu_isa_is_portable_and_native_only_on_request():
    default = packager.build_flags("cpu")
    assert default["cpu_isa"] == "x86-64-v3" and "-march=x86-64-v3" in default["cxx_flags"]
    assert not any(f == "-march=native" for f in default["cxx_flags"])
    native = packager.build_flags("cpu", "native")
    assert native["cpu_isa"] == "native" and "-march=native" in native["cxx_flags"]
    assert packager.build_flags("cuda", "x86-64-v2")["cxx_flags"] == ["-O3", "-march=x86-64-v2"]  # host code


@x86
def test_unknown_cpu_isa_is_a_user_error_with_the_choices():
    with pytest.raises(ForgeError) as e:
        packager.check_cpu_isa("pentium4")
    assert "unknown --cpu-isa 'pentium4'" in e.value.message
    assert "x86-64-v3" in e.value.hint and "native" in e.value.hint


def test_isa_macros_are_found_in_conditionals_only():
    src = "#if defined(__AVX512F__) && __AVX2__\n#endif\n// __SSE4_2__ in a comment\n#ifdef __FMA__\n#endif\n"
    assert packager.isa_macros(src) == ["__AVX512F__", "__AVX2__", "__FMA__"]
    assert packager.isa_macros("int x = 1;\n") == []


def _with_isa_test(monkeypatch):
    real = packager.collect

    def collect(run_dir):
        winners, dropped = real(run_dir)
        w = winners[0]
        src = "#ifdef __AVX2__\n#define FP_WIDE 1\n#endif\n" + w.candidate.source
        winners[0] = dataclasses.replace(w, candidate=dataclasses.replace(w.candidate, source=src))
        return winners, dropped

    monkeypatch.setattr(packager, "collect", collect)


@x86
def test_kernel_testing_isa_macros_is_not_packed_for_another_isa(tmp_path, monkeypatch):
    run = helpers.make_cpu_run(tmp_path / "run")
    _with_isa_test(monkeypatch)
    r = packager.pack(run, tmp_path / "pkg", "isa_pkg", confirm=False, say=lambda s: None)
    (d,) = [d for d in r.dropped if "__AVX2__" in d["reason"]]
    assert d["reason"].startswith("its source tests __AVX2__: verified as compiled with -march=native, which a "
                                  "--cpu-isa x86-64-v3 build would not reproduce")
    r = packager.pack(run, tmp_path / "native", "isa_pkg", confirm=False, cpu_isa="native", say=lambda s: None)
    assert not [d for d in r.dropped if "__AVX2__" in d["reason"]] and len(r.targets) == 5


def test_manifest_and_readme_hold_no_folder_of_the_build_machine(tmp_path):
    run = helpers.make_cpu_run(tmp_path / "run")
    r = packager.pack(run, tmp_path / "pkg", "paths_pkg", confirm=False, say=lambda s: None)
    doc = json.loads((tmp_path / "pkg" / "paths_pkg" / "manifest.json").read_text())
    assert doc["model"]["path"] == helpers.TINY_MODEL.name
    for f in (tmp_path / "pkg").rglob("*"):
        if f.is_file() and f.suffix in (".json", ".md", ".py", ".toml", ".cpp", ".in"):
            text = f.read_text()
            assert str(helpers.TINY_MODEL.parent) not in text and str(tmp_path) not in text, f
    readme = (tmp_path / "pkg" / "README.md").read_text()
    assert "## Deploy on another machine" in readme and "pip install dist/paths_pkg-*.whl" in readme
