"""pack / manifest / binding / confirm without compiling anything (fast): the package's files,
the manifest and its schema, launch values, no-winner and --out/--name handling, confirmation."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.pack import binding, manifest
from forge_pack.evaluate import confirm# noqa: E402
from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.pack.packager import check_name, collect, default_name, pack  # noqa: E402
from forge_pack.core.verdict import Baseline, Evaluation, Timing, Verdict  # noqa: E402


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return helpers.make_cpu_run(tmp_path_factory.mktemp("run") / "run")


@pytest.fixture(scope="module")
def packed(cpu_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("pkg") / "tiny_pkg"
    result = pack(cpu_run, out, "tiny_pkg", confirm=False)
    return out, result


def test_pack_writes_the_package_tree(packed):
    out, result = packed
    assert result.written and result.package == "tiny_pkg"
    for rel in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in", "csrc/binding.cpp", "tiny_pkg/__init__.py",
                "tiny_pkg/_patch.py", "tiny_pkg/__main__.py", "tiny_pkg/manifest.json", "tiny_pkg/manifest.schema.json"):
        assert (out / rel).is_file(), rel
    assert list((out / "tiny_pkg" / "fixtures").glob("*.safetensors"))
    assert not list(out.parent.glob(".tiny_pkg.staging-*")), "the staging directory is cleaned up"
    doc = manifest.load(out / "tiny_pkg" / "manifest.json")
    ops = sorted(t["op"] for t in doc["targets"])
    assert ops == ["adaptive_avg_pool2d", "group_norm", "layer_norm", "rms_norm", "softmax"]
    assert doc["package"]["namespace"] == "tiny_pkg_ops"
    assert all(t["torch_op"] == f"tiny_pkg_ops::{t['id']}" for t in doc["targets"])


def test_kernel_sources_are_verbatim_and_launchers_rename_symbols(packed, cpu_run):
    out, _ = packed
    doc = manifest.load(out / "tiny_pkg" / "manifest.json")
    winners = {w.hotspot.id: w for w in collect(cpu_run)[0]}
    for t in doc["targets"]:
        assert (out / t["kernel"]["file"]).read_text() == winners[t["hotspot_id"]].candidate.source
        launcher = (out / t["kernel"]["launcher"]).read_text()
        for k in t["launch"]["kernels"]:
            assert f"#define {k['name']} {k['symbol']}" in launcher
        assert t["kernel"]["launcher"] in doc["build"]["sources"]
    assert (out / "csrc" / "forge_cpu.h").is_file(), "helper headers a kernel includes ship beside it"
    text = (out / "csrc" / "binding.cpp").read_text()
    assert "TORCH_LIBRARY(tiny_pkg_ops, m)" in text and "-std=c++17" not in (out / "setup.py").read_text()


def test_manifest_records_what_was_measured(packed):
    out, _ = packed
    doc = manifest.load(out / "tiny_pkg" / "manifest.json")
    t = next(t for t in doc["targets"] if t["op"] == "softmax")
    assert set(t["call_paths"]) == {"F.softmax", "Tensor.softmax", "nn.Softmax", "torch.softmax"}
    assert t["timing"]["eager"]["median_us"] == 10.0 and t["speedup"]["vs_eager"] == pytest.approx(2.0)
    assert t["speedup"]["vs_compile"] == pytest.approx(2.4)
    assert t["search"]["evaluations"] == 2 and t["search"]["verdicts"] == {"mismatch": 1, "ok": 1}
    assert t["errors"]["captured"]["max_abs"] == pytest.approx(2e-7) and t["errors"]["fresh"]["checks"] == 1
    assert t["tolerance"]["atol"] > 0 and t["tolerance"]["reason"]
    assert t["confirmed"] is False and t["errors"]["source"] == "search"
    k = t["launch"]["kernels"][0]
    assert [a["kind"] for a in k["args"]] == ["tensor", "tensor", "i64", "i64"]
    assert [a["value"] for a in k["args"][2:]] == [64, 64]  # rows = 4*16, cols = 64, for this exact signature
    rms = next(t for t in doc["targets"] if t["op"] == "rms_norm")
    assert rms["module_class"].endswith(":TinyRMSNorm")
    assert doc["environment"]["torch"] and doc["model"]["sha256"] and doc["backend"] == "cpu"
    assert doc["build"]["cuda_arch_list"] is None and "-fopenmp" in doc["build"]["ldflags"]


def test_readme_shows_the_measured_table(packed):
    out, _ = packed
    text = (out / "README.md").read_text()
    assert "| t0 |" in text and "2.00x" in text and "pip install --no-build-isolation" in text
    assert "tiny_pkg.apply(model)" in text and "$" not in text.split("## Use")[0]


@pytest.mark.parametrize("corrupt, expect", [
    (lambda d: d.pop("targets"), "'targets' is a required property"),
    (lambda d: d["targets"][0].update(id="zero"), "targets/0/id"),
    (lambda d: d["targets"][0]["timing"]["kernel"].update(n=0), "targets/0/timing/kernel/n"),
    (lambda d: d["targets"][0]["launch"]["kernels"][0].update(grid=[1, 1]), "grid"),
    (lambda d: d.update(schema_version=4), "schema_version"),
    (lambda d: d.update(surprise=True), "Additional properties"),
])
def test_corrupted_manifest_is_refused_with_the_bad_field(packed, tmp_path, corrupt, expect):
    out, _ = packed
    doc = json.loads((out / "tiny_pkg" / "manifest.json").read_text())
    bad = copy.deepcopy(doc)
    corrupt(bad)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ForgeError) as e:
        manifest.load(path)
    assert expect in e.value.message
    with pytest.raises(ForgeError):
        manifest.write(tmp_path / "never.json", bad)
    assert not (tmp_path / "never.json").exists()


def test_truncated_manifest_is_not_json(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text('{"schema_version": 1, "targ')
    with pytest.raises(ForgeError, match="not valid JSON"):
        manifest.load(path)


def test_no_winner_writes_no_package(tmp_path):
    run = tmp_path / "run"
    hotspots, cands = helpers.cuda_hotspots()
    helpers.store_winners(run, hotspots, cands, str(helpers.TINY_MODEL), "0" * 64, "cuda",
                          {"compute_capability": "9.0"}, speedup=1.01)
    result = pack(run, tmp_path / "out", "nothing", confirm=False)
    assert not result.written and not (tmp_path / "out").exists()
    assert "No faster kernel" in result.message and "1.01x" in result.message
    assert len(result.dropped) == len(hotspots) == 5


def test_cli_pack_no_winner_exits_zero(tmp_path, cli_env, forge_cmd):
    run = tmp_path / "run"
    hotspots, cands = helpers.cuda_hotspots()
    helpers.store_winners(run, hotspots[:1], cands, str(helpers.TINY_MODEL), "0" * 64, "cuda", {}, speedup=0.9)
    r = subprocess.run([*forge_cmd, "pack", str(run), "--out", str(tmp_path / "out"), "--no-confirm"],
                       capture_output=True, text=True, env=cli_env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "No faster kernel to pack, so no package was written" in r.stdout
    assert not (tmp_path / "out").exists()


def test_out_dir_is_refused_unless_force(cpu_run, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ForgeError, match="already exists") as e:
        pack(cpu_run, out, "tiny_pkg", confirm=False)
    assert "--force" in e.value.hint and (out / "keep.txt").exists()
    with pytest.raises(ForgeError, match="replaces only a package directory forge-pack wrote"):
        pack(cpu_run, out, "tiny_pkg", force=True, confirm=False)  # not ours: --force leaves it alone
    (out / "keep.txt").unlink()
    assert pack(cpu_run, out, "tiny_pkg", force=True, confirm=False).written  # empty: replaced
    (out / "left_over.txt").write_text("x")
    result = pack(cpu_run, out, "tiny_pkg", force=True, confirm=False)  # ours now: replaced whole
    assert result.written and not (out / "left_over.txt").exists() and (out / "tiny_pkg" / "manifest.json").is_file()


@pytest.mark.parametrize("name", ["Bad-Name", "1abc", "class", "torch", "json", "", "a" * 70])
def test_invalid_names_are_clear_errors(name):
    with pytest.raises(ForgeError, match="invalid package name"):
        check_name(name)


def test_cli_invalid_name_and_existing_out(tmp_path, cli_env, forge_cmd):
    r = subprocess.run([*forge_cmd, "build", str(helpers.TINY_MODEL), "--out", str(tmp_path / "o"), "--name", "my-pkg",
                        "--device", "cpu"], capture_output=True, text=True, env=cli_env, timeout=120)
    assert r.returncode == 1 and "error: invalid package name 'my-pkg'" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr
    (tmp_path / "o").mkdir()
    r = subprocess.run([*forge_cmd, "build", str(helpers.TINY_MODEL), "--out", str(tmp_path / "o"), "--device", "cpu",
                        "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, env=cli_env, timeout=120)
    assert r.returncode == 1 and "already exists" in r.stderr and "--force" in r.stderr
    assert not (tmp_path / "run").exists(), "refused before any search"


def test_default_name_is_valid():
    assert check_name(default_name("/x/My Model-v2.py")) == "my_model_v2_forge"
    assert check_name(default_name("3d.py")) == "m_3d_forge"


def test_cuda_launch_values_are_resolved_for_the_exact_signature(tmp_path):
    hotspots, cands = helpers.cuda_hotspots()
    from forge_pack.targets.ops import with_output

    sig = with_output(hotspots[0].signature)
    launch = binding.resolve_launch(cands[hotspots[0].id], sig, "fp_p_t0")
    k = launch["kernels"][0]
    assert k["symbol"] == "fp_p_t0_reference_softmax" and k["grid"][0] == 32  # one block per row: 4*8 rows
    assert all(isinstance(v, int) for v in k["grid"] + k["block"]) and k["shared_mem"] >= 0
    code = binding.TargetCode("t0", sig, cands[hotspots[0].id], "csrc/t0_softmax.cu", "csrc/t0_launch.cu", launch)
    src = binding.launcher_source(code, "p", "0")
    assert "cudaLaunchKernel(fn" in src and "#undef __CUDA_NO_HALF_OPERATORS__" in src
    bind = binding.binding_source([code], "p", "p_ops", "0")
    assert "c10/cuda/CUDAStream.h" in bind and "ATen/cuda/CUDAContext.h" not in bind.replace("not ATen/cuda", "")
    assert "getCurrentCUDAStream" in bind and "TORCH_LIBRARY_IMPL(p_ops, CUDA, m)" in bind


def test_cuda_package_records_the_arch(tmp_path):
    run = helpers.make_cuda_run(tmp_path / "run")
    result = pack(run, tmp_path / "out", "cuda_pkg", confirm=False)
    doc = manifest.load(tmp_path / "out" / "cuda_pkg" / "manifest.json")
    assert result.written and doc["backend"] == "cuda" and doc["build"]["cuda_arch_list"] == "9.0"
    assert doc["environment"]["gpu_name"] == "NVIDIA H200" and doc["build"]["nvcc_flags"] == ["-O3"]
    assert all(s.endswith(".cu") or s.endswith("binding.cpp") for s in doc["build"]["sources"])


# ------------------------------------------------------------------ confirmation


def _t(median: float, iqr: float = 0.5, n: int = 50) -> Timing:
    return Timing(median, iqr, n)


def test_confirm_keeps_a_held_speedup_and_drops_a_lost_one():
    base = Baseline(_t(10.0), _t(12.0))
    ok = Verdict(True, "ok")
    assert confirm.judge(Evaluation(ok, _t(5.0)), base)[0]
    kept, why = confirm.judge(Evaluation(ok, _t(10.05, 1.0)), base)  # slower by less than the noise: still slower
    assert not kept and "slower than eager (within measurement noise, but not faster)" in why
    kept, why = confirm.judge(Evaluation(ok, _t(14.0)), base)
    assert not kept and "did not hold" in why and "0.71x" in why
    kept, why = confirm.judge(Evaluation(Verdict(False, "mismatch", "index (3,): got 1, expected 2"), _t(1.0)), base)
    assert not kept and "mismatch" in why and "index (3,)" in why


class FakeEvaluator:
    """Stands in for a fresh Evaluator: the second winner's speedup does not hold."""

    def __init__(self):
        self.calls = []

    def baseline(self, hotspot):
        return Baseline(_t(10.0), _t(12.0))

    def evaluate(self, cand, hotspot, baseline, final=False):
        self.calls.append((hotspot.op, final))
        slow = len(self.calls) == 2
        return Evaluation(Verdict(True, "ok"), _t(20.0 if slow else 4.0), speedup_vs_eager=0.5 if slow else 2.5)

    def close(self):
        pass


def test_pack_drops_a_winner_that_does_not_hold(cpu_run, tmp_path, monkeypatch):
    fake = FakeEvaluator()
    monkeypatch.setattr(confirm, "_default_evaluator", lambda info, backend: fake)
    monkeypatch.setattr(confirm, "CONFIRM_FILE", "confirm-test.json")
    result = pack(cpu_run, tmp_path / "out", "tiny_pkg", model_check=False)
    assert all(final for _, final in fake.calls) and len(fake.calls) == 5
    assert result.written and len(result.targets) == 4
    doc = manifest.load(tmp_path / "out" / "tiny_pkg" / "manifest.json")
    assert len(doc["dropped"]) == 1 and "did not hold" in doc["dropped"][0]["reason"]
    assert all(t["confirmed"] and t["timing"]["kernel"]["median_us"] == 4.0 for t in doc["targets"])
    assert all(t["speedup"]["vs_eager"] == pytest.approx(2.5) for t in doc["targets"])
    # a second pack reuses the saved confirmation instead of re-running it
    pack(cpu_run, tmp_path / "out2", "tiny_pkg", model_check=False)
    assert len(fake.calls) == 5


# ------------------------------------------------------------------ what the README and build output claim


def _model_result(speedup: float, max_abs_diff: float | None) -> dict:
    t = {"median_us": 1000.0, "iqr_us": 10.0, "n": 20}
    return {"eager": t, "patched": {**t, "median_us": 1000.0 / speedup}, "speedup": speedup,
            "max_abs_diff": max_abs_diff, "output_kind": "tensor", "argmax_agreement": None,
            "within_tolerance": True, "kernel_calls": {}, "fallback_calls": {}}


def test_readme_says_slower_when_the_model_is_slower(packed):
    from forge_pack.pack import readme

    out, _ = packed
    doc = manifest.load(out / "tiny_pkg" / "manifest.json")
    doc["model_result"] = _model_result(0.91, 1e-6)
    text = readme.render(doc)
    assert "runs slower end to end" in text and "0.91x the original's speed" in text and "faster end to end" not in text
    doc["model_result"] = _model_result(1.25, 1e-6)
    assert "The whole model runs 1.25x faster end to end" in readme.render(doc)


def test_readme_says_which_kernels_were_re_timed(packed):
    """Packed with confirm=False: no target is confirmed, and the README must not claim a re-timing."""
    from forge_pack.pack import readme

    out, _ = packed
    doc = manifest.load(out / "tiny_pkg" / "manifest.json")
    text = (out / "README.md").read_text()
    assert not any(t["confirmed"] for t in doc["targets"])
    assert "re-timed against eager PyTorch" not in text and "not re-timed in a fresh process" in text
    assert "(tolerances above). The timings are the search's own" in text
    for t in doc["targets"][:2]:
        t["confirmed"] = True
    assert "2 of 5 kernels (t0, t1) were re-timed" in readme.render(doc)
    for t in doc["targets"]:
        t["confirmed"] = True
    assert "(tolerances above), then re-timed against eager PyTorch" in readme.render(doc)


def test_build_output_without_a_max_difference_says_n_a():
    from forge_pack.cli.build import format_result
    from forge_pack.pack.packager import PackResult

    r = PackResult(True, "packed", out_dir="/x", package="p", model_result=_model_result(1.2, None))
    assert "max output difference n/a" in format_result(r)
    r.model_result = _model_result(1.2, 2.5e-5)
    assert "max output difference 2.5e-05" in format_result(r)


def test_an_out_dir_under_a_file_is_refused_before_any_work(tmp_path):
    from forge_pack.core.errors import ForgeError
    from forge_pack.pack.packager import check_out_dir

    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(ForgeError, match="not a writable directory"):
        check_out_dir(blocker / "deeper" / "pkg", force=False)
    check_out_dir(tmp_path / "new" / "pkg", force=False)  # a missing parent is fine: it will be created


def test_only_kernels_sized_to_every_sm_record_a_minimum_sm_count():
    from types import SimpleNamespace

    from forge_pack.pack.packager import _min_sm_count

    env = {"sm_count": 132}
    resident = SimpleNamespace(op="group_norm", backend="cuda", origin="template", family="resident")
    assert _min_sm_count(resident, env) == {"min_sm_count": 132}
    for other in (SimpleNamespace(op="adaptive_avg_pool2d", backend="cuda", origin="template", family="nchw_tile"),
                  SimpleNamespace(op="group_norm", backend="cuda", origin="llm", family="resident"),
                  SimpleNamespace(op="group_norm", backend="cpu", origin="template", family="resident")):
        assert _min_sm_count(other, env) == {}
    assert _min_sm_count(resident, {}) == {}
