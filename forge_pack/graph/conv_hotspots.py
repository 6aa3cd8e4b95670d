"""Conv epilogue regions as hotspots of a region search (``forge-pack search --regions``).

Per group of chains with one epilogue signature (``conv_chain.epilogue_region``: the bias, residual
and activation after the folded convolution; chains of other convolutions may share it), one hotspot:
the epilogue is a pointwise region the search generates, verifies and times a kernel for like any
other. Its captured inputs are real: the folded convolution's output on the model's own activations,
the folded bias, the residual. ``hotspot.extra["conv"]`` carries what the package needs to stand for
the whole chain:

- per chain signature: its form (what compile mode finds), its roles, its convolution arguments,
  and per instance (each layer has its own weights) the digest of the parameters folded and the file
  of folded tensors (``inputs/<chain>_fold<i>.safetensors``);
- the checks of the whole-chain candidates (``evaluate/conv_check``): folded conv + eager epilogue
  (the folding) and, on CUDA for ReLU chains, cuDNN's fused call (a library candidate);
- their timings on the build device (``timing.time_calls``) and the chain's eager time: the packer
  picks per chain the faster verified one of the library call and folded conv + the epilogue kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from forge_pack.core.hotspot import Hotspot
from forge_pack.graph import conv_fold
from forge_pack.graph.conv_chain import ConvChain, epilogue_perm, epilogue_region
from forge_pack.profile.capture import save_capture
from forge_pack.targets.region_target import signature

CAPTURES_PER_REGION = 2  # real input sets per epilogue signature, as for other regions


def keep_names(chains: list[ConvChain]) -> set[str]:
    """Graph values the hotspots need: every chain's inputs (the parameters of every instance)."""
    return {n for c in chains for n in c.region.inputs}


def conv_hotspots(chains: list[ConvChain], values: dict, run_dir: str | Path,
                  say: Callable[[str], None] = lambda m: None, capture_bytes: int = 4 << 30,
                  captures_per_region: int = CAPTURES_PER_REGION) -> list[Hotspot]:
    """One hotspot per epilogue signature of these chains (values: the graph's values by node name);
    ``capture_bytes``: what the epilogues' captured inputs may take in the run dir (the folded tensors,
    which the package needs, are always written)."""
    from forge_pack.evaluate import conv_check
    from forge_pack.search.families.region import coverage

    by_epi: dict[str, list[ConvChain]] = {}
    epis = {}
    for c in chains:
        e = epilogue_region(c)
        by_epi.setdefault(e.key, []).append(c)
        epis[e.key] = e
    out = []
    for key, group in by_epi.items():
        epi = epis[key]
        sig = signature(epi)
        by_chain: dict[str, list[ConvChain]] = {}
        for c in group:
            by_chain.setdefault(c.region.key, []).append(c)
        entries, captures = [], []
        for ckey, instances in by_chain.items():
            first = instances[0]
            entry = {"name": first.name, "perm": epilogue_perm(first), "pattern": first.region.pattern, "form": first.region.form,
                     "key": ckey, "output": first.region.output_spec.to_json(), "roles": list(first.roles),
                     **first.conv_args(), "eps": first.eps, "activation": first.activation,
                     "residual": first.residual, "instances": [], "modules": []}
            for i, c in enumerate(instances):
                if any(n not in values for n in c.region.inputs):
                    continue
                ins = [values[n] for n in c.region.inputs]
                w, b, digest = conv_check.folded_params(c, ins)
                rel = f"inputs/{c.name}_fold{i}.safetensors"
                fmt = conv_fold.save(Path(run_dir) / rel, w, b)
                entry["instances"].append({"digest": digest, "folded": rel, "format": fmt, "module": c.region.module})
                if i == 0:
                    entry.update(_candidates(c, ins, w, b, say))
                if len(captures) < captures_per_region and not epi.unsupported():
                    tensors, res = _epilogue_capture(c, epi, ins, w, b)
                    size = sum(t.numel() * t.element_size() for t in (*tensors.values(), res))
                    if size <= capture_bytes:
                        rel_in = f"inputs/{epi.name}_{len(captures)}.safetensors"
                        capture_bytes -= save_capture(Path(run_dir) / rel_in, sig, tensors, res)
                        captures.append(rel_in)
            if entry["instances"]:
                entries.append(entry)
        epi_instances = [epilogue_region(c) for c in group]
        total = sum(e.time_us for e in epi_instances)
        why = epi.unsupported() or coverage(sig) or ("" if entries else "the chains' parameters were not captured")
        extra = {"region": {"name": epi.name, "kind": epi.kind, "pattern": epi.pattern, "ops": list(epi.ops),
                            "instances": len(group), "modules": sorted({c.region.module for c in group if c.region.module}),
                            "code": epi.reference("cpu").code.strip(), "bytes_moved": epi.bytes_moved()},
                 "conv": {"epilogue_inputs": list(epi.inputs), "chains": entries,
                          "chain_time_us": sum(c.region.time_us for c in group),
                          "chain_time_share": sum(c.region.time_share for c in group)}}
        out.append(Hotspot(sig, ("region",), float(len(group)), total, total / len(group),
                           sum(e.time_share for e in epi_instances), tuple(captures), epi.device,
                           unsupported=why, extra=extra))
        say(f"conv epilogue {epi.name}: {len(group)} chains, {len(entries)} signatures")
    return out


def _epilogue_capture(c: ConvChain, epi, ins: list, w, b) -> tuple[dict, torch.Tensor]:
    with torch.no_grad():
        y = conv_fold.conv(ins[c.index("x")], w, None, c.conv_args())
        args = conv_fold.epilogue_args(epi.inputs, epilogue_perm(c), y, b,
                                       ins[c.index("residual")] if c.residual else None)
        tensors = {f"in{k}": t for k, t in enumerate(args)}
        res = epi.reference(str(y.device.type))(*tensors.values())
    return tensors, res


def _candidates(c: ConvChain, ins: list, w, b, say) -> dict:
    """Checks and timings of the whole-chain candidates on the first instance of a chain signature."""
    from forge_pack.evaluate import conv_check

    device = c.region.device
    sets = conv_check.input_sets(c, ins)
    folded = conv_check.check(c, conv_check.folded_candidate(c, w, b), sets)
    found = {"checks": {"folded": folded}, "timing": {}}
    if not folded["ok"]:
        say(f"{c.name}: folding fails the chain check: {folded['reason']}")
    if device != "cuda":
        return found
    timing = found["timing"]
    timing["eager"] = conv_check.time_us(c.region.reference(), ins, device)
    timing["folded_conv"] = conv_check.time_us(lambda *a: conv_fold.conv(a[c.index("x")], w, None, c.conv_args()),
                                               ins, device)
    lib = conv_check.library_candidate(c, w, b)
    if lib is not None:
        label, call = lib
        try:
            verdict = conv_check.check(c, call, sets)
        except RuntimeError as e:  # cuDNN declines this configuration: no library candidate
            verdict = {"ok": False, "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", "checks": []}
        found["checks"]["library"] = {**verdict, "label": label}
        if verdict["ok"]:
            timing["library"] = conv_check.time_us(call, ins, device)
    return found
