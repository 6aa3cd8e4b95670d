"""The regions of a model as the hotspots of a search (``forge-pack search --regions``).

Capture the graph, find its regions, group instances by key (one search per signature: equal
keys are the same computation), and save, per region, the real inputs of up to
``CAPTURES_PER_REGION`` instances from one run of the graph (``graph.run(keep=...)``) with the
region's own output, in the capture format op hotspots use. A region the generated kernels do
not cover is kept with ``unsupported = "not covered: <why>"``, so the plan lists it as skipped
with its reason; so is a region whose output is no kernel's (``Region.unsupported``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from forge_pack.core.hotspot import Hotspot
from forge_pack.graph.attention_chain import find_attention_chains
from forge_pack.graph.attention_hotspots import attention_hotspots, keep_names as attention_keep
from forge_pack.graph.capture import capture
from forge_pack.graph.conv_chain import find_conv_chains
from forge_pack.graph.conv_hotspots import conv_hotspots, keep_names
from forge_pack.graph.regions import Region, find_regions
from forge_pack.profile.capture import save_capture
from forge_pack.profile.profiler import Profile
from forge_pack.targets.region_target import signature

CAPTURES_PER_REGION = 2  # real input sets per region signature, as for op hotspots
CAPTURE_BYTES_TOTAL = 4 << 30  # per run dir, as the op profiler's cap


def region_hotspot(group: list[Region], captures: tuple[str, ...] = ()) -> Hotspot:
    """The hotspot of a group of region instances with one key."""
    from forge_pack.search.families.region import coverage

    r = group[0]
    sig = signature(r)
    why = r.unsupported() or coverage(sig)
    total = sum(x.time_us for x in group)
    extra = {"region": {"name": r.name, "kind": r.kind, "pattern": r.pattern, "ops": list(r.ops),
                        "instances": len(group), "modules": sorted({x.module for x in group if x.module}),
                        "code": _code(r), "bytes_moved": r.bytes_moved()}}
    return Hotspot(sig, ("region",), float(len(group)), total, total / len(group),
                   sum(x.time_share for x in group), captures, r.device, unsupported=why, extra=extra)


def _code(r: Region) -> str:
    try:
        return r.reference("cpu").code.strip()
    except Exception as e:  # noqa: BLE001 - informative only (the dashboard and the LLM prompt)
        return f"# the subgraph could not be rebuilt: {e}"


def profile_regions(target, run_dir: str | Path, quiet: bool = False) -> Profile:
    """``Toolkit.profile`` for a region search: the graph's regions as hotspots, largest first."""
    say = (lambda m: None) if quiet else (lambda m: print(f"[regions] {m}", file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    graph = capture(target.module, target.args, target.kwargs)
    regions = find_regions(graph)
    chains = find_conv_chains(graph)
    attention = find_attention_chains(graph)
    say(f"captured on the {graph.route} route: {len(regions)} region instances, {len(attention)} attention chains "
        f"({graph.time_source} times)")
    groups: dict[str, list[Region]] = {}
    for r in regions:
        groups.setdefault(r.key, []).append(r)
    ordered = sorted(groups.values(), key=lambda g: -sum(x.time_us for x in g))
    keep = {name for g in ordered for r in g[:CAPTURES_PER_REGION] for name in (*r.inputs, r.nodes[-1])}
    keep |= keep_names(chains) | attention_keep(attention)
    values = graph.run(keep=keep) if graph.values is not None else {}
    hotspots, written = [], 0
    for g in ordered:
        captures = []
        for i, r in enumerate(g[:CAPTURES_PER_REGION]):
            if not values or r.unsupported() or any(n not in values for n in (*r.inputs, r.nodes[-1])):
                continue
            tensors = {f"in{k}": values[n] for k, n in enumerate(r.inputs)}
            out = values[r.nodes[-1]]
            if not isinstance(out, torch.Tensor):
                continue
            size = sum(t.numel() * t.element_size() for t in (*tensors.values(), out) if isinstance(t, torch.Tensor))
            if written + size > CAPTURE_BYTES_TOTAL:
                break
            rel = f"inputs/{r.name}_{i}.safetensors"
            written += save_capture(Path(run_dir) / rel, signature(r), tensors, out)
            captures.append(rel)
        hotspots.append(region_hotspot(g, tuple(captures)))
    covered = sum(h.time_share for h in hotspots)  # a conv epilogue's ops are a batch_norm region's: not again
    # largest first; a conv epilogue ties with the batch_norm region it holds, which stays first
    # an attention chain holds a softmax region, and is searched as the attention target (attention_hotspots)
    att = attention_hotspots(attention, values, run_dir, say, CAPTURE_BYTES_TOTAL - written)
    written += sum((Path(run_dir) / rel).stat().st_size for h in att for rel in h.captures)
    hotspots = hotspots + att
    hotspots = sorted(hotspots + conv_hotspots(chains, values, run_dir, say, CAPTURE_BYTES_TOTAL - written), key=lambda h: -h.time_share)
    say(f"{len(hotspots)} region signatures, {covered * 100:.1f}% of the attributed time; "
        f"{sum(1 for h in hotspots if h.unsupported)} not covered")
    notes = [f"regions on the {graph.route} route; times: {graph.time_source}"]
    forward_us = graph.total_us
    return Profile(str(target.path), graph.device, target.dtype, 1, forward_us, forward_us, hotspots,
                   max(0.0, 1.0 - covered), [], str(run_dir), written, sum(len(h.captures) for h in hotspots),
                   notes + [f"profiled in {time.perf_counter() - t0:.1f}s"])
