"""`python -m <package> bench`: each kernel against the original PyTorch op, timed on this machine with
the protocol the build timed them with (forge_pack/evaluate/timing.py), so the two figures printed side
by side mean the same thing.

The protocol, per timed function:
- warm-up calls first (allocator, lazy initialisation, thread pools);
- the inputs rotate over several copies (up to ROTATE, within ROTATE_MAX_BYTES), one call per copy in
  turn, so no call finds its inputs where the previous call left them;
- before every timed call a cache flush: on CUDA a write of twice the GPU's L2, on the CPU a touch of
  twice the last-level cache (at most 256 MB), so every call starts cold, as in the build;
- CUDA: CUDA events around each call, each batch of calls queued behind a GPU-side spin so the event
  pair spans GPU work and not the host's time to enqueue it: QUEUE_LEAD_US per call or twice the
  host's measured time to enqueue one, whichever is longer; the spin's length measured by its own
  event pair, and a batch the host outlasted its spin in run again with a longer one (at most
  DRAIN_RETRIES times); at least MIN_CUDA_REPS timed calls;
- CPU: per call the smaller of the wall time and this process's CPU time, so a call that waited for
  the scheduler on a loaded machine is not charged for the wait (the build holds eager and kernel to
  the same rule);
- the median, the IQR (inclusive quartiles) and n of the timed calls.

Why a compact copy of the protocol and not timing.py itself: the package cannot import forge-pack, and
timing.py is not standalone (it returns forge-pack's Timing type and times the build's sandboxed
runner, whose staging and GO->DONE clock do not exist in a package). This file keeps exactly the parts
that apply to an in-process call, with the same constants.

Plain torch and the standard library: nothing here may import forge_pack.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

WARMUP = 10  # the build's TimingConfig.warmup
REPS = 50  # the build's TimingConfig.reps
MIN_CUDA_REPS = 30  # the build's floor: fewer calls give a median that moves by several % run to run
ROTATE = 4  # input copies timed in turn (the build's TimingConfig.rotate)
ROTATE_MAX_BYTES = 2 << 30  # bound on the memory the copies take (the build's rotate_max_bytes)
CPU_FLUSH_MAX_BYTES = 256 << 20  # the build's cap on the CPU flush buffer
QUEUE_LEAD_US = 40.0  # CUDA: GPU spin ahead of each batch, per call in it (the build's queue_lead_us)
QUEUE_LEAD_MAX_US = 20000.0
HOST_LEAD_FACTOR = 2.0  # the build's: the lead per call is at least this many times the host's enqueue time
SPIN_MARGIN = 1.25  # the build's: a batch enqueued within its spin's measured length / this never drained
DRAIN_RETRIES = 3  # the build's: a batch the host outlasted its spin in is run again, this many times at most
# An IQR above a fifth of the median: half the calls of the same work differ by more than +-10% from
# the middle, far more than a quiet machine shows; something else was running.
BUSY_IQR_FRACTION = 0.20


# ------------------------------------------------------------------ statistics


def summarize(times_us: list[float]) -> dict:
    """Median, IQR (inclusive quartiles, as the build), min and n of per-call times in µs."""
    xs = sorted(times_us)
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = (xs[-1] - xs[0]) if xs else 0.0
    return {"median_us": statistics.median(xs), "iqr_us": iqr, "n": len(xs), "min_us": xs[0]}


# ------------------------------------------------------------------ cache flush


def _cpu_llc_bytes() -> int:
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (idx / "size").read_text().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best or (32 << 20)  # unknown: a large server's last-level cache


def flush_bytes(device: str) -> int:
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return 2 * (int(getattr(props, "L2_cache_size", 0) or 0) or (64 << 20))
    return min(2 * _cpu_llc_bytes(), CPU_FLUSH_MAX_BYTES)


class Flusher:
    """Writes a buffer larger than the cache; called before every timed call."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.buf = torch.empty(flush_bytes(device) // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_() if self.cuda else self.buf.add_(1)


# ------------------------------------------------------------------ timing


def rotation_count(bytes_per_copy: int) -> int:
    return max(1, min(ROTATE, ROTATE_MAX_BYTES // max(bytes_per_copy, 1)))


def _batches(total: int, k: int):
    done = 0
    while done < total:
        n = min(k, total - done)
        yield n
        done += n


_cycles_per_us: dict[int, float] = {}


def _gpu_cycles_per_us() -> float:
    dev = torch.cuda.current_device()
    if dev not in _cycles_per_us:
        cycles = 2_000_000
        torch.cuda._sleep(cycles // 20)  # the first launch pays the module load
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1000.0
        _cycles_per_us[dev] = cycles / us if us > 0 else 2000.0
    return _cycles_per_us[dev]


def _spin(us: float):
    """``us`` of GPU spinning between an event pair: (start, end, cycles)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = int(us * _gpu_cycles_per_us())
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    return start, end, cycles


def _spun_us(spin) -> float:
    """The synchronised spin's length on the GPU; a faster clock than calibrated raises the calibration."""
    start, end, cycles = spin
    us = start.elapsed_time(end) * 1000.0
    dev = torch.cuda.current_device()
    if us > 0 and cycles / us > _cycles_per_us.get(dev, 0.0):
        _cycles_per_us[dev] = cycles / us
    return us


def time_calls(calls: list[Callable[[], object]], device: str, reps: int = REPS, warmup: int = WARMUP,
               flusher: Flusher | None = None) -> dict:
    """Time calls[0], calls[1], ... in turn (one per input copy), flushed before each timed call."""
    flusher = flusher or Flusher(device)
    k = len(calls)
    cuda = device.startswith("cuda")
    host_us = float("inf")
    for n in _batches(max(warmup, 1) if cuda else warmup, k):
        t0 = time.perf_counter()
        for i in range(n):
            calls[i]()
        host_us = min(host_us, (time.perf_counter() - t0) * 1e6 / n)
    times: list[float] = []
    if cuda:
        torch.cuda.synchronize()
        for n in _batches(max(reps, MIN_CUDA_REPS), k):
            for attempt in range(DRAIN_RETRIES + 1):
                starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
                ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
                lead_us = min(max(QUEUE_LEAD_US, HOST_LEAD_FACTOR * host_us) * n, QUEUE_LEAD_MAX_US)
                t0 = time.perf_counter()
                spin = _spin(lead_us)
                for i in range(n):
                    flusher()
                    starts[i].record()
                    calls[i]()
                    ends[i].record()
                enqueue_us = (time.perf_counter() - t0) * 1e6
                torch.cuda.synchronize()
                spun = _spun_us(spin)
                if enqueue_us * SPIN_MARGIN <= spun or attempt == DRAIN_RETRIES or lead_us >= QUEUE_LEAD_MAX_US:
                    times.extend(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
                    break
                host_us = max(host_us, enqueue_us / n)
        return summarize(times)
    for n in _batches(max(reps, 1), k):
        for i in range(n):
            flusher()
            c0 = time.process_time_ns()
            t0 = time.perf_counter_ns()
            calls[i]()
            wall_us = (time.perf_counter_ns() - t0) / 1000.0
            cpu_us = (time.process_time_ns() - c0) / 1000.0
            times.append(min(wall_us, cpu_us))
    return summarize(times)


def _nbytes(inputs: dict) -> int:
    return sum(v.numel() * v.element_size() for v in inputs.values() if isinstance(v, torch.Tensor))


def _copies(inputs: dict, k: int) -> list[dict]:
    return [inputs] + [{n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in inputs.items()}
                       for _ in range(k - 1)]


def bench_pair(eager: Callable[[dict], object], kernel: Callable[[dict], object], inputs: dict, device: str,
               reps: int = REPS, warmup: int = WARMUP) -> dict:
    """Eager and kernel on the same rotating copies of ``inputs``, each with the protocol above."""
    copies = _copies(inputs, rotation_count(_nbytes(inputs)))
    # the events, the spin and the flush go to the GPU the kernels run on, not to the current one
    on_device = torch.cuda.device(torch.device(device)) if device.startswith("cuda") else contextlib.nullcontext()
    with on_device, torch.inference_mode():
        flusher = Flusher(device)
        e = time_calls([lambda x=x: eager(x) for x in copies], device, reps, warmup, flusher)
        k = time_calls([lambda x=x: kernel(x) for x in copies], device, reps, warmup, flusher)
    return {"eager": e, "kernel": k, "speedup": e["median_us"] / max(k["median_us"], 1e-9), "copies": len(copies)}


# ------------------------------------------------------------------ the CPU's OpenMP runtime


def passive_rerun_env(device: str) -> dict | None:
    """The environment to run bench again in, or None to run it here. The build's CPU workers run
    with OMP_WAIT_POLICY=PASSIVE (forge_pack/evaluate/worker.py): OpenMP threads that spin after a
    parallel region steal the cores the next one needs, and on a busy 2-core machine that turns a
    1 ms kernel into an 8 ms one. The policy is read when the OpenMP runtime loads (with torch,
    before this code runs), so bench sets it by starting itself again; an explicit
    OMP_WAIT_POLICY is left as the user set it."""
    if device.startswith("cuda") or os.environ.get("OMP_WAIT_POLICY") is not None:
        return None
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


# ------------------------------------------------------------------ is the machine busy?


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on every platform
        return None


def core_count() -> int:
    return os.cpu_count() or 1


def busy_warnings(rows: list[dict], load: float | None, cores: int) -> list[str]:
    """Why the figures may not hold: a load above the core count, or a timing whose IQR is above
    BUSY_IQR_FRACTION of its median."""
    out = []
    if load is not None and load > cores:
        out.append(f"WARNING: the machine is busy: load average {load:.2f} over {cores} cores; other work competes "
                   "with the timed calls, so the figures below may not hold; run bench again on a quiet machine")
    noisy = [f"{r['id']} {what}" for r in rows for what in ("eager", "kernel")
             if r[what]["iqr_us"] > BUSY_IQR_FRACTION * r[what]["median_us"]]
    if noisy:
        out.append(f"WARNING: noisy timings (IQR above {BUSY_IQR_FRACTION:.0%} of the median: {', '.join(noisy)}); "
                   "the machine is probably busy; run bench again on a quiet machine")
    return out


# ------------------------------------------------------------------ the report


def _cell(t: dict) -> str:
    return f"{t['median_us']:.2f} (IQR {t['iqr_us']:.2f}, n={t['n']})"


def format_report(rows: list[dict], device: str, warnings: list[str], edited_message: str | None = None,
                  warmup: int = WARMUP) -> str:
    """A table: per target eager and kernel median (IQR, n) in µs, their ratio, and the build's ratio."""
    cpu = "" if device.startswith("cuda") else (f"; {torch.get_num_threads()} CPU threads, OMP_WAIT_POLICY="
                                                f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    lines = [f"device {device}; timed as the build times: warm-up {warmup}, a cache flush before every call, "
             f"rotating input copies, median (IQR, n) in µs{cpu}"]
    lines += warnings
    if edited_message:
        lines.append(f"WARNING: {edited_message}; the 'at build' column is left out")
    e_w = max([len("eager µs median (IQR, n)")] + [len(_cell(r["eager"])) for r in rows])
    k_w = max([len("kernel µs median (IQR, n)")] + [len(_cell(r["kernel"])) for r in rows])
    lines.append(f"{'target':<6}  {'eager µs median (IQR, n)':<{e_w}}  {'kernel µs median (IQR, n)':<{k_w}}  "
                 f"{'speedup':>7}  {'at build':>8}  signature")
    for r in rows:
        at_build = "edited" if edited_message else (f"{r['measured_speedup']:.2f}x"
                                                    if r["measured_speedup"] is not None else "-")
        lines.append(f"{r['id']:<6}  {_cell(r['eager']):<{e_w}}  {_cell(r['kernel']):<{k_w}}  "
                     f"{r['speedup']:>6.2f}x  {at_build:>8}  {r['signature']}")
    return "\n".join(lines)
