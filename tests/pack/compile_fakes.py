"""Compile-mode tests without building an extension: a packed manifest's targets registered as
torch.library ops implemented in Python (the op's own eager call, or a deliberately slow one), driven
by the package's own _patch.py and _compile.py loaded from templates/package/."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import sys
import time
from pathlib import Path

import torch

from forge_pack.targets import registry

TEMPLATES = Path(__file__).resolve().parent.parent.parent / "templates" / "package"
_COUNT = itertools.count()
_LIBS: list = []  # torch.library registrations live as long as their Library object


def template_module(file: str, name: str):
    spec = importlib.util.spec_from_file_location(name, TEMPLATES / file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


PATCH = template_module("_patch.py", "_forge_cm_test_patch")
COMPILE = template_module("_compile.py", "_forge_cm_test_compile")


def python_ops(doc: dict, slow_s: dict | None = None, wrong: set | None = None) -> str:
    """Define the manifest's targets as ops of a fresh namespace, each computing its op's eager call
    (sleeping slow_s[target id] seconds first; 1.5 times the right answer for the ids in `wrong`);
    the namespace."""
    ns = f"forge_cm_test_{next(_COUNT)}"
    lib = torch.library.Library(ns, "DEF")
    _LIBS.append(lib)
    for t in doc["targets"]:
        sig = t["signature"]
        present = [name for name, s in sig["inputs"] if s is not None]
        lib.define(f"{t['id']}({', '.join('Tensor ' + n for n in present)}) -> Tensor")
        fn = registry.get(t["op"]).eager(dict(sig["params"]), sig["output"]["dtype"])
        delay = (slow_s or {}).get(t["id"], 0.0)
        factor = 1.5 if t["id"] in (wrong or ()) else 1.0

        def impl(*tensors, fn=fn, present=present, delay=delay, factor=factor):
            if delay:
                time.sleep(delay)
            return fn(dict(zip(present, tensors))) * factor

        lib.impl(t["id"], impl, "CPU")
    return ns


def patcher(doc: dict, use: list[str] | None = None, slow_s: dict | None = None, wrong: set | None = None):
    """A Patcher over a copy of `doc` whose ops are Python ones; `use`: the ids marked compile.use."""
    doc = copy.deepcopy(doc)
    doc.pop("integrity", None)
    doc["package"]["namespace"] = python_ops(doc, slow_s, wrong)
    for t in doc["targets"]:
        if use is not None:
            t["compile"] = {"use": t["id"] in use, "reason": "test", "compiled_ms": 1.0, "compiled_with_ms": 0.9}
    return PATCH.Patcher(doc, "cm_test_pkg", lambda: None)


def region_ops(regions: list, wrong: set | None = None) -> str:
    """Define each region as an op of a fresh namespace, ``<id>(Tensor in0, ...) -> Tensor``, computing
    the region's own eager reference (its graph rebuilt from the form) into the captured output layout
    (1.5 times that for the ids in `wrong`); the namespace. The "kernel" of a region, without a compiler."""
    from forge_pack.graph import canonical

    ns = f"forge_cm_region_{next(_COUNT)}"
    lib = torch.library.Library(ns, "DEF")
    _LIBS.append(lib)
    for rid, region in regions:
        args = ", ".join(f"Tensor in{k}" for k in range(len(region.input_specs)))
        tag = getattr(torch._C.Tag, "needs_exact_strides", None)  # Inductor hands the op the traced strides
        lib.define(f"{rid}({args}) -> Tensor", tags=(tag,) if tag is not None else ())
        out = region.output_spec
        factor = 1.5 if rid in (wrong or ()) else 1.0

        def impl(*tensors, form=region.form, out=out, factor=factor):
            value = canonical.rebuild(form, tensors[0].device.type)(*tensors)
            result = torch.empty_strided(out.shape, out.strides, dtype=getattr(torch, out.dtype),
                                         device=tensors[0].device)
            return result.copy_(value * factor if factor != 1.0 else value)

        lib.impl(rid, impl, "CPU")
        lib.impl(rid, impl, "CUDA")
    return ns


def region_patcher(doc: dict, regions: list, use: list[str] | None = None, wrong: set | None = None):
    """A Patcher over a copy of `doc` with no op targets and `regions` ([(id, Region)]) as the manifest's
    regions, their ops Python ones (``region_ops``); `use`: the ids marked compile.use (None: no record)."""
    doc = copy.deepcopy(doc)
    doc.pop("integrity", None)
    doc["targets"] = []
    ns = region_ops(regions, wrong)
    doc["regions"] = []
    for rid, region in regions:
        entry = {"id": rid, "name": region.name, "form": region.form, "op": f"{ns}::{rid}",
                 "output": region.output_spec.to_json()}
        if use is not None:
            entry["compile"] = {"use": rid in use, "reason": "test", "compiled_ms": 1.0, "compiled_with_ms": 0.9}
        doc["regions"].append(entry)
    return PATCH.Patcher(doc, "cm_region_pkg", lambda: None)


def aot_backend(cm, graphs: list | None = None):
    """A torch.compile backend that stops where Inductor's joint-graph passes run: AOTAutograd with Inductor's
    decompositions, the package's call rewrite and region pass, the rewritten graph then run eagerly (an
    Inductor compile costs ~20 s on a small CPU); each forward graph goes into `graphs` when given."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.decomposition import select_decomp_table

    def backend(gm, example_inputs):
        cm.rewrite(gm, example_inputs)
        region_pass = cm.region_pass(gm, example_inputs)

        def forward_compiler(fgm, _inputs):
            if region_pass is not None:
                region_pass(fgm.graph)
                fgm.recompile()
            if graphs is not None:
                graphs.append(fgm)
            return fgm.forward

        return aot_module_simplified(gm, example_inputs, fw_compiler=forward_compiler,
                                     decompositions=select_decomp_table())

    return backend


def aot_compiled(cm, model):
    """(model compiled with ``aot_backend``, the forward graphs it made), Dynamo's caches reset first."""
    graphs: list = []
    torch._dynamo.reset()
    return torch.compile(model, backend=aot_backend(cm, graphs)), graphs


def aot_only(cm, model, *inputs):
    """``aot_compiled``, called once without autograd: (output, graphs)."""
    compiled, graphs = aot_compiled(cm, model)
    with torch.no_grad():
        out = compiled(*inputs)
    return out, graphs
