"""Profiling: every call path recognised, real tensors captured bit for bit, shares that add up."""

import json
import subprocess
import textwrap

import pytest
import torch

from forge_pack.profile.capture import load_capture
from forge_pack.profile.load import load
from forge_pack.profile.profiler import ProfileConfig, profile

from conftest import MODELS

FAST = ProfileConfig(warmup=1, iterations=1)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    out = {}
    for name in ("vision_net", "vae_decoder", "llm_block", "attention_block", "style_net"):
        run_dir = tmp_path_factory.mktemp(name)
        out[name] = profile(load(MODELS / f"{name}.py", device="cpu"), run_dir, FAST, quiet=True)
    return out


def paths_by_op(p):
    seen = {}
    for h in p.hotspots:
        seen.setdefault(h.op, set()).update(h.call_paths)
    return seen


# Between them, the examples use every call path in the registry (issue 2).
EXPECTED = {
    "vision_net": {"batch_norm": {"nn.BatchNorm2d", "F.batch_norm", "torch.batch_norm"},
                   "group_norm": {"nn.GroupNorm", "torch.group_norm"},
                   "adaptive_avg_pool2d": {"nn.AdaptiveAvgPool2d", "F.adaptive_avg_pool2d"}},
    "vae_decoder": {"group_norm": {"nn.GroupNorm", "F.group_norm"}, "softmax": {"nn.Softmax", "torch.softmax"}},
    "llm_block": {"rms_norm": {"module:LlamaStyleRMSNorm", "module:GemmaStyleRMSNorm", "nn.RMSNorm", "F.rms_norm",
                               "torch.rms_norm"},
                  "softmax": {"F.softmax", "Tensor.softmax", "torch.softmax"},
                  "log_softmax": {"F.log_softmax", "torch.log_softmax", "Tensor.log_softmax", "nn.LogSoftmax"},
                  "layer_norm": {"nn.LayerNorm", "F.layer_norm", "torch.layer_norm"}},
    "attention_block": {"attention": {"F.scaled_dot_product_attention", "function:eager_attention_forward"}},
    "style_net": {"instance_norm": {"nn.InstanceNorm2d", "F.instance_norm"}},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_finds_each_call_path(profiles, name):
    found = paths_by_op(profiles[name])
    for op, paths in EXPECTED[name].items():
        assert paths <= found.get(op, set()), f"{op}: missing {paths - found.get(op, set())}"


def test_registry_call_paths_all_covered_by_examples():
    from forge_pack.targets.ops import CALL_PATHS

    covered = set()
    for ops in EXPECTED.values():
        for paths in ops.values():
            covered |= paths
    registry = {p.label for paths in CALL_PATHS.values() for p in paths
                if p.label not in ("nn.BatchNorm1d", "nn.BatchNorm3d", "nn.InstanceNorm1d",
                                   "nn.InstanceNorm3d")}  # 2-d models only
    assert registry <= covered, registry - covered


def test_the_eager_attention_function_is_one_target_with_its_code_and_no_softmax_of_its_own(profiles):
    p = profiles["attention_block"]
    eager = [h for h in p.hotspots if h.call_paths == ("function:eager_attention_forward",)]
    assert len(eager) == 1 and eager[0].unsupported == "" and eager[0].signature.param("composite") is True
    assert eager[0].module_class.endswith(":eager_attention_forward") and len(eager[0].module_code) == 16
    assert eager[0].captures and eager[0].time_share > 0
    assert not [h for h in p.hotspots if h.op == "softmax"]  # its softmax is part of it, not a target


def test_composite_rmsnorm_offsets_detected(profiles):
    comps = {h.call_paths: h.signature.param("weight_offset") for h in profiles["llm_block"].hotspots
             if h.signature.param("composite")}
    assert comps[("module:LlamaStyleRMSNorm",)] == 0.0
    assert comps[("module:GemmaStyleRMSNorm",)] == 1.0


def test_expected_signatures(profiles):
    sigs = {h.signature.pretty() for h in profiles["vae_decoder"].hotspots}
    assert "group_norm(x: f32[1,64,24,24], weight: f32[64], bias: f32[64], eps=1e-06, num_groups=32)" in sigs
    router = [h for h in profiles["llm_block"].hotspots
              if h.op == "softmax" and h.signature.x.shape == (128, 8)]
    assert router and router[0].signature.param("dtype") == "float32"
    assert router[0].calls_per_forward == 2  # two layers, one router each


def test_shares_are_fractions_that_sum_to_at_most_one(profiles):
    for p in profiles.values():
        shares = [h.time_share for h in p.hotspots]
        assert all(0.0 <= s <= 1.0 for s in shares)
        assert sum(shares) + p.other_share == pytest.approx(1.0, abs=1e-6)
        assert sum(shares) <= 1.0
        assert p.other_ops and p.other_ops[0].name.startswith("aten::")


def test_captured_tensors_are_bitwise_what_the_op_received(tmp_path):
    model = tmp_path / "spy.py"
    model.write_text(textwrap.dedent("""
        import torch
        import torch.nn.functional as F
        SEEN = []
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gn = torch.nn.GroupNorm(4, 8)
                with torch.no_grad():
                    self.gn.weight.normal_(); self.gn.bias.normal_()
            def forward(self, x):
                y = (x * 3).to(memory_format=torch.channels_last)
                SEEN.append(("pool", y.clone()))
                p = F.adaptive_avg_pool2d(y, 1)
                z = x.sin()
                SEEN.append(("gn", z.clone()))
                return self.gn(z), p
        def get_model(): return M()
        def get_inputs():
            torch.manual_seed(0)
            return (torch.randn(2, 8, 5, 6),)
    """))
    target = load(model, device="cpu")
    prof = profile(target, tmp_path / "run", FAST, quiet=True)
    import sys
    spy = [m for n, m in sys.modules.items() if n.startswith("forge_user_model_spy")][0]
    first = {kind: t for kind, t in spy.SEEN[:2]}  # the capture pass is the first forward
    by_op = {h.op: h for h in prof.hotspots}
    tensors, out = load_capture(tmp_path / "run" / by_op["adaptive_avg_pool2d"].captures[0],
                                by_op["adaptive_avg_pool2d"].signature)
    assert tensors["x"].stride() == first["pool"].stride()  # channels_last preserved
    assert torch.equal(tensors["x"], first["pool"])
    assert torch.equal(out, torch.nn.functional.adaptive_avg_pool2d(first["pool"], 1))
    tensors, out = load_capture(tmp_path / "run" / by_op["group_norm"].captures[0], by_op["group_norm"].signature)
    assert torch.equal(tensors["x"], first["gn"])
    assert torch.equal(tensors["weight"], target.module.gn.weight.detach())
    assert torch.equal(out, target.module.gn(first["gn"]).detach())


RMS_VARIANTS = textwrap.dedent("""
    import torch, torch.nn as nn

    def _rms(x, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    class ScaleRMSNorm(nn.Module):  # the gain is called `scale`, and a bias follows
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.scale = nn.Parameter(torch.ones(d))
            self.shift = nn.Parameter(torch.zeros(d))
        def forward(self, x):
            return _rms(x, self.eps) * self.scale + self.shift

    class BiasRMSNorm(nn.Module):  # `weight` as the kernel expects, plus a bias it would drop
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d))
            self.bias = nn.Parameter(torch.zeros(d))
        def forward(self, x):
            return _rms(x, self.eps) * self.weight + self.bias

    class SquaredRMSNorm(nn.Module):  # w * w: the same as w while w is all ones
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d))
        def forward(self, x):
            return _rms(x, self.eps) * self.weight * self.weight

    class PreScaledRMSNorm(nn.Module):  # the weight scales x before the normalisation
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d))
        def forward(self, x):
            return _rms(x * self.weight, self.eps)

    class PlainRMSNorm(nn.Module):  # what the kernel computes: stays targeted
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d))
        def forward(self, x):
            return _rms(x, self.eps) * self.weight

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = nn.ModuleList([ScaleRMSNorm(16), BiasRMSNorm(24), SquaredRMSNorm(32), PreScaledRMSNorm(40),
                                        PlainRMSNorm(48)])
        def forward(self, xs):
            return [n(x) for n, x in zip(self.norms, xs)]

    def get_model(): return M()
    def get_inputs(): return ([torch.randn(8, d) for d in (16, 24, 32, 40, 48)],)
""")


def test_rmsnorm_composites_that_the_kernel_would_get_wrong_are_not_targeted(tmp_path):
    model = tmp_path / "rms_variants.py"
    model.write_text(RMS_VARIANTS)
    prof = profile(load(model, device="cpu"), tmp_path / "run", FAST, quiet=True)
    why = {h.call_paths[0].partition(":")[2]: h.unsupported for h in prof.hotspots if h.signature.param("composite")}
    assert "state other than `weight` (scale, shift)" in why["ScaleRMSNorm"]
    assert "state other than `weight` (bias)" in why["BiasRMSNorm"]
    assert "formula is not" in why["SquaredRMSNorm"]  # found with a random weight, not the init's ones
    assert "formula is not" in why["PreScaledRMSNorm"]
    assert why["PlainRMSNorm"] == ""


def test_calls_under_autocast_are_not_targeted(tmp_path):
    model = tmp_path / "amp.py"
    model.write_text(textwrap.dedent("""
        import torch, torch.nn as nn, torch.nn.functional as F
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(64, 64)
                self.ln = nn.LayerNorm(64)
                self.gn = nn.GroupNorm(4, 16)
            def forward(self, x, img):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    p = F.softmax(self.ln(self.lin(x)), dim=-1)
                    g = self.gn(img)
                return p, g, torch.log_softmax(x, -1)  # outside autocast: targeted
        def get_model(): return M()
        def get_inputs(): return (torch.randn(8, 64), torch.randn(2, 16, 4, 4))
    """))
    prof = profile(load(model, device="cpu"), tmp_path / "run", FAST, quiet=True)
    why = {h.op: h.unsupported for h in prof.hotspots}
    reason = "called under torch.autocast (the package runs the original op there)"
    assert why["softmax"] == why["layer_norm"] == why["group_norm"] == reason
    assert why["log_softmax"] == ""


def test_capture_caps_hold(tmp_path):
    cfg = ProfileConfig(warmup=0, iterations=1, captures_per_signature=1, capture_bytes_total=200_000)
    p = profile(load(MODELS / "vision_net.py", device="cpu"), tmp_path, cfg, quiet=True)
    assert all(len(h.captures) <= 1 for h in p.hotspots)
    assert p.capture_bytes <= 200_000
    assert sum((tmp_path / c).stat().st_size for h in p.hotspots for c in h.captures) < 200_000 + 64_000


def test_model_without_targets_says_so(tmp_path, forge_cmd, cli_env):
    model = tmp_path / "mlp.py"
    model.write_text("import torch\ndef get_model(): return torch.nn.Sequential(torch.nn.Linear(8, 8), "
                     "torch.nn.ReLU())\ndef get_inputs(): return (torch.randn(4, 8),)\n")
    r = subprocess.run(forge_cmd + ["profile", str(model), "--device", "cpu", "--run-dir", str(tmp_path / "r")],
                       capture_output=True, text=True, env=cli_env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "No targeted op is called by this model" in r.stdout


def test_profile_json_is_one_document(tmp_path, forge_cmd, cli_env):
    r = subprocess.run(forge_cmd + ["profile", str(MODELS / "vae_decoder.py"), "--device", "cpu", "--json",
                                    "--iterations", "1", "--run-dir", str(tmp_path / "r")],
                       capture_output=True, text=True, env=cli_env, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["device"] == "cpu" and doc["hotspots"]
    assert (tmp_path / "r" / "profile.json").exists()
    assert "[profile]" in r.stderr  # progress goes to stderr, never into the JSON


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_examples_on_cuda(tmp_path, name):
    p = profile(load(MODELS / f"{name}.py", device="cuda"), tmp_path, FAST, quiet=True)
    assert p.device == "cuda" and p.forward_us > 0
    found = paths_by_op(p)
    for op, paths in EXPECTED[name].items():
        assert paths <= found.get(op, set())
    assert all(h.total_us > 0 for h in p.hotspots)  # device time attributed to every signature
    assert sum(h.time_share for h in p.hotspots) <= 1.0
    h = p.hotspots[0]
    tensors, out = load_capture(tmp_path / h.captures[0], h.signature, "cuda")
    assert tensors["x"].is_cuda and out.shape == h.signature.output.shape


def test_an_rmsnorm_that_cannot_be_copied_is_probed_in_place_and_left_as_it_was():
    import threading

    from forge_pack.profile.profiler import _detect_offset

    class LockedRMSNorm(torch.nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((d,), 0.5))
            self.eps = eps
            self.lock = threading.Lock()  # deepcopy refuses it

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    m = LockedRMSNorm(16)
    assert _detect_offset(m, torch.randn(4, 16)) == 1.0
    assert torch.equal(m.weight, torch.full((16,), 0.5))


@pytest.mark.gpu
def test_cuda_profile_counts_each_kernel_once(tmp_path):
    """The profiler can report one record_function range twice (its CPU event and a GPU-side
    annotation): the device time of a forward that is one large softmax must match CUDA-event
    timing of that softmax, not twice it."""
    model = tmp_path / "one_softmax.py"
    model.write_text(textwrap.dedent("""
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.softmax(x, dim=-1)
        def get_model():
            return Model()
        def get_inputs():
            return [torch.randn(64, 8192, 1024)]
    """))
    target = load(model, device="cuda")
    p = profile(target, tmp_path / "run", ProfileConfig(warmup=2, iterations=5), quiet=True)
    x = target.args[0]
    for _ in range(3):
        torch.softmax(x, dim=-1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.softmax(x, dim=-1)
    end.record()
    torch.cuda.synchronize()
    event_us = start.elapsed_time(end) * 100.0  # per call
    (h,) = [h for h in p.hotspots if h.op == "softmax"]
    assert 0.6 * event_us < h.per_call_us < 1.5 * event_us, (h.per_call_us, event_us)
    assert 0.6 * event_us < p.forward_us < 1.6 * event_us, (p.forward_us, event_us)
