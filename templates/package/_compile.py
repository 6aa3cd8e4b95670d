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

Regions (a chain of memory-bound ops one kernel computes: an RMSNorm written as eager ops, mask add
+ softmax + cast, SiLU(gate) x up) are found later, in the ATen graph AOTAutograd traced with Inductor's
decompositions: a pass run as Inductor's ``joint_custom_pre_pass`` (before Inductor's own rewrites)
replaces every subgraph whose canonical form is a used manifest region's form (``_graph/region_match``,
forge-pack's own forge_pack/graph code shipped verbatim: the same canonicalisation that named the
region) with one call of the region's op, inputs in the form's order. A subgraph that differs in any
op, constant, dtype, shape or stride, or whose intermediate values are read elsewhere, stays Inductor's.

``CompileMode.export`` writes an AOTInductor package (.pt2) with the used kernels in it; for that one
trace (torch.export, non-strict) the used targets are patched as apply() patches them, then reverted.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

_NO_VALUE = object()


def _static(v: Any) -> bool:
    """A tensor whose sizes and strides are plain ints: a symbolic one (dynamic shapes) would compare
    by adding guards, and was never verified for all the sizes it stands for."""
    return all(type(d) is int for d in v.shape) and all(type(s) is int for s in v.stride())


def _load_graph_runtime() -> Any:
    """``region_match`` of the shipped ``_graph/`` (forge_pack/graph's canonical form and matcher, verbatim).
    This file run from forge-pack's source tree (templates/package/, in forge-pack's tests) has no copy
    beside it and loads the source it is copied from under a private name."""
    here = Path(__file__).resolve().parent
    if __package__ and (here / "_graph" / "__init__.py").is_file():
        return importlib.import_module(f"{__package__}._graph.region_match")
    src = here / "_graph" if (here / "_graph").is_dir() else here.parent.parent / "forge_pack" / "graph"
    name = f"{__name__}_graph"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, src / "__init__.py", submodule_search_locations=[str(src)])
        if spec is None or spec.loader is None or not (src / "region_match.py").is_file():
            raise ImportError(f"the region matcher is missing beside {Path(__file__).name} (no _graph/): the package "
                              "is incomplete; reinstall it or rebuild it with forge-pack")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return importlib.import_module(f"{name}.region_match")


def _graph_runtime_problem(manifest: dict) -> str | None:
    """Why the shipped _graph/ files are not the ones the build recorded (None when they are, or when this
    runs from forge-pack's source tree, which has no record to compare with)."""
    record = manifest.get("graph_runtime")
    here = Path(__file__).resolve().parent / "_graph"
    if not record or not here.is_dir():
        return None
    for file, digest in record.get("files", {}).items():
        path = here / file
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return f"_graph/{file} is not the file the package was built with; regions are left to Inductor"
    return None


class _Region:
    """One manifest region: its canonical form and the package op that computes it."""

    def __init__(self, r: dict, namespace: str):
        self.id: str = r["id"]
        self.form: dict = r["form"]
        op = r.get("op") or r["id"]
        self.qualname: str = op if "::" in op else f"{namespace}::{op}"
        self.output: dict | None = r.get("output")  # {dtype, shape, strides} the kernel returns
        self.conv: dict | None = r.get("conv")  # a conv epilogue region: its op is defined by _conv_regions.py
        # the op's arguments as form inputs (op argument j is form input args[j]): an attention chain's op is
        # the attention target's (x, k, v[, mask]); None: the form's own order
        self.args: list[int] | None = r.get("args")
        # the form input the kernel computes as the causal mask (not an argument), with its sliding window (0:
        # none): a match is swapped only where that input is proven a constant of that causal pattern in the
        # compiled graph (region_match.constant_causal_window)
        self.causal_mask: int | None = r.get("causal_mask")
        self.window: int = int(r.get("window") or 0)
        self.raw = r
        self.fn: Any = None

    def bind(self) -> Any:
        if self.fn is None:
            ns, _, name = self.qualname.partition("::")
            self.fn = getattr(getattr(torch.ops, ns), name).default
        return self.fn


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
    ``compile`` record was never measured compiled, so it is not used), and for a torch.compile mode the
    build measured on its own (``compile.modes``, e.g. reduce-overhead on a GPU) that mode's decisions.
    The build's compile gate passes its own sets to measure each replacement (in every mode).
    """

    def __init__(self, patcher: Any, use: Iterable[str] | None = None):
        self.patcher = patcher
        self.regions = [_Region(r, patcher.namespace) for r in patcher.manifest.get("regions") or []]
        self._use_by_mode: dict[str, frozenset] = {}
        if use is None:
            every = [*patcher.manifest["targets"], *(patcher.manifest.get("regions") or [])]
            use = [t["id"] for t in every if (t.get("compile") or {}).get("use")]
            for mode in {m for t in every for m in ((t.get("compile") or {}).get("modes") or {})}:
                self._use_by_mode[mode] = frozenset(
                    t["id"] for t in every if (((t.get("compile") or {}).get("modes") or {}).get(mode) or {}).get("use"))
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
        self.matched: dict[str, int] = {}  # region id -> subgraphs replaced, over the graphs Inductor compiled
        self._respelled: dict[tuple[str, str], Any] = {}  # (region id, device type) -> Respelled; None: not usable
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

    def use_for(self, mode: str | None) -> frozenset:
        """The targets used under torch.compile's `mode`: the build's decisions for that mode where it
        measured it, else the default mode's."""
        return self._use_by_mode.get(mode or "default", self.use)

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list, mode: str | None = None,
                options: dict | None = None) -> Callable:
        """A torch.compile backend: replace the verified calls in `gm` that win in context under `mode`, then
        Inductor, with the region pass in its joint-graph passes when a used region can occur in this graph."""
        use = self.use_for(mode)
        self.rewrite(gm, example_inputs, use)
        region_pass = self.region_pass(gm, example_inputs, (options or {}).get("joint_custom_pre_pass"), use=use)
        if region_pass is not None:
            options = {**(options or {}), "joint_custom_pre_pass": region_pass}
        return _inductor(mode, options)(gm, example_inputs)

    def report(self) -> dict:
        """What was swapped in: traced calls per target, subgraphs per region (counted when Inductor compiles
        a graph: one it loads from its cache was rewritten when it was first compiled)."""
        return {"use": sorted(self.use), "replaced": dict(self.replaced), "regions": dict(self.matched),
                "graphs": len(self.graphs)}

    # ---- regions
    def region_pass(self, gm: torch.fx.GraphModule, example_inputs: Any, then: Any = None,
                    export: bool = False, use: frozenset | None = None) -> Any:
        """Inductor's joint_custom_pre_pass replacing the used regions in the graph Inductor traces from `gm`
        (None: no region can be used there); `then`: a pass of the caller's, run after it. ``export``: for an
        AOTInductor package, which cannot call the conv regions' Python op: those stay Inductor's."""
        use = self.use if use is None else use
        used = [r for r in self.regions if r.id in use and not (export and r.conv is not None)]
        device = _graph_device(gm, example_inputs)
        if not used or device is None or device.type != self.patcher.backend:
            return None
        with self._lock:
            if not self._usable(gm, use) or not self._usable_regions(device):
                return None
            ready = []
            for r in used:
                got = self._prepare(r, device)
                if got is not None:
                    ready.append((r, got))
        return _region_pass_class()(self, ready, then) if ready else None

    def _usable_regions(self, device: Any) -> bool:
        if device.type == "cuda" and not self.patcher._cap_ok(device):
            return False
        problem = _graph_runtime_problem(self.patcher.manifest)
        if problem:
            self._warn_once(problem)
            return False
        return True

    def _prepare(self, r: _Region, device: Any) -> Any:
        """The region's form respelled as Inductor's graph spells it on this device (cached), its op bound
        with a fake kernel; None (warned once) when it cannot be used."""
        cache_key = (r.id, device.type)
        if cache_key not in self._respelled:
            why = None
            try:
                from torch._inductor.decomposition import select_decomp_table

                if r.conv is not None:
                    # its tensors made now, outside any CUDA graph's memory pool (ConvRegionOp.preload)
                    _register_conv_region(r, self.patcher).preload(device)
                got = _load_graph_runtime().respell(r.form, device.type, select_decomp_table())
                if r.output is not None and got.output != r.output:
                    why = f"traced, its output is {got.output}, not the kernel's {r.output}"
                else:
                    _bind_region_op(r, got.output)
            except Exception as e:  # noqa: BLE001 - a region that cannot be traced or bound stays Inductor's
                why = f"{type(e).__name__}: {e}"
            if why is not None:
                self._warn_once(f"region {r.id} is left to Inductor: {why}")
                got = None
            self._respelled[cache_key] = got
        return self._respelled[cache_key]

    def _replace_regions(self, graph: torch.fx.Graph, ready: list) -> int:
        match = _load_graph_runtime()
        count = 0
        causal: dict = {}  # mask node -> its window as a proven constant causal mask, None: not one (the layers
        # of a model share a mask, or two: Gemma's sliding and full layers)
        unproven: dict = {}  # a match's output -> the causal region that left it (a later region may take it)
        for r, respelled in ready:
            try:
                found = match.find(graph, respelled)
            except Exception as e:  # noqa: BLE001 - a graph the matcher cannot read: the region stays Inductor's
                self._warn_once(f"region {r.id} is left to Inductor: matching failed ({type(e).__name__}: {e})")
                continue
            renamed: dict = {}  # a match's output replaced earlier, read by a later match of the same form
            for m in found:
                m.inputs = [renamed.get(v, v) for v in m.inputs]
                mask = m.inputs[r.causal_mask] if r.causal_mask is not None else None
                if mask is not None and mask not in causal:
                    causal[mask] = match.constant_causal_window(graph, mask)
                if mask is not None and causal[mask] != r.window:
                    unproven.setdefault(m.output, r)
                    continue
                if r.args is not None:
                    m.inputs = [m.inputs[i] for i in r.args]
                renamed[m.output] = match.replace(graph, m, r.bind())
                with self._lock:
                    self.matched[r.id] = self.matched.get(r.id, 0) + 1
                count += 1
        alive = set(graph.nodes)
        for node, r in unproven.items():  # not taken by a later region of the form either (its other pattern)
            if node in alive:
                pattern = f"causal mask with a window of {r.window}" if r.window else "causal mask"
                self._warn_once(f"region {r.id} is left to Inductor where its mask is not a constant {pattern} "
                                "(its kernel computes that one)")
        if count:
            graph.lint()
        return count

    # ---- the graph pass
    def rewrite(self, gm: torch.fx.GraphModule, example_inputs: list, use: frozenset | None = None) -> int:
        """Replace each verified call of a used target (``use``, default: the default mode's) in `gm` with the
        package's op; the count."""
        use = self.use if use is None else use
        with self._lock:
            n = self._rewrite(gm, example_inputs, use) if self._usable(gm, use) else 0
            self.graphs.append(gm)
        return n

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"{self.patcher.package}: {message}", RuntimeWarning, stacklevel=4)

    def _usable(self, gm: torch.fx.GraphModule, use: frozenset) -> bool:
        if not use:
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

    def _rewrite(self, gm: torch.fx.GraphModule, example_inputs: list, use: frozenset) -> int:
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
            if target.id not in use or target.fn is None:
                continue
            if (out.dtype, tuple(out.shape), tuple(out.stride())) != target.out:
                continue  # the traced call returns something else than what was verified
            if not all(id(v) in node_of for v in inputs):
                continue
            lower_as_fallback(target.fn)
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

            before = dict(self.matched)
            region_pass = self.region_pass(program.graph_module, [*args, *kwargs.values()], export=True)
            configs = {"joint_custom_pre_pass": region_pass} if region_pass is not None else None
            written = aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
        regions = {k: v - before.get(k, 0) for k, v in self.matched.items() if v > before.get(k, 0)}
        return {"path": str(written), "used": sorted([*nodes, *regions]), "nodes": nodes, "regions": regions}


def _graph_device(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    """The device of the graph's first tensor input (None when it reads no tensor)."""
    for v in example_inputs:
        if isinstance(v, torch.Tensor):
            return v.device
    for node in gm.graph.nodes:
        v = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(v, torch.Tensor):
            return v.device
    return None


def _register_conv_region(r: _Region, patcher: Any) -> Any:
    """Define a conv epilogue region's op (``_conv_regions.py`` beside this file: the folded convolution and
    the epilogue kernel, or the original ops when the model's parameters are not the ones folded)."""
    here = Path(__file__).resolve().parent
    name = f"{__package__}._conv_regions" if __package__ else f"{__name__}_conv_regions"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, here / "_conv_regions.py")
        if spec is None or spec.loader is None:
            raise ImportError(f"_conv_regions.py is missing beside {Path(__file__).name}: the package is incomplete")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    match = _load_graph_runtime()
    runtime = {m: importlib.import_module(f"{match.__package__}.{m}") for m in ("conv_fold", "canonical")}
    return sys.modules[name].register(r.raw, patcher.namespace, patcher.package, here, runtime)


def _bind_region_op(r: _Region, output: dict) -> None:
    """Resolve the region's op and give it a fake kernel (the output's layout, so AOTAutograd, Inductor and
    CUDA graphs treat the call as one opaque node) unless the extension registered one."""
    r.bind()
    dtype, shape, strides = getattr(torch, output["dtype"]), tuple(output["shape"]), tuple(output["strides"])

    def fake(*tensors):
        return torch.empty_strided(shape, strides, dtype=dtype, device=tensors[0].device)

    try:
        torch.library.register_fake(r.qualname)(fake)
    except RuntimeError as e:  # registered already (by the extension, or another CompileMode): keep it
        if "already" not in str(e):
            raise
    lower_as_fallback(r.fn)


def lower_as_fallback(op: Any) -> None:
    """Give Inductor its fallback lowering of ``op`` (a call of the eager kernel, with the layout constraint of
    the op's tag) before it lowers a graph that calls it: the lowering Inductor would make itself on meeting the
    op. Made here because torch 2.11's implicit fallback first formats the op's arguments for an info log, eagerly:
    an argument's string holds its whole producer graph, doubling at every residual add that reaches it: a ResNet-50
    with 24 conv region ops sat over 8 minutes in that string on an H100, and compiles in 4.6 s with this (torch
    2.14 formats the log lazily)."""
    from torch._inductor import lowering

    if op in lowering.lowerings:
        return
    try:
        from torch._library.utils import get_layout_constraint_tag

        constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
    except (ImportError, AttributeError, AssertionError):  # a torch without the tags: Inductor's old default
        constraint = getattr(lowering, "constrain_to_fx_strides", None)
    try:
        lowering.make_fallback(op, layout_constraint=constraint, warn=False)
    except (AssertionError, RuntimeError, TypeError):  # an op with a decomposition, or not an op overload:
        pass  # Inductor lowers it as it would have (the implicit fallback, or the decomposition)


_PASS_CLASS: Any = None


def _region_pass_class() -> type:
    """Inductor's CustomGraphPass (its uuid keys Inductor's caches) implemented by CompileMode's matcher."""
    global _PASS_CLASS
    if _PASS_CLASS is None:
        try:
            from torch._inductor.custom_graph_pass import CustomGraphPass
        except ImportError:  # a torch without the interface: a plain callable pass (uncached)
            CustomGraphPass = object  # noqa: N806

        class RegionPass(CustomGraphPass):  # type: ignore[misc, valid-type]
            def __init__(self, mode: "CompileMode", ready: list, then: Any):
                self.mode, self.ready, self.then = mode, ready, then
                # everything that decides the rewrite keys Inductor's caches: a rebuilt package whose op takes its
                # inputs otherwise (args, a computed causal mask) must not load code that calls it the old way
                ident = [(r.id, r.qualname, got.key, r.args, r.causal_mask, r.window, r.output) for r, got in ready]
                then_id = then.uuid() if hasattr(then, "uuid") else (repr(then) if then is not None else None)
                self._uuid = hashlib.sha256(json.dumps([mode.patcher.package, ident, then_id]).encode()).hexdigest()

            def __call__(self, graph: torch.fx.Graph) -> None:
                self.mode._replace_regions(graph, self.ready)
                if self.then is not None:
                    self.then(graph)

            def uuid(self) -> str:
                return self._uuid

            def __deepcopy__(self, memo: dict) -> "RegionPass":
                return self  # Inductor copies its config; the pass holds the package state, shared

        _PASS_CLASS = RegionPass
    return _PASS_CLASS


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
