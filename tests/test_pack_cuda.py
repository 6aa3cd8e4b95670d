"""The CUDA variant of an emitted package. CI (no GPU) compiles it for sm_90 with nvcc, so a broken
CUDA build is caught without a GPU; on a GPU (marker `gpu`) it is installed, verified and round-tripped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.pack.packager import pack  # noqa: E402


def _nvcc_missing() -> str:
    import torch

    if torch.version.cuda is None:
        return "this torch build has no CUDA"
    if not (shutil.which("nvcc") or os.environ.get("CUDA_HOME") or Path("/usr/local/cuda/bin/nvcc").exists()):
        return "nvcc is not installed"
    return ""


def _cuda_run(tmp_path: Path) -> Path:
    run = helpers.make_cuda_run(tmp_path / "run")
    try:  # on a GPU machine, pack for the GPU that is there
        import torch

        if torch.cuda.is_available():
            import sqlite3

            cc = "%d.%d" % torch.cuda.get_device_capability()
            conn = sqlite3.connect(run / "run.db")
            row = conn.execute("SELECT id, env_json FROM runs").fetchone()
            env = {**json.loads(row[1]), "compute_capability": cc, "gpu": torch.cuda.get_device_name()}
            conn.execute("UPDATE runs SET env_json=? WHERE id=?", (json.dumps(env), row[0]))
            conn.commit()
            conn.close()
    except ImportError:
        pass
    return run


@pytest.mark.slow  # > 10 s on 2 cores
@pytest.mark.skipif(bool(_nvcc_missing()), reason=_nvcc_missing() or "nvcc present")
def test_cuda_package_compiles_for_sm90_without_a_gpu(tmp_path):
    run = helpers.make_cuda_run(tmp_path / "run")
    out = tmp_path / "cuda_pkg"
    assert pack(run, out, "cuda_pkg", confirm=False).written
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST="9.0")
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=out, capture_output=True, text=True,
                       env=env, timeout=900)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    assert list((out / "cuda_pkg").glob("_C*.so")), log[-3000:]
    assert "arch=compute_90,code=sm_90" in log  # TORCH_CUDA_ARCH_LIST from the manifest reached nvcc
    assert "-std=c++17" not in (out / "setup.py").read_text()
    info = json.loads((out / "cuda_pkg" / "_build_info.json").read_text())
    assert info["cuda_arch_list"] == "9.0" and info["nvcc"].split(".")[0] == info["cuda"].split(".")[0]
    # deployable: the stable Python ABI where torch allows it, and no folder of this machine in the binary
    (so,) = (out / "cuda_pkg").glob("_C*.so")
    if info["python_abi"].endswith("-abi3"):
        assert so.name == "_C.abi3.so"
    binary = so.read_bytes()
    assert str(tmp_path).encode() not in binary and str(Path.home()).encode() + b"/" not in binary


def _big_signatures() -> list:
    from forge_pack.core.signature import Signature, TensorSpec, contiguous_strides

    def spec(d, shape, strides=None):
        return TensorSpec(d, shape, strides or contiguous_strides(shape))

    nhwc = (64 * 28 * 28, 1, 28 * 64, 64)
    return [
        Signature("softmax", (("x", spec("float32", (8, 262144))),), (("dim", 1), ("dtype", None)),
                  spec("float32", (8, 262144))),
        Signature("group_norm", (("x", spec("bfloat16", (1, 128, 1024, 1024))), ("weight", spec("bfloat16", (128,))),
                                 ("bias", spec("bfloat16", (128,)))), (("eps", 1e-6), ("num_groups", 32)),
                  spec("bfloat16", (1, 128, 1024, 1024))),
        Signature("batch_norm", (("x", spec("bfloat16", (32, 64, 28, 28), nhwc)), ("running_mean", spec("float32", (64,))),
                                 ("running_var", spec("float32", (64,))), ("weight", spec("float32", (64,))),
                                 ("bias", spec("float32", (64,)))), (("eps", 1e-5), ("training", False)),
                  spec("bfloat16", (32, 64, 28, 28), nhwc)),
        Signature("rms_norm", (("x", spec("bfloat16", (4096, 4096))), ("weight", spec("bfloat16", (4096,)))),
                  (("composite", True), ("eps", 1e-6), ("normalized_shape", [4096]), ("weight_offset", 1.0)),
                  spec("bfloat16", (4096, 4096))),
    ]


def _stage_all_families(tmp_path: Path, arch: str) -> tuple[Path, int]:
    """One package holding every CUDA starting point of the search for a range of signatures."""
    from forge_pack.core.hotspot import Hotspot
    from forge_pack.pack.packager import RunInfo, Winner, stage_package
    from forge_pack.search.propose import ProposeRequest
    from forge_pack.search.templates_proposer import TemplateProposer
    from forge_pack.core.verdict import Baseline, Timing

    proposer = TemplateProposer()
    hotspots = helpers.cuda_hotspots()[0] + [Hotspot(s, ("F.x",), 1.0, 1.0, 1.0, 0.1, (), "cuda",
                                                     "tests:FakeNorm" if s.param("composite") else "")
                                             for s in _big_signatures()]
    winners = []
    for h in hotspots:
        for move in proposer.propose(ProposeRequest(h, "cuda", None, max_moves=8)):
            winners.append(Winner(h, len(winners), len(winners), move.candidate, helpers._evaluation(2.0),
                                  Baseline(Timing(10.0, 0.1, 30), Timing(12.0, 0.1, 30)),
                                  {"evaluations": 1, "verdicts": {"ok": 1}}))
    families = {(w.hotspot.op, w.candidate.family) for w in winners}
    assert len(winners) >= 15 and ("softmax", "split_row") in families and ("group_norm", "split") in families
    assert any(w.candidate.spec.workspaces for w in winners) and any(len(w.candidate.spec.kernels) > 1 for w in winners)
    info = RunInfo(tmp_path, str(helpers.TINY_MODEL), None, "cuda", None,
                   {"compute_capability": arch, "gpu": "NVIDIA H200", "cuda": "13.0"}, {}, None)
    out = tmp_path / "all_families"
    stage_package(out, "all_families", info, winners, {}, [])
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=out, capture_output=True, text=True,
                       env=dict(os.environ, TORCH_CUDA_ARCH_LIST=arch, MAX_JOBS="2"), timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-8000:]
    assert list((out / "all_families").glob("_C*.so"))
    return out, len(winners)


@pytest.mark.slow  # ~80 s on 2 cores: nvcc compiles ~25 kernels
@pytest.mark.skipif(bool(_nvcc_missing()), reason=_nvcc_missing() or "nvcc present")
def test_every_cuda_template_family_builds_inside_a_package(tmp_path):
    """The search's CUDA starting points (multi-kernel, workspaces, vector loads, bf16) build verbatim in one package."""
    _stage_all_families(tmp_path, "9.0")


@pytest.mark.gpu
@pytest.mark.slow
def test_every_cuda_template_family_verifies_on_the_gpu(tmp_path):
    """...and each one, launched by the generated binding, matches a float64 reference on the GPU."""
    import torch

    out, n = _stage_all_families(tmp_path, "%d.%d" % torch.cuda.get_device_capability())
    r = subprocess.run([sys.executable, "-m", "all_families", "verify", "--random", "2", "--seed", "1"],
                       capture_output=True, text=True, env=helpers.env_with(out), timeout=1800)
    print(r.stdout)
    assert r.returncode == 0 and f"PASS: {n} kernels" in r.stdout, r.stdout[-8000:] + r.stderr[-3000:]


@pytest.fixture(scope="module")
def gpu_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    run = _cuda_run(root)
    assert pack(run, root / "pkg", "cuda_pkg", confirm=False).written
    r = helpers.pip_install(root / "pkg", root / "site")
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return root / "site"


ROUNDTRIP = r"""
import json, torch, torch.nn.functional as F, cuda_pkg
from cuda_pkg._patch import DTYPES, ORIGINALS
res = {}
with torch.inference_mode():
    assert cuda_pkg.apply(), cuda_pkg.status()
    for t in cuda_pkg.manifest["targets"]:
        p = dict(t["signature"]["params"])
        x = {}
        for name, s in t["signature"]["inputs"]:
            if s is not None:
                v = torch.randn(s["shape"], device="cuda")
                x[name] = (v * 0.2 + 1.0 if name == "weight" else v).to(DTYPES[s["dtype"]])
        op = t["op"]
        if op in ("softmax", "log_softmax"):
            dt = DTYPES[p["dtype"]] if p["dtype"] else None
            call = lambda: getattr(F, op)(x["x"], dim=-1, dtype=dt)
            ref = lambda: ORIGINALS[("torch.nn.functional", op)](x["x"], dim=-1, dtype=dt)
        elif op == "group_norm":
            call = lambda: F.group_norm(x["x"], p["num_groups"], x.get("weight"), x.get("bias"), p["eps"])
            ref = lambda: ORIGINALS[("torch.nn.functional", op)](x["x"], p["num_groups"], x.get("weight"), x.get("bias"), p["eps"])
        else:
            call = lambda: F.adaptive_avg_pool2d(x["x"], 1)
            ref = lambda: ORIGINALS[("torch.nn.functional", op)](x["x"], 1)
        before = cuda_pkg.status()["kernel_calls"].get(t["id"], 0)
        got = call()
        torch.cuda.synchronize()
        hit = cuda_pkg.status()["kernel_calls"].get(t["id"], 0) > before
        expect = ref()
        tol = t["tolerance"]
        ok = torch.allclose(got.double(), expect.double(), atol=4 * tol["atol"], rtol=4 * tol["rtol"])
        res[t["id"]] = {"op": op, "kernel": hit, "close": bool(ok), "max": float((got.double() - expect.double()).abs().max())}
    cuda_pkg.revert()
print(json.dumps(res))
"""


@pytest.mark.gpu
def test_cuda_package_round_trip_on_the_gpu(gpu_site):
    r = subprocess.run([sys.executable, "-c", ROUNDTRIP], capture_output=True, text=True, timeout=600,
                       env=helpers.env_with(gpu_site))
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(res) == 5 and all(v["kernel"] and v["close"] for v in res.values()), res


@pytest.mark.gpu
def test_cuda_package_verify_passes_on_the_gpu(gpu_site):
    r = subprocess.run([sys.executable, "-m", "cuda_pkg", "verify"], capture_output=True, text=True, timeout=600,
                       env=helpers.env_with(gpu_site))
    print(r.stdout)
    assert r.returncode == 0 and "PASS: 5 kernels" in r.stdout, r.stdout + r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("t") and line.endswith("PASS")]
    assert len(rows) >= 5 * 5 and all(" armed " in line for line in rows), r.stdout  # the sentinel reached out


MODELS = sorted((Path(__file__).resolve().parent / "models").glob("*.py"))
# Build flags an example model needs on CUDA: the CUDA attention family computes in bf16/fp16 (mma.sync),
# so the float32 attention model is built in bfloat16 (a float32 build searches nothing and writes nothing).
CUDA_BUILD_FLAGS = {"attention_block": ["--dtype", "bfloat16"]}


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS, ids=[m.stem for m in MODELS])
def test_build_example_model_on_cuda_round_trip(model, tmp_path, cli_env, forge_cmd):
    """forge-pack build on the GPU, pip install, apply, compare, revert bitwise, `python -m <pkg> verify`."""
    name = f"{model.stem}_gpu"
    out = tmp_path / name
    # --allow-no-gain: this test is the package's round trip on the GPU, which must run whatever the
    # whole-model gain of a tiny model (the gain gate has its own tests, test_build_gain_and_from_run.py)
    r = subprocess.run([*forge_cmd, "build", str(model), "--device", "cuda", "--budget", "12", "--out", str(out),
                        "--name", name, "--run-dir", str(tmp_path / "run"), "--allow-no-gain",
                        *CUDA_BUILD_FLAGS.get(model.stem, [])],
                       capture_output=True, text=True, env=cli_env, timeout=3600)
    print(r.stdout[-6000:])
    assert r.returncode == 0, r.stderr[-6000:]
    assert (out / name / "manifest.json").is_file(), r.stdout[-3000:]
    doc = json.loads((out / name / "manifest.json").read_text())
    assert doc["model_result"] is not None and doc["model_result"]["kernel_calls"], doc["model_result"]
    site = tmp_path / "site"
    r = helpers.pip_install(out, site)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    env = helpers.env_with(site)
    r = subprocess.run([sys.executable, "-m", name, "verify"], capture_output=True, text=True, env=env, timeout=900)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "forge_pack.cli.demo", "show", name, str(model), "--device", "cuda",
                        *CUDA_BUILD_FLAGS.get(model.stem, []), "--json"], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(res)
    assert res["applied"] and res["bitwise_after_revert"] and res["kernel_calls"]
    assert res["within_tolerance"], res


@pytest.mark.gpu
def test_cuda_wheel_installs_and_says_what_it_was_built_for(tmp_path):
    """The deployment wheel of a CUDA package (--wheel): tagged abi3 where torch allows it, torch pinned
    exactly, and `info` names its GPU architecture and loads the extension on this GPU."""
    import zipfile

    import torch

    run = _cuda_run(tmp_path)
    result = pack(run, tmp_path / "pkg", "cuda_whl", confirm=False, wheel=True, say=lambda s: None)
    wheel = Path(result.wheel)
    meta = zipfile.ZipFile(wheel).read("cuda_whl-0.1.0.dist-info/METADATA").decode()
    assert f"Requires-Dist: torch=={torch.__version__}\n" in meta
    r = helpers.pip_install(wheel, tmp_path / "site")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    r = subprocess.run([sys.executable, "-m", "cuda_whl", "info"], capture_output=True, text=True, timeout=300,
                       env=helpers.env_with(tmp_path / "site"))
    assert r.returncode == 0 and "extension: loaded" in r.stdout, r.stdout + r.stderr[-3000:]
    major, minor = torch.cuda.get_device_capability()
    assert f"GPU architectures: sm_{major}{minor} (compute capability {major}.{minor})" in r.stdout, r.stdout
    assert "Python ABI " in r.stdout and f"torch {torch.__version__} (CUDA {torch.version.cuda})" in r.stdout
