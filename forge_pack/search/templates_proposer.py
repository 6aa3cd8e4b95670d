"""The template proposer: the search's default, offline source of kernels (no LLM, no API key).

Families of parameterised kernels live in templates/kernels/{cuda,cpu}/, their Python half in
forge_pack/search/families/<kind>.py (the registry). For the root of a search the proposer offers
one candidate per family that applies to the signature, at defaults chosen for its shape and for
the GPU the evaluator reports (`Gpu.from_report`; the H200 when it reports nothing); for a node
it offers moves that change ONE parameter by one notch, or switch to another family keeping the
parameters the two share. Moves are ordered deterministically (seeded by the parent) but
interleave parameters, so a few moves already cover several directions. Pure Python, no torch.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from forge_pack.targets import abi
from forge_pack.core.candidate import Candidate
from forge_pack.evaluate.launch import launch_env
from forge_pack.search.propose import Move, ProposeRequest
from forge_pack.core.signature import Signature
from forge_pack.search import families as registry
from forge_pack.search.template_kit import H200, Built, Family, Gpu, check_spec, dtype_defines, nearest, render


@dataclass(frozen=True)
class FamilyInfo:
    """What tests, the LLM prompt builder and the dashboard need to know about a family."""

    op: str
    backend: str
    name: str
    template: str  # file under templates/kernels/<backend>/
    params: dict  # tuned parameter -> its values in order
    param_docs: dict  # tuned parameter -> one line
    doc: str


def families(op: str, backend: str) -> list[FamilyInfo]:
    return [FamilyInfo(op, backend, f.name, f.template, {k.name: k.values for k in f.knobs},
                       {k.name: k.doc for k in f.knobs}, f.doc)
            for f in registry.families(op, backend)]


def applicable_families(sig: Signature, backend: str, gpu: Gpu = H200) -> list[Family]:
    """Families that serve this signature with at least one valid set of parameters."""
    if abi.supports(sig) is not None or dtype_defines(sig, backend) is None:
        return []
    return [f for f in registry.families(sig.op, backend) if f.applicable(sig, gpu) is None
            and _first_valid(f, sig, f.defaults(sig, gpu), gpu) is not None]


def _first_valid(fam: Family, sig: Signature, params: dict, gpu: Gpu) -> Built | None:
    """The defaults, or the nearest valid variant (one knob moved at a time) when they are invalid."""
    built = _build(fam, sig, params, gpu)
    if not isinstance(built, str):
        return built
    for knob in fam.knobs:
        i = knob.values.index(params[knob.name]) if params.get(knob.name) in knob.values else 0
        for j in sorted(range(len(knob.values)), key=lambda j: abs(j - i)):
            built = _build(fam, sig, {**params, knob.name: knob.values[j]}, gpu)
            if not isinstance(built, str):
                return built
    return None


def _build(fam: Family, sig: Signature, params: dict, gpu: Gpu = H200) -> Built | str:
    for k in fam.knobs:
        if params.get(k.name) not in k.values:
            return f"{k.name}={params.get(k.name)!r} is not one of {k.values}"
    built = fam.build(sig, params, gpu)
    if isinstance(built, str):
        return built
    why = check_spec(built.spec, launch_env(sig), fam.backend, gpu)
    return why if why else built


def _candidate(fam: Family, sig: Signature, built: Built) -> Candidate:
    defines = {**dtype_defines(sig, fam.backend), **built.defines}  # type: ignore[arg-type]
    title = f"{sig.op} / {fam.name} ({fam.backend}), templates/kernels/{fam.backend}/{fam.template}"
    source = render(fam.backend, fam.template, title, defines, built.code)
    return Candidate(op=sig.op, backend=fam.backend, source=source, spec=built.spec, family=fam.name,
                     params=dict(built.params), origin="template")


def instantiate(op: str, backend: str, family: str, params: dict | None, sig: Signature,
                gpu: Gpu = H200) -> Candidate:
    """The family's candidate for this signature and GPU; missing parameters take the family's
    defaults. ValueError when the family does not apply or the values are invalid for the signature."""
    if sig.op != op:
        raise ValueError(f"signature is for {sig.op!r}, not {op!r}")
    fam = registry.family(op, backend, family)
    why = abi.supports(sig) or fam.applicable(sig, gpu)
    if why:
        raise ValueError(f"{backend} family {family!r} does not apply to {sig.pretty()}: {why}")
    if dtype_defines(sig, backend) is None:
        raise ValueError(f"no {backend} element type for {sig.pretty()}")
    tuned = {k.name for k in fam.knobs}
    given = {k: v for k, v in (params or {}).items() if k in tuned}
    full = {**fam.defaults(sig, gpu), **given}
    built = _build(fam, sig, full, gpu) if given else _first_valid(fam, sig, full, gpu)
    if built is None or isinstance(built, str):
        raise ValueError(f"{family}{full} is invalid for {sig.pretty()}: {built or 'no valid parameters'}")
    return _candidate(fam, sig, built)


def _params_label(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


class TemplateProposer:
    name = "templates"

    def propose(self, request: ProposeRequest) -> list[Move]:
        sig = request.hotspot.signature
        backend = request.backend
        gpu = Gpu.from_report(request.gpu)  # grids and shared memory sized for the GPU the evaluator runs on
        fams = applicable_families(sig, backend, gpu)
        if not fams:
            return []
        seen = set(request.tried_hashes) | {s.candidate.content_hash for s in request.siblings}
        limit = max(0, request.max_moves)
        if request.parent is None:
            return self._roots(sig, fams, seen, limit, gpu)
        return self._children(request, sig, fams, seen, limit, gpu)

    # ------------------------------------------------------------ roots

    def _roots(self, sig: Signature, fams: list[Family], seen: set, limit: int, gpu: Gpu) -> list[Move]:
        moves: list[Move] = []
        for fam in sorted(fams, key=lambda f: (f.score(sig, gpu), f.name)):
            built = _first_valid(fam, sig, fam.defaults(sig, gpu), gpu)
            if built is None:
                continue
            cand = _candidate(fam, sig, built)
            if cand.content_hash in seen:
                continue
            seen.add(cand.content_hash)
            moves.append(Move(cand, f"{fam.name}({_params_label(dict(cand.params))})", kind="root"))
            if len(moves) >= limit:
                break
        return moves

    # ------------------------------------------------------------ children

    def _children(self, request: ProposeRequest, sig: Signature, fams: list[Family], seen: set,
                  limit: int, gpu: Gpu) -> list[Move]:
        parent = request.parent.candidate  # type: ignore[union-attr]
        fam = next((f for f in fams if f.name == parent.family), None)
        seed = int(hashlib.sha256(f"{parent.content_hash}|{len(request.siblings)}".encode()).hexdigest()[:12], 16)
        rng = random.Random(seed)
        groups: list[list[tuple[Candidate, str]]] = []
        if fam is not None:
            params = {k.name: parent.params.get(k.name) for k in fam.knobs}
            for knob in fam.knobs:
                groups.append(self._knob_moves(fam, sig, params, knob, rng, gpu))
        groups.append(self._family_moves(fams, fam, sig, dict(parent.params), rng, gpu))
        groups = [g for g in groups if g]
        rng.shuffle(groups)
        self._prioritise(groups, request)
        moves: list[Move] = []
        while groups and len(moves) < limit:  # round-robin over the knobs: diverse first moves
            for g in list(groups):
                while g:
                    cand, label = g.pop(0)
                    if cand.content_hash not in seen:
                        seen.add(cand.content_hash)
                        moves.append(Move(cand, label, kind="template"))
                        break
                if not g:
                    groups.remove(g)
                if len(moves) >= limit:
                    break
        return moves

    def _knob_moves(self, fam: Family, sig: Signature, params: dict, knob, rng: random.Random, gpu: Gpu):
        cur = params.get(knob.name)
        if cur not in knob.values:
            return []
        i = knob.values.index(cur)
        steps = [s for s in (1, -1) if 0 <= i + s < len(knob.values)]
        rng.shuffle(steps)
        out = []
        for s in steps:
            new = knob.values[i + s]
            built = _build(fam, sig, {**params, knob.name: new}, gpu)
            if not isinstance(built, str):
                out.append((_candidate(fam, sig, built), f"{knob.name} {cur}->{new}"))
        return out

    def _family_moves(self, fams: list[Family], current: Family | None, sig: Signature, params: dict,
                      rng: random.Random, gpu: Gpu):
        out = []
        others = [f for f in fams if current is None or f.name != current.name]
        rng.shuffle(others)
        for f in others:
            # keep the parameters the families share (nearest value in the new domain), else defaults
            kept = {**f.defaults(sig, gpu)}
            for k in f.knobs:
                if k.name in params and params[k.name] is not None:
                    kept[k.name] = nearest(k.values, params[k.name])
            built = _build(f, sig, kept, gpu)
            if isinstance(built, str):
                built = _first_valid(f, sig, f.defaults(sig, gpu), gpu)
            if built is not None:
                out.append((_candidate(f, sig, built), f"family {current.name if current else '?'}->{f.name}"))
        return out

    @staticmethod
    def _prioritise(groups: list, request: ProposeRequest) -> None:
        """Learn a little from the parent's verdict: an accuracy failure with a fast exp tries the
        accurate exp first; a resource failure tries fewer threads / items first."""
        ev = request.parent.evaluation if request.parent else None
        if ev is None or ev.verdict.ok:
            return
        reason = ev.verdict.reason
        wanted: list[str] = []
        if reason in ("mismatch", "nan"):
            wanted = ["fast_exp", "family"]
        elif reason in ("launch_error", "compile_error", "crash", "timeout"):
            wanted = ["family", "items", "threads"]

        def key(g):
            label = g[0][1]
            name = "family" if label.startswith("family") else label.split(" ")[0]
            return wanted.index(name) if name in wanted else len(wanted)

        groups.sort(key=key)
