"""The whole-model check (confirm.model_check, demo.show) compares what it means to compare.

A model that returns a buffer it reuses, draws random numbers, or writes into its inputs must not
make the check compare an output with itself, with another random draw, or with a run on other
inputs. The package is a stand-in here (forward hooks that scale a norm's output: factor 1.0 is a
faithful kernel, anything else a wrong one), so nothing is compiled.
"""

import sys
import textwrap

import pytest
import torch

from forge_pack.evaluate import confirm
from forge_pack.cli import demo

# The model returns a buffer it owns and overwrites on every forward (static-shape serving code).
ALIAS = """
import torch, torch.nn as nn
class M(nn.Module):
    def __init__(self):
        super().__init__(); self.ln = nn.LayerNorm(64); self.register_buffer("out", torch.zeros(8, 64))
    def forward(self, x):
        self.out.copy_(self.ln(x))
        return self.out
def get_model(): return M()
def get_inputs(): return (torch.randn(8, 64),)
"""

# A VAE encoder's latent_dist.sample(): noise far larger than the error of a wrong group_norm.
RNG = """
import torch, torch.nn as nn
class M(nn.Module):
    def __init__(self):
        super().__init__(); self.conv = nn.Conv2d(3, 8, 3, padding=1); self.gn = nn.GroupNorm(4, 8)
    def forward(self, x):
        h = self.gn(self.conv(x)); mean, logvar = h.chunk(2, 1)
        return mean + 4.0 * torch.randn_like(mean)
def get_model(): return M()
def get_inputs(): return (torch.randn(1, 3, 16, 16),)
"""

# Writes into the caller's tensor: every run on the same inputs sees other inputs.
INPLACE = """
import torch, torch.nn as nn
class M(nn.Module):
    def __init__(self):
        super().__init__(); self.ln = nn.LayerNorm(64); self.register_buffer("pos", 3.0 * torch.randn(64))
    def forward(self, x):
        x += self.pos
        return self.ln(x) + 0.1 * x
def get_model(): return M()
def get_inputs(): return (torch.randn(8, 64),)
"""

MODELS = {"alias": ALIAS, "rng": RNG, "inplace": INPLACE}
NORMS = (torch.nn.LayerNorm, torch.nn.GroupNorm)


class FakePatcher:
    """What confirm.model_check uses of the package's Patcher: norms' outputs scaled by `factor`."""

    def __init__(self, factor: float):
        self.factor = factor
        self.load_error = None
        self.kernel_calls: dict = {}
        self.fallback_calls: dict = {}
        self.hooks: list = []

    def load(self) -> bool:
        return True

    def apply(self, model) -> bool:
        if not self.hooks:
            for m in model.modules():
                if isinstance(m, NORMS):
                    self.hooks.append(m.register_forward_hook(self._hook))
        return True

    def _hook(self, module, args, out):
        self.kernel_calls["norm"] = self.kernel_calls.get("norm", 0) + 1
        return out * self.factor

    def revert(self) -> None:
        while self.hooks:
            self.hooks.pop().remove()


def model_file(tmp_path, name):
    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(MODELS[name]))
    return str(p)


def run_model_check(tmp_path, monkeypatch, name, factor):
    monkeypatch.setattr(confirm, "dev_patcher", lambda package_dir, build_root=None, only=None: FakePatcher(factor))
    torch.manual_seed(0)
    return confirm.model_check(str(tmp_path), model_file(tmp_path, name), "cpu", None, None)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_check_rejects_a_wrong_kernel(tmp_path, monkeypatch, name):
    r = run_model_check(tmp_path, monkeypatch, name, 1.1)
    assert r["kernel_calls"]
    assert r["within_tolerance"] is False, r


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_check_accepts_a_faithful_kernel(tmp_path, monkeypatch, name):
    r = run_model_check(tmp_path, monkeypatch, name, 1.0)
    assert r["within_tolerance"] is True, r
    assert r["max_abs_diff"] == 0.0


def test_model_check_leaves_the_callers_random_state_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(confirm, "dev_patcher", lambda package_dir, build_root=None, only=None: FakePatcher(1.0))
    target_path = model_file(tmp_path, "rng")
    from forge_pack.profile.load import load
    from forge_pack.evaluate.model_accuracy import seeded_forward

    target = load(target_path, "cpu")
    state = torch.get_rng_state()
    x0 = target.args[0].clone()
    with torch.inference_mode():
        a = seeded_forward(target.module, target.args, target.kwargs, "cpu")
        b = seeded_forward(target.module, target.args, target.kwargs, "cpu")
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(target.args[0], x0)


def test_nested_outputs_are_cloned():
    from forge_pack.evaluate.model_accuracy import clone_outputs

    buf = torch.zeros(3)
    out = clone_outputs({"a": (buf, [buf]), "b": 1})
    buf.fill_(7.0)
    assert out["b"] == 1
    assert not out["a"][0].any() and not out["a"][1][0].any()


def fake_package(tmp_path, monkeypatch, factor):
    """An installed package as demo.show imports it: apply(model), revert(), status()."""
    name = f"fake_pkg_{str(factor).replace('.', '_')}"
    d = tmp_path / "site" / name
    d.mkdir(parents=True)
    (d / "__init__.py").write_text(textwrap.dedent(f"""
        import torch
        _hooks = []
        _calls = {{}}
        def _hook(module, args, out):
            _calls["norm"] = _calls.get("norm", 0) + 1
            return out * {factor}
        def apply(model):
            if not _hooks:
                for m in model.modules():
                    if isinstance(m, (torch.nn.LayerNorm, torch.nn.GroupNorm)):
                        _hooks.append(m.register_forward_hook(_hook))
            return True
        def revert():
            while _hooks:
                _hooks.pop().remove()
        def status():
            return {{"kernel_calls": dict(_calls)}}
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


@pytest.mark.parametrize("name", sorted(MODELS))
def test_demo_show_compares_fresh_seeded_outputs(tmp_path, monkeypatch, name):
    path = model_file(tmp_path, name)
    wrong = demo.show(fake_package(tmp_path, monkeypatch, 1.1), path, "cpu", None)
    assert wrong["within_tolerance"] is False, wrong
    right = demo.show(fake_package(tmp_path, monkeypatch, 1.0), path, "cpu", None)
    assert right["within_tolerance"] is True, right
    assert right["bitwise_after_revert"] is True
