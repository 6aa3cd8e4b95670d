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
and reads no mask.
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


def keep_names(chains: list[AttentionChain]) -> set[str]:
    """Graph values a run must keep to capture the first instances of each form, and every instance's mask
    (whether the kernel may compute it is decided over all of them; layers usually share one mask)."""
    seen: dict[str, int] = {}
    names: set[str] = set()
    for c in chains:
        i = seen.get(c.region.key, 0)
        if i < CAPTURES_PER_CHAIN:
            names |= {*c.region.inputs, c.region.nodes[-1]}
        if "mask" in c.roles:
            names.add(c.region.inputs[c.roles.index("mask")])
        seen[c.region.key] = i + 1
    return names


def attention_hotspots(chains: list[AttentionChain], values: dict, run_dir: str | Path,
                       say: Callable[[str], None] = lambda m: None, capture_bytes: int = 4 << 30) -> list[Hotspot]:
    """One hotspot per chain form (values: the graph's values by node name)."""
    from forge_pack.targets import registry

    groups: dict[str, list[AttentionChain]] = {}
    for c in chains:
        groups.setdefault(c.region.key, []).append(c)
    out = []
    for group in groups.values():
        why = None
        window = _causal_window(group, values)
        if window is not None:
            causal = [dataclasses.replace(c, causal_mask=True, window=window) for c in group]
            if check(causal[0]) is None:  # else the kernel reads the mask, as it would for any other
                group, why = causal, ""  # checked: the float64 check is a whole attention, not run twice
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
            rel = f"inputs/{c.name}_{len(captures)}.safetensors"
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
        masked = f" with the causal mask{f' (window {first.window})' if first.window else ''}" if first.causal_mask else ""
        say(f"attention {r.name}: {len(group)} instances{masked}"
            f"{f' (skipped: {why})' if why else ''}")
    return out


def _causal_window(group: list[AttentionChain], values: dict) -> int | None:
    """The sliding window (0: none) of the causal mask the kernel computes for the chains, or None where it
    reads the mask: every instance's mask, as the graph run gave it, must be the causal one with the same
    window. Only a choice of kernel: compile mode swaps a chain in only where it proves its mask a constant of
    that pattern in the compiled graph, and leaves the others to Inductor."""
    if "mask" not in group[0].roles:
        return None
    windows = set()
    for c in group:
        mask = values.get(c.region.inputs[c.roles.index("mask")])
        windows.add(causal_window(mask) if isinstance(mask, torch.Tensor) else None)
        if None in windows or len(windows) > 1:
            return None
    return windows.pop()
