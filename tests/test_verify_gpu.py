"""The CUDA evaluator on a real GPU: cheating fixtures, faults, reference kernels, timing.

Needs a CUDA GPU (marker `gpu`; skipped centrally without one). Static and compile-time CUDA
fixtures (aliasing, side stream, int width, compile error) are covered without a GPU in
test_static_check.py and test_compile.py.
"""

import pytest

from forge_pack.core.candidate import Candidate, parse_spec
from forge_pack.evaluate.evaluator import Evaluator
from forge_pack.search.families import reference_candidate
from forge_pack.evaluate.timing import MIN_CUDA_REPS, TimingConfig

from eval_helpers import (CUDA_SIGNATURE, expected_reasons, fixture_files, fixture_final, fixture_signature, hotspot,
                          load_fixture)

pytestmark = pytest.mark.gpu

CFG = TimingConfig(warmup=5, reps=30, compile_baseline=False)
STATIC = {"static_check", "aliasing", "compile_error"}
FAULTS = {"launch_error", "timeout", "crash"}


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    ev = Evaluator("cuda", workers=1, timeout_s=30, timing=CFG, log_dir=tmp_path_factory.mktemp("workers"))
    yield ev
    ev.close()


def _reference_ok(evaluator, h):
    e = evaluator.evaluate(reference_candidate(h.signature, "cuda"), h)
    assert e.verdict.ok, e.verdict.detail
    return e


CHEATS = [p for p in fixture_files("cuda_") if not expected_reasons(p) & (STATIC | FAULTS | {"ok"})]
FAULTY = [p for p in fixture_files("cuda_") if expected_reasons(p) & FAULTS]
HONEST = [p for p in fixture_files("cuda_") if expected_reasons(p) == {"ok"}]


@pytest.mark.parametrize("path", CHEATS, ids=lambda p: p.stem)
def test_verify_rejects_cuda_cheating_kernel(evaluator, path):
    h = hotspot("softmax", fixture_signature(path, CUDA_SIGNATURE), device="cuda")
    e = evaluator.evaluate(load_fixture(path), h, final=fixture_final(path))
    assert not e.verdict.ok
    assert e.verdict.reason in expected_reasons(path), (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_verify_passes_honest_cuda_fixture(evaluator, path):
    h = hotspot("softmax", fixture_signature(path, CUDA_SIGNATURE), device="cuda")
    e = evaluator.evaluate(load_fixture(path), h, final=fixture_final(path))
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("path", FAULTY, ids=lambda p: p.stem)
def test_cuda_faults_become_verdicts_and_the_next_candidate_is_judged(evaluator, path):
    h = hotspot("softmax", CUDA_SIGNATURE, device="cuda")
    e = evaluator.evaluate(load_fixture(path), h)
    assert e.verdict.reason in expected_reasons(path), (e.verdict.reason, e.verdict.detail)
    _reference_ok(evaluator, h)


@pytest.mark.parametrize("path", [p for p in fixture_files("cuda_") if expected_reasons(p) & STATIC],
                         ids=lambda p: p.stem)
def test_static_cuda_fixtures_are_rejected_by_the_evaluator(evaluator, path):
    e = evaluator.evaluate(load_fixture(path), hotspot("softmax", CUDA_SIGNATURE, device="cuda"))
    assert e.verdict.reason in expected_reasons(path), (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("op,text", [
    ("softmax", "x: f32[512,2048], dim=-1"),
    ("softmax", "x: bf16[1,8,256,2048], dim=-1, dtype=float32"),
    ("softmax", "x: bf16[4096,256], dim=-1, dtype=float32"),
    ("softmax", "x: f16[8,262144], dim=-1"),
    ("log_softmax", "x: bf16[64,1000], dim=-1"),
    ("group_norm", "x: f32[1,512,32,32], num_groups=32, weight: f32[512], bias: f32[512]"),
    ("group_norm", "x: bf16[2,128,64,64], num_groups=32, weight: bf16[128], bias: bf16[128]"),
    ("adaptive_avg_pool2d", "x: f32[32,2048,7,7], output_size=(1,1)"),
    ("adaptive_avg_pool2d", "x: bf16[32,2048,7,7]{channels_last}, output_size=(1,1)"),
])
def test_reference_kernels_pass_on_gpu(evaluator, op, text):
    h = hotspot(op, text, device="cuda")
    e = _reference_ok(evaluator, h)
    assert e.verdict.reason == "ok" and e.verdict.detail == f"{len(e.verdict.checks)} input sets verified"
    # one batch of max(reps, MIN_CUDA_REPS) timed calls (min_time_s is 0), on CUDA events
    assert e.timing is not None and (e.timing.n, e.timing.clock) == (max(CFG.reps, MIN_CUDA_REPS), "cuda_events")
    assert e.timing.min_us <= e.timing.median_us
    # the driver's attributes of every kernel the spec launches, with the four fields read
    names = {k.name for k in reference_candidate(h.signature, "cuda").spec.kernels}
    assert set(e.extra["attributes"]) == names
    assert all(set(a) == {"max_threads", "static_smem_bytes", "local_bytes", "registers"} and a["registers"] > 0
               for a in e.extra["attributes"].values())
    assert e.extra["resources"]
    assert 0 < e.bandwidth_fraction < 1.25  # a fraction of the measured copy bandwidth; >1 only within noise


def test_dynamic_shared_memory_above_48k_is_opted_in(evaluator):
    src = r'''
extern "C" __global__ void copy_rows_smem(const float* __restrict__ x, float* __restrict__ out, long long cols) {
  extern __shared__ float row[];
  const long long r = blockIdx.x;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) row[c] = x[r * cols + c];
  __syncthreads();
  __shared__ float red[32];
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) m = fmaxf(m, red[i]);
  __syncthreads();
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(row[c] - m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  s = 0.f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) s += red[i];
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = expf(row[c] - m) / s;
}
'''
    spec = parse_spec('{"kernels": [{"name": "copy_rows_smem", "args": ["x", "out", "cols"], "grid": ["rows"], '
                      '"block": [256], "shared_mem": "cols * 4"}], "requires": ["cols <= 16384"]}')
    h = hotspot("softmax", "x: f32[64,16384], dim=-1", device="cuda")
    e = evaluator.evaluate(Candidate("softmax", "cuda", src, spec, "test"), h)
    assert e.verdict.ok, e.verdict.detail  # 64 KB of dynamic shared memory needs cuFuncSetAttribute
    # exactly 48 KB dynamic: the default cap is on static + dynamic, so the 128 static bytes need it too
    h48 = hotspot("softmax", "x: f32[64,12288], dim=-1", device="cuda")
    e = evaluator.evaluate(Candidate("softmax", "cuda", src, spec, "test"), h48)
    assert e.verdict.ok, e.verdict.detail


def test_baseline_times_eager_and_torch_compile_and_measures_bandwidth(tmp_path):
    h = hotspot("softmax", "x: bf16[1,8,2048,2048], dim=-1, dtype=float32", device="cuda")
    with Evaluator("cuda", workers=1, timeout_s=60, timing=TimingConfig(compile_baseline=True),
                   log_dir=tmp_path) as ev:
        base = ev.baseline(h)
        e = ev.evaluate(reference_candidate(h.signature, "cuda"), h, base)
        info = ev.device_info()
    assert (base.eager.n, base.eager.clock) == (max(TimingConfig().reps, MIN_CUDA_REPS), "cuda_events")
    # exactly one of: a compiled timing, or the recorded reason it failed (never raised)
    assert (base.compiled is None) == bool(base.compile_error)
    assert base.copy_bandwidth_gbs > 500 and base.floor_us > 0
    assert e.verdict.ok
    assert e.speedup_vs_eager == pytest.approx(base.eager.median_us / e.timing.median_us, rel=1e-9)
    assert info["arch"].startswith("sm_") and info["smem_optin_bytes"] > 48 * 1024


def test_same_kernel_timed_twice_agrees(evaluator):
    h = hotspot("softmax", "x: bf16[1,8,2048,2048], dim=-1, dtype=float32", device="cuda")
    ref = reference_candidate(h.signature, "cuda")
    a = evaluator.evaluate(ref, h)
    b = evaluator.evaluate(Candidate(ref.op, ref.backend, ref.source + "\n// again\n", ref.spec), h)
    assert a.verdict.ok and b.verdict.ok
    assert abs(a.timing.median_us - b.timing.median_us) / a.timing.median_us < 0.10


def test_host_time_to_enqueue_a_call_is_not_timed():
    """A call whose Python side takes 100 us before it launches a tiny kernel: with the GPU spinning
    ahead of the batch (the queue lead) the event pair spans the kernel only; with no lead the
    GPU drains its queue after each flush and the host's 100 us land inside the timed region."""
    import time

    import torch

    from forge_pack.evaluate.timing import time_calls

    x = torch.zeros(1024, device="cuda")

    def slow_host_call():
        t_end = time.perf_counter() + 100e-6
        while time.perf_counter() < t_end:
            pass
        x.add_(1.0)

    led = time_calls([slow_host_call], "cuda", TimingConfig(warmup=3, reps=30, queue_lead_us=250.0))
    bare = time_calls([slow_host_call], "cuda", TimingConfig(warmup=3, reps=30, queue_lead_us=0.0))
    assert led.median_us < 40.0, led
    assert bare.median_us > 70.0, bare


def test_the_judges_per_call_preparation_never_synchronises_the_stream():
    """Ahead of every timed call the judge changes one element of x, prefills out and garbles the
    workspaces. None of it may wait for the GPU: a synchronising step drains the queue lead's spin, the
    host then outlasts every lead (each batch run again up to DRAIN_RETRIES times, 20 ms spins waited
    out), and the launch is no longer covered. torch's sync debug mode raises on any synchronising call."""
    import random

    import torch

    from forge_pack.evaluate import judge

    x = torch.randn(64, 1024, device="cuda")
    out = torch.empty(64, 1024, device="cuda")
    ws = torch.empty(4096, dtype=torch.uint8, device="cuda")
    slot = {"tensors": {"x": x}, "pending": []}
    state = {"batch": 0}
    before = judge._before_timed_call(slot, out, [ws], random.Random(0),
                                      torch.Generator(device="cuda").manual_seed(0), state)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in range(4):
            state["batch"] = batch
            before()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert len(slot["pending"]) == 4
    idx, value = slot["pending"][-1]
    assert float(x[idx]) == pytest.approx(value, rel=1e-6)


def test_the_comparisons_read_back_once_whatever_the_number_of_chunks(monkeypatch):
    """compare and surely_within fold their per-chunk counts and maxima on the device and read them back at the
    end: the synchronising calls are as many for 64 chunks as for 4 (one per chunk left the GPU idle while the
    host queued the next chunk: ~90 ms per 1.9 GB compare on an H100). Counted by torch's sync debug mode."""
    import warnings

    import torch

    from forge_pack.evaluate import tolerance, verdict_rules

    monkeypatch.setattr(verdict_rules, "_CHUNK", 1 << 12)

    def syncs(n: int) -> int:
        ref = torch.linspace(-2, 2, n, dtype=torch.float64, device="cuda")
        out = ref.float()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                assert verdict_rules.compare(out, ref).mismatches == 0
                assert tolerance.surely_within(out, ref)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in seen)

    syncs(4 << 12)  # the first comparison in a process synchronised once more (4 then 3 on an H100): not per chunk
    few, many = syncs(4 << 12), syncs(64 << 12)
    assert few == many and 0 < few <= 4, (few, many)
