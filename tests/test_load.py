"""Model loading: both file forms, device/dtype flags, and every error path a user can hit."""

import subprocess
import textwrap

import pytest
import torch

from forge_pack.core.errors import ForgeError
from forge_pack.profile.load import load, run_forward

from conftest import MODELS


def write(tmp_path, text, name="model.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_load_get_model_form_casts_dtype():
    target = load(MODELS / "vision_net.py", device="cpu", dtype="bfloat16")
    assert target.form == "get_model"
    assert all(p.dtype == torch.bfloat16 for p in target.module.parameters())
    assert target.args[0].dtype == torch.bfloat16
    assert run_forward(target).dtype == torch.bfloat16


def test_load_kernelbench_form():
    target = load(MODELS / "vae_decoder.py", device="cpu")
    assert target.form == "kernelbench"
    assert target.args[0].shape == (1, 64, 24, 24)
    assert target.dtype is None and target.args[0].dtype == torch.float32


def test_load_dict_inputs_become_keywords(tmp_path):
    p = write(tmp_path, """
        import torch
        class M(torch.nn.Module):
            def forward(self, a, scale=1.0):
                return torch.softmax(a * scale, -1)
        def get_model(): return M()
        def get_inputs(): return {"a": torch.randn(2, 3), "scale": 2.0}
    """)
    t = load(p, device="cpu")
    assert t.args == () and set(t.kwargs) == {"a", "scale"}
    assert run_forward(t).shape == (2, 3)


def test_load_keeps_integer_inputs_uncast():
    t = load(MODELS / "llm_block.py", device="cpu", dtype="float16")
    assert t.args[0].dtype == torch.int64


CASES = {
    "missing": (None, "model file not found"),
    "syntax": ("def get_model(:\n", "syntax error"),
    "import": ("import not_a_real_package_xyz\n", "failed to import"),
    "module_raises": ("raise RuntimeError('boom at import')\n", "raised while being imported"),
    "neither": ("x = 1\n", "defines neither"),
    "not_module": ("def get_model(): return 3\ndef get_inputs(): return ()\n", "not a torch.nn.Module"),
    "bad_inputs": ("import torch\ndef get_model(): return torch.nn.Identity()\ndef get_inputs(): return 7\n",
                   "get_inputs() in"),
    "get_model_raises": ("def get_model(): raise ValueError('no weights')\ndef get_inputs(): return ()\n",
                         "get_model() in"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_errors_are_forge_errors(tmp_path, case):
    text, expected = CASES[case]
    path = tmp_path / "missing.py" if text is None else write(tmp_path, text)
    with pytest.raises(ForgeError) as err:
        load(path, device="cpu")
    assert expected in err.value.message
    assert err.value.hint


def test_forward_that_raises_is_a_forge_error(tmp_path):
    p = write(tmp_path, """
        import torch
        class M(torch.nn.Module):
            def forward(self, x):
                raise RuntimeError("shape mismatch in block 3")
        def get_model(): return M()
        def get_inputs(): return (torch.randn(2),)
    """)
    with pytest.raises(ForgeError, match="forward raised RuntimeError: shape mismatch"):
        run_forward(load(p, device="cpu"))


def test_a_type_error_inside_the_forward_is_the_models_own_error(tmp_path):
    p = write(tmp_path, """
        import torch
        class M(torch.nn.Module):
            def forward(self, x):
                return torch.softmax(torch.cat(x, x), -1)
        def get_model(): return M()
        def get_inputs(): return (torch.randn(2, 3),)
    """)
    with pytest.raises(ForgeError) as err:
        run_forward(load(p, device="cpu"))
    msg = err.value.message
    assert "get_inputs" not in msg and "get_inputs" not in err.value.hint
    assert msg.startswith("the model's forward raised TypeError: cat()")
    assert f"{p}, line 5, in forward" in msg  # where in the model file


def test_inputs_the_forward_cannot_take_are_blamed_on_get_inputs(tmp_path):
    p = write(tmp_path, """
        import torch
        def get_model(): return torch.nn.Softmax(-1)
        def get_inputs(): return (torch.randn(2, 3), torch.randn(2))
    """)
    with pytest.raises(ForgeError, match="rejected the inputs from get_inputs"):
        run_forward(load(p, device="cpu"))


def test_inputs_of_the_wrong_type_are_a_forge_error(tmp_path):
    p = write(tmp_path, """
        import torch
        def get_model(): return torch.nn.Linear(4, 4)
        def get_inputs(): return ("not a tensor",)
    """)
    with pytest.raises(ForgeError, match="rejected the inputs|forward raised"):
        run_forward(load(p, device="cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_device_cuda_without_gpu_is_a_forge_error():
    with pytest.raises(ForgeError, match="--device cuda"):
        load(MODELS / "vision_net.py", device="cuda")


def test_cli_errors_print_two_lines_and_exit_1(tmp_path, forge_cmd, cli_env):
    bad = write(tmp_path, "def get_model(:\n")
    r = subprocess.run(forge_cmd + ["profile", str(bad), "--device", "cpu"], capture_output=True, text=True,
                       env=cli_env, timeout=120)
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error: syntax error in")
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in r.stderr


def test_cli_debug_shows_traceback(tmp_path, forge_cmd, cli_env):
    r = subprocess.run(forge_cmd + ["--debug", "profile", str(tmp_path / "nope.py"), "--device", "cpu"],
                       capture_output=True, text=True, env=cli_env, timeout=120)
    assert r.returncode != 0
    assert "Traceback" in r.stderr
