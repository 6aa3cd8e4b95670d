"""The whole-model gate of ``build`` and ``pack``: a package is written only if the model, patched
with every kernel the package ships, passes the whole-model check (``confirm.check_model``).

When the check fails, the gate finds out which kernels are responsible: it checks the model with
each kernel alone (only that target patched, the same compiled package, no timing), drops every
kernel that fails alone with the reason, stages the package again without them and checks it
again, until it passes or no kernel is left (then no package is written; the reasons say why).

A failure that no single kernel explains (each passes alone, together they fail) cannot be fixed by
dropping one with cause: it is an error naming them all, and no package is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from forge_pack.core.errors import ForgeError


@dataclass
class GateResult:
    winners: list  # the kernels that passed (the package ships exactly these)
    doc: dict | None  # the manifest staged for them (None when none is left)
    model_result: dict | None  # the passing whole-model check (None when none is left)
    dropped: list[dict] = field(default_factory=list)  # the kernels the check dropped, with the reason


def passes(result: dict) -> bool:
    return bool(result.get("within_tolerance"))


def failure_words(result: dict) -> str:
    """What went wrong, in a clause: 'its outputs differ from the original's by up to 0.52 (argmax
    agreement 0.10%), more than the tolerance allows'."""
    if result.get("output_kind") == "structure" and result.get("max_abs_diff") is None:
        return "the patched model's outputs have another structure or shape than the original's"
    return (f"the patched model's outputs differ from the original's{difference_words(result)}, more than the "
            "tolerance allows")


def difference_words(result: dict) -> str:
    """' by up to 0.52 (argmax agreement 0.10%)': what of the two a comparison measured."""
    d = result.get("max_abs_diff")
    a = result.get("argmax_agreement")
    by = f" by up to {d:.3g}" if d is not None else ""
    agree = f" (argmax agreement {100 * a:.2f}%)" if a is not None else ""
    return by + agree


def _label(tid: str, winner) -> str:
    return f"{tid} ({winner.hotspot.signature.pretty()})"


def run_gate(winners: list, stage: Callable[[list], dict], check: Callable[[list[str] | None], dict],
             say: Callable[[str], None] = lambda s: None) -> GateResult:
    """stage(winners) -> the staged manifest; check(None) checks the model with every staged kernel,
    check([tid]) with that one alone. Each round drops at least one kernel, so it ends."""
    dropped: list[dict] = []
    while winners:
        doc = stage(winners)
        result = check(None)
        if passes(result):
            return GateResult(winners, doc, result, dropped)
        tids = {t["hotspot_id"]: t["id"] for t in doc["targets"]}
        say(f"  the whole-model check failed: {failure_words(result)}")
        if len(winners) == 1:
            alone = {winners[0].hotspot.id: result}  # one kernel: the failure is its own
        else:
            say(f"  checking the model with each of the {len(winners)} kernels alone")
            alone = {w.hotspot.id: check([tids[w.hotspot.id]]) for w in winners}
        culprits = [w for w in winners if not passes(alone[w.hotspot.id])]
        if not culprits:
            names = ", ".join(_label(tids[w.hotspot.id], w) for w in winners)
            raise ForgeError(f"the whole-model check failed ({failure_words(result)}) with the kernels {names} "
                             "patched together, yet the model passes with each of them alone, so none can be "
                             "dropped with cause; no package was written",
                             "the kernels' errors add up through the model: package fewer of them (search with "
                             "--top 1), or report the run directory to forge-pack's maintainers")
        for w in culprits:
            why = failure_words(alone[w.hotspot.id])
            reason = f"dropped by the whole-model check: with only this kernel patched, {why}"
            dropped.append({"hotspot_id": w.hotspot.id, "op": w.hotspot.op, "pretty": w.hotspot.signature.pretty(),
                            "reason": reason})
            say(f"  dropped {_label(tids[w.hotspot.id], w)}: {reason}")
        winners = [w for w in winners if w not in culprits]
    return GateResult([], None, None, dropped)
