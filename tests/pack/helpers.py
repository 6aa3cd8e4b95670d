"""Synthetic run directories for the packaging tests: a real profile of a model file (real
signatures, real captured tensors) plus, per hotspot, one correct kernel recorded as the search's
winner with made-up timings. Packing them exercises everything after the search, in seconds."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

from forge_pack.core.candidate import Candidate, parse_spec
from forge_pack.core.hotspot import Hotspot
from forge_pack.search.families import reference_candidate
from forge_pack.core.signature import Signature, TensorSpec, contiguous_strides
from forge_pack.store.run_store import Store
from forge_pack.core.verdict import Baseline, Check, Evaluation, Timing, Verdict

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TINY_MODEL = HERE / "tiny_model.py"
E2E_MODEL = HERE / "e2e_model.py"

CPU_LAYER_NORM = r"""
#include <cmath>
// Test kernel: layer_norm over the last `cols` elements; weight/bias may be NULL.
extern "C" void test_layer_norm(const float* x, const float* w, const float* b, float* out,
                                long long rows, long long cols, float eps) {
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* o = out + r * cols;
    double s = 0.0;
    for (long long c = 0; c < cols; ++c) s += xr[c];
    const double mean = s / cols;
    double v = 0.0;
    for (long long c = 0; c < cols; ++c) { const double d = xr[c] - mean; v += d * d; }
    const float inv = (float)(1.0 / std::sqrt(v / cols + (double)eps));
    for (long long c = 0; c < cols; ++c) {
      float y = (float)(xr[c] - mean) * inv;
      if (w) y *= w[c];
      if (b) y += b[c];
      o[c] = y;
    }
  }
}
"""
CPU_LAYER_NORM_SPEC = {"kernels": [{"name": "test_layer_norm",
                                    "args": ["x", "weight", "bias", "out", "rows", "cols", "eps"]}]}

CPU_RMS_NORM = r"""
#include <cmath>
// Test kernel: x * rsqrt(mean(x^2) + eps) * (w + offset), fp32.
extern "C" void test_rms_norm(const float* x, const float* w, float* out, long long rows, long long cols,
                              float eps, float offset) {
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    double s = 0.0;
    for (long long c = 0; c < cols; ++c) s += (double)xr[c] * xr[c];
    const float inv = (float)(1.0 / std::sqrt(s / cols + (double)eps));
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = xr[c] * inv * (w ? w[c] + offset : 1.0f);
  }
}
"""
CPU_RMS_NORM_SPEC = {"kernels": [{"name": "test_rms_norm",
                                  "args": ["x", "weight", "out", "rows", "cols", "eps", "weight_offset"]}]}


def cpu_candidate(sig: Signature) -> Candidate | None:
    if sig.op == "layer_norm" and sig.x.dtype == "float32":
        return Candidate("layer_norm", "cpu", CPU_LAYER_NORM, parse_spec(CPU_LAYER_NORM_SPEC), "test", {}, "user")
    if sig.op == "rms_norm" and sig.x.dtype == "float32" and (sig.output is None or sig.output.dtype == "float32"):
        return Candidate("rms_norm", "cpu", CPU_RMS_NORM, parse_spec(CPU_RMS_NORM_SPEC), "test", {}, "user")
    return reference_candidate(sig, "cpu")


def _evaluation(speedup: float) -> Evaluation:
    checks = (Check("captured[0]", 2e-7, 3e-6, 0, 1e-5, 1e-4), Check("fresh[0]", 3e-7, 4e-6, 0, 1e-5, 1e-4),
              Check("adversarial:large", 1e-6, 1e-5, 0, 1e-5, 1e-4))
    kernel = Timing(10.0 / speedup, 0.3, 30, 10.0 / speedup - 0.2, "monotonic")
    return Evaluation(Verdict(True, "ok", "", 3e-7, 4e-6, checks), kernel, compile_s=0.5,
                      speedup_vs_eager=speedup, speedup_vs_compile=12.0 / kernel.median_us)


def store_winners(run_dir: Path, hotspots: list[Hotspot], candidates: dict, model_path: str, model_hash: str,
                  device: str, env: dict, speedup: float = 2.0) -> None:
    """Record each hotspot with its candidate as the winner (and one failed sibling, for statistics)."""
    with Store(run_dir) as store:
        run_id = store.start_run(model_path, model_hash, device, "", env, {"seed": 0, "timeout_s": 60.0})
        for rank, h in enumerate(hotspots, 1):
            store.add_hotspot(run_id, rank, h.to_json(), 4)
            cand = candidates.get(h.id)
            if cand is None:
                store.set_hotspot_status(h.id, "skipped")
                continue
            store.set_baseline(h.id, Baseline(Timing(10.0, 0.4, 30, 9.5, "monotonic"),
                                              Timing(12.0, 0.4, 30, 11.5, "monotonic")).to_json())
            bad = store.add_node(h.id, None, 1, "broken start", "root", {**cand.to_json(), "hash": "x" * 64})
            store.record_evaluation(bad, h.id, Evaluation(Verdict(False, "mismatch", "index (0,): got 1, expected 2"))
                                    .to_json(), math.log(0.25))
            node = store.add_node(h.id, None, 1, "reference kernel", "root", cand.to_json())
            store.record_evaluation(node, h.id, _evaluation(speedup).to_json(), math.log(speedup))
            store.set_hotspot_status(h.id, "done", node)
        store.finish_run(run_id)


def make_cpu_run(run_dir: Path, model_path: Path = TINY_MODEL, speedup: float = 2.0) -> Path:
    """Profile `model_path` on the CPU for real, then record a correct CPU kernel per hotspot as its winner."""
    from forge_pack.profile.load import load
    from forge_pack.profile.profiler import profile

    target = load(str(model_path), "cpu", None)
    prof = profile(target, run_dir, quiet=True)
    cands = {}
    for h in prof.hotspots:
        c = cpu_candidate(h.signature) if not h.unsupported else None
        if c is not None:
            cands[h.id] = c
    env = {"torch": __import__("torch").__version__, "python": sys.version.split()[0], "platform": "test"}
    store_winners(run_dir, prof.hotspots, cands, str(model_path), target.model_hash, "cpu", env, speedup)
    with Store(run_dir) as s:
        s.set_meta("forward_us", prof.forward_us)
    return run_dir


# bf16 in and out, written with cuda_bf16.h's conversion operators: torch's CUDAExtension flags
# (-D__CUDA_NO_BFLOAT16_CONVERSIONS__ ...) would reject it; the generated launcher lifts them.
CUDA_BF16_SOFTMAX = r"""
#include <cuda_bf16.h>
extern "C" __global__ void bf16_softmax_rows(const __nv_bfloat16* x, __nv_bfloat16* out, long long rows, int cols) {
  extern __shared__ float red[];
  const long long r = blockIdx.x;
  if (r >= rows) return;
  const __nv_bfloat16* xr = x + r * cols;
  __nv_bfloat16* o = out + r * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) { float v = xr[c]; m = fmaxf(m, v); }
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf((float)xr[c] - m);
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  sum = red[0];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = expf((float)xr[c] - m) / sum;
}
"""
CUDA_BF16_SOFTMAX_SPEC = {"kernels": [{"name": "bf16_softmax_rows", "args": ["x", "out", "rows", "i32:cols"],
                                       "grid": ["rows", 1, 1], "block": [256, 1, 1], "shared_mem": "256 * 4"}]}


def cuda_hotspots() -> tuple[list[Hotspot], dict]:
    """CUDA signatures (no GPU needed to pack or compile them) with the reference CUDA kernels."""
    def spec(dtype, shape):
        return TensorSpec(dtype, shape, contiguous_strides(shape))

    sigs = [
        Signature("softmax", (("x", spec("bfloat16", (4, 8, 256))),), (("dim", 2), ("dtype", "float32")),
                  spec("float32", (4, 8, 256))),
        Signature("log_softmax", (("x", spec("float32", (64, 1000))),), (("dim", 1), ("dtype", None)),
                  spec("float32", (64, 1000))),
        Signature("group_norm", (("x", spec("bfloat16", (2, 64, 16, 16))), ("weight", spec("bfloat16", (64,))),
                                 ("bias", spec("bfloat16", (64,)))), (("eps", 1e-6), ("num_groups", 32)),
                  spec("bfloat16", (2, 64, 16, 16))),
        Signature("adaptive_avg_pool2d", (("x", spec("float32", (8, 128, 7, 7))),), (("output_size", [1, 1]),),
                  spec("float32", (8, 128, 1, 1))),
    ]
    bf16 = Signature("softmax", (("x", spec("bfloat16", (16, 512))),), (("dim", 1), ("dtype", None)),
                     spec("bfloat16", (16, 512)))
    hotspots, cands = [], {}
    for s in sigs + [bf16]:
        h = Hotspot(s, (f"F.{s.op}",), 1.0, 10.0, 10.0, 0.15, (), "cuda")
        hotspots.append(h)
        c = reference_candidate(s, "cuda") if s is not bf16 else \
            Candidate("softmax", "cuda", CUDA_BF16_SOFTMAX, parse_spec(CUDA_BF16_SOFTMAX_SPEC), "test", {}, "user")
        assert c is not None, s.op
        cands[h.id] = c
    return hotspots, cands


def make_cuda_run(run_dir: Path) -> Path:
    hotspots, cands = cuda_hotspots()
    env = {"torch": "2.11.0", "cuda": "13.0", "gpu": "NVIDIA H200", "compute_capability": "9.0", "python": "3.12"}
    run_dir.mkdir(parents=True, exist_ok=True)
    store_winners(run_dir, hotspots, cands, str(TINY_MODEL), "0" * 64, "cuda", env)
    return run_dir


def pip_install(package_dir: Path, target: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q",
                           "--target", str(target), str(package_dir)], capture_output=True, text=True, timeout=1200)


def env_with(site: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("FORGE_PACK_DISABLE", None)
    env.update(extra)
    return env
