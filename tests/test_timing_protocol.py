"""The timing protocol's figures, in process and with a fake clock: the median/IQR summary, the
batch order of before/flush/call/check, the stopping rules, the cache sizes that decide whether a
time is judged by the plausibility gate, the copy-bandwidth probe and the rotation count.

Fast on purpose: these are the tests `make mutation` runs against forge_pack/evaluate/timing.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from forge_pack.evaluate import timing
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.core.verdict import Timing


# ---------------------------------------------------------------- summarize


def test_summarize_sorts_and_takes_inclusive_quartiles():
    t = timing.summarize([5.0, 1.0, 4.0, 2.0, 3.0], "monotonic")
    assert t == Timing(median_us=3.0, iqr_us=2.0, n=5, min_us=1.0, clock="monotonic")


def test_summarize_of_exactly_four_times_uses_quartiles_not_the_range():
    t = timing.summarize([10.0, 1.0, 3.0, 2.0], "cuda_events")
    # inclusive quartiles of 1, 2, 3, 10: 1.75 and 4.75
    assert t == Timing(median_us=2.5, iqr_us=3.0, n=4, min_us=1.0, clock="cuda_events")


def test_summarize_of_three_times_uses_the_range_as_iqr():
    assert timing.summarize([9.0, 1.0, 4.0], "monotonic") == Timing(4.0, 8.0, 3, 1.0, "monotonic")


def test_summarize_of_no_times_is_an_error_of_the_median():
    import statistics

    with pytest.raises(statistics.StatisticsError):
        timing.summarize([], "monotonic")


def test_summarize_of_one_time_has_no_spread():
    assert timing.summarize([7.0], "monotonic") == Timing(7.0, 0.0, 1, 7.0, "monotonic")


# ---------------------------------------------------------------- cache sizes


def _sysfs(monkeypatch, root: Path) -> None:
    """timing reads /sys through Path(...): point it at a fake tree under root."""
    monkeypatch.setattr(timing, "Path", lambda p: Path(str(root) + str(p)))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cpu_llc_bytes_is_the_largest_cache_of_cpu0_with_any_unit_suffix(tmp_path, monkeypatch):
    cache = tmp_path / "sys/devices/system/cpu/cpu0/cache"
    _write(cache / "index0/size", "48k\n")  # lower case: read case-insensitively
    _write(cache / "index1/size", "2M\n")
    _write(cache / "index2/size", "30720K\n")
    _write(cache / "index3/size", "garbage\n")  # unreadable entries are skipped
    (cache / "index4").mkdir()  # no size file at all
    _sysfs(monkeypatch, tmp_path)
    assert timing._cpu_llc_bytes() == 30720 << 10


def test_cpu_llc_bytes_reads_gigabytes_and_plain_byte_counts(tmp_path, monkeypatch):
    cache = tmp_path / "sys/devices/system/cpu/cpu0/cache"
    _write(cache / "index0/size", "1G")
    _sysfs(monkeypatch, tmp_path)
    assert timing._cpu_llc_bytes() == 1 << 30
    _write(cache / "index0/size", "4096")
    assert timing._cpu_llc_bytes() == 4096


def test_cpu_llc_bytes_reads_megabytes(tmp_path, monkeypatch):
    cache = tmp_path / "sys/devices/system/cpu/cpu0/cache"
    _write(cache / "index0/size", "32K")
    _write(cache / "index3/size", "8M")
    _sysfs(monkeypatch, tmp_path)
    assert timing._cpu_llc_bytes() == 8 << 20


def test_cpu_llc_bytes_defaults_to_32_mib_without_sysfs(tmp_path, monkeypatch):
    _sysfs(monkeypatch, tmp_path)
    assert timing._cpu_llc_bytes() == 32 << 20


def _cpu(root: Path, n: int, levels: dict[str, tuple[str, str | None]]) -> None:
    for idx, (level, shared) in levels.items():
        _write(root / f"sys/devices/system/cpu/cpu{n}/cache/{idx}/level", level)
        if shared is not None:
            _write(root / f"sys/devices/system/cpu/cpu{n}/cache/{idx}/shared_cpu_list", shared)


def test_cpu_llc_domains_counts_distinct_top_level_caches(tmp_path, monkeypatch):
    _cpu(tmp_path, 0, {"index0": ("1", "0"), "index3": ("3", "0-1\n")})
    _cpu(tmp_path, 1, {"index0": ("1", "1"), "index3": ("3", "0-1")})
    _cpu(tmp_path, 2, {"index0": ("1", "2"), "index2": ("2", "2"), "index3": ("3", "2-3")})
    _cpu(tmp_path, 3, {"index0": ("x", "3"), "index3": ("3", "2-3")})  # an unreadable level is skipped
    _cpu(tmp_path, 4, {"index0": ("1", "4"), "index3": ("3", None)})  # no shared list: not counted
    (tmp_path / "sys/devices/system/cpu/cpu5").mkdir()  # no cache folder
    for n, shared in ((6, "6"), (7, "7"), (8, "8")):  # unreadable levels before and after a good one
        _cpu(tmp_path, n, {"index0": ("?", "x"), "index1": ("", "x"), "index2": ("3", shared), "index5": ("-", "x")})
    _write(tmp_path / "sys/devices/system/cpu/cpufreq/cache/index0/level", "9")  # not a cpu[0-9]* folder
    _write(tmp_path / "sys/devices/system/cpu/cpufreq/cache/index0/shared_cpu_list", "9")
    _sysfs(monkeypatch, tmp_path)
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: 12345)
    assert timing._cpu_llc_domains() == (12345, 5)


def test_cpu_llc_domains_counts_the_level_1_list_when_it_is_the_top(tmp_path, monkeypatch):
    # the highest level wins, whatever its index folder is called
    _cpu(tmp_path, 0, {"index0": ("2", "0-3"), "index1": ("1", "0")})
    _cpu(tmp_path, 1, {"index0": ("2", "0-3"), "index1": ("1", "1")})
    _sysfs(monkeypatch, tmp_path)
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: 1)
    assert timing._cpu_llc_domains() == (1, 1)


def test_cpu_llc_domains_is_at_least_one_without_sysfs(tmp_path, monkeypatch):
    _sysfs(monkeypatch, tmp_path)
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: 99)
    assert timing._cpu_llc_domains() == (99, 1)


def test_cache_bytes_is_the_l2_on_cuda_and_every_llc_together_on_cpu(monkeypatch):
    monkeypatch.setattr(timing, "_cuda_l2_bytes", lambda: 50 << 20)
    monkeypatch.setattr(timing, "_cpu_llc_domains", lambda: (8 << 20, 3))
    assert timing.cache_bytes("cuda") == 50 << 20
    assert timing.cache_bytes("cpu") == 24 << 20


def test_flush_bytes_follows_the_config_and_the_cache(monkeypatch):
    monkeypatch.setattr(timing, "_cuda_l2_bytes", lambda: 50 << 20)
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: 10 << 20)
    assert timing.flush_bytes("cuda", TimingConfig(flush=False)) == 0
    assert timing.flush_bytes("cpu", TimingConfig(flush=False, cpu_flush_bytes=4096)) == 0
    assert timing.flush_bytes("cuda", TimingConfig()) == 100 << 20
    assert timing.flush_bytes("cuda", TimingConfig(cpu_flush_bytes=4096)) == 100 << 20  # CPU-only setting
    assert timing.flush_bytes("cpu", TimingConfig()) == 20 << 20
    assert timing.flush_bytes("cpu", TimingConfig(cpu_flush_bytes=4096)) == 4096


def test_flush_bytes_on_cpu_is_capped_at_256_mib(monkeypatch):
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: 200 << 20)
    assert timing.flush_bytes("cpu", TimingConfig()) == 256 << 20
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: 128 << 20)
    assert timing.flush_bytes("cpu", TimingConfig()) == 256 << 20
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: (128 << 20) - 1)
    assert timing.flush_bytes("cpu", TimingConfig()) == (256 << 20) - 2


def test_cold_cache_needs_a_flush_of_twice_all_the_cache(monkeypatch):
    monkeypatch.setattr(timing, "_cpu_llc_domains", lambda: (1000, 2))  # 2000 bytes of cache
    monkeypatch.setattr(timing, "_cuda_l2_bytes", lambda: 1000)  # flush 2000 = 1x the L2 on CUDA
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: 10)  # a CPU-sized flush would be 20 bytes
    assert timing.cold_cache("cpu", TimingConfig(cpu_flush_bytes=4000)) is True
    assert timing.cold_cache("cpu", TimingConfig(cpu_flush_bytes=3999)) is False
    assert timing.cold_cache("cpu", TimingConfig(flush=False, cpu_flush_bytes=4000)) is False
    assert timing.cold_cache("cuda", TimingConfig()) is True  # 2x L2 flush >= 2x L2


# ---------------------------------------------------------------- the flusher


def test_flusher_writes_its_whole_buffer_on_cpu_every_call():
    f = timing.Flusher("cpu", TimingConfig(cpu_flush_bytes=4096))
    assert f.buf.dtype == torch.int32 and f.buf.numel() == 1024 and f.buf.device.type == "cpu"
    before = f.buf.clone()
    f()
    assert torch.equal(f.buf, before + 1)
    f()
    assert torch.equal(f.buf, before + 2)


def test_flusher_on_cuda_zeroes_twice_the_l2_on_the_device(monkeypatch):
    made = []
    real_empty = torch.empty

    def spy(n, dtype=None, device=None):
        made.append((n, dtype, device))
        return real_empty(n, dtype=dtype)

    monkeypatch.setattr(timing.torch, "empty", spy)
    monkeypatch.setattr(timing, "_cuda_l2_bytes", lambda: 1 << 12)
    monkeypatch.setattr(timing, "_cpu_llc_bytes", lambda: 1 << 20)
    f = timing.Flusher("cuda", TimingConfig())
    assert made == [(2048, torch.int32, "cuda")]

    class Buf:
        class device:
            type = "cuda"

        def __init__(self):
            self.log = []

        def add_(self, v):
            self.log.append("add")

        def zero_(self):
            self.log.append("zero")

    f.buf = Buf()
    f()
    assert f.buf.log == ["zero"]


def test_flusher_without_flush_holds_nothing_and_does_nothing():
    f = timing.Flusher("cpu", TimingConfig(flush=False, cpu_flush_bytes=4096))
    assert f.buf is None
    f()  # a no-op, never an error
    assert f.buf is None


# ---------------------------------------------------------------- batches and the CPU loop


def test_batches_cover_the_total_in_copies_then_the_rest():
    assert list(timing._batches(5, 2)) == [2, 2, 1]
    assert list(timing._batches(4, 2)) == [2, 2]
    assert list(timing._batches(2, 3)) == [2]
    assert list(timing._batches(0, 3)) == []


class FakeClock:
    """perf_counter_ns and process_time_ns advancing by fixed steps per call made."""

    def __init__(self, wall_ns: list[int], cpu_ns: list[int]):
        self.wall, self.cpu = list(wall_ns), list(cpu_ns)
        self.t_wall = self.t_cpu = 0

    def perf_counter_ns(self) -> int:
        self.t_wall += self.wall.pop(0) if self.wall else 0
        return self.t_wall

    def process_time_ns(self) -> int:
        self.t_cpu += self.cpu.pop(0) if self.cpu else 0
        return self.t_cpu


def _fake_time(monkeypatch, clock: FakeClock) -> None:
    monkeypatch.setattr(timing.time, "perf_counter_ns", clock.perf_counter_ns)
    monkeypatch.setattr(timing.time, "process_time_ns", clock.process_time_ns)


def test_cpu_loop_order_of_before_flush_call_and_batch_checks(monkeypatch):
    log = []
    _fake_time(monkeypatch, FakeClock([0], [0]))
    calls = [lambda i=i: log.append(f"call{i}") for i in range(2)]
    befores = [lambda i=i: log.append(f"before{i}") for i in range(2)]

    def after(phase):
        log.append(phase)
        return False

    cfg = TimingConfig(warmup=3, reps=3)
    t = timing.time_calls(calls, "cpu", cfg, flusher=lambda: log.append("flush"), before=befores, after=after)
    assert log == ["before0", "call0", "before1", "call1", "warm-up", "before0", "call0", "warm-up",
                   "before0", "flush", "call0", "before1", "flush", "call1", "timed",
                   "before0", "flush", "call0", "timed"]
    assert t.n == 3 and t.clock == "monotonic"


def test_cpu_time_is_the_smaller_of_wall_and_cpu_time(monkeypatch):
    # per timed call: perf_counter_ns is read twice, process_time_ns twice (c0 first)
    clock = FakeClock(wall_ns=[7 * 10**6, 5000, 0, 2000], cpu_ns=[10**6, 3000, 0, 9000])
    _fake_time(monkeypatch, clock)
    t = timing.time_calls([lambda: None], "cpu", TimingConfig(warmup=0, reps=2, flush=False))
    assert t == Timing(median_us=2.5, iqr_us=1.0, n=2, min_us=2.0, clock="monotonic")


def test_cpu_time_of_a_sandboxed_call_is_its_own_clock_and_staged_before_the_flush(monkeypatch):
    log = []
    _fake_time(monkeypatch, FakeClock([0, 10**9], [0, 10**9]))

    def call():
        log.append("call")

    call.stage = lambda: log.append("stage")
    call.elapsed_s = lambda: 0.5  # 0.5 s, whatever the wall clock says
    t = timing.time_calls([call], "cpu", TimingConfig(warmup=1, reps=2), flusher=lambda: log.append("flush"))
    assert log == ["call", "stage", "flush", "call", "stage", "flush", "call"]
    assert t.median_us == 500000.0 and t.min_us == 500000.0 and t.n == 2


def test_cpu_loop_without_before_or_after_runs_every_call(monkeypatch):
    n = [0, 0]
    _fake_time(monkeypatch, FakeClock([], []))

    def make(i):
        def call():
            n[i] += 1
        return call

    t = timing.time_calls([make(0), make(1)], "cpu", TimingConfig(warmup=2, reps=5, flush=False))
    assert n == [1 + 3, 1 + 2] and t.n == 5  # warm-up one each; timed 3 + 2


def test_cpu_loop_keeps_timing_until_min_time_then_stops(monkeypatch):
    # every call takes 1 s of wall and CPU time
    _fake_time(monkeypatch, FakeClock([0, 10**9] * 20, [0, 10**9] * 20))
    t = timing.time_calls([lambda: None], "cpu", TimingConfig(warmup=0, reps=2, min_time_s=3.0, max_reps=50,
                                                            flush=False))
    assert t.n == 4 and t.median_us == pytest.approx(1e6)


def test_cpu_loop_stops_at_exactly_min_time(monkeypatch):
    _fake_time(monkeypatch, FakeClock([0, 10**9] * 20, [0, 10**9] * 20))
    t = timing.time_calls([lambda: None], "cpu", TimingConfig(warmup=0, reps=2, min_time_s=2.0, max_reps=50,
                                                            flush=False))
    assert t.n == 2


def test_cpu_loop_stops_at_max_reps_short_of_min_time(monkeypatch):
    _fake_time(monkeypatch, FakeClock([0, 10**9] * 20, [0, 10**9] * 20))
    t = timing.time_calls([lambda: None], "cpu", TimingConfig(warmup=0, reps=2, min_time_s=100.0, max_reps=5,
                                                            flush=False))
    assert t.n == 5


def test_cpu_loop_times_at_least_one_call_for_zero_reps(monkeypatch):
    _fake_time(monkeypatch, FakeClock([], []))
    assert timing.time_calls([lambda: None], "cpu", TimingConfig(warmup=0, reps=0, flush=False)).n == 1
    assert timing.time_calls([lambda: None], "cpu", TimingConfig(warmup=0, reps=0, min_time_s=1.0, max_reps=3,
                                                               flush=False)).n == 3


def test_cpu_loop_with_zero_reps_adds_one_call_at_a_time_until_min_time(monkeypatch):
    _fake_time(monkeypatch, FakeClock([0, 10**9] * 20, [0, 10**9] * 20))
    t = timing.time_calls([lambda: None], "cpu", TimingConfig(warmup=0, reps=0, min_time_s=2.0, max_reps=50,
                                                            flush=False))
    assert t.n == 2


def test_cpu_loop_stops_and_returns_nothing_when_a_warm_up_check_fails(monkeypatch):
    _fake_time(monkeypatch, FakeClock([], []))
    phases = []

    def after(phase):
        phases.append(phase)
        return True

    assert timing.time_calls([lambda: None] * 2, "cpu", TimingConfig(warmup=4, reps=5, flush=False),
                             after=after) is None
    assert phases == ["warm-up"]


def test_cpu_loop_returns_the_calls_so_far_when_a_timed_check_fails(monkeypatch):
    _fake_time(monkeypatch, FakeClock([], []))
    phases = []

    def after(phase):
        phases.append(phase)
        return phase == "timed" and phases.count("timed") == 2

    t = timing.time_calls([lambda: None] * 2, "cpu", TimingConfig(warmup=2, reps=9, flush=False), after=after)
    assert phases == ["warm-up", "timed", "timed"] and t.n == 4 and t.clock == "monotonic"


def test_time_calls_makes_its_own_flusher_from_the_config(monkeypatch):
    made = []

    class Recording(timing.Flusher):
        def __init__(self, device, cfg):
            made.append((device, cfg.cpu_flush_bytes))
            super().__init__(device, cfg)

    monkeypatch.setattr(timing, "Flusher", Recording)
    _fake_time(monkeypatch, FakeClock([], []))
    timing.time_calls([lambda: None], "cpu", TimingConfig(warmup=0, reps=1, cpu_flush_bytes=64))
    assert made == [("cpu", 64)]


def test_time_calls_sends_cuda_to_the_event_timer(monkeypatch):
    seen = []
    monkeypatch.setattr(timing, "_time_cuda", lambda calls, cfg, fl, befores, after: seen.append(
        (len(calls), cfg, fl, len(befores), befores[0](), after("timed"))) or "cuda")
    monkeypatch.setattr(timing, "_time_cpu", lambda *a: "cpu")
    cfg = TimingConfig(flush=False)
    flusher = timing.Flusher("cpu", cfg)
    assert timing.time_calls([lambda: None] * 3, "cuda", cfg, flusher) == "cuda"
    assert seen == [(3, cfg, flusher, 3, None, False)]
    assert timing.time_calls([lambda: None], "cpu", cfg) == "cpu"


# ---------------------------------------------------------------- copy bandwidth and rotation


def test_copy_bandwidth_probe_copies_a_quarter_of_copy_bytes_on_cpu(monkeypatch):
    seen = {}

    def fake_time_calls(calls, device, cfg):
        calls[0]()
        seen["device"], seen["cfg"], seen["calls"] = device, cfg, len(calls)
        return Timing(median_us=2.0, iqr_us=0.0, n=5)

    monkeypatch.setattr(timing, "time_calls", fake_time_calls)
    copied = []
    real_copy = torch.Tensor.copy_

    def spy(dst, src, *a, **k):
        copied.append((dst.dtype, dst.numel(), bool((src == 1.0).all())))
        return real_copy(dst, src, *a, **k)

    monkeypatch.setattr(torch.Tensor, "copy_", spy)
    bw = timing.copy_bandwidth_gbs("cpu", TimingConfig(copy_bytes=4000))
    # 1000 bytes read + written = 2000 bytes in 2 us: 1 GB/s
    assert bw == pytest.approx(1.0)
    assert copied == [(torch.bfloat16, 500, True)]
    assert seen["device"] == "cpu" and seen["calls"] == 1
    assert (seen["cfg"].warmup, seen["cfg"].reps, seen["cfg"].flush) == (2, 5, False)


def test_copy_bandwidth_probe_is_capped_at_256_mib_on_cpu(monkeypatch):
    sizes = []
    real_empty = torch.empty

    def spy_empty(*shape, **kw):
        sizes.append(shape[0])
        return real_empty(1, dtype=kw.get("dtype"), device=kw.get("device"))

    monkeypatch.setattr(timing.torch, "empty", spy_empty)
    monkeypatch.setattr(timing, "time_calls", lambda calls, device, cfg: Timing(median_us=1.0, iqr_us=0.0, n=5))
    bw = timing.copy_bandwidth_gbs("cpu", TimingConfig(copy_bytes=4 << 30))
    assert sizes == [128 << 20]
    assert bw == pytest.approx(2 * (256 << 20) / 1e3)


def test_copy_bandwidth_probe_shrinks_fourfold_when_memory_runs_out(monkeypatch):
    sizes = []
    real_empty = torch.empty

    def failing_once(*shape, **kw):
        sizes.append((shape[0], kw.get("dtype"), kw.get("device")))
        if len(sizes) == 1:
            raise RuntimeError("out of memory")
        return real_empty(*shape, **kw)

    monkeypatch.setattr(timing.torch, "empty", failing_once)
    dsts = []

    def fake_time_calls(calls, device, cfg):
        dsts.append(calls[0]())
        return Timing(1.0, 0.0, 5)

    monkeypatch.setattr(timing, "time_calls", fake_time_calls)
    bw = timing.copy_bandwidth_gbs("cpu", TimingConfig(copy_bytes=16000))
    # 4000 bytes, then 1000 bytes, in 2-byte elements
    assert sizes == [(2000, torch.bfloat16, "cpu"), (500, torch.bfloat16, "cpu")]
    assert dsts[0].dtype == torch.bfloat16 and bool((dsts[0] == 1.0).all())
    assert bw == pytest.approx(2 * 1000 / 1e3)


def test_copy_bandwidth_probe_on_cuda_copies_all_of_copy_bytes_with_30_reps(monkeypatch):
    made, seen = [], {}
    real_empty = torch.empty

    def spy_empty(n, dtype=None, device=None):
        made.append((n, dtype, device))
        return real_empty(n, dtype=dtype)

    def fake_time_calls(calls, device, cfg):
        seen["device"], seen["reps"] = device, cfg.reps
        return Timing(median_us=4.0, iqr_us=0.0, n=30)

    monkeypatch.setattr(timing.torch, "empty", spy_empty)
    monkeypatch.setattr(timing, "time_calls", fake_time_calls)
    bw = timing.copy_bandwidth_gbs("cuda", TimingConfig(copy_bytes=8000))
    assert made == [(4000, torch.bfloat16, "cuda")]
    assert seen == {"device": "cuda", "reps": 30}
    assert bw == pytest.approx(2 * 8000 / 4e3)


def test_rotation_count_takes_one_copy_when_a_copy_is_eight_times_the_cache():
    """At ROTATE_ONE_FACTOR (8) x the cache a copy is never cached anyway: one copy, no more memory.
    Just under it, and with the cache unknown (0), the memory bound alone decides."""
    cfg = timing.TimingConfig(rotate=4, rotate_max_bytes=10_000)
    assert timing.ROTATE_ONE_FACTOR == 8
    assert timing.rotation_count(800, cfg, cache=100) == 1
    assert timing.rotation_count(900, cfg, cache=100) == 1
    assert timing.rotation_count(799, cfg, cache=100) == 4
    assert timing.rotation_count(800, cfg, cache=0) == 4
    assert timing.rotation_count(2500, cfg, cache=400) == 4  # 6.25x the cache: below the factor
    assert timing.rotation_count(3200, cfg, cache=400) == 1


def test_rotation_count_bounds_the_copies_by_memory():
    cfg = TimingConfig(rotate=4, rotate_max_bytes=1000)
    assert timing.rotation_count(100, cfg) == 4
    assert timing.rotation_count(300, cfg) == 3
    assert timing.rotation_count(500, cfg) == 2
    assert timing.rotation_count(1000, cfg) == 1
    assert timing.rotation_count(2000, cfg) == 1
    assert timing.rotation_count(0, cfg) == 4
    many = TimingConfig(rotate=5000, rotate_max_bytes=1000)
    assert timing.rotation_count(1, many) == 1000 and timing.rotation_count(0, many) == 1000


def test_timing_config_round_trips_through_json():
    cfg = TimingConfig(warmup=3, reps=7, flush=False, cpu_flush_bytes=99)
    assert TimingConfig.from_json(cfg.to_json()) == cfg
    assert TimingConfig.from_json(None) == TimingConfig()
    assert TimingConfig.from_json({}) == TimingConfig()
    assert cfg.to_json()["reps"] == 7


# ---------------------------------------------------------------- the CUDA protocol, on a simulated GPU

from sim_gpu import SimGpu  # noqa: E402


def _on_sim(monkeypatch, sim: SimGpu, calibrated: float = 1000.0) -> dict:
    """The protocol on ``sim``, its spin clock calibrated at ``calibrated`` cycles per µs."""
    rates = {0: calibrated}
    monkeypatch.setattr(timing, "torch", sim)
    monkeypatch.setattr(timing, "_cycles_per_us", rates)
    monkeypatch.setattr(timing, "_clock", sim.clock)
    return rates


def _time_on_sim(sim: SimGpu, cfg: TimingConfig, copies: int = 4):
    checks = []

    def after(phase):
        checks.append(phase)
        return False

    t = timing.time_calls([sim.call] * copies, "cuda", cfg, flusher=sim.flush, before=[sim.before] * copies,
                          after=after)
    return t, checks


def test_a_host_heavier_than_the_fixed_lead_is_not_timed(monkeypatch):
    """87 µs of host work per call (input changes, a flush, the events, a Python wrapper) against 31 µs
    of GPU work: the old fixed 40 µs lead per call runs out within a batch and the GPU waits for
    launches inside event pairs; the protocol's lead, sized from the measured enqueue time, keeps
    every pair on GPU work: 10 µs."""
    sim = SimGpu(host_before_us=40.0, host_launch_us=40.0, kernel_us=10.0)
    _on_sim(monkeypatch, sim)
    t, checks = _time_on_sim(sim, TimingConfig(warmup=8, reps=40))
    assert t.median_us == pytest.approx(10.0) and t.iqr_us == pytest.approx(0.0) and t.n == 40
    assert min(sim.spins) > 4 * 40.0  # longer than the fixed lead of 4 calls
    assert checks.count("timed") >= 10  # every batch is checked, a rerun one included

    fixed = SimGpu(host_before_us=40.0, host_launch_us=40.0, kernel_us=10.0)
    _on_sim(monkeypatch, fixed)
    monkeypatch.setattr(timing, "lead_us", lambda cfg, calls, host: min(cfg.queue_lead_us * calls, cfg.queue_lead_max_us))
    old, _ = _time_on_sim(fixed, TimingConfig(warmup=8, reps=40))
    # what the unchecked fixed lead measured: later calls of each batch with host time in their pairs,
    # a bimodal spread as on the H100 (an 11 µs kernel timed at 30 µs with an IQR of 24 µs)
    assert old.median_us > 15.0 and old.iqr_us > 10.0 and old.min_us == pytest.approx(10.0)


def test_a_batch_that_outlasted_its_lead_is_run_again_and_dropped(monkeypatch):
    """The warm-up's enqueue time leaves out the flush and the events: with a flush that costs the
    host 200 µs, the first timed batch's lead (from the warm-up's 50 µs per call) is short, its CPU
    outlasts it, and its times (host time included) are not kept."""
    sim = SimGpu(host_before_us=0.0, host_launch_us=50.0, kernel_us=10.0, flush_us=0.0, flush_host_us=200.0)
    _on_sim(monkeypatch, sim)
    cfg = TimingConfig(warmup=4, reps=30, queue_lead_us=1.0)
    t, checks = _time_on_sim(sim, cfg)
    assert t.median_us == pytest.approx(10.0) and t.n == 30  # 8 kept batches: 7 of 4 calls, 1 of 2
    assert checks.count("timed") > 8  # and at least one batch more, run and checked, then dropped
    assert sim.spins[0] < sim.spins[-1]


def test_a_lead_of_zero_turns_the_spin_off(monkeypatch):
    """queue_lead_us=0: no spin, no rerun (tests/test_verify_gpu.py times the bare protocol so)."""
    sim = SimGpu(host_before_us=30.0, host_launch_us=30.0, kernel_us=10.0)
    _on_sim(monkeypatch, sim)
    t, checks = _time_on_sim(sim, TimingConfig(warmup=4, reps=30, queue_lead_us=0.0))
    assert sim.spins == [] and checks.count("timed") == 8
    # the launch's 30 µs of host time, less the 20 µs flush ahead of the start event, and the event's 1 µs
    assert t.median_us == pytest.approx(10.0 + 30.0 - 20.0 + 1.0)


def test_the_lead_is_capped_and_a_batch_is_kept_after_the_retries(monkeypatch):
    sim = SimGpu(host_before_us=0.0, host_launch_us=500.0, kernel_us=10.0, flush_us=0.0)
    _on_sim(monkeypatch, sim)
    cfg = TimingConfig(warmup=4, reps=30, queue_lead_max_us=300.0)
    t, checks = _time_on_sim(sim, cfg)
    assert max(sim.spins) == pytest.approx(300.0) and t.n == 30
    assert checks.count("timed") == 8  # at the cap a rerun cannot help: each batch kept at once
    assert timing.lead_us(cfg, 4, 1e9) == 300.0 and timing.lead_us(TimingConfig(queue_lead_us=0), 4, 50.0) == 0.0
    assert timing.lead_us(TimingConfig(), 2, 5.0) == 80.0 and timing.lead_us(TimingConfig(), 2, 30.0) == 120.0
    assert timing.outlasted(100.0, 126.0) is False and timing.outlasted(101.0, 126.0) is True
    assert timing.outlasted(1e6, 0.0) is False


def test_a_spin_cut_short_by_a_faster_clock_is_measured_not_assumed(monkeypatch):
    """Calibrated at 1000 cycles per µs, the GPU now runs at 4000: every spin takes a quarter of what
    was asked. Judged by the asked length, the batches would pass with host time in their pairs; the
    spin's own event pair shows it short, the batch is run again, and the calibration is raised."""
    sim = SimGpu(host_before_us=40.0, host_launch_us=40.0, kernel_us=10.0, clock_rate=4000.0)
    rates = _on_sim(monkeypatch, sim, calibrated=1000.0)
    t, checks = _time_on_sim(sim, TimingConfig(warmup=8, reps=40))
    assert t.median_us == pytest.approx(10.0) and t.iqr_us == pytest.approx(0.0)
    assert rates[0] == pytest.approx(4000.0, rel=0.01)  # the spin's events add their own microsecond
    assert checks.count("timed") > 10  # the first batch ran again

    asked = SimGpu(host_before_us=40.0, host_launch_us=40.0, kernel_us=10.0, clock_rate=4000.0)
    _on_sim(monkeypatch, asked, calibrated=1000.0)
    monkeypatch.setattr(timing, "spun_us", lambda spin: spin[2] / 1000.0 if spin else 0.0)  # the asked length
    fooled, _ = _time_on_sim(asked, TimingConfig(warmup=8, reps=40))
    assert fooled.median_us > 15.0 and fooled.iqr_us > 10.0


def _phases_on_sim(sim: SimGpu, cfg: TimingConfig, copies: int = 1, stop_at: int | None = None):
    """time_calls on the simulated GPU with ``copies`` copies: the Timing, the phase of every ``after``
    call, and the number of calls made; ``stop_at``: after() asks to stop at that check."""
    phases, made = [], []

    def call():
        made.append(1)
        sim.call()

    def after(phase):
        phases.append(phase)
        return stop_at is not None and len(phases) >= stop_at

    t = timing.time_calls([call] * copies, "cuda", cfg, flusher=sim.flush, before=[sim.before] * copies, after=after)
    return t, phases, len(made)


def test_the_cuda_loop_names_its_phases_its_clock_and_makes_one_warm_up_call_at_least(monkeypatch):
    sim = SimGpu(host_before_us=5.0, host_launch_us=5.0, kernel_us=10.0)
    _on_sim(monkeypatch, sim)
    t, phases, made = _phases_on_sim(sim, TimingConfig(warmup=0, reps=30))
    assert phases == ["warm-up"] + ["timed"] * 30 and made == 31  # warmup=0 still warms up once
    assert t.clock == "cuda_events" and t.n == 30 and t.median_us == pytest.approx(10.0)
    t, phases, made = _phases_on_sim(sim, TimingConfig(warmup=3, reps=30), copies=2)
    assert phases == ["warm-up"] * 2 + ["timed"] * 15 and made == 3 + 30


def test_a_stop_in_the_warm_up_times_nothing_and_a_stop_while_timed_keeps_the_calls_so_far(monkeypatch):
    sim = SimGpu(host_before_us=5.0, host_launch_us=5.0, kernel_us=10.0)
    _on_sim(monkeypatch, sim)
    t, phases, _ = _phases_on_sim(sim, TimingConfig(warmup=2, reps=30), stop_at=1)
    assert t is None and phases == ["warm-up"]
    t, phases, made = _phases_on_sim(sim, TimingConfig(warmup=2, reps=30), copies=2, stop_at=4)
    assert phases == ["warm-up", "timed", "timed", "timed"] and made == 2 + 6
    assert t.clock == "cuda_events" and t.n == 6 and t.median_us == pytest.approx(10.0)


def test_min_time_keeps_timing_in_rounds_of_reps_up_to_max_reps(monkeypatch):
    """Each round is ``reps`` more calls; timing stops once the kept times sum to ``min_time_s`` (that
    sum exactly included) or ``max_reps`` calls were kept (exactly included)."""
    sim = SimGpu(host_before_us=5.0, host_launch_us=5.0, kernel_us=10.0)
    _on_sim(monkeypatch, sim)
    two_rounds = (60 * 10.0) * 1e-6  # the sum of 60 kept times of 10 µs, as the loop computes it
    t, phases, made = _phases_on_sim(sim, TimingConfig(warmup=1, reps=30, min_time_s=two_rounds))
    assert t.n == 60 and made == 1 + 60 and phases.count("timed") == 60
    t, _, made = _phases_on_sim(sim, TimingConfig(warmup=1, reps=30, min_time_s=1.0, max_reps=75))
    assert t.n == 75 and made == 1 + 75  # 30, 30, then the 15 left to max_reps
    t, _, made = _phases_on_sim(sim, TimingConfig(warmup=1, reps=30, min_time_s=1.0, max_reps=30))
    assert t.n == 30 and made == 1 + 30


def test_each_spin_is_sized_from_the_hosts_measured_enqueue_time_exactly(monkeypatch):
    """The warm-up's enqueue time per call (the warmest batch) sizes the first lead: HOST_LEAD_FACTOR x it
    per call; a batch the host outlasted is rerun with the lead sized from that batch's enqueue time."""
    # a clock fine enough that a spin is as long as asked to the picosecond, and a host clock well past 0
    sim = SimGpu(host_before_us=0.0, host_launch_us=50.0, kernel_us=10.0, flush_us=0.0, flush_host_us=200.0,
                 clock_rate=1e9)
    sim.host = sim.gpu = 1e4
    _on_sim(monkeypatch, sim, calibrated=1e9)
    _phases_on_sim(sim, TimingConfig(warmup=2, reps=30, queue_lead_us=1.0), copies=2)
    # warm-up: the launch's 50 µs per call, nothing else between its clock readings
    assert sim.spins[0] == pytest.approx(timing.HOST_LEAD_FACTOR * 50.0 * 2, rel=1e-9)
    # the timed batch: the spin's 4 µs of host time (its two events and the sleep), then per call the
    # flush (200), the start event (1), the launch (50) and the end event (1): outlasted, so rerun
    enqueue = 4.0 + 2 * (200.0 + 1.0 + 50.0 + 1.0)
    assert sim.spins[1] == pytest.approx(timing.HOST_LEAD_FACTOR * enqueue, rel=1e-9)


def test_a_batch_the_host_always_outlasts_is_run_drain_retries_more_times_then_kept(monkeypatch):
    sim = SimGpu(host_before_us=5.0, host_launch_us=5.0, kernel_us=10.0)
    _on_sim(monkeypatch, sim)
    monkeypatch.setattr(timing, "outlasted", lambda enqueue_us, spin_us: True)
    t, phases, made = _phases_on_sim(sim, TimingConfig(warmup=1, reps=30), copies=30)
    assert t.n == 30 and phases.count("timed") == timing.DRAIN_RETRIES + 1
    assert made == 1 + 30 * (timing.DRAIN_RETRIES + 1)  # one warm-up call (warmup=1), then 4 runs of the batch


def test_a_spin_is_asked_for_any_positive_lead_between_timing_events(monkeypatch):
    sim = SimGpu(host_before_us=0.0, host_launch_us=0.0, kernel_us=1.0)
    _on_sim(monkeypatch, sim, calibrated=1000.0)
    assert timing.queue_lead(0.0) is None and timing.queue_lead(-1.0) is None
    spin = timing.queue_lead(0.5)
    assert spin[2] == 500 and sim.spins == [0.5]
    assert timing.spun_us(spin) == pytest.approx(3.0, rel=1e-12)  # the host: 2 µs to sleep, 1 to record the end
    assert timing.spun_us(None) == 0.0 and timing.outlasted(1.0, 0.5) and not timing.outlasted(4.0, 5.0)


class _Spin:
    """An event pair that measured ``us`` microseconds."""

    def __init__(self, us):
        self.us = us

    def elapsed_time(self, end):
        return self.us / 1000.0


def test_spun_us_raises_the_calibration_to_a_faster_clock_only(monkeypatch):
    sim = SimGpu(host_before_us=0.0, host_launch_us=0.0, kernel_us=1.0)
    rates = _on_sim(monkeypatch, sim, calibrated=1000.0)
    assert timing.spun_us((_Spin(10.0), None, 8000)) == pytest.approx(10.0, rel=1e-12)
    assert rates[0] == 1000.0  # a slower clock (800 cycles per µs) never lowers it
    assert timing.spun_us((_Spin(2.0), None, 3000)) == pytest.approx(2.0, rel=1e-12)
    assert rates[0] == pytest.approx(1500.0, rel=1e-12)
    assert timing.spun_us((_Spin(0.5), None, 1000)) == pytest.approx(0.5) and rates[0] == pytest.approx(2000.0)
    assert timing.spun_us((_Spin(0.0), None, 1000)) == 0.0 and rates[0] == pytest.approx(2000.0)
    rates.clear()  # none measured yet on this device: any measured rate is taken
    assert timing.spun_us((_Spin(10.0), None, 1)) == pytest.approx(10.0) and rates[0] == pytest.approx(0.1)
