"""Evaluator behaviour beyond single verdicts: concurrency, worker isolation, torch.compile baseline."""

import os
import threading
import time

import pytest

from forge_pack.candidate import Candidate
from forge_pack.evaluate import Evaluator
from forge_pack.reference_kernels import reference_candidate
from forge_pack.timing import TimingConfig, summarize
from forge_pack.worker import worker_envs

from eval_helpers import KERNELS, hotspot, load_fixture

FAST = TimingConfig(warmup=1, reps=5, flush=False, compile_baseline=False)


def _variant(cand: Candidate, i: int) -> Candidate:
    return Candidate(cand.op, cand.backend, cand.source + f"\n// variant {i}\n", cand.spec, "reference", {"i": i})


@pytest.mark.slow  # > 10 s on 2 cores
def test_evaluate_is_thread_safe_across_workers(tmp_path):
    h = hotspot("softmax", "x: f32[32,256], dim=-1")
    ref = reference_candidate(h.signature, "cpu")
    cands = [_variant(ref, i) for i in range(4)] + [load_fixture(KERNELS / "cpu_low_precision.cpp"),
                                                   load_fixture(KERNELS / "cpu_segfault.cpp")]
    results: dict[int, object] = {}
    with Evaluator("cpu", workers=2, timeout_s=10, timing=FAST, log_dir=tmp_path) as ev:
        def run(i):
            results[i] = ev.evaluate(cands[i], h)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cands))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        reasons = [results[i].verdict.reason for i in range(len(cands))]
        assert reasons == ["ok"] * 4 + ["mismatch", "crash"]
        # after the crash the pool is whole again
        assert ev.evaluate(_variant(ref, 99), h).verdict.ok


def test_worker_envs_split_cpu_threads_and_pin_gpus(monkeypatch):
    monkeypatch.delenv("FORGE_PACK_CPU_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    share = {"OMP_NUM_THREADS": "4", "FORGE_PACK_THREADS": "4", "OMP_WAIT_POLICY": "PASSIVE"}
    assert worker_envs("cpu", 2) == [share, share]
    assert worker_envs("cpu", 16)[0]["OMP_NUM_THREADS"] == "1"  # never below one thread
    monkeypatch.setenv("FORGE_PACK_CPU_THREADS", "3")
    assert worker_envs("cpu", 2)[1]["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert worker_envs("cuda", 8) == [{"CUDA_VISIBLE_DEVICES": "3"}, {"CUDA_VISIBLE_DEVICES": "5"}]
    assert worker_envs("cuda", 1) == [{"CUDA_VISIBLE_DEVICES": "3"}]


def test_compile_error_needs_no_worker_time(tmp_path):
    h = hotspot("softmax", "x: f32[8,64], dim=-1")
    with Evaluator("cpu", workers=1, timeout_s=10, timing=FAST, log_dir=tmp_path) as ev:
        t0 = time.perf_counter()
        e = ev.evaluate(load_fixture(KERNELS / "cpu_compile_error.cpp"), h)
        assert e.verdict.reason == "compile_error" and e.verdict.ok is False
        assert "error: expected primary-expression before" in e.compile_log and "+;" in e.verdict.detail
        assert e.compile_cmd.split()[0] in ("g++", "c++", "clang++") and " -shared " in e.compile_cmd
        assert time.perf_counter() - t0 < 30


def test_summarize_median_iqr_min():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0], "monotonic")
    assert (t.median_us, t.min_us, t.n) == (3.0, 1.0, 5) and t.iqr_us == pytest.approx(2.0)


@pytest.mark.slow
def test_baseline_times_torch_compile_on_cpu(tmp_path):
    h = hotspot("softmax", "x: f32[64,512], dim=-1")
    cfg = TimingConfig(warmup=2, reps=5, flush=False, compile_baseline=True)
    with Evaluator("cpu", workers=1, timeout_s=30, timing=cfg, log_dir=tmp_path) as ev:
        base = ev.baseline(h)
    assert (base.eager.n, base.eager.clock) == (5, "monotonic")
    # exactly one of: a compiled timing, or the recorded reason it failed (never raised)
    assert (base.compiled is None) == bool(base.compile_error)
    if base.compiled is not None:
        assert (base.compiled.n, base.compiled.clock) == (5, "monotonic")


def test_implausible_flags_only_times_below_the_copy_floor_where_it_is_judged():
    from forge_pack.evaluate import implausible
    from forge_pack.sigparse import parse_signature
    from forge_pack.verdict import Timing

    sig = parse_signature("softmax", "x: f32[4096,4096], dim=-1")  # 128 MB in + out
    cfg = TimingConfig()

    def t(us):
        return Timing(median_us=us, iqr_us=0.0, n=30, min_us=us, clock="cuda_events")

    floor = 50.0
    assert implausible(t(0.79 * floor), floor, 4000.0, sig, "cuda", cfg) == (
        "median 39.50 us is below 0.8x the bandwidth floor 50.00 us (134217728 bytes at 4000 GB/s): no kernel "
        "moves its bytes faster than a copy; review it (cached or skipped work?)")
    assert implausible(t(0.8 * floor), floor, 4000.0, sig, "cuda", cfg) is None  # the margin itself passes
    assert implausible(t(0.81 * floor), floor, 4000.0, sig, "cuda", cfg) is None
    # below ~2 us launch costs and timer resolution decide: not judged
    assert implausible(t(0.1), 1.0, 4000.0, sig, "cuda", cfg) is None
    # small CPU working sets sit in caches that legitimately beat DRAM copy speed
    small = parse_signature("softmax", "x: f32[64,1000], dim=-1")
    assert implausible(t(1.0), 50.0, 20.0, small, "cpu", cfg) is None
    assert implausible(t(1.0), 50.0, 20.0, sig, "cpu", cfg).startswith(
        "median 1.00 us is below 0.8x the bandwidth floor 50.00 us (134217728 bytes at 20 GB/s)")
    # judged from exactly the minimum floor on
    assert implausible(t(1.0), cfg.implausible_min_floor_us, 4000.0, sig, "cuda", cfg) is not None


def test_a_workspace_larger_than_a_few_copies_of_the_data_is_a_static_check(tmp_path):
    src = (KERNELS / "cpu_uninitialised_workspace.cpp").read_text()
    assert '"bytes": "rows * 8"' in src
    path = tmp_path / "huge_workspace.cpp"
    path.write_text(src.replace('"bytes": "rows * 8"', '"bytes": "rows * cols * 1000000000"'))
    ev = Evaluator("cpu", workers=1, timeout_s=20, timing=TimingConfig(warmup=1, reps=3, flush=False,
                                                                       compile_baseline=False), log_dir=tmp_path)
    try:
        e = ev.evaluate(load_fixture(path), hotspot("softmax", "x: f32[64,1000], dim=-1"))
    finally:
        ev.close()
    assert e.verdict.reason == "static_check", (e.verdict.reason, e.verdict.detail)
    assert e.verdict.detail == ("launch spec: workspace sums asks for 64000000000000 bytes, more than 67108864 (4x "
                                "the bytes the op moves, at least 64 MiB) (size the workspace from the problem; a "
                                "scratch buffer never needs more than a few copies of the data)")
