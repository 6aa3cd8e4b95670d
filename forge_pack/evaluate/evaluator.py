"""evaluate = static checks -> compile -> object check (parent) -> verify -> bench (isolated worker).

``Evaluator`` is what the search calls. ``evaluate`` is thread-safe: several search threads may
call it at once; each compiles in its own thread (NVRTC and g++ run outside the GIL), then
waits for a free worker, and gets back an ``Evaluation`` whose ``Verdict`` says what happened.
Nothing a candidate does (compile error, segfault, illegal address, trap, endless loop) raises
here. What runs in the worker (verification, the out-of-bounds run, timing, the baseline) is in
``forge_pack.evaluate.judge``, handed over as its typed jobs through ``forge_pack.evaluate.worker``, which runs
them without knowing what they are.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from pathlib import Path

from forge_pack.evaluate import object_check, static_check
from forge_pack.core.candidate import Candidate
from forge_pack.evaluate.compile import compile_candidate
from forge_pack.evaluate.device_pool import run_on_a_device
from forge_pack.core.hotspot import Hotspot
from forge_pack.evaluate.judge import JudgeCandidate, Judged, Loaded, LoadInputs, MeasureBaseline, Session, Startup
from forge_pack.core.signature import Signature
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.core.verdict import Baseline, Evaluation, Verdict
from forge_pack.evaluate.worker import JobError, WorkerLost, WorkerPool


# Seconds of judging allowed per GB of a signature's data (inputs + output), on top of ``timeout_s``.
# One evaluation verifies a dozen sets against float64 references and times the kernel: measured on an
# H100 (bench/results/eval_memory.md, 2026-12-06), 3.3 s per GB in a search's steady state and 5.1 s
# per GB for the evaluation that loads the sets. 10 s per GB leaves twice that; without it every
# evaluation of a 12.8 GB softmax (KernelBench level 1, 4096x393216 fp32) ran out its 60 s.
JUDGE_S_PER_GB = 10.0


def _limit_text(base_s: float, limit_s: float) -> str:
    if limit_s - base_s < 0.5:
        return f"{limit_s:.0f} s"
    return f"{limit_s:.0f} s ({base_s:.0f} s + {JUDGE_S_PER_GB:g} s per GB of the signature's data)"


def judge_timeout_s(base_s: float, sig: Signature) -> float:
    """The judge's time limit for one candidate of ``sig``: ``base_s`` plus JUDGE_S_PER_GB per GB of its
    inputs and output, so the limit catches endless loops at every size, not honest GB-scale work."""
    from forge_pack.targets import abi

    return base_s + JUDGE_S_PER_GB * abi.bytes_moved(sig) / 1e9


class Evaluator:
    def __init__(self, backend: str, workers: int = 1, timeout_s: float = 60.0, seed: int = 0,
                 timing: TimingConfig = TimingConfig(), run_dir: str | Path | None = None, *,
                 cache_dir: str | Path | None = None, load_timeout_s: float = 900.0,
                 baseline_timeout_s: float = 1800.0, log_dir: str | Path | None = None, pool=None):
        """``pool``: the workers to use instead of ``workers`` local ones (``device_pool.DevicePool``, one
        per GPU; ``ray_pool.RayPool``); a worker it hands out with a ``device`` label has that label
        recorded in each evaluation's ``extra["device"]``."""
        if backend not in ("cuda", "cpu"):
            raise ValueError(f"unknown backend {backend!r}")
        self.backend, self.timeout_s, self.seed, self.timing = backend, timeout_s, seed, timing
        self.run_dir = str(run_dir) if run_dir else None
        self.cache_dir = cache_dir
        self.load_timeout_s, self.baseline_timeout_s = load_timeout_s, baseline_timeout_s
        if log_dir is None and run_dir:
            log_dir = Path(run_dir) / "workers"
        self.pool = pool if pool is not None else WorkerPool(backend, workers, Startup(), str(log_dir) if log_dir else None)
        self._lock = threading.Lock()
        self._baselines: dict[str, Baseline] = {}
        self._sigs: dict[str, Signature] = {}
        self._info: dict | None = None

    # ---------------------------------------------------------------- context manager

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.pool.close()

    # ---------------------------------------------------------------- device

    def device_info(self) -> dict:
        """What the worker reported (GPU name, capability, arch, SMs, smem, L2) plus copy bandwidth."""
        if self._info is None:
            info = self.pool.info()
            if isinstance(info, WorkerLost):
                raise RuntimeError(f"the {self.backend} worker did not start: {info.detail}\n{_tail(info.log_tail, 2000)}")
            self._info = dict(info)
        info = dict(self._info)
        for b in self._baselines.values():
            info["copy_bandwidth_gbs"] = b.copy_bandwidth_gbs
        return info

    @property
    def arch(self) -> str:
        return self.device_info().get("arch", "") if self.backend == "cuda" else ""

    def signature(self, hotspot: Hotspot) -> Signature:
        """The hotspot's signature with its output spec filled in (from a meta-device eager call)."""
        key = hotspot.signature.key()
        with self._lock:
            if key not in self._sigs:
                from forge_pack.targets.ops import with_output

                self._sigs[key] = with_output(hotspot.signature)
            return self._sigs[key]

    # ---------------------------------------------------------------- baseline

    def baseline(self, hotspot: Hotspot) -> Baseline:
        with self._lock:
            if hotspot.id in self._baselines:
                return self._baselines[hotspot.id]
        sig = self.signature(hotspot)
        job = MeasureBaseline(sig, self.timing, self.seed)
        for attempt in range(2):
            result = run_on_a_device(self.pool, lambda w: w.run(job, self.baseline_timeout_s))
            if not isinstance(result, WorkerLost):
                break
            if attempt == 1 or not self.timing.compile_baseline:
                raise RuntimeError(f"baseline of {sig.pretty()} failed: {result.detail}")
            # torch.compile hung or crashed the worker: measure eager alone and say why
            cfg = TimingConfig.from_json({**self.timing.to_json(), "compile_baseline": False})
            job = MeasureBaseline(sig, cfg, self.seed, f"torch.compile: {result.detail}")
        if isinstance(result, JobError):
            raise RuntimeError(f"baseline of {sig.pretty()} failed in the worker:\n{result.traceback}")
        base = result
        with self._lock:
            self._baselines[hotspot.id] = base
        return base

    # ---------------------------------------------------------------- evaluate

    def evaluate(self, candidate: Candidate, hotspot: Hotspot, baseline: Baseline | None = None,
                 final: bool = False, bounds: bool = False) -> Evaluation:
        """``bounds``: also run it against guard pages (out_of_bounds); the final check always does."""
        t0 = time.perf_counter()
        try:
            return self._evaluate(candidate, hotspot, baseline, final, t0, bounds)
        except Exception as e:  # a fault of forge-pack itself: recorded, never raised into the search
            import traceback

            return Evaluation(Verdict(False, "internal_error", f"{type(e).__name__}: {e}\n"
                                      f"{traceback.format_exc()[-3000:]}"), eval_s=time.perf_counter() - t0)

    def _evaluate(self, candidate: Candidate, hotspot: Hotspot, baseline: Baseline | None, final: bool,
                  t0: float, bounds: bool = False) -> Evaluation:
        sig = self.signature(hotspot)
        rejected = static_check.check(candidate, sig)
        if rejected is not None:
            return Evaluation(rejected, eval_s=time.perf_counter() - t0)
        build = compile_candidate(candidate, arch=self.arch or None, cache_dir=self.cache_dir)
        common = dict(compile_s=build.compile_s, compile_log=build.log, compile_cmd=build.cmd)
        if not build.ok:
            return Evaluation(Verdict(False, "compile_error", _tail(build.log, 4000)), eval_s=time.perf_counter() - t0,
                              extra={"cached_build": build.cached}, **common)
        rejected = object_check.check_build(build)  # what was built, not only its text
        if rejected is not None:
            return Evaluation(rejected, eval_s=time.perf_counter() - t0, extra={"cached_build": build.cached}, **common)
        if baseline is None:
            with self._lock:
                baseline = self._baselines.get(hotspot.id)
        key = f"{hotspot.id}|{'final' if final else 'search'}|{'/'.join(hotspot.captures)}|{self.run_dir}"
        inputs = LoadInputs(key, sig, tuple(hotspot.captures), self.run_dir, self.seed, final)
        job = JudgeCandidate(inputs, candidate, build.path, self.timing, bounds)
        limit_s = judge_timeout_s(self.timeout_s, sig)
        extra = {"cached_build": build.cached, "resources": build.resources}

        def judge_on(w) -> object:
            loaded = w.memo.setdefault("loaded", OrderedDict())  # hotspot keys whose sets the child holds (its LRU)
            if key not in loaded:
                got = w.run(inputs, self.load_timeout_s)
                if isinstance(got, WorkerLost):
                    raise RuntimeError(f"loading the inputs of {sig.pretty()} failed: {got.detail}")
                if not isinstance(got, Loaded):
                    raise RuntimeError(f"loading the inputs of {sig.pretty()} failed:\n{getattr(got, 'traceback', got)}")
                _touch(loaded, key)
                extra["skipped_sets"] = list(got.skipped)
            extra["worker"] = f"{w.backend}-{w.index}.{w.generation}"
            device = getattr(w, "device", None)
            if device:  # several devices: which one measured it (the run store's evaluations.device)
                extra["device"] = device
            judged = w.run(job, limit_s)
            if isinstance(judged, Judged):
                if judged.sets_dropped:
                    loaded.pop(key, None)
                elif key in loaded:
                    loaded.move_to_end(key)
            return judged

        # a lost device's job runs again on another; the evaluation names the devices it was lost with
        judged = run_on_a_device(self.pool, judge_on,
                                 on_lost=lambda label: extra.setdefault("requeued_from", []).append(label))
        if isinstance(judged, WorkerLost):
            if judged.kind == "timeout":
                return Evaluation(Verdict(False, "timeout", f"no verdict within {_limit_text(self.timeout_s, limit_s)} "
                                          f"(endless loop or far too slow); the worker was killed and replaced"),
                                  eval_s=time.perf_counter() - t0, extra=extra, **common)
            return Evaluation(Verdict(False, "crash", f"{judged.detail} while running the candidate\n"
                                      f"{_tail(judged.log_tail, 2000)}"),
                              eval_s=time.perf_counter() - t0, extra=extra, **common)
        if isinstance(judged, JobError):
            reason = "launch_error" if judged.retire else "internal_error"
            return Evaluation(Verdict(False, reason, _tail(judged.traceback, 4000)), eval_s=time.perf_counter() - t0,
                              extra=extra, **common)
        verdict, timing = judged.verdict, judged.timing
        extra.update(attributes=dict(judged.attributes), floor_us=judged.floor_us,
                     copy_bandwidth_gbs=judged.copy_bandwidth_gbs)
        if not extra["resources"] and extra["attributes"]:
            # No ptxas report in the compile log (seen on the H200 for a cached NVRTC build): the
            # loaded function's own attributes are the ground truth for registers and memory.
            extra["resources"] = {name: {"registers": a.get("registers", 0), "smem_bytes": a.get("static_smem_bytes", 0),
                                         "stack_bytes": a.get("local_bytes", 0), "source": "cuFuncGetAttribute"}
                                  for name, a in extra["attributes"].items()}
        if judged.retire:
            extra["worker_replaced"] = True
        speed_eager = speed_compile = fraction = None
        if timing is not None:
            if baseline is not None:
                speed_eager = baseline.eager.median_us / timing.median_us
                if baseline.compiled is not None:
                    speed_compile = baseline.compiled.median_us / timing.median_us
            if judged.floor_us:
                fraction = judged.floor_us / timing.median_us
        return Evaluation(verdict, timing, eval_s=time.perf_counter() - t0, speedup_vs_eager=speed_eager,
                          speedup_vs_compile=speed_compile, bandwidth_fraction=fraction, extra=extra, **common)


def _touch(loaded: OrderedDict, key: str) -> None:
    """Mirror the child's LRU of loaded hotspots (judge.Session.MAX_CACHED)."""
    loaded[key] = True
    loaded.move_to_end(key)
    while len(loaded) > Session.MAX_CACHED:
        loaded.popitem(last=False)


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "...\n" + text[-chars:]
