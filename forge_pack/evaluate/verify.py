"""Verification: the known ways generated kernels cheat or silently fail, and the guard for each.

Runs inside a worker, on the candidate's device. Each input set (captured real tensors, fresh
random draws made for this very evaluation, sets derived from the captured or fresh tensors by
random transforms, adversarial inputs, odd sizes) is run twice: first into an output holding the
NaN sentinel, then into one prepared as timed calls and the package's calls get it (CPU: a fresh
allocation; CUDA: finite garbage), so seeing the sentinel tells a kernel nothing.

| failure                              | guard here                                                     |
| output never written / stale memory  | sentinel bit pattern in out before the first run; after either |
|                                      | run no element may still hold it                              |
| works only while it sees the sentinel| second run without it, held to the reference                   |
| out-of-bounds writes                 | canary bytes around the output and the workspaces              |
| input mutated or zeroed              | bitwise compare of every input with a saved copy after each    |
|                                      | call; a changed cached set (fingerprint) after the evaluation  |
| output aliases an input              | storage ranges checked (static_check also rejects writable     |
|                                      | parameters bound to inputs)                                    |
| hard-coded / cached results          | fresh inputs seeded by the candidate's hash; another seed set  |
|                                      | for the final check; captured real tensors                     |
| correct only on generated-looking    | derived sets (scale, shift, permutation, per-row magnitudes,   |
| inputs                               | sign flips of real tensors), new for every evaluation          |
| lower precision than claimed         | tolerance table vs float64 reference, every element            |
| NaN/Inf as a wildcard                | NaN/Inf parity position by position                            |
| races, uninitialised workspaces      | second run with new garbage in workspaces: bitwise equal output|
| side-stream / deferred work          | device-wide synchronisation before any check                   |
| behaving only while verified         | judge.time_candidate checks every warm-up and timed call       |
|                                      | the same way, with the buffer preparation used here            |

The first failing check decides the verdict; every check made is kept in ``Verdict.checks``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from forge_pack.targets import ops, registry
from forge_pack.evaluate import memory_plan
from forge_pack.evaluate import verdict_rules as rules
from forge_pack.core.candidate import Candidate
from forge_pack.core.errors import ForgeError
from forge_pack.evaluate.launch import LaunchError, check_requires, plan
from forge_pack.core.signature import Signature, TensorSpec, contiguous_strides
from forge_pack.evaluate.tolerance import as_check
from forge_pack.core.verdict import Check, Verdict
# The sentinel, the bitwise checks and the order of the per-call verdicts are verdict_rules' (shipped
# verbatim in every package): the sentinel helpers are re-exported for evaluate.py.
from forge_pack.evaluate.verdict_rules import SENTINEL, count_sentinel, fill_sentinel  # noqa: F401

CANARY = 0xA5
GUARD_BYTES = 512  # canary bytes on each side; keeps the allocator's 512-byte alignment


def seed_for(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & ((1 << 63) - 1)


@dataclass
class InputSet:
    kind: str  # captured[i] | fresh[i] | adversarial:<kind> | odd:<shape>
    sig: Signature  # with output
    tensors: dict[str, torch.Tensor | None]
    ref: torch.Tensor  # float64
    atol_floor: "float | torch.Tensor" = 0.0  # tolerance.eager_allowance: eager's own error, by magnitude
    fingerprint: tuple = field(default=())
    magnitude: torch.Tensor | None = None  # rules.magnitude: the allowance's lookup key where not |ref|
    # made for this evaluation alone (memory_plan: a large hotspot): the reference may be dropped once
    # the first run is judged and made again only if the second run needs it
    streamed: bool = False


def make_set(kind: str, sig: Signature, tensors: dict, device: str, known: dict | None = None) -> InputSet | None:
    """Reference and eager error for one input; None when eager itself breaks NaN/Inf parity there
    (a kernel is not held to a standard PyTorch does not meet). ``known``: a dict kept by the caller
    for the same tensors made again (a streamed static set): the first call stores the eager allowance
    in it (or that the set is skipped), later calls take it from there instead of running eager and
    measuring its error again (a GB set: a few hundred ms per evaluation)."""
    ref = memory_plan.reference64(sig, tensors)
    spec = registry.spec_for(sig)
    mag = rules.magnitude(spec, tensors)
    if known is not None and "allowance" in known:
        allowance = known["allowance"]
    else:
        eager_out = ops.eager(sig)(tensors)
        allowance = rules.allowance(eager_out, ref, sig.output.dtype if sig.output else None, spec, mag)
        del eager_out
        if known is not None:
            known["allowance"] = allowance
    if allowance is None:
        return None
    s = InputSet(kind, sig, tensors, ref, allowance, magnitude=mag)
    s.fingerprint = fingerprint(s)
    return s


def static_sets(sig: Signature, captures: list[str], run_dir: str | None, device: str, seed: int,
                final: bool) -> tuple[list[InputSet], list[str]]:
    """Captured, adversarial and odd-size sets for one hotspot (cached by the worker)."""
    from forge_pack.profile.capture import load_capture

    op = ops.get_op(sig.op)
    sets: list[InputSet] = []
    skipped: list[str] = []
    mode = "final" if final else "search"
    for i, rel in enumerate(captures):
        path = Path(run_dir or ".") / rel
        tensors, _ = load_capture(path, sig, device)
        _add(sets, skipped, f"captured[{i}]", sig, tensors, device)
    for kind in op.adversarial_kinds(sig):
        gen = torch.Generator().manual_seed(seed_for(seed, mode, "adversarial", kind, sig.key()))
        _add(sets, skipped, f"adversarial:{kind}", sig, op.make_inputs(sig, kind, gen, device), device)
    for osig in op.odd_signatures(sig):
        osig = ops.with_output(osig)
        gen = torch.Generator().manual_seed(seed_for(seed, mode, "odd", osig.key()))
        shape = "x".join(str(s) for s in osig.x.shape)
        _add(sets, skipped, f"odd:{shape}", osig, op.make_inputs(osig, "fresh", gen, device), device)
    return sets, skipped


class StaticStream:
    """A hotspot's static sets too large to cache (``memory_plan.cache_static``): remade for each
    evaluation from the same seeds, one at a time, in the order the judge verifies them (odd,
    adversarial, captured). ``captures`` names the captured sets (sources of the derived sets)."""

    def __init__(self, sig: Signature, captures: list[str], run_dir: str | None, device: str, seed: int,
                 final: bool):
        self.sig, self.captures, self.run_dir, self.device, self.seed, self.final = (
            sig, list(captures), run_dir, device, seed, final)
        self.skipped: list[str] = []
        # kind -> the set's tensors in host memory (memory_plan.host_cache_bytes): copied to the device
        # for each evaluation instead of drawn again; the kernel only ever sees the device copy
        self.host: dict[str, dict] = {}
        self.host_room = memory_plan.host_cache_bytes(device)
        # kind -> make_set's ``known`` for a set kept in host memory (the same tensors every time)
        self.known: dict[str, dict] = {}

    def capture(self, i: int) -> dict:
        from forge_pack.profile.capture import load_capture

        tensors, _ = load_capture(Path(self.run_dir or ".") / self.captures[i], self.sig, self.device)
        return tensors

    def source(self, i: int) -> dict:
        """Capture ``i``'s tensors on the device as a derived set's source: a copy of the host copy the
        captured set keeps (where there is room), else loaded from its file. A GB capture is read from
        disk once per hotspot, not once per derived set (five per evaluation)."""
        return self._tensors(f"captured[{i}]", lambda: self.capture(i))

    def __iter__(self):
        op = ops.get_op(self.sig.op)
        mode = "final" if self.final else "search"
        for osig in op.odd_signatures(self.sig):
            osig = ops.with_output(_no_larger(osig, self.sig))
            gen = torch.Generator().manual_seed(seed_for(self.seed, mode, "odd", osig.key()))
            shape = "x".join(str(s) for s in osig.x.shape)
            yield from self._made(f"odd:{shape}", osig,
                                  lambda osig=osig, gen=gen: op.make_inputs(osig, "fresh", gen, self.device))
        for kind in op.adversarial_kinds(self.sig):
            gen = torch.Generator().manual_seed(seed_for(self.seed, mode, "adversarial", kind, self.sig.key()))
            yield from self._made(f"adversarial:{kind}", self.sig,
                                  lambda kind=kind, gen=gen: op.make_inputs(self.sig, kind, gen, self.device))
        for i in range(len(self.captures)):
            yield from self._made(f"captured[{i}]", self.sig, lambda i=i: self.capture(i))

    def _tensors(self, kind: str, make) -> dict:
        """The set's tensors on the device: from the host copy when there is one, else made (and kept
        in host memory while there is room)."""
        if kind in self.host:
            return {n: (memory_plan.from_host(t, self.device) if t is not None else None)
                    for n, t in self.host[kind].items()}
        tensors = make()
        size = memory_plan.tensors_bytes(tensors)
        if size <= self.host_room:
            self.host[kind] = {n: (memory_plan.to_host(t) if t is not None else None) for n, t in tensors.items()}
            self.host_room -= size
        return tensors

    def _made(self, kind: str, sig: Signature, make):
        tensors = self._tensors(kind, make)
        # the allowance is kept only for a set whose tensors are kept: one made again from its seed or
        # file is the same too, but a kept allowance must never outlive the tensors it was measured on
        known = self.known.setdefault(kind, {}) if kind in self.host else None
        s = make_set(kind, sig, tensors, self.device, known)
        del tensors
        if s is None:
            self.skipped.append(f"{kind}: eager PyTorch itself differs from float64 in NaN/Inf positions")
        else:
            s.streamed = True
            yield s


def fresh_inputs(sig: Signature, device: str, seed: int, candidate_hash: str, final: bool, i: int = 0) -> dict:
    """The tensors of ``fresh[i]`` (the same draw every time: a large hotspot's timed input is made
    again for timing rather than held while the other sets are verified)."""
    gen = torch.Generator().manual_seed(seed_for(seed, "final" if final else "search", candidate_hash, i))
    return ops.get_op(sig.op).make_inputs(sig, "fresh", gen, device)


def _no_larger(osig: Signature, sig: Signature) -> Signature:
    """An odd-size signature no larger than the signature itself (a few huge rows make 37 rows of
    them 2x the data): its leading dim becomes the largest odd count that keeps it within, so it
    still catches a hard-coded row count and a missing tail."""
    x = osig.x
    if x.numel <= sig.x.numel or len(x.shape) < 2:
        return osig
    per = x.numel // max(x.shape[0], 1)
    lead = max(1, sig.x.numel // max(per, 1) - 1) | 1
    shape = (min(lead, x.shape[0]),) + tuple(x.shape[1:])
    inputs = tuple((n, TensorSpec(s.dtype, shape, contiguous_strides(shape)) if n == "x" else s)
                   for n, s in osig.inputs)
    return Signature(osig.op, inputs, osig.params, None)


def fresh_sets(sig: Signature, device: str, seed: int, candidate_hash: str, final: bool, count: int = 1
               ) -> list[InputSet]:
    """Inputs drawn for this evaluation: seeded by the candidate's own hash, so no candidate can
    have seen them, and by the mode, so the final check uses a different set than the search."""
    sets: list[InputSet] = []
    for i in range(count):
        tensors = fresh_inputs(sig, device, seed, candidate_hash, final, i)
        s = make_set(f"fresh[{i}]", sig, tensors, device)
        if s is None:  # never expected for random inputs; keep the set (timing needs one) without slack
            s = InputSet(f"fresh[{i}]", sig, tensors, memory_plan.reference64(sig, tensors))
        sets.append(s)
    return sets


def derived_sets(sig: Signature, device: str, seed: int, candidate_hash: str, final: bool,
                 sources: list[InputSet]) -> list[InputSet]:
    """One set per ``ops.DERIVED_KINDS`` transform of a source drawn at random from ``sources``
    (the captured sets; the fresh draw where there are none), seeded like ``fresh_sets``: by the
    candidate's hash and the mode. A kernel correct only on inputs that look like the generated
    sets (standard-normal rows, the adversarial patterns) fails on these. A set where eager
    PyTorch itself breaks NaN/Inf parity is left out, as in ``static_sets``."""
    out: list[InputSet] = []
    mode = "final" if final else "search"
    for kind in ops.DERIVED_KINDS:
        gen = torch.Generator().manual_seed(seed_for(seed, mode, candidate_hash, "derived", kind, sig.key()))
        src = sources[rules.derived_source(len(sources), gen)]
        s = make_set(f"derived:{kind}", sig, ops.derive_inputs(sig, kind, src.tensors, gen), device)
        if s is not None:
            out.append(s)
    return out


def iter_derived_sets(sig: Signature, device: str, seed: int, candidate_hash: str, final: bool, count: int,
                      source) -> "Iterator[InputSet]":
    """``derived_sets`` one at a time, for sets too large to hold together: ``source(i)`` gives the
    tensors of source ``i`` of ``count`` (loaded when needed); the same seeds, transforms and sources
    as ``derived_sets`` over the same sources."""
    mode = "final" if final else "search"
    for kind in ops.DERIVED_KINDS:
        gen = torch.Generator().manual_seed(seed_for(seed, mode, candidate_hash, "derived", kind, sig.key()))
        src = source(rules.derived_source(count, gen))
        tensors = ops.derive_inputs(sig, kind, src, gen)
        del src
        s = make_set(f"derived:{kind}", sig, tensors, device)
        del tensors
        if s is not None:
            s.streamed = True
            yield s


def _add(sets: list, skipped: list, kind: str, sig: Signature, tensors: dict, device: str) -> None:
    s = make_set(kind, sig, tensors, device)
    if s is None:
        skipped.append(f"{kind}: eager PyTorch itself differs from float64 in NaN/Inf positions")
    else:
        sets.append(s)


def fingerprint(s: InputSet) -> tuple:
    """Cheap content hash of a cached set, to notice a candidate's stray writes into it."""
    out = []
    for t in [*s.tensors.values(), s.ref]:
        if t is None:
            out.append(None)
            continue
        int_dtype = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        out.append(int(t.view(int_dtype).sum(dtype=torch.int64)))
    return tuple(out)


# ---------------------------------------------------------------- guarded buffers


def guarded_empty(nbytes: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload bytes, whole buffer): the payload sits between canary zones."""
    whole = torch.empty(nbytes + 2 * GUARD_BYTES, dtype=torch.uint8, device=device)
    return whole[GUARD_BYTES:GUARD_BYTES + nbytes], whole


def guarded_like(spec: TensorSpec, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = ops.TORCH_DTYPES[spec.dtype]
    esize = torch.empty(0, dtype=dtype).element_size()
    span = 1 + sum((s - 1) * st for s, st in zip(spec.shape, spec.strides)) if spec.numel else 0
    payload, whole = guarded_empty(span * esize, device)
    t = payload.view(dtype).as_strided(spec.shape, spec.strides)
    return t, whole


def set_canaries(whole: torch.Tensor) -> None:
    whole[:GUARD_BYTES].fill_(CANARY)
    whole[-GUARD_BYTES:].fill_(CANARY)


def canaries_intact(whole: torch.Tensor) -> bool:
    return bool((whole[:GUARD_BYTES] == CANARY).all()) and bool((whole[-GUARD_BYTES:] == CANARY).all())


def fill_stale(out: torch.Tensor, gen: torch.Generator) -> None:
    """Finite garbage, the way a reused allocation looks (the package's torch.empty output holds
    old activations): a call prepared like this cannot be told from one outside the judge."""
    out.normal_(generator=gen)


def prefill(out: torch.Tensor, mode: str, gen: torch.Generator) -> None:
    """The output preparation shared by verified and timed calls: "sentinel" (NaN pattern: an
    element still holding it was never written) or "stale" (finite garbage, checked by value)."""
    if mode == "sentinel":
        fill_sentinel(out)
    else:
        fill_stale(out, gen)


def garble(payload: torch.Tensor, gen: torch.Generator) -> None:
    """New random bytes in a workspace (verified and timed calls alike): no state survives."""
    if payload.numel():
        payload.random_(0, 256, generator=gen)


def fresh_output(spec: TensorSpec) -> torch.Tensor:
    """A CPU output allocated for one call, as eager and the shipped package allocate it."""
    return torch.empty_strided(spec.shape, spec.strides, dtype=ops.TORCH_DTYPES[spec.dtype])


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # device-wide: work on any stream must be finished


def _ranges_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return sa.nbytes() > 0 and sb.nbytes() > 0 and a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


# ---------------------------------------------------------------- the verification run


def verify(module, candidate: Candidate, sets: list[InputSet], device: str) -> Verdict:
    """Run every set through the candidate; the first failure is the verdict. LaunchError escapes
    (the worker turns it into launch_error and decides whether the process is poisoned)."""
    checks: list[Check] = []
    for s in sets:
        try:
            if check_requires(candidate.spec, s.sig) is not None:
                continue  # the candidate declares it does not handle this (odd) size
            p = plan(candidate.spec, s.sig)
        except ForgeError as e:
            return Verdict(False, "static_check", f"{s.kind}: launch spec: {e.message}", checks=tuple(checks))
        verdict, check = _run_set(module, p, s, device)
        if check is not None:
            checks.append(check)
        if verdict is not None:
            return _with_errors(Verdict(verdict.ok, verdict.reason, verdict.detail), checks)
    if not checks:
        return Verdict(False, "inapplicable", "no input set was applicable (requires excludes them all)")
    return _with_errors(Verdict(True, "ok", f"{len(checks)} input sets verified"), checks)


def _with_errors(v: Verdict, checks: list[Check]) -> Verdict:
    finite = [c for c in checks if c.max_abs_err != float("inf")]
    return Verdict(v.ok, v.reason, v.detail, max((c.max_abs_err for c in finite), default=None),
                   max((c.max_rel_err for c in finite), default=None), tuple(checks))


def _run_set(module, p, s: InputSet, device: str) -> tuple[Verdict | None, Check | None]:
    out_spec = s.sig.output
    assert out_spec is not None
    out, out_whole = guarded_like(out_spec, device)
    workspaces, ws_wholes, zeroed = {}, [], []
    for name, nbytes, zero in p.workspaces:
        payload, whole = guarded_empty(nbytes, device)
        workspaces[name] = payload
        ws_wholes.append(whole)
        if zero:
            zeroed.append(payload)
    inputs = {n: t for n, t in s.tensors.items()}
    for n, t in inputs.items():
        for other in (out_whole, *ws_wholes):
            if t is not None and _ranges_overlap(t, other):
                return Verdict(False, "aliasing", f"{s.kind}: out or a workspace shares memory with input {n}"), None
    saved = {n: t.clone() for n, t in inputs.items() if t is not None}
    call = module.bind(p, {**inputs, "out": out, **workspaces})
    gen = torch.Generator(device=device).manual_seed(seed_for("garbage", s.kind))

    def prepare(mode: str) -> None:
        if mode == "sentinel" or device == "cuda":
            prefill(out, mode, gen)
        set_canaries(out_whole)
        for whole in ws_wholes:
            set_canaries(whole)
            # garbage, different each round: a kernel reading workspace it never wrote will differ
            garble(whole[GUARD_BYTES:-GUARD_BYTES], gen)
        for z in zeroed:
            z.zero_()

    def damage(run: str) -> Verdict | None:
        """Inputs written or canaries hit by the call just made (checked after each of the two
        calls: a kernel may behave only on one of them)."""
        for n, t in saved.items():
            cur = inputs[n]
            changed = rules.input_change(n, cur, t, s.kind, run)
            if changed is not None:
                cur.copy_(t)  # keep the cached set intact for the next candidate
                return Verdict(False, *changed)
        if not canaries_intact(out_whole) or not all(canaries_intact(w) for w in ws_wholes):
            return Verdict(False, "mismatch", f"{s.kind}: out-of-bounds write past the end of out or a workspace "
                                              f"(the {run} call)")
        return None

    prepare("sentinel")
    call()
    sync(device)
    bad = damage("first")
    if bad is not None:
        return bad, None
    spec = registry.spec_for(s.sig)
    cmp, reason, detail = rules.judge_output(out, s.ref, out_spec.dtype, spec, s.atol_floor, s.kind, s.magnitude)
    if reason == "mismatch":
        again = rules.rejudge(out, s.ref, out_spec.dtype, spec, s.kind, s.tensors, lambda: ops.eager(s.sig)(s.tensors))
        if again is not None and again[1] is None:  # passes under the kind's second key: the set keeps that key
            cmp, reason, detail, s.atol_floor, s.magnitude = again
    check = as_check(cmp)
    if reason is not None:
        return Verdict(False, reason, detail), check
    # The second run is prepared the way timed calls and the package's calls are: no sentinel in
    # out (CPU: a fresh allocation, as timing makes per call; CUDA: finite garbage), so the
    # sentinel's presence tells a kernel nothing about being verified.
    if s.streamed:
        s.ref = None  # judged: made again below only if the second run differs from the first
    first = out.clone() if device == "cuda" else out  # CPU: the second run writes a new output, out stays
    second = out
    if device != "cuda":
        second = fresh_output(out_spec)
        call.retarget("out", second)
    prepare("stale")
    call()
    sync(device)
    bad = damage("second")
    if bad is not None:
        return bad, check
    unwritten, where = count_sentinel(second)
    if unwritten:
        return Verdict(False, "unwritten_output", f"{s.kind}: {unwritten} of {second.numel()} output elements not "
                                                  f"written by the second run ({where})"), check
    changed = rules.repeat_change(second, first, s.kind)
    if changed is not None:
        ref = s.ref if s.ref is not None else memory_plan.reference64(s.sig, s.tensors)
        again = as_check(rules.compare(second, ref, out_spec.dtype, spec, atol_floor=s.atol_floor,
                                       input_kind=s.kind, magnitude=s.magnitude))
        if not again.passed:
            return Verdict(False, "mismatch", f"{s.kind}: the second run, into an output not pre-filled with the "
                                              f"sentinel, is wrong ({again.mismatches} of {second.numel()} elements, "
                                              f"{again.first_mismatch}): the kernel behaves differently when it "
                                              f"does not see the sentinel"), again
        return Verdict(False, *changed), check
    return None, check


def launch_error_verdict(err: LaunchError | Exception, where: str = "") -> Verdict:
    return Verdict(False, "launch_error", (where + ": " if where else "") + str(err)[:2000])
