"""The manifest's conv epilogue regions and their folded tensors (docs/package.md, "Conv epilogue regions").

A packed epilogue kernel (a region target whose hotspot carries ``extra["conv"]``, written by
``graph/conv_hotspots``) makes one compile-mode region per chain signature it serves: id ``c<N>``, the
chain's form (what compile mode finds in Inductor's graph), op ``<namespace>_conv::c<N>`` (defined by the
package's ``_conv_regions.py``), and a ``conv`` record: the inputs' roles, the convolution's arguments,
the epilogue kernel to call, the chosen candidate, and per instance the digest of the parameters folded
and the folded tensors' file, copied to ``<pkg>/conv/c<N>_<i>.safetensors``.

The candidate per chain signature: cuDNN's fused call (``library:...``) where it passed the chain check
and its measured time beats the folded convolution's plus the epilogue kernel's (both measured on the
build device with the evaluator's protocol); else the folded convolution and the kernel. A chain whose
folding failed its check gets no region.
"""

from __future__ import annotations

import hashlib

import shutil
from pathlib import Path

CONV_DIR = "conv"


def conv_regions(winners: list, targets: list[dict], run_dir: Path, pkg: Path, namespace: str) -> list[dict]:
    """Manifest region entries for the packed epilogue kernels' chains (folded files copied into `pkg`)."""
    by_hotspot = {t["hotspot_id"]: t for t in targets}
    out: list[dict] = []
    for w in winners:
        conv = (w.hotspot.extra or {}).get("conv")
        target = by_hotspot.get(w.hotspot.id)
        if not conv or target is None:
            continue
        kernel_us = target["timing"]["kernel"]["median_us"]
        for chain in conv["chains"]:
            checks = chain.get("checks", {})
            if not checks.get("folded", {}).get("ok"):
                continue
            cid = f"c{len(out)}"
            candidate, why = choose(chain, kernel_us)
            instances = []
            for i, inst in enumerate(chain["instances"]):
                rel = f"{CONV_DIR}/{cid}_{i}.safetensors"
                (pkg / CONV_DIR).mkdir(exist_ok=True)
                shutil.copy2(Path(run_dir) / inst["folded"], pkg / rel)
                instances.append({"digest": inst["digest"], "file": rel, "format": inst.get("format", "safetensors"),
                                  "sha256": hashlib.sha256((pkg / rel).read_bytes()).hexdigest(),
                                  "module": inst.get("module", "")})
            out.append({
                "id": cid, "name": chain["name"], "form": chain["form"], "op": f"{namespace}_conv::{cid}",
                "output": chain["output"],
                "conv": {"roles": chain["roles"], "stride": chain["stride"], "padding": chain["padding"],
                         "dilation": chain["dilation"], "groups": chain["groups"], "eps": chain["eps"],
                         "activation": chain["activation"], "residual": chain["residual"],
                         "pattern": chain["pattern"], "candidate": candidate, "choice": why,
                         "epilogue": {"target": target["id"], "op": target["torch_op"],
                                      "inputs": conv["epilogue_inputs"], "perm": chain["perm"]},
                         "instances": instances, "timing": {**chain.get("timing", {}), "epilogue_kernel_us": kernel_us},
                         "checks": {k: {"ok": v.get("ok"), "reason": v.get("reason", ""), "label": v.get("label")}
                                    for k, v in checks.items()}}})
    return out


def choose(chain: dict, kernel_us: float) -> tuple[str, str]:
    """(candidate, why): the library call when it verified and its measured time beats folded conv + kernel."""
    lib = chain.get("checks", {}).get("library")
    timing = chain.get("timing", {})
    if not lib:
        return "folded", "folded convolution + the epilogue kernel (no library candidate for this chain here)"
    if not lib.get("ok"):
        return "folded", f"folded convolution + the epilogue kernel (the library call failed its check: {lib.get('reason')})"
    lib_us = (timing.get("library") or {}).get("median_us")
    conv_us = (timing.get("folded_conv") or {}).get("median_us")
    if lib_us is None or conv_us is None:
        return "folded", "folded convolution + the epilogue kernel (no timing of the library call)"
    ours = conv_us + kernel_us
    if lib_us < ours:
        return lib["label"], f"{lib['label']} {lib_us:.1f} us < folded conv {conv_us:.1f} + epilogue kernel {kernel_us:.1f} us"
    return "folded", f"folded conv {conv_us:.1f} + epilogue kernel {kernel_us:.1f} us <= {lib['label']} {lib_us:.1f} us"
