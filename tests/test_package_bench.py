"""`python -m <package> bench`: timed with the build's protocol (templates/package/_bench.py: a cache
flush before every timed call, rotating input copies, warm-up, min(wall, CPU time) per call on the
CPU, median with IQR and n), the build's figure beside each row, and a warning when the machine is
busy. CPU only: the package is packed (no compiler run) and its kernels stand in as the original ops."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.pack.packager import pack  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "package" / "_bench.py"
PKG = "bench_pkg"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("_forge_test_bench", TEMPLATE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_bench_module_is_standalone():
    imports = [line.split()[1] for line in TEMPLATE.read_text().splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["__future__", "contextlib", "os", "statistics", "time", "pathlib", "typing", "torch"]


def test_cpu_time_is_the_smaller_of_wall_and_cpu_time(bench):
    """A call that waits (as one descheduled on a loaded machine) is charged its CPU time, not the wait."""
    t = bench.time_calls([lambda: time.sleep(0.02)], "cpu", reps=4, warmup=0, flusher=lambda: None)
    assert t["n"] == 4 and t["median_us"] < 5000.0


def test_a_flush_before_every_timed_call_and_the_copies_in_turn(bench):
    order, flushes = [], []
    calls = [lambda i=i: order.append(i) for i in range(3)]
    t = bench.time_calls(calls, "cpu", reps=7, warmup=2, flusher=lambda: flushes.append(len(order)))
    assert order == [0, 1, 0, 1, 2, 0, 1, 2, 0]  # warm-up 2 calls, then 7 timed ones over the 3 copies
    assert flushes == [2, 3, 4, 5, 6, 7, 8]  # one flush right before each timed call, none in the warm-up
    assert t["n"] == 7


def test_summary_statistics_match_the_build(bench):
    s = bench.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s == {"median_us": 3.0, "iqr_us": 2.0, "n": 5, "min_us": 1.0}  # inclusive quartiles 2 and 4


def test_bench_pair_rotates_copies_of_the_inputs(bench):
    import torch

    x = {"x": torch.randn(64, 64), "dim": 1}
    seen = set()
    r = bench.bench_pair(lambda d: torch.softmax(d["x"], 1), lambda d: seen.add(id(d["x"])), x, "cpu", reps=8,
                         warmup=1)
    assert r["copies"] == 4 and len(seen) == 4 and r["eager"]["n"] == r["kernel"]["n"] == 8


def _row(tid: str, median: float, iqr: float) -> dict:
    t = {"median_us": median, "iqr_us": iqr, "n": 50, "min_us": median}
    return {"id": tid, "signature": "softmax(x)", "eager": t, "kernel": t, "speedup": 1.0, "measured_speedup": 2.0}


def test_busy_when_the_load_is_above_the_core_count(bench):
    assert bench.busy_warnings([_row("t0", 100.0, 5.0)], 2.0, 2) == []
    w = bench.busy_warnings([_row("t0", 100.0, 5.0)], 3.5, 2)
    assert len(w) == 1 and w[0].startswith("WARNING: the machine is busy: load average 3.50 over 2 cores")


def test_busy_when_an_iqr_is_above_a_fifth_of_the_median(bench):
    assert bench.busy_warnings([_row("t0", 100.0, 20.0)], None, 2) == []
    w = bench.busy_warnings([_row("t0", 100.0, 5.0), _row("t1", 100.0, 21.0)], None, 2)
    assert w == ["WARNING: noisy timings (IQR above 20% of the median: t1 eager, t1 kernel); the machine is "
                 "probably busy; run bench again on a quiet machine"]


# ------------------------------------------------------------------ the command, in a packed package


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    run = helpers.make_cpu_run(root / "run")
    assert pack(run, root / "pkg", PKG, confirm=False).written
    assert (root / "pkg" / PKG / "_bench.py").read_bytes() == TEMPLATE.read_bytes()
    sys.path.insert(0, str(root / "pkg"))
    try:
        pkg = importlib.import_module(PKG)
        main = importlib.import_module(f"{PKG}.__main__")
        importlib.import_module(f"{PKG}._bench")
    finally:
        sys.path.remove(str(root / "pkg"))
    return pkg, main


@pytest.fixture
def cli(package, monkeypatch):
    """`python -m bench_pkg bench` in-process; no extension is compiled here, so each 'kernel' is the
    original op (the timing protocol and the report are what is under test)."""
    pkg, main = package
    from bench_pkg import _verify

    monkeypatch.setattr(pkg._PATCHER, "load", lambda: True)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # as the re-started bench has it

    def kernel(t):
        names = [n for n, s in t["signature"]["inputs"] if s is not None]
        eager = _verify.eager(t)
        return lambda *xs: eager(dict(zip(names, xs)))

    monkeypatch.setattr(main, "_kernel", kernel)
    return pkg, main


def test_bench_prints_median_iqr_n_and_the_builds_figure(cli, capsys, monkeypatch):
    pkg, main = cli
    monkeypatch.setattr(pkg._bench, "load_average", lambda: 0.0)
    assert main.main(["bench", "--n", "6", "--warmup", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("device cpu; timed as the build times: warm-up 1, a cache flush before every call")
    header = next(line for line in out if line.startswith("target"))
    for col in ("eager µs median (IQR, n)", "kernel µs median (IQR, n)", "speedup", "at build", "signature"):
        assert col in header
    rows = [line for line in out if line.startswith("t") and not line.startswith("target")]
    assert len(rows) == len(pkg.manifest["targets"]) == 5
    for line in rows:
        assert line.count("(IQR ") == 2 and line.count(", n=6)") == 2
        speedup, at_build = line.split(", n=6)")[-1].split()[:2]
        assert speedup.endswith("x") and at_build == "2.00x"  # the build's figure (the test run records 2.0x)
    assert not any("machine is busy: load average" in line for line in out)


def test_bench_on_the_cpu_restarts_itself_with_the_builds_openmp_wait_policy(cli, monkeypatch):
    import subprocess

    pkg, main = cli
    monkeypatch.delenv("OMP_WAIT_POLICY")
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, env: ran.append((cmd, env)) or
                        subprocess.CompletedProcess(cmd, 3))
    assert main.main(["bench", "--n", "7", "--json"]) == 3  # the restarted bench's exit status
    (cmd, env), = ran
    assert cmd[1:] == ["-m", PKG, "bench", "--n", "7", "--warmup", "10", "--json"]
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's own choice is kept: no restart
    assert pkg._bench.passive_rerun_env("cpu") is None and pkg._bench.passive_rerun_env("cuda:0") is None


def test_bench_warns_when_the_load_is_faked_high(cli, capsys, monkeypatch):
    pkg, main = cli
    monkeypatch.setattr(pkg._bench, "load_average", lambda: 7.25)
    monkeypatch.setattr(pkg._bench, "core_count", lambda: 2)
    assert main.main(["bench", "--n", "4", "--warmup", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("WARNING: the machine is busy: load average 7.25 over 2 cores")


def test_bench_json_carries_the_warnings_and_the_statistics(cli, capsys, monkeypatch):
    import json

    pkg, main = cli
    monkeypatch.setattr(pkg._bench, "load_average", lambda: 9.0)
    monkeypatch.setattr(pkg._bench, "core_count", lambda: 2)
    assert main.main(["bench", "--n", "4", "--warmup", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["load_average"] == 9.0 and doc["cores"] == 2 and "machine is busy" in doc["warnings"][0]
    t = doc["targets"][0]
    assert t["eager"]["n"] == t["kernel"]["n"] == 4 and t["measured_speedup"] == pytest.approx(2.0)
    assert set(t["kernel"]) == {"median_us", "iqr_us", "n", "min_us"}


@pytest.mark.gpu
def test_cuda_bench_pair_times_with_events_and_at_least_30_calls(bench):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    x = {"x": torch.randn(4096, 4096, device="cuda")}
    soft = lambda d: torch.softmax(d["x"], -1)  # noqa: E731
    r = bench.bench_pair(soft, soft, x, "cuda", reps=5, warmup=2)
    assert r["eager"]["n"] == r["kernel"]["n"] == 30  # MIN_CUDA_REPS
    assert r["copies"] == 4 and 0.8 < r["speedup"] < 1.25  # the same op on both sides, flushed alike


def _on_sim(monkeypatch, bench, sim, calibrated: float = 1000.0) -> dict:
    import types

    rates = {0: calibrated}
    monkeypatch.setattr(bench, "torch", sim)
    monkeypatch.setattr(bench, "_cycles_per_us", rates)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=sim.clock))
    return rates


@pytest.mark.parametrize("clock_rate", [1000.0, 4000.0])
def test_cuda_time_calls_keeps_the_hosts_launch_out_of_the_pairs(bench, monkeypatch, clock_rate):
    """On a simulated stream: 80 µs of Python per launch against 30 µs of GPU work a call. The build's
    protocol (the spin sized from the host's enqueue time, measured by its events, a drained batch
    run again) gives the kernel's 10 µs, also when the clock runs 4x faster than calibrated; the old
    fixed 40 µs lead per call let the host's launch into the pairs."""
    from sim_gpu import SimGpu

    sim = SimGpu(host_before_us=0.0, host_launch_us=80.0, kernel_us=10.0, clock_rate=clock_rate)
    rates = _on_sim(monkeypatch, bench, sim)
    t = bench.time_calls([sim.call] * 4, "cuda", reps=40, warmup=8, flusher=sim.flush)
    assert t["median_us"] == pytest.approx(10.0) and t["iqr_us"] == pytest.approx(0.0) and t["n"] == 40
    assert rates[0] == pytest.approx(clock_rate, rel=0.01)

    fixed = SimGpu(host_before_us=0.0, host_launch_us=80.0, kernel_us=10.0, clock_rate=clock_rate)
    _on_sim(monkeypatch, bench, fixed)
    monkeypatch.setattr(bench, "HOST_LEAD_FACTOR", 0.0)
    monkeypatch.setattr(bench, "DRAIN_RETRIES", 0)
    old = bench.time_calls([fixed.call] * 4, "cuda", reps=40, warmup=8, flusher=fixed.flush)
    assert old["median_us"] > 15.0


def test_the_packages_drain_constants_are_the_builds():
    from forge_pack.evaluate import timing

    src = TEMPLATE.read_text()
    for name in ("HOST_LEAD_FACTOR", "SPIN_MARGIN", "DRAIN_RETRIES"):
        assert f"\n{name} = {getattr(timing, name)!r}" in src, name
    cfg = timing.TimingConfig()
    assert f"\nQUEUE_LEAD_US = {cfg.queue_lead_us!r}" in src and f"\nQUEUE_LEAD_MAX_US = {cfg.queue_lead_max_us!r}" in src
