"""forge-pack itself installs as a wheel with templates inside forge_pack/templates."""

import subprocess
import sys
import zipfile

from conftest import ROOT


def test_wheel_ships_templates_under_forge_pack(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = next(tmp_path.glob("forge_pack-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("forge_pack/templates/kernels/") for n in names)
    assert not any(n.startswith("templates/") for n in names)
    assert "forge_pack/cli/main.py" in names
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "forge-pack = forge_pack.cli.main:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


def test_non_editable_install_finds_templates(tmp_path):
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", str(ROOT), "--no-deps", "--no-build-isolation",
                        "--target", str(target), "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    code = ("import forge_pack, pathlib, importlib.resources as r; "
            "p = pathlib.Path(str(r.files('forge_pack.templates'))); "
            "assert str(p).startswith(%r), p; print(sorted(x.name for x in (p / 'kernels').iterdir()))" % str(target))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "cuda" in r.stdout and "cpu" in r.stdout
