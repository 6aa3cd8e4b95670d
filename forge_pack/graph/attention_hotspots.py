"""Eager attention chains (``attention_chain``) as hotspots of a region search.

One hotspot per chain form (equal forms are the same computation, and their attention signatures
are equal too). Its signature is the attention target's (``AttentionChain.signature``): the search,
the verification and the package treat it as any attention kernel, with ``composite=True`` semantics
and the chain's output layout. A chain whose subgraph is not that computation (``attention_chain.check``,
run once per form) or that the attention kernels do not support is kept with its reason, so the plan
lists it as skipped. ``hotspot.extra["attention"]`` carries what compile mode needs to stand the
kernel in for the chain: the form, its key and the form inputs' order in the op's arguments
(``pack/packager`` writes it into the manifest's ``regions``).

The captured inputs are the chain's real q, k, v and mask, with the chain's own output. A chain whose
mask is the causal one in every instance the run captured, with one sliding window or none, is searched as
causal attention without a mask (``AttentionChain.causal_mask``, ``window``): the kernel skips the masked tiles
and reads no mask. Where the layers of one form have different masks (Gemma 3's sliding and full layers,
of equal shapes), the form gives one hotspot per mask pattern: the sliding layers' (windowed), the full
layers' (causal), and one reading the mask for any other. Compile mode tries a form's causal regions
first, each only where it proves the mask its own, and the mask-reading one takes what is left.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch

from forge_pack.core.hotspot import Hotspot
from forge_pack.graph.attention_chain import AttentionChain, check
from forge_pack.graph.region_match import causal_window
from forge_pack.profile.capture import save_capture

CAPTURES_PER_CHAIN = 2  # real input sets per chain form, as for op and region hotspots


def _mask_name(c: AttentionChain) -> str | None:
    return c.region.inputs[c.roles.index("mask")] if "mask" in c.roles else None


def keep_names(chains: list[AttentionChain]) -> set[str]:
    """Graph values a run must keep to capture the first instances of each form and mask (layers of one
    mask share its pattern, and each pattern may become a hotspot of its own), and every instance's mask
    (whether the kernel may compute it is decided over all of them)."""
    seen: dict[tuple, int] = {}
    names: set[str] = set()
    for c in chains:
        key = (c.region.key, _mask_name(c))
        i = seen.get(key, 0)
        if i < CAPTURES_PER_CHAIN:
            names |= {*c.region.inputs, c.region.nodes[-1]}
        if "mask" in c.roles:
            names.add(_mask_name(c))
        seen[key] = i + 1
    return names


def attention_hotspots(chains: list[AttentionChain], values: dict, run_dir: str | Path,
                       say: Callable[[str], None] = lambda m: None, capture_bytes: int = 4 << 30) -> list[Hotspot]:
    """One hotspot per chain form (values: the graph's values by node name)."""
    from forge_pack.targets import registry

    forms: dict[str, list[AttentionChain]] = {}
    for c in chains:
        forms.setdefault(c.region.key, []).append(c)
    out = []
    for group, why in (part for form in forms.values() for part in _by_mask(form, values)):
        first = group[0]
        sig = first.signature()
        if why is None:
            why = check(first)
        if not why:
            why = registry.spec_for(sig).supports(sig) or ""
            if why:
                why = f"not covered: {why}"
        captures = []
        for c in group[:CAPTURES_PER_CHAIN]:
            if why or any(n not in values for n in (*c.region.inputs, c.region.nodes[-1])):
                continue
            kept = c.kernel_roles()
            tensors = {role: values[name] for role, name in zip(c.roles, c.region.inputs) if role in kept}
            res = values[c.region.nodes[-1]]
            if not isinstance(res, torch.Tensor):
                continue
            size = sum(t.numel() * t.element_size() for t in (*tensors.values(), res))
            if size > capture_bytes:
                break
            rel = f"inputs/{c.name}{_pattern_suffix(first)}_{len(captures)}.safetensors"
            capture_bytes -= save_capture(Path(run_dir) / rel, sig, tensors, res)
            captures.append(rel)
        total = sum(c.region.time_us for c in group)
        r = first.region
        extra = {"region": {"name": r.name, "kind": r.kind, "pattern": r.pattern, "ops": list(r.ops),
                            "instances": len(group), "modules": sorted({c.region.module for c in group if c.region.module}),
                            "code": r.reference("cpu").code.strip(), "bytes_moved": r.bytes_moved()},
                 "attention": {"name": r.name, "form": r.form, "key": r.key, "abi_order": first.abi_order(),
                               "causal_mask": first.mask_index(), "window": first.window,
                               "output": r.output_spec.to_json() if r.output_spec else None}}
        out.append(Hotspot(sig, ("region",), float(len(group)), total, total / len(group),
                           sum(c.region.time_share for c in group), tuple(captures), r.device,
                           unsupported=why, extra=extra))
        window = f" (window {first.window})" if first.window else ""
        masked = f" with the causal mask{window}" if first.causal_mask else ""
        say(f"attention {r.name}: {len(group)} instances{masked}"
            f"{f' (skipped: {why})' if why else ''}")
    return out


def _pattern_suffix(c: AttentionChain) -> str:
    """Tells the capture files of one form's mask patterns apart."""
    return ("_causal" + (f"_w{c.window}" if c.window else "")) if c.causal_mask else ""


def _by_mask(form: list[AttentionChain], values: dict) -> list[tuple[list[AttentionChain], str | None]]:
    """A form's instances split by the pattern of their mask, as (chains, why) with why "" where the float64
    check already passed (None: still to run): one part per causal pattern (``region_match.causal_window``: the
    causal mask, or a sliding window of W), the chains read as causal attention with that window, and last one
    part reading the mask, for the instances whose mask is no causal pattern (or whose causal reading fails
    the check). Which kernel a part gets is only a choice: compile mode swaps a causal part's kernel in only
    where it proves the mask a constant of that pattern in the compiled graph; the mask-reading kernel is right
    for any mask."""
    if "mask" not in form[0].roles:
        return [(form, None)]
    patterns: dict[int | None, list[AttentionChain]] = {}
    for c in form:
        mask = values.get(_mask_name(c))
        patterns.setdefault(causal_window(mask) if isinstance(mask, torch.Tensor) else None, []).append(c)
    parts: list[tuple[list[AttentionChain], str | None]] = []
    reading = patterns.pop(None, [])
    for window, chains in patterns.items():
        causal = [dataclasses.replace(c, causal_mask=True, window=window) for c in chains]
        if check(causal[0]) is None:  # checked: the float64 check is a whole attention, not run twice
            parts.append((causal, ""))
        else:  # the kernel reads the mask, as it would for any other
            reading += chains
    if reading:
        parts.append((sorted(reading, key=form.index), None))
    return parts
