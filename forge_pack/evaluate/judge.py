"""The worker side of evaluation: typed jobs the evaluator hands to ``forge_pack.evaluate.worker``, and the
code that judges a candidate in the worker (verify, out-of-bounds run, timing, plausibility).

Jobs (frozen dataclasses, pickled to the worker; each ``run(ctx)`` returns a typed result):
``Startup`` (import torch, report the device), ``LoadInputs`` -> ``Loaded`` (the hotspot's
static input sets, kept in the worker between candidates: loading captured tensors per candidate
would kill throughput), ``JudgeCandidate`` -> ``Judged`` (the verdict, timing and what the
parent records) and ``MeasureBaseline`` -> ``verdict.Baseline``. A ``Judged`` with ``retire``
set means the CUDA context is unusable: the worker exits after sending it.

Nothing here imports ``forge_pack.evaluate.evaluator`` (the parent side) or is imported by the worker's
own module; ``tests/test_worker_jobs.py`` keeps it so.
"""

from __future__ import annotations

import os
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field

from forge_pack.targets import abi
from forge_pack.core.candidate import Candidate
from forge_pack.core.signature import Signature
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.core.verdict import Baseline, Timing, Verdict


class Session:
    """The worker's evaluation state: device, copy bandwidth, cached input sets per hotspot."""

    MAX_CACHED = 2  # hotspots whose sets stay loaded (captured tensors can be hundreds of MB)

    def __init__(self, backend: str):
        import torch

        self.torch = torch
        self.backend = backend
        self.device = "cuda" if backend == "cuda" else "cpu"
        if backend == "cpu" and os.environ.get("FORGE_PACK_THREADS"):
            torch.set_num_threads(int(os.environ["FORGE_PACK_THREADS"]))
        self.copy_bw: float | None = None
        self.sets: OrderedDict = OrderedDict()

    def hello(self) -> dict:
        torch = self.torch
        info = {"backend": self.backend, "pid": os.getpid(), "torch": torch.__version__}
        if self.backend == "cuda":
            from forge_pack.evaluate.launch import DEV_SMEM_OPTIN, Driver

            props = torch.cuda.get_device_properties(0)
            Driver.get().ensure_context()
            info.update(name=props.name, capability=f"{props.major}.{props.minor}", arch=f"sm_{props.major}{props.minor}",
                        sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
                        l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
                        smem_optin_bytes=Driver.get().device_attribute(DEV_SMEM_OPTIN),
                        cuda=torch.version.cuda)
        else:
            info.update(name="cpu", threads=torch.get_num_threads())
        return info

    def bandwidth(self, cfg) -> float:
        if self.copy_bw is None:
            from forge_pack.evaluate.timing import copy_bandwidth_gbs

            self.copy_bw = copy_bandwidth_gbs(self.device, cfg)
        return self.copy_bw

    def load(self, inputs: "LoadInputs") -> "Loaded":
        from forge_pack.evaluate import memory_plan
        from forge_pack.evaluate.verify import StaticStream, static_sets
        from forge_pack.targets import ops

        key = inputs.key
        if key not in self.sets:
            sig = inputs.signature
            if memory_plan.cache_static(sig, len(inputs.captures) + len(ops.get_op(sig.op).adversarial_kinds(sig))):
                sets, skipped = static_sets(sig, list(inputs.captures), inputs.run_dir, self.device, inputs.seed,
                                            inputs.final)
                self.sets[key] = (sets, skipped)
            else:  # too large to keep: remade per evaluation, one set at a time (memory_plan)
                stream = StaticStream(sig, list(inputs.captures), inputs.run_dir, self.device, inputs.seed,
                                      inputs.final)
                self.sets[key] = (stream, stream.skipped)
            while len(self.sets) > self.MAX_CACHED:
                self.sets.popitem(last=False)
        self.sets.move_to_end(key)
        static, skipped = self.sets[key]
        return Loaded(tuple(s.kind for s in static) if isinstance(static, list) else (), tuple(skipped))

    def healthy(self) -> bool:
        """After a CUDA error: is the context still usable? (sticky errors poison it for good)"""
        if self.backend != "cuda":
            return True
        try:
            self.torch.cuda.synchronize()
            return float(self.torch.ones(1, device="cuda").add_(1).item()) == 2.0
        except Exception:
            return False


def _session(ctx) -> Session:
    """The worker's Session (created by the first job that needs one, normally ``Startup``)."""
    s = ctx.state.get("session")
    if s is None:
        s = ctx.state["session"] = Session(ctx.backend)
    return s


@dataclass(frozen=True)
class Startup:
    """The pool's first job in each worker: import torch, set the threads, report the device."""

    def run(self, ctx) -> dict:
        return _session(ctx).hello()


@dataclass(frozen=True)
class Loaded:
    sets: tuple[str, ...]  # the kinds of the static sets now held
    skipped: tuple = ()  # captures that could not be used, with why


@dataclass(frozen=True)
class LoadInputs:
    """Load (or touch, in the worker's LRU) one hotspot's static input sets under ``key``."""

    key: str
    signature: Signature
    captures: tuple[str, ...] = ()
    run_dir: str | None = None
    seed: int = 0
    final: bool = False

    def run(self, ctx) -> Loaded:
        return _session(ctx).load(self)


@dataclass(frozen=True)
class Judged:
    verdict: Verdict
    timing: Timing | None = None
    floor_us: float | None = None
    copy_bandwidth_gbs: float | None = None
    attributes: dict = field(default_factory=dict)  # CUDA: each kernel's function attributes
    sets_dropped: bool = False  # a cached set changed: the worker dropped it (reloaded next time)
    retire: bool = False  # the CUDA context is poisoned: the worker exits after sending this


@dataclass(frozen=True)
class JudgeCandidate:
    """Verify, bounds-check (``bounds`` or a final check) and time one built candidate."""

    inputs: LoadInputs
    candidate: Candidate
    artifact: str
    timing: TimingConfig
    bounds: bool = False

    def run(self, ctx) -> Judged:
        return judge(_session(ctx), self)

    def usable_after_error(self, ctx) -> bool:
        return _session(ctx).healthy()


@dataclass(frozen=True)
class MeasureBaseline:
    """Time eager (and, with ``timing.compile_baseline``, torch.compile) on fresh inputs."""

    signature: Signature
    timing: TimingConfig
    seed: int = 0
    compile_error: str = ""  # why an earlier attempt with torch.compile was given up

    def run(self, ctx) -> Baseline:
        return measure_baseline(_session(ctx), self)


# ====================================================================== judging


def judge(session: Session, job: JudgeCandidate) -> Judged:
    """Load, verify, bounds-check and time one candidate in this process (its CPU code in a runner)."""
    from forge_pack.evaluate import memory_plan
    from forge_pack.evaluate.launch import LaunchError, load_module
    from forge_pack.evaluate.timing import cache_bytes, cold_cache
    from forge_pack.evaluate.verify import (derived_sets, fingerprint, fresh_inputs, fresh_sets, launch_error_verdict,
                                            verify)

    cand, cfg, inputs = job.candidate, job.timing, job.inputs
    sig = inputs.signature
    session.load(inputs)  # a no-op (LRU touch) when the parent already had the sets loaded
    static, _ = session.sets[inputs.key]
    names = [k.name for k in cand.spec.kernels]
    timing = floor = bw = None
    attributes: dict = {}
    try:
        if cand.backend == "cpu":
            from forge_pack.evaluate.sandbox import default_memory_cap

            cap = cfg.cpu_memory_cap or default_memory_cap(abi.bytes_moved(sig))
            module = load_module(cand.backend, job.artifact, names, memory_cap=cap)
        else:
            module = load_module(cand.backend, job.artifact, names)
    except LaunchError as e:
        return Judged(_launch_verdict(e, launch_error_verdict, "loading the module"),
                      retire=e.sticky and not session.healthy())
    poisoned = False
    streamed = not isinstance(static, list)
    try:
        seed, final = inputs.seed, inputs.final
        room = memory_plan.fits(sig, memory_plan.free_bytes(session.device), _workspace_bytes(cand, sig))
        if room is not None:  # refused before allocating anything (the module is closed below)
            return Judged(Verdict(False, "out_of_memory", room))
        fresh = fresh_sets(sig, session.device, seed, cand.content_hash, final)
        if streamed:
            parked: dict = {}
            sets = _streamed_sets(static, fresh[0], sig, session.device, seed, cand.content_hash, final, parked)
        else:
            captured = [s for s in static if s.kind.startswith("captured")]
            derived = derived_sets(sig, session.device, seed, cand.content_hash, final, captured or fresh)
            order = {"fresh": 0, "derived": 1, "odd": 2, "adversarial": 3, "captured": 4}  # cheap, likely failures first
            sets = sorted(fresh + derived + static, key=lambda s: order.get(s.kind.split("[")[0].split(":")[0], 9))
        verdict = verify(module, cand, sets, session.device)
        del sets
        if streamed and verdict.ok:  # the timed input again (not held on the device while the other sets were verified)
            fresh[0].tensors = ({n: (memory_plan.from_host(t, session.device) if t is not None else None)
                                 for n, t in parked["fresh"].items()} if "fresh" in parked
                                else fresh_inputs(sig, session.device, seed, cand.content_hash, final))
        if verdict.ok and (final or job.bounds) and getattr(module, "supports_guard", False):
            check_bounds(module, cand, fresh[0], session.device)  # a fault: LaunchError(out_of_bounds)
        if verdict.ok:
            timing, timed_verdict = time_candidate(module, cand, sig, fresh[0], cfg, session.device,
                                                   own_base=streamed)
            bw = session.bandwidth(cfg)
            floor = abi.floor_us(sig, bw)
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
            attributes = module.attributes()
        settle = getattr(module, "settle", None)
        if settle is not None:
            settle()  # a CPU runner busy after the last call returned: work_after_return
    except LaunchError as e:
        verdict = _launch_verdict(e, launch_error_verdict)
        poisoned = e.sticky or not session.healthy()
    except (RuntimeError, MemoryError) as e:  # torch surfaces asynchronous CUDA faults at the next synchronisation
        if memory_plan.is_out_of_memory(e):  # the estimate was short: still a verdict, and the worker goes on
            timing = None
            verdict = Verdict(False, "out_of_memory",
                              memory_plan.allocation_failed(sig, e, cand.backend, _workspace_bytes(cand, sig)))
            # the traceback's frames hold the failed step's tensors: clear them, or the release frees nothing
            traceback.clear_frames(e.__traceback__)
            fresh = sets = parked = None  # noqa: F841 (this evaluation's sets, dropped before the release)
            memory_plan.release(session.device)
            poisoned = not session.healthy()
            return Judged(verdict, None, floor, bw, attributes, False, poisoned)
        if cand.backend != "cuda" or "CUDA" not in str(e) and session.healthy():
            raise
        verdict = launch_error_verdict(e)
        poisoned = not session.healthy()
    finally:
        if not poisoned:
            module.close()
    dropped = False
    if not poisoned and not streamed and any(fingerprint(s) != s.fingerprint for s in static):
        session.sets.pop(inputs.key, None)  # a stray write hit the cached inputs: reload them next time
        dropped = True
        if verdict.ok:  # the per-call checks missed it (a write outside the calls' view): still a mutation
            verdict = Verdict(False, "input_mutated", "a cached input set changed during the evaluation (its "
                                                      "content fingerprint differs afterwards)",
                              verdict.max_abs_err, verdict.max_rel_err, verdict.checks)
    return Judged(verdict, timing, floor, bw, attributes, dropped, poisoned)


def _workspace_bytes(cand: Candidate, sig: Signature) -> int:
    from forge_pack.core.errors import ForgeError
    from forge_pack.evaluate.launch import plan

    try:
        return sum(n for _, n, _ in plan(cand.spec, sig).workspaces)
    except ForgeError:
        return 0  # a spec that cannot be planned: verification says why


def _streamed_sets(stream, base, sig: Signature, device: str, seed: int, candidate_hash: str, final: bool,
                   parked: dict):
    """The sets of a hotspot too large to hold together, made one at a time in the order the
    cached path verifies them (fresh, derived, odd, adversarial, captured). A set's tensors and
    reference are dropped as soon as verification asks for the next one. The fresh set (the timed
    input, and the derived sets' source where there are no captures) waits in host memory
    (``memory_plan.PARK_ON_HOST``: a GPU) while the other sets are verified, copied back to the
    device only to derive one set (and for timing: ``parked["fresh"]``); elsewhere it is dropped
    once verified where captures are the derived sets' source, else once the derived sets are made,
    and the judge draws the timed input again for timing."""
    from forge_pack.evaluate import memory_plan
    from forge_pack.evaluate.verify import iter_derived_sets

    base.streamed = True
    yield base
    host = None
    if memory_plan.park_on_host(device):
        host = parked["fresh"] = {n: (memory_plan.to_host(t) if t is not None else None)
                                  for n, t in base.tensors.items()}
        base.tensors, base.ref = {}, None
    elif stream.captures:  # not the derived sets' source: drawn again for timing
        base.tensors, base.ref = {}, None
    if stream.captures:
        derived = iter_derived_sets(sig, device, seed, candidate_hash, final, len(stream.captures), stream.source)
    elif host is not None:
        derived = iter_derived_sets(sig, device, seed, candidate_hash, final, 1,
                                    lambda i: {n: (memory_plan.from_host(t, device) if t is not None else None)
                                               for n, t in host.items()})
    else:
        derived = iter_derived_sets(sig, device, seed, candidate_hash, final, 1, lambda i: base.tensors)
    for source in (derived, iter(stream)):
        for s in source:
            yield s
            s.tensors, s.ref, s.magnitude = {}, None, None  # verified: nothing of it is needed again
            del s
        base.tensors, base.ref = {}, None  # the derived sets are made: the timed input is drawn again for timing


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
        tensors = {n: (same_layout(t) if t is not None else None) for n, t in base.tensors.items()}
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


def time_candidate(module, cand: Candidate, sig: Signature, base, cfg: TimingConfig, device: str,
                   own_base: bool = False) -> tuple[Timing | None, Verdict | None]:
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
    had, with the set's eager allowance (``mismatch``). ``own_base``: the set is not needed after
    timing, so the first copy is its own tensors rather than a clone (one copy fewer in memory)."""
    import random

    import torch

    from forge_pack.evaluate import memory_plan
    from forge_pack.evaluate.launch import plan
    from forge_pack.evaluate.timing import rotation_cache, rotation_count, time_calls
    from forge_pack.evaluate.verify import guarded_empty, guarded_like, seed_for, set_canaries

    p = plan(cand.spec, sig)
    ws_bytes = sum(n for _, n, _ in p.workspaces)
    k = rotation_count(abi.bytes_moved(sig) + ws_bytes, cfg, rotation_cache(device))
    rng = random.Random(seed_for("timing", cand.content_hash, sig.key()))
    gen = torch.Generator(device=device).manual_seed(seed_for("timing-garbage", cand.content_hash, sig.key()))
    out_spec = sig.output
    # one copy of a large row-wise signature: its reference is kept and updated where x changed
    state = {"batch": 0, "calls": 0, "verdict": None, "running": k == 1 and memory_plan.running_reference(sig)}
    calls, befores, slots = [], [], []
    for i in range(k):
        tensors = {n: (t if own_base and i == 0 or t is None else same_layout(t)) for n, t in base.tensors.items()}
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
        slot = {"index": i, "tensors": tensors, "shadow": {n: (same_layout(t) if t is not None else None)
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
    from forge_pack.evaluate.tolerance import compare, magnitude, surely_within
    from forge_pack.evaluate.verdict_rules import bitwise_equal, first_diff
    from forge_pack.evaluate.verify import canaries_intact, count_sentinel, set_canaries

    for slot in slots:
        if not slot["called"]:
            continue
        slot["called"] = False
        state["calls"] += 1
        what = f"call {state['calls']} of the timing loop ({phase}, copy {slot['index']})"
        changed = [idx[0] for idx, _ in slot["pending"]]  # the dim-0 indices of x the judge changed
        for idx, value in slot["pending"]:  # the judge's own changes, made on the shadow too
            slot["shadow"][main_input(slot["tensors"])][idx].fill_(value)
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
        ref = _timed_reference(sig, slot, changed, state.get("running", False))
        if surely_within(out, ref, sig.output.dtype, sig):
            continue
        check = compare(out, ref, sig.output.dtype, sig, atol_floor=base.atol_floor,
                        input_kind=f"timed[{slot['index']}]", magnitude=magnitude(sig, slot["tensors"]))
        if not check.passed and _passes_rekeyed(out, ref, sig, slot):
            continue
        if not check.passed:
            return Verdict(False, "mismatch", f"{what}: the output is wrong for its inputs ({check.mismatches} of "
                                              f"{out.numel()} elements, {check.first_mismatch}): the kernel behaves "
                                              f"differently when timed (cached or skipped work?)", checks=(check,))
    return None


def _timed_reference(sig: Signature, slot: dict, changed: list, running: bool):
    """The float64 reference of the inputs a timed call had (checked equal to the shadow: the judge's
    changes only). ``running`` (``memory_plan.running_reference``, one copy): the first check makes it
    whole and keeps it in the slot; later checks recompute only the dim-0 slices of x changed since
    (one per call), a 1/rows share of the work. Otherwise made whole for every call; its float64
    temporaries are bounded by slices either way."""
    from forge_pack.evaluate import memory_plan

    if not running:
        return memory_plan.reference64(sig, slot["tensors"])
    if slot.get("ref") is None:
        slot["ref"] = memory_plan.reference64(sig, slot["tensors"])
    else:
        memory_plan.reference64_rows(sig, slot["tensors"], slot["ref"], changed)
    return slot["ref"]


def _passes_rekeyed(out, ref, sig: Signature, slot: dict) -> bool:
    """A timed output that fails under the kind's key passes under its second key (``rules.rejudge``), both made
    from this call's tensors (the judge changed one element of them before the call)."""
    from forge_pack.evaluate import verdict_rules as rules
    from forge_pack.evaluate.tolerance import spec_for
    from forge_pack.targets import ops

    spec, tensors = spec_for(sig), slot["tensors"]
    again = rules.rejudge(out, ref, sig.output.dtype, spec, "timed", tensors, lambda: ops.eager(sig)(tensors))
    return again is not None and again[1] is None


def same_layout(t):
    """A copy with t's exact strides: ``clone`` makes a non-dense view (a slice of a fused buffer,
    a region's input) dense, and a kernel specialised to the strides would read the wrong places."""
    import torch

    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def main_input(tensors: dict) -> str:
    """The input the timing loop perturbs: "x" for an op; a region (in0..inK) its largest floating
    input (a mask is broadcast, so never larger than the data it masks)."""
    if "x" in tensors:
        return "x"
    floating = [(t.numel(), -i, n) for i, (n, t) in enumerate(tensors.items())
                if t is not None and t.is_floating_point()]
    return max(floating)[2] if floating else next(iter(tensors))


def _before_timed_call(slot: dict, out, garbage: list, rng, gen, state: dict):
    """The untimed preparation of one call (see time_candidate): change one element of x to a
    value far from the standard-normal draws and from the previous change (recorded for the
    shadow), prepare out (CUDA) as verification does, garble the workspaces."""
    from forge_pack.evaluate.verify import garble, prefill

    x = slot["tensors"][main_input(slot["tensors"])]
    sign = [1.0]

    def before() -> None:
        idx = tuple(rng.randrange(n) for n in x.shape)
        sign[0] = -sign[0]
        value = sign[0] * (4.0 + 2.0 * rng.random())
        # fill_ on the element's view, not x[idx] = value: a Python number assigned to one element of a
        # CUDA tensor is copied from the host and synchronises the stream, so every timed call waited
        # out the queue lead's spin here (~20 ms at the cap) and the lead no longer covered the launch
        x[idx].fill_(value)
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


def measure_baseline(session: Session, job: MeasureBaseline) -> Baseline:
    from forge_pack.targets import ops
    from forge_pack.evaluate.timing import Flusher, rotation_cache, rotation_count, time_calls
    from forge_pack.evaluate.verify import seed_for

    torch = session.torch
    sig, cfg = job.signature, job.timing
    device = session.device
    gen = torch.Generator().manual_seed(seed_for(job.seed, "baseline", sig.key()))
    base = ops.make_inputs(sig, "fresh", gen, device)
    k = rotation_count(abi.bytes_moved(sig), cfg, rotation_cache(device))
    slots = [base] + [{n: (same_layout(t) if t is not None else None) for n, t in base.items()} for _ in range(k - 1)]
    fn = ops.eager(sig)
    flusher = Flusher(device, cfg)
    eager = time_calls([lambda t=t: fn(t) for t in slots], device, cfg, flusher)
    compiled, error = None, job.compile_error
    if cfg.compile_baseline:
        try:
            cfn = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
            cfn(slots[0])
            compiled = time_calls([lambda t=t: cfn(t) for t in slots], device, cfg, flusher)
        except Exception as e:  # torch.compile failing is a fact about the baseline, not a crash
            error = f"{type(e).__name__}: {str(e)[:2000]}"
    bw = session.bandwidth(cfg)
    return Baseline(eager, compiled, error, abi.floor_us(sig, bw), bw)
