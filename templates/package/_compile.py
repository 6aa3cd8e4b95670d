"""Compile mode: torch.compile with Inductor, and the package's kernels where they win in context.

``CompileMode.backend`` is a torch.compile backend. Dynamo hands it each captured FX graph (torch-level
calls, with fake tensors of the traced shapes in ``node.meta["example_value"]``); the backend replaces
a call with the package's custom op only when

- the manifest marks the target ``compile.use`` (the build measured the whole model compiled with and
  without it, and it won), and
- the traced call is exactly the verified one: the same guards as eager ``apply()`` (device, GPU
  architecture, dtypes, shapes, strides, parameters, no autograd graph needed; ``Patcher.verified_call``),
  static shapes only (a symbolic size is left to Inductor), the traced output of the verified dtype,
  shape and strides, and no autocast in or around the graph,

then hands the graph to Inductor (``torch._inductor.compile_fx``, through torch.compile's own Inductor
wrapper so ``mode=`` and ``options=`` mean what they mean for ``torch.compile``). Everything else stays
Inductor's: our op is an opaque node (its fake kernel gives Inductor the output's layout) between
Inductor's fused kernels, and CUDA graphs (``mode="reduce-overhead"``) capture it like any other op.
Nothing global is patched: eager calls outside the compiled model are untouched.

Module composites (an RMSNorm written as eager ops) are several calls in a traced graph, not one:
compile mode leaves them to Inductor.

``CompileMode.export`` writes an AOTInductor package (.pt2) with the used kernels in it; for that one
trace (torch.export, non-strict) the used targets are patched as apply() patches them, then reverted.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from typing import Any, Callable, Iterable

import torch

_NO_VALUE = object()


def _static(v: Any) -> bool:
    """A tensor whose sizes and strides are plain ints: a symbolic one (dynamic shapes) would compare
    by adding guards, and was never verified for all the sizes it stands for."""
    return all(type(d) is int for d in v.shape) and all(type(s) is int for s in v.stride())


def _inductor(mode: str | None, options: dict | None) -> Callable:
    """Inductor as torch.compile(mode=..., options=...) would run it; compile_fx with the mode's
    config where torch's wrapper is not there (it is private)."""
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is not None:
        return wrapper(mode, options, None)
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = {**(list_mode_options(mode) if mode and mode != "default" else {}), **(options or {})}
    return lambda gm, example_inputs: compile_fx(gm, example_inputs, config_patches=patches)


class CompileMode:
    """The compile-mode state of one package: which targets it may use and what it replaced.

    ``use``: the target ids to replace; None takes the manifest's ``compile.use`` (a target without a
    ``compile`` record was never measured compiled, so it is not used). The build's compile gate
    passes its own sets to measure each replacement.
    """

    def __init__(self, patcher: Any, use: Iterable[str] | None = None):
        self.patcher = patcher
        if use is None:
            use = [t["id"] for t in patcher.manifest["targets"] if (t.get("compile") or {}).get("use")]
        self.use = frozenset(use)
        # the patcher's own module (the installed package's _patch, or a staged package's under
        # another name): its call-path table and originals are what Dynamo's graph calls
        patch_mod = importlib.import_module(type(patcher).__module__)
        self._functions: dict[Any, tuple[str, str]] = {}
        self._methods: dict[str, str] = {}
        for op, paths in patch_mod.CALL_PATHS.items():
            for owner, attr, style in paths:
                if style == "method":
                    self._methods[attr] = op
                elif (owner, attr) in patch_mod.ORIGINALS:
                    self._functions[patch_mod.ORIGINALS[(owner, attr)]] = (op, style)
        self._disable_setting = patch_mod.disable_setting
        self._autocast_on = patch_mod._autocast_on
        self.graphs: list = []  # every graph handed to Inductor, after replacement (newest last)
        self.replaced: dict[str, int] = {}  # target id -> traced calls replaced, over all graphs
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    # ---- public
    def compile(self, model: Any, **kwargs: Any) -> Any:
        """torch.compile(model, backend=this backend, **kwargs): mode, options, fullgraph, dynamic ... as
        torch.compile takes them."""
        if "backend" in kwargs:
            raise TypeError("compile() chooses the backend itself (Inductor with the package's kernels); "
                            "for another backend call torch.compile directly")
        return torch.compile(model, backend=self.backend, **kwargs)

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list, mode: str | None = None,
                options: dict | None = None) -> Callable:
        """A torch.compile backend: replace the verified, winning calls in `gm`, then Inductor."""
        self.rewrite(gm, example_inputs)
        return _inductor(mode, options)(gm, example_inputs)

    def report(self) -> dict:
        return {"use": sorted(self.use), "replaced": dict(self.replaced), "graphs": len(self.graphs)}

    # ---- the graph pass
    def rewrite(self, gm: torch.fx.GraphModule, example_inputs: list) -> int:
        """Replace each verified call of a used target in `gm` with the package's op; the count."""
        with self._lock:
            n = self._rewrite(gm, example_inputs) if self._usable(gm) else 0
            self.graphs.append(gm)
        return n

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"{self.patcher.package}: {message}", RuntimeWarning, stacklevel=4)

    def _usable(self, gm: torch.fx.GraphModule) -> bool:
        if not self.use:
            return False
        off, odd = self._disable_setting()
        if odd:
            self._warn_once(odd)
        if off:
            self._warn_once("disabled by FORGE_PACK_DISABLE; compile mode runs plain Inductor")
            return False
        if not self.patcher.load():
            self._warn_once(f"compile mode runs plain Inductor: {self.patcher.load_error}")
            return False
        # autocast changes what the ops return; the kernels were verified without it
        if self._autocast_on(self.patcher.backend):
            return False
        return not any("autocast" in getattr(node.target, "__name__", str(node.target))
                       for node in gm.graph.nodes if node.op == "call_function")

    def _values(self, gm: torch.fx.GraphModule, example_inputs: list) -> dict:
        """node -> the value it was traced with (fake tensors; parameters for get_attr)."""
        values: dict = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for node in gm.graph.nodes:
            v = node.meta.get("example_value", _NO_VALUE)
            if v is _NO_VALUE and node.op == "get_attr":
                v = getattr(gm, str(node.target), _NO_VALUE)
            if v is _NO_VALUE and node.op == "placeholder" and len(placeholders) == len(example_inputs):
                v = example_inputs[placeholders.index(node)]
            if v is not _NO_VALUE:
                values[node] = v
        return values

    def _call(self, node: torch.fx.Node) -> tuple[str, str] | None:
        if node.op == "call_function":
            try:
                return self._functions.get(node.target)
            except TypeError:  # an unhashable target: not one of ours
                return None
        if node.op == "call_method" and node.target in self._methods:
            return self._methods[node.target], "method"
        return None

    def _rewrite(self, gm: torch.fx.GraphModule, example_inputs: list) -> int:
        values = self._values(gm, example_inputs)
        node_of = {id(v): n for n, v in values.items()}
        count = 0
        for node in list(gm.graph.nodes):
            call = self._call(node)
            if call is None:
                continue
            missing = []

            def value(n: torch.fx.Node) -> Any:
                if n not in values:
                    missing.append(n)
                return values.get(n)

            args = torch.fx.node.map_arg(node.args, value)
            kwargs = torch.fx.node.map_arg(node.kwargs, value)
            out = values.get(node)
            if missing or not isinstance(out, torch.Tensor) or not _static(out):
                continue
            tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
            if not all(_static(v) for v in tensors):
                continue  # dynamic shapes: Inductor's
            hit = self.patcher.verified_call(call[0], call[1], tuple(args), dict(kwargs))
            if hit is None:
                continue
            target, inputs = hit
            if target.id not in self.use or target.fn is None:
                continue
            if (out.dtype, tuple(out.shape), tuple(out.stride())) != target.out:
                continue  # the traced call returns something else than what was verified
            if not all(id(v) in node_of for v in inputs):
                continue
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(target.fn, tuple(node_of[id(v)] for v in inputs))
            new.meta.update(node.meta)
            values[new], node_of[id(out)] = out, new  # a later call may take it as input
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            self.replaced[target.id] = self.replaced.get(target.id, 0) + 1
            count += 1
        if count:
            gm.graph.lint()
            gm.recompile()
        return count


    # ---- AOTInductor export
    def export(self, model: Any, args: tuple, kwargs: dict | None = None, path: str = "model.pt2") -> dict:
        """An AOTInductor package (.pt2) of `model` on these example inputs, with the used kernels in it.

        torch.export traces the model (non-strict) while a Patcher of only the used targets is applied,
        so each verified call of a used target is traced as the package's op; the patches are reverted
        before this returns. Loading the .pt2 needs torch and this package installed (``load_exported``),
        not the model's code. Returns {path, used: target ids in the graph, nodes}."""
        if not self.patcher.load():
            raise RuntimeError(f"{self.patcher.package}: cannot export with the kernels: {self.patcher.load_error}")
        doc = {k: v for k, v in self.patcher.manifest.items() if k != "integrity"}
        doc["targets"] = [t for t in doc["targets"] if t["id"] in self.use]
        patcher = type(self.patcher)(doc, self.patcher.package, lambda: None, self.patcher.build_info)
        patcher.load()
        kwargs = dict(kwargs or {})
        # Dynamo's map of torch functions is built once, from whatever F.layer_norm & co. are then: import
        # it before the patches (apply() builds the map), or it would hold the wrappers, and compiling
        # after the revert would not know torch's own functions
        import torch._dynamo  # noqa: F401
        import torch.export  # noqa: F401

        with torch.no_grad():
            if doc["targets"]:
                patcher.apply(model)
            try:
                program = torch.export.export(model, tuple(args), kwargs, strict=False)
            finally:
                patcher.revert()
            nodes = our_nodes(program.graph_module, self.patcher.namespace)
            from torch._inductor import aoti_compile_and_package

            written = aoti_compile_and_package(program, package_path=str(path))
        return {"path": str(written), "used": sorted(nodes), "nodes": nodes}


def load_exported(patcher: Any, path: str) -> Callable:
    """A .pt2 written by ``CompileMode.export``, ready to call: the package's ops registered first."""
    if not patcher.load():
        raise RuntimeError(f"{patcher.package}: the package's kernels do not load here: {patcher.load_error}")
    from torch._inductor import aoti_load_package

    return aoti_load_package(str(path))


def load_model_file(path: str, device: str = "cpu", dtype: str | None = None) -> tuple[Any, tuple, dict]:
    """(model, args, kwargs) from a forge-pack model file: get_model() and get_inputs() (a list, tuple or
    dict of keyword arguments), or KernelBench's Model(*get_init_inputs()) with get_inputs(); in eval mode
    on `device`, floating tensors cast to `dtype` when given."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"_forge_export_{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if hasattr(mod, "get_model"):
        model = mod.get_model()
    elif hasattr(mod, "Model"):
        model = mod.Model(*getattr(mod, "get_init_inputs", lambda: [])())
    else:
        raise AttributeError(f"{path} defines neither get_model() nor Model")
    cast = getattr(torch, dtype) if dtype else None

    def move(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            v = v.to(device)
            return v.to(cast) if cast is not None and v.is_floating_point() else v
        if isinstance(v, (list, tuple)):
            return type(v)(move(x) for x in v)
        if isinstance(v, dict):
            return {k: move(x) for k, x in v.items()}
        return v

    model = model.to(device).eval()
    if cast is not None:
        model = model.to(cast)
    inputs = move(mod.get_inputs())
    if isinstance(inputs, dict):
        return model, (), inputs
    return model, tuple(inputs), {}


def our_nodes(gm: torch.fx.GraphModule, namespace: str) -> dict[str, int]:
    """Per op name of `namespace`, how many nodes of `gm` call it (what a rewrite put in)."""
    found: dict[str, int] = {}
    for node in gm.graph.nodes:
        name = getattr(node.target, "name", None)
        if node.op == "call_function" and callable(name):
            qual = name()  # OpOverload.name(): 'ns::op.overload'
            ns, _, rest = qual.partition("::")
            if ns == namespace:
                op = rest.split(".")[0]
                found[op] = found.get(op, 0) + 1
    return found
