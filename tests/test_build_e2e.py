"""The real `forge-pack build` on the CPU, end to end: profile, search, confirm in a fresh process,
whole-model check, pack; then pip install the package into a fresh --target dir, apply it in a
fresh process, compare with the original, revert bitwise, `python -m <pkg> verify`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402


@pytest.mark.slow
def test_forge_pack_build_on_cpu_then_install_apply_revert(tmp_path, cli_env, forge_cmd):
    out, run = tmp_path / "tiny_build", tmp_path / "run"
    r = subprocess.run([*forge_cmd, "build", str(helpers.E2E_MODEL), "--device", "cpu", "--budget", "4", "--top", "2",
                        "--out", str(out), "--name", "tiny_build", "--run-dir", str(run), "--json",
                        "--allow-no-gain"],  # the install path is under test, whatever the end-to-end gain here
                       capture_output=True, text=True, env=cli_env, timeout=1500)
    assert r.returncode == 0, r.stderr[-6000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])  # --json: exactly one document
    assert doc["run_dir"] == str(run) and doc["search"]["hotspots"]
    result = doc["pack"]
    if not result["written"]:  # a slow shared CPU may find nothing faster: said plainly, no package
        assert "No faster kernel" in result["message"] and not out.exists()
        pytest.skip("no kernel beat eager on this machine: " + result["message"])
    # every step of a few seconds or more says how long it took (forge_pack.core.progress_line)
    assert "  confirming: done in " in r.stderr and "  whole-model check: done in " in r.stderr, r.stderr[-3000:]
    manifest = json.loads((out / "tiny_build" / "manifest.json").read_text())
    assert all(t["confirmed"] for t in manifest["targets"])
    m = manifest["model_result"]
    assert m is not None and m["kernel_calls"] and m["within_tolerance"] and m["argmax_agreement"] == 1.0
    assert (run / "confirm.json").is_file()

    site = tmp_path / "site"
    r = helpers.pip_install(out, site)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    env = helpers.env_with(site)
    r = subprocess.run([sys.executable, "-m", "forge_pack.cli.demo", "show", "tiny_build", str(helpers.E2E_MODEL),
                        "--device", "cpu", "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    show = json.loads(r.stdout.strip().splitlines()[-1])
    assert show["applied"] and show["kernel_calls"] and show["within_tolerance"] and show["bitwise_after_revert"]
    r = subprocess.run([sys.executable, "-m", "tiny_build", "verify"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr[-3000:]
