"""A model file that calls sys.exit() (issue 17 item 9): error naming the file, the line and the
call that exited, a hint, exit 1; never forge-pack ending with the model's own status and no word."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from forge_pack.core.errors import ForgeError
from forge_pack.profile.load import load, run_forward

BODY = """
import sys
import torch
{at_import}
class M(torch.nn.Module):
    def forward(self, x):
        {in_forward}
        return torch.softmax(x, -1)
def get_model():
    {in_get_model}
    return M()
def get_inputs():
    {in_get_inputs}
    return (torch.randn(4, 8),)
"""
PLACES = ("at_import", "in_forward", "in_get_model", "in_get_inputs")


def _model(tmp_path, where: str, call: str = "sys.exit(3)"):
    fields = {p: ("pass" if p != "at_import" else "") for p in PLACES}
    fields[where] = call
    path = tmp_path / f"exits_{where}.py"
    path.write_text(textwrap.dedent(BODY).format(**fields))
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if call in ln)
    return path, line


@pytest.mark.parametrize("where, what", [("at_import", "{p} called sys.exit(3) while being imported"),
                                         ("in_get_model", "get_model() in {p} called sys.exit(3)"),
                                         ("in_get_inputs", "get_inputs() in {p} called sys.exit(3)"),
                                         ("in_forward", "the model's forward called sys.exit(3)")])
def test_sys_exit_in_a_model_is_a_named_error(tmp_path, where, what):
    path, line = _model(tmp_path, where)
    with pytest.raises(ForgeError) as e:
        run_forward(load(str(path), "cpu"))
    assert e.value.message.startswith(what.format(p=path)), e.value.message
    assert f"{path}, line {line}" in e.value.message
    assert "must not exit" in e.value.hint and '__name__ == "__main__"' in e.value.hint


def test_exit_without_a_status_and_raise_systemexit_too(tmp_path):
    path, _ = _model(tmp_path, "in_get_model", "raise SystemExit('bye')")
    with pytest.raises(ForgeError, match=r"called sys.exit\('bye'\)"):
        load(str(path), "cpu")
    path, _ = _model(tmp_path, "in_get_inputs", "exit()")
    with pytest.raises(ForgeError, match=r"called sys.exit\(None\)"):
        load(str(path), "cpu")


@pytest.mark.parametrize("where", ["at_import", "in_forward"])
def test_cli_exits_1_with_error_and_hint_not_the_models_status(tmp_path, cli_env, forge_cmd, where):
    path, line = _model(tmp_path, where)
    r = subprocess.run([*forge_cmd, "profile", str(path), "--device", "cpu"], capture_output=True, text=True,
                       env=cli_env, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "error: " in r.stderr and "called sys.exit(3)" in r.stderr and f"line {line}" in r.stderr
    assert "hint: a model file must not exit" in r.stderr and "Traceback" not in r.stderr
