"""The region table: regions grouped by signature with their share, ops and shapes, and the time
no region covers, with the reason. Used by ``forge-pack profile --regions``."""

from __future__ import annotations

from dataclasses import dataclass

from forge_pack.graph.capture import Graph
from forge_pack.graph.attention_chain import find_attention_chains
from forge_pack.graph.conv_chain import epilogue_region, find_conv_chains
from forge_pack.graph.regions import Region, find_regions, uncovered


@dataclass
class RegionGroup:
    """The instances of one region signature in a forward: one search target."""

    regions: list[Region]

    @property
    def first(self) -> Region:
        return self.regions[0]

    @property
    def time_us(self) -> float:
        return sum(r.time_us for r in self.regions)

    @property
    def time_share(self) -> float:
        return sum(r.time_share for r in self.regions)

    def to_json(self) -> dict:
        r = self.first
        return {"name": r.name, "pattern": r.pattern, "kind": r.kind, "calls": len(self.regions),
                "time_us": self.time_us, "time_share": self.time_share, "ops": list(r.short_ops),
                "modules": sorted({x.module for x in self.regions if x.module}),
                "kernel": self.kernel_coverage(), "region": r.to_json()}

    def kernel_coverage(self) -> str:
        """"" when the generated kernels compute this region (``search --regions`` searches it), else why not."""
        from forge_pack.search.families.region import coverage
        from forge_pack.targets.region_target import signature

        r = self.first
        return r.unsupported() or coverage(signature(r))


def group_regions(regions: list[Region]) -> list[RegionGroup]:
    """Instances with the same signature key together, largest share first."""
    by_key: dict[str, list[Region]] = {}
    for r in regions:
        by_key.setdefault(r.key, []).append(r)
    return sorted((RegionGroup(v) for v in by_key.values()), key=lambda g: -g.time_us)


def regions_json(graph: Graph, regions: list[Region] | None = None) -> dict:
    regions = find_regions(graph) if regions is None else regions
    groups = group_regions(regions)
    covered = sum(g.time_share for g in groups)
    attention = find_attention_chains(graph)
    chains = [c.region for c in find_conv_chains(graph)] + [c.region for c in attention]  # their matmuls too
    return {"route": graph.route, "attempts": [list(a) for a in graph.attempts], "device": graph.device,
            "time_source": graph.time_source, "profiled_fraction": graph.profiled_fraction,
            "forward_us": graph.forward_us, "attributed_us": graph.total_us, "region_share": covered,
            "output_check": graph.output_check,
            "regions": [g.to_json() for g in groups], "uncovered": uncovered(graph, regions + chains),
            "conv_regions": conv_groups(graph), "attention_regions": attention_groups(attention), "notes": graph.notes}


def _chain_groups(chains: list) -> list[dict]:
    """Chains (conv or attention: each with a ``region``) grouped by form, largest first: the common row of
    each group, with the first chain under "first"."""
    by_key: dict[str, list] = {}
    for c in chains:
        by_key.setdefault(c.region.key, []).append(c)
    out = []
    for group in sorted(by_key.values(), key=lambda cs: -sum(c.region.time_us for c in cs)):
        c = group[0]
        out.append({"name": c.name, "pattern": c.region.pattern, "calls": len(group),
                    "time_us": sum(x.region.time_us for x in group),
                    "time_share": sum(x.region.time_share for x in group),
                    "modules": sorted({x.region.module for x in group if x.region.module}),
                    "chain": c.to_json(), "first": c})
    return out


def attention_groups(chains: list) -> list[dict]:
    """The eager attention chains (graph/attention_chain), grouped by form, largest first: what
    `search --regions` searches as attention kernels and compile mode swaps for one op."""
    return [{**{k: v for k, v in g.items() if k != "first"}, "signature": g["first"].signature().pretty()}
            for g in _chain_groups(chains)]


def conv_groups(graph: Graph) -> list[dict]:
    """The convolution epilogue regions (graph/conv_chain), grouped by signature, largest first: what
    `search --regions` folds and fuses (the epilogue) and compile mode swaps for one op."""
    return [{**{k: v for k, v in g.items() if k != "first"}, "epilogue": epilogue_region(g["first"]).name}
            for g in _chain_groups(find_conv_chains(graph))]


def _us(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def format_regions(graph: Graph, regions: list[Region] | None = None, top: int = 20) -> str:
    doc = regions_json(graph, regions)
    time_note = {"profile": "profiled (eager, per node)",
                 "profile+estimate": f"profiled, {100 * (1 - graph.profiled_fraction):.0f}% of nodes estimated "
                                     "from bytes moved",
                 "estimate": "estimated from bytes moved (no profile)"}[graph.time_source]
    lines = [f"Regions ({graph.route} graph, {len(graph.nodes)} nodes, time {time_note}): "
             f"{len(doc['regions'])} signatures, {doc['region_share'] * 100:.1f}% of the attributed "
             f"{_us(graph.total_us)} per forward"]
    lines.append(f"{'#':>2}  {'share':>6}  {'per fwd':>9}  {'calls':>5}  {'kind':<9}  pattern: ops  [input shapes]")
    for i, g in enumerate(doc["regions"][:top], 1):
        r = g["region"]
        shapes = ", ".join(_spec_text(s) for s in r["input_specs"][:4]) + (" ..." if len(r["input_specs"]) > 4 else "")
        lines.append(f"{i:>2}  {g['time_share'] * 100:5.1f}%  {_us(g['time_us']):>9}  {g['calls']:>5}  "
                     f"{g['kind']:<9}  {g['pattern']}: {' '.join(g['ops'])}  [{shapes}]")
        if g["kernel"]:
            lines.append(f"{'':>37}no generated kernel: {g['kernel']}")
    if len(doc["regions"]) > top:
        rest = sum(g["time_share"] for g in doc["regions"][top:])
        lines.append(f"    ... {len(doc['regions']) - top} more signatures, {rest * 100:.1f}% together")
    if doc["conv_regions"]:
        lines.append(f"Convolution epilogue regions (batch_norm folded into the convolution): "
                     f"{len(doc['conv_regions'])} signatures")
        for i, g in enumerate(doc["conv_regions"][:top], 1):
            c = g["chain"]
            lines.append(f"{i:>2}  {g['time_share'] * 100:5.1f}%  {_us(g['time_us']):>9}  {g['calls']:>5}  "
                         f"{'conv':<9}  {g['pattern']}: stride {c['stride']} padding {c['padding']} groups "
                         f"{c['groups']}  [{_spec_text(c['region']['input_specs'][0])} -> "
                         f"{_spec_text(c['region']['output_spec'])}]")
    if doc["attention_regions"]:
        lines.append(f"Attention regions (eager attention as one flash-attention kernel): "
                     f"{len(doc['attention_regions'])} signatures")
        for i, g in enumerate(doc["attention_regions"][:top], 1):
            lines.append(f"{i:>2}  {g['time_share'] * 100:5.1f}%  {_us(g['time_us']):>9}  {g['calls']:>5}  "
                         f"{'attention':<9}  {g['pattern']}: {g['signature']}")
    if doc["uncovered"]:
        lines.append("Not covered by any region:")
        for u in doc["uncovered"]:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(u["ops"].items(), key=lambda kv: -kv[1])[:6])
            lines.append(f"  {u['time_share'] * 100:5.1f}%  {u['reason']}  ({ops})")
    if graph.output_check != "equal":
        lines.append(f"Captured graph vs eager outputs: {graph.output_check}")
    failed = [f"{r}: {why}" for r, why in graph.attempts if why != "ok"]
    if failed:
        lines.append("Capture routes that failed first: " + "; ".join(failed))
    return "\n".join(lines)


def _spec_text(s: dict) -> str:
    from forge_pack.core.signature import TensorSpec

    if s.get("dtype") == "?":
        return "?"
    return TensorSpec.from_json(s).pretty()
