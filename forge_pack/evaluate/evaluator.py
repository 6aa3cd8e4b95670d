"""evaluate = static checks -> compile -> object check (parent) -> verify -> bench (isolated worker).

``Evaluator`` is what the search calls. ``evaluate`` is thread-safe: several search threads may
call it at once; each compiles in its own thread (NVRTC and g++ run outside the GIL), then
waits for a free worker, and gets back an ``Evaluation`` whose ``Verdict`` says what happened.
Nothing a candidate does (compile error, segfault, illegal address, trap, endless loop) raises
here. The worker-side halves (``worker_evaluate``, ``worker_baseline``) live here too so the
whole flow reads in one file.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from forge_pack.targets import abi
from forge_pack.evaluate import object_check, static_check
from forge_pack.core.candidate import Candidate
from forge_pack.evaluate.compile import compile_candidate
from forge_pack.core.hotspot import Hotspot
from forge_pack.core.signature import Signature
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.core.verdict import Baseline, Evaluation, Timing, Verdict
from forge_pack.evaluate.worker import Session, WorkerDied, WorkerPool, WorkerTimeout


class Evaluator:
    def __init__(self, backend: str, workers: int = 1, timeout_s: float = 60.0, seed: int = 0,
                 timing: TimingConfig = TimingConfig(), run_dir: str | Path | None = None, *,
                 cache_dir: str | Path | None = None, load_timeout_s: float = 900.0,
                 baseline_timeout_s: float = 1800.0, log_dir: str | Path | None = None):
        if backend not in ("cuda", "cpu"):
            raise ValueError(f"unknown backend {backend!r}")
        self.backend, self.timeout_s, self.seed, self.timing = backend, timeout_s, seed, timing
        self.run_dir = str(run_dir) if run_dir else None
        self.cache_dir = cache_dir
        self.load_timeout_s, self.baseline_timeout_s = load_timeout_s, baseline_timeout_s
        if log_dir is None and run_dir:
            log_dir = Path(run_dir) / "workers"
        self.pool = WorkerPool(backend, workers, str(log_dir) if log_dir else None)
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
            self._info = dict(self.pool.info())
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
        req = {"cmd": "baseline", "signature": sig.to_json(), "timing": self.timing.to_json(), "seed": self.seed}
        reply: dict = {}
        for attempt in range(2):
            with self.pool.acquire() as w:
                try:
                    reply = w.request(req, self.baseline_timeout_s)
                    break
                except (WorkerTimeout, WorkerDied) as e:
                    if attempt == 1 or not self.timing.compile_baseline:
                        raise RuntimeError(f"baseline of {sig.pretty()} failed: {e}") from e
                    # torch.compile hung or crashed the worker: measure eager alone and say why
                    cfg = TimingConfig.from_json({**self.timing.to_json(), "compile_baseline": False})
                    req = {**req, "timing": cfg.to_json(), "compile_error": f"torch.compile: {e}"}
        if "error" in reply:
            raise RuntimeError(f"baseline of {sig.pretty()} failed in the worker:\n{reply['error']}")
        base = Baseline.from_json(reply["baseline"])
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
        load = {"cmd": "load", "key": key, "signature": sig.to_json(), "captures": list(hotspot.captures),
                "run_dir": self.run_dir, "seed": self.seed, "final": final}
        req = {**load, "cmd": "evaluate", "candidate": candidate.to_json(), "artifact": build.path,
               "timing": self.timing.to_json(), "bounds": bounds}
        extra = {"cached_build": build.cached, "resources": build.resources}
        with self.pool.acquire() as w:
            try:
                if key not in w.loaded:
                    loaded = w.request(load, self.load_timeout_s)
                    if "error" in loaded:
                        raise RuntimeError(f"loading the inputs of {sig.pretty()} failed:\n{loaded['error']}")
                    w.mark_loaded(key)
                    extra["skipped_sets"] = loaded.get("skipped", [])
            except (WorkerTimeout, WorkerDied) as e:
                raise RuntimeError(f"loading the inputs of {sig.pretty()} failed: {e}") from e
            extra["worker"] = f"{w.backend}-{w.index}.{w.generation}"
            try:
                reply = w.request(req, self.timeout_s)
            except WorkerTimeout:
                return Evaluation(Verdict(False, "timeout", f"no verdict within {self.timeout_s:.0f} s (endless loop "
                                          f"or far too slow); the worker was killed and replaced"),
                                  eval_s=time.perf_counter() - t0, extra=extra, **common)
            except WorkerDied as e:
                return Evaluation(Verdict(False, "crash", f"{e} while running the candidate\n{_tail(e.log_tail, 2000)}"),
                                  eval_s=time.perf_counter() - t0, extra=extra, **common)
            if reply.get("sets_dropped"):
                w.loaded.pop(key, None)
            elif key in w.loaded:
                w.loaded.move_to_end(key)
        if "error" in reply:
            reason = "launch_error" if reply.get("poisoned") else "internal_error"
            return Evaluation(Verdict(False, reason, _tail(reply["error"], 4000)), eval_s=time.perf_counter() - t0,
                              extra=extra, **common)
        verdict = Verdict.from_json(reply["verdict"])
        timing = Timing.from_json(reply.get("timing"))
        extra.update(attributes=reply.get("attributes", {}), floor_us=reply.get("floor_us"),
                     copy_bandwidth_gbs=reply.get("copy_bandwidth_gbs"))
        if not extra["resources"] and extra["attributes"]:
            # No ptxas report in the compile log (seen on the H200 for a cached NVRTC build): the
            # loaded function's own attributes are the ground truth for registers and memory.
            extra["resources"] = {name: {"registers": a.get("registers", 0), "smem_bytes": a.get("static_smem_bytes", 0),
                                         "stack_bytes": a.get("local_bytes", 0), "source": "cuFuncGetAttribute"}
                                  for name, a in extra["attributes"].items()}
        if reply.get("poisoned"):
            extra["worker_replaced"] = True
        speed_eager = speed_compile = fraction = None
        if timing is not None:
            if baseline is not None:
                speed_eager = baseline.eager.median_us / timing.median_us
                if baseline.compiled is not None:
                    speed_compile = baseline.compiled.median_us / timing.median_us
            if reply.get("floor_us"):
                fraction = reply["floor_us"] / timing.median_us
        return Evaluation(verdict, timing, eval_s=time.perf_counter() - t0, speedup_vs_eager=speed_eager,
                          speedup_vs_compile=speed_compile, bandwidth_fraction=fraction, extra=extra, **common)


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "...\n" + text[-chars:]


# ====================================================================== worker side


def worker_evaluate(session: Session, req: dict) -> dict:
    from forge_pack.evaluate.launch import LaunchError, load_module
    from forge_pack.evaluate.timing import cache_bytes, cold_cache
    from forge_pack.evaluate.verify import derived_sets, fingerprint, fresh_sets, launch_error_verdict, verify

    cand = Candidate.from_json(req["candidate"])
    sig = Signature.from_json(req["signature"])
    cfg = TimingConfig.from_json(req["timing"])
    session.load(req)  # a no-op (LRU touch) when the parent already had the sets loaded
    static, _ = session.sets[req["key"]]
    names = [k.name for k in cand.spec.kernels]
    reply: dict = {}
    try:
        if cand.backend == "cpu":
            from forge_pack.evaluate.sandbox import default_memory_cap

            cap = cfg.cpu_memory_cap or default_memory_cap(abi.bytes_moved(sig))
            module = load_module(cand.backend, req["artifact"], names, memory_cap=cap)
        else:
            module = load_module(cand.backend, req["artifact"], names)
    except LaunchError as e:
        return {"verdict": _launch_verdict(e, launch_error_verdict, "loading the module").to_json(),
                "poisoned": e.sticky and not session.healthy()}
    poisoned = False
    try:
        seed, final = req.get("seed", 0), req.get("final", False)
        fresh = fresh_sets(sig, session.device, seed, cand.content_hash, final)
        captured = [s for s in static if s.kind.startswith("captured")]
        derived = derived_sets(sig, session.device, seed, cand.content_hash, final, captured or fresh)
        order = {"fresh": 0, "derived": 1, "odd": 2, "adversarial": 3, "captured": 4}  # cheap, likely failures first
        sets = sorted(fresh + derived + static, key=lambda s: order.get(s.kind.split("[")[0].split(":")[0], 9))
        verdict = verify(module, cand, sets, session.device)
        if verdict.ok and (req.get("final") or req.get("bounds")) and getattr(module, "supports_guard", False):
            check_bounds(module, cand, fresh[0], session.device)  # a fault: LaunchError(out_of_bounds)
        if verdict.ok:
            timing, timed_verdict = time_candidate(module, cand, sig, fresh[0], cfg, session.device)
            bw = session.bandwidth(cfg)
            floor = abi.floor_us(sig, bw)
            reply.update(floor_us=floor, copy_bandwidth_gbs=bw)
            if timing is not None:
                reply["timing"] = timing.to_json()
            if timed_verdict is not None:
                verdict = Verdict(False, timed_verdict.reason, timed_verdict.detail, verdict.max_abs_err,
                                  verdict.max_rel_err, verdict.checks + timed_verdict.checks)
            why = None
            if verdict.ok and timing is not None:
                why = implausible(timing, floor, bw, sig, cfg, cold_cache(session.device, cfg),
                                  cache_bytes(session.device))
            if why:
                verdict = Verdict(False, "implausible_speedup", why, verdict.max_abs_err, verdict.max_rel_err,
                                  verdict.checks)
        if cand.backend == "cuda":
            reply["attributes"] = module.attributes()
        settle = getattr(module, "settle", None)
        if settle is not None:
            settle()  # a CPU runner busy after the last call returned: work_after_return
    except LaunchError as e:
        verdict = _launch_verdict(e, launch_error_verdict)
        poisoned = e.sticky or not session.healthy()
    except RuntimeError as e:  # torch surfaces asynchronous CUDA faults at the next synchronisation
        if cand.backend != "cuda" or "CUDA" not in str(e) and session.healthy():
            raise
        verdict = launch_error_verdict(e)
        poisoned = not session.healthy()
    finally:
        if not poisoned:
            module.close()
    if poisoned:
        reply["poisoned"] = True
    elif any(fingerprint(s) != s.fingerprint for s in static):
        session.sets.pop(req["key"], None)  # a stray write hit the cached inputs: reload them next time
        reply["sets_dropped"] = True
        if verdict.ok:  # the per-call checks missed it (a write outside the calls' view): still a mutation
            verdict = Verdict(False, "input_mutated", "a cached input set changed during the evaluation (its "
                                                      "content fingerprint differs afterwards)",
                              verdict.max_abs_err, verdict.max_rel_err, verdict.checks)
    reply["verdict"] = verdict.to_json()
    return reply


def _launch_verdict(err, make, where: str = "") -> Verdict:
    """A LaunchError as a verdict: its own reason (crash, out_of_bounds, work_after_return, ...)."""
    v = make(err, where) if where else make(err)
    reason = getattr(err, "reason", "launch_error")
    return v if reason == v.reason else Verdict(False, reason, v.detail)


def check_bounds(module, cand: Candidate, base, device: str) -> None:
    """Run the candidate once with every tensor flush against inaccessible memory after its end and
    once before its start (guard pages; a fault raises LaunchError(reason="out_of_bounds")). The
    outputs are not judged here: verification did that."""
    import torch

    from forge_pack.targets import ops
    from forge_pack.evaluate.launch import plan

    p = plan(cand.spec, base.sig)
    for guard in ("end", "start"):
        tensors = {n: (t.clone() if t is not None else None) for n, t in base.tensors.items()}
        ws = {name: torch.zeros(max(n, 1), dtype=torch.uint8, device=device)[:n] for name, n, _ in p.workspaces}
        run = module.bind(p, {**tensors, "out": ops.empty_like_spec(base.sig.output, device), **ws}, guard=guard)
        run()
        if device == "cuda":
            torch.cuda.synchronize()


def implausible(timing: Timing, floor_us: float, bw_gbs: float, sig: Signature, cfg: TimingConfig,
                cold: bool, cache: int) -> str | None:
    """Why a verified kernel's time cannot be believed (faster than copying its bytes), else None.

    Judged where the working set cannot sit in cache: always when every timed call starts from a
    flushed cache (``timing.cold_cache``), otherwise only for a working set of at least
    ``implausible_uncached_factor`` x all the cache there is. Every timed call's output is also
    checked, so a time this low means work done outside the timed region, or a broken timer."""
    moved = abi.bytes_moved(sig)
    if not cold and moved < cfg.implausible_uncached_factor * cache:
        return None
    # CUDA events resolve about 0.5 us: a time that short of the floor is not yet proof
    resolution = 0.5 if timing.clock == "cuda_events" else 0.0
    if timing.median_us + resolution >= cfg.implausible_margin * floor_us:
        return None
    where = "after a cache flush" if cold else f"a working set of {moved / cache:.0f}x the cache"
    return (f"median {timing.median_us:.2f} us is below {cfg.implausible_margin:g}x the bandwidth floor "
            f"{floor_us:.2f} us ({moved} bytes at {bw_gbs:.0f} GB/s, {where}): no kernel moves its bytes "
            f"faster than a copy (work done outside the timed calls?)")


def time_candidate(module, cand: Candidate, sig: Signature, base, cfg: TimingConfig, device: str
                   ) -> tuple[Timing | None, Verdict | None]:
    """Time the bound launch over rotating copies of one verified input set and check every call
    it makes, warm-up included: (timing, None), or (timing so far, the verdict that rejects it).

    Calls run in batches of one call per copy. Outside the timed region, ahead of every call: one
    element of x changes (a kernel caching results keyed on its input returns a stale answer),
    the non-zeroed workspaces get new garbage, and on CUDA out is prepared as in verification:
    the sentinel in even batches, finite garbage in odd ones (a kernel that works only while it
    sees the sentinel fails the odd ones, as it fails every verified set's second run). On CPU
    each call allocates its output, as eager and the shipped package do (fresh pages cost their
    first touch), which verification's second run does too. After each batch (untimed, after a
    device-wide synchronisation), for every copy: its inputs byte for byte against a shadow
    holding exactly the judge's own changes (``input_mutated``), canaries, the sentinel
    (``unwritten_output``), and the output against the float64 reference of the inputs that call
    had, with the set's eager allowance (``mismatch``)."""
    import random

    import torch

    from forge_pack.evaluate.launch import plan
    from forge_pack.evaluate.timing import rotation_count, time_calls
    from forge_pack.evaluate.verify import guarded_empty, guarded_like, seed_for, set_canaries

    p = plan(cand.spec, sig)
    ws_bytes = sum(n for _, n, _ in p.workspaces)
    k = rotation_count(abi.bytes_moved(sig) + ws_bytes, cfg)
    rng = random.Random(seed_for("timing", cand.content_hash, sig.key()))
    gen = torch.Generator(device=device).manual_seed(seed_for("timing-garbage", cand.content_hash, sig.key()))
    out_spec = sig.output
    state = {"batch": 0, "calls": 0, "verdict": None}
    calls, befores, slots = [], [], []
    for i in range(k):
        tensors = {n: (t.clone() if t is not None else None) for n, t in base.tensors.items()}
        out, out_whole = guarded_like(out_spec, device)
        ws, wholes = {}, [out_whole]
        for name, n, _ in p.workspaces:
            ws[name], whole = guarded_empty(max(n, 1), device)
            wholes.append(whole)
        for whole in wholes:
            set_canaries(whole)
        run = module.bind(p, {**tensors, "out": out, **ws})
        zeroed = [ws[name] for name, _, zero in p.workspaces if zero]
        garbage = [ws[name] for name, _, zero in p.workspaces if not zero]
        slot = {"index": i, "tensors": tensors, "shadow": {n: (t.clone() if t is not None else None)
                                                           for n, t in tensors.items()},
                "pending": [], "out": out, "wholes": wholes if device == "cuda" else wholes[1:], "called": False}
        slots.append(slot)
        befores.append(_before_timed_call(slot, out if device == "cuda" else None, garbage, rng, gen, state))
        calls.append(_marking(_with_zeroing(run, zeroed), slot) if device == "cuda"
                     else _allocating(run, zeroed, slot, out_spec))

    def after(phase: str) -> bool:
        state["verdict"] = _check_batch(slots, sig, base, phase, state)
        state["batch"] += 1
        return state["verdict"] is not None

    timing = time_calls(calls, device, cfg, before=befores, after=after)
    return timing, state["verdict"]


def _check_batch(slots: list, sig: Signature, base, phase: str, state: dict) -> Verdict | None:
    """Every call of the batch just made, checked as a verified call is (see time_candidate)."""
    from forge_pack.targets import ops
    from forge_pack.evaluate.tolerance import compare, magnitude, surely_within
    from forge_pack.evaluate.verdict_rules import bitwise_equal, first_diff
    from forge_pack.evaluate.verify import canaries_intact, count_sentinel, set_canaries

    for slot in slots:
        if not slot["called"]:
            continue
        slot["called"] = False
        state["calls"] += 1
        what = f"call {state['calls']} of the timing loop ({phase}, copy {slot['index']})"
        for idx, value in slot["pending"]:  # the judge's own changes, made on the shadow too
            slot["shadow"]["x"][idx] = value
        slot["pending"].clear()
        for n, want in slot["shadow"].items():
            got = slot["tensors"][n]
            if want is not None and not bitwise_equal(got, want):
                return Verdict(False, "input_mutated", f"{what}: input `{n}` changed during the call "
                                                       f"({first_diff(got, want)})")
        if not all(canaries_intact(w) for w in slot["wholes"]):
            return Verdict(False, "mismatch", f"{what}: out-of-bounds write past the end of out or a workspace")
        for w in slot["wholes"]:
            set_canaries(w)
        out = slot["out"]
        unwritten, where = count_sentinel(out)
        if unwritten:
            return Verdict(False, "unwritten_output", f"{what}: {unwritten} of {out.numel()} output elements "
                                                      f"not written ({where})")
        ref = ops.reference64(sig, slot["tensors"])
        if surely_within(out, ref, sig.output.dtype, sig.op):
            continue
        check = compare(out, ref, sig.output.dtype, sig.op, atol_floor=base.atol_floor,
                        input_kind=f"timed[{slot['index']}]", magnitude=magnitude(sig.op, slot["tensors"]))
        if not check.passed:
            return Verdict(False, "mismatch", f"{what}: the output is wrong for its inputs ({check.mismatches} of "
                                              f"{out.numel()} elements, {check.first_mismatch}): the kernel behaves "
                                              f"differently when timed (cached or skipped work?)", checks=(check,))
    return None


def _before_timed_call(slot: dict, out, garbage: list, rng, gen, state: dict):
    """The untimed preparation of one call (see time_candidate): change one element of x to a
    value far from the standard-normal draws and from the previous change (recorded for the
    shadow), prepare out (CUDA) as verification does, garble the workspaces."""
    from forge_pack.evaluate.verify import garble, prefill

    x = slot["tensors"]["x"]
    sign = [1.0]

    def before() -> None:
        idx = tuple(rng.randrange(n) for n in x.shape)
        sign[0] = -sign[0]
        value = sign[0] * (4.0 + 2.0 * rng.random())
        x[idx] = value
        slot["pending"].append((idx, value))
        if out is not None:
            prefill(out, "sentinel" if state["batch"] % 2 == 0 else "stale", gen)
        for g in garbage:
            garble(g, gen)

    return before


def _marking(run, slot: dict):
    def call() -> None:
        run()
        slot["called"] = True

    return call


def _allocating(run, zeroed: list, slot: dict, spec):
    """CPU (the sandbox, ``forge_pack.evaluate.sandbox``): a new output per call, as eager and the shipped
    package allocate theirs; the runner's output slot is marked fresh (a large one gets
    never-touched pages, so its first touch is timed). ``call.stage`` stages the call ahead of the
    cache flush; ``call.elapsed_s`` is the judge's measurement of the launch plus the zeroing of
    ``zero`` workspaces (which the shipped launcher does per call)."""
    import torch

    from forge_pack.targets import ops

    dtype = ops.TORCH_DTYPES[spec.dtype]
    stage = run.stage
    pending = [False]
    zeroing_s = [0.0]

    def prepare() -> None:
        out = torch.empty_strided(spec.shape, spec.strides, dtype=dtype)
        run.retarget("out", out, fresh=True)
        t0 = time.perf_counter()
        for z in zeroed:  # the shipped launcher zeroes them per call too: its time is added below
            z.zero_()
        zeroing_s[0] = time.perf_counter() - t0
        stage()
        slot["out"] = out
        pending[0] = True

    def sandboxed() -> None:
        if not pending[0]:
            prepare()
        pending[0] = False
        run()
        slot["called"] = True

    sandboxed.stage = prepare  # type: ignore[attr-defined]
    sandboxed.elapsed_s = lambda: run.elapsed_s() + zeroing_s[0]  # type: ignore[attr-defined]
    return sandboxed


def _with_zeroing(run, zeroed):
    if not zeroed:
        return run

    def call() -> None:
        for z in zeroed:  # the shipped launcher zeroes them per call too: it counts
            z.zero_()
        run()

    return call


def worker_baseline(session: Session, req: dict) -> dict:
    from forge_pack.targets import ops
    from forge_pack.evaluate.timing import Flusher, rotation_count, time_calls
    from forge_pack.evaluate.verify import seed_for

    torch = session.torch
    sig = Signature.from_json(req["signature"])
    cfg = TimingConfig.from_json(req["timing"])
    device = session.device
    gen = torch.Generator().manual_seed(seed_for(req.get("seed", 0), "baseline", sig.key()))
    base = ops.make_inputs(sig, "fresh", gen, device)
    k = rotation_count(abi.bytes_moved(sig), cfg)
    slots = [{n: (t.clone() if t is not None else None) for n, t in base.items()} for _ in range(k)]
    fn = ops.eager(sig)
    flusher = Flusher(device, cfg)
    eager = time_calls([lambda t=t: fn(t) for t in slots], device, cfg, flusher)
    compiled, error = None, req.get("compile_error", "")
    if cfg.compile_baseline:
        try:
            cfn = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
            cfn(slots[0])
            compiled = time_calls([lambda t=t: cfn(t) for t in slots], device, cfg, flusher)
        except Exception as e:  # torch.compile failing is a fact about the baseline, not a crash
            error = f"{type(e).__name__}: {str(e)[:2000]}"
    bw = session.bandwidth(cfg)
    base_ = Baseline(eager, compiled, error, abi.floor_us(sig, bw), bw)
    return {"baseline": base_.to_json()}
