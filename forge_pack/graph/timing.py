"""Per-node time of a captured graph: the eager model's profiler events matched to nodes.

The eager forward runs under ``torch.profiler``. Its outermost aten calls, in order, are aligned
with the graph's nodes by op family: in-place spellings folded, a composite and its decomposed
form in one family (``linear`` with ``addmm``). ``align`` stays local, so repeated layers never
pair with the wrong layer. Calls nested in another are its internals and take no part; an eager
call that has no node (the fast path of ``nn.MultiheadAttention``) leaves those nodes unmatched
without shifting the rest. A node's time is its call's device time on CUDA (the kernels of the
call and its children) or CPU time on the CPU. Nodes left unmatched get an estimate from bytes
moved (and flops for matmuls and convolutions) at a bandwidth calibrated on the matched
memory-bound nodes.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from forge_pack.graph import opclass
from forge_pack.graph.capture import Graph, GraphNode, spec_bytes

FORWARD_RANGE = "forge::graph_forward"
# Names one call has at different levels (eager's outer composite vs the graph's decomposed op):
FAMILIES = [opclass.MATMUL, opclass.CONV, {"softmax", "_softmax", "_safe_softmax"}, {"log_softmax", "_log_softmax"},
            {"group_norm", "native_group_norm"}, {"layer_norm", "native_layer_norm"},
            {"rms_norm", "_fused_rms_norm"},
            {"batch_norm", "_batch_norm_impl_index", "native_batch_norm", "_native_batch_norm_legit_no_training",
             "cudnn_batch_norm", "_native_batch_norm_legit"},
            {"to", "_to_copy", "type_as"}, {"dropout", "native_dropout"}, {"contiguous", "clone"},
            {"adaptive_avg_pool2d", "_adaptive_avg_pool2d", "mean"}, {"max_pool2d", "max_pool2d_with_indices"},
            {"max_pool3d", "max_pool3d_with_indices"}]
FAMILY_OF = {name: min(f) for f in FAMILIES for name in f}
# Nominal rates when nothing was measured to calibrate on (order of magnitude only; shares matter):
NOMINAL_BW_GBS = {"cpu": 20.0, "cuda": 3000.0}  # one socket's DRAM; most of an H100/H200's HBM
NOMINAL_GFLOPS = {"cpu": 100.0, "cuda": 400_000.0}  # a few AVX cores; bf16 tensor cores at ~half peak
RESYNC_WINDOW = 64  # calls skipped on both sides to find the next common point: an unmatched composite's worth
RESYNC_CONFIRM = 3  # keys that must agree after a resync point, so one common op does not fake it
COMPUTE_KINDS = ("pointwise", "reduction", "matmul", "conv", "attention", "other")


def attach_times(graph: Graph, module, args, kwargs, iterations: int) -> None:
    """Profile the eager model and give each node its matched time (else an estimate)."""
    try:
        runs, forward_us = _profile_eager(module, args, kwargs, graph.device, iterations)
    except Exception as e:  # profiling is best effort: the graph stays usable with estimates
        graph.notes.append(f"profiling failed ({type(e).__name__}: {e}); times are estimates")
        estimate_times(graph)
        return
    # views are not matched: they cost no device time, and their many eager calls would mislead
    order = [n for n in graph.nodes.values() if n.kind in COMPUTE_KINDS]
    times: dict[str, list[float]] = defaultdict(list)
    for events in runs:
        for name, us in match(order, events).items():
            times[name].append(us)
    for n in order:
        if len(times[n.name]) == len(runs):  # matched in every forward: the same call each time
            n.time_us = statistics.median(times[n.name])  # the machine may be shared: the median resists a stall
            n.time_source = "profile"
    graph.forward_us = forward_us
    estimate_times(graph, only_missing=True)
    compute = [n for n in order if n.kind in COMPUTE_KINDS]
    matched = sum(1 for n in compute if n.time_source == "profile")
    graph.profiled_fraction = matched / len(compute) if compute else 1.0
    graph.time_source = ("profile" if matched == len(compute) else "profile+estimate" if matched else "estimate")


def match(nodes: list[GraphNode], events: list[tuple[str, float, float, float]]) -> dict[str, float]:
    """Node name -> time: the eager forward's outermost aten calls aligned with the nodes by
    their op families (``align``). A call nested in a kept call is its
    internals (its time is in its parent's); views are transparent (``reshape`` of a strided
    tensor keeps the ``clone`` inside it)."""
    top = _outermost(events)
    a = [match_key(n.op) for n in nodes]
    b = [match_key(e[0]) for e in top]
    return {nodes[i].name: top[j][3] for i, j in align(a, b)}


def align(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """Pairs (i, j) with a[i] == b[j], in order: equal runs are taken as they come; at a
    difference, the nearest point (fewest skipped on both sides together, within RESYNC_WINDOW)
    where the next RESYNC_CONFIRM keys agree. Model graphs repeat layer after layer, so a
    longest-block matcher (difflib) pairs layer 1 with layer 4; this stays local."""
    pairs: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
            continue
        found = None
        for k in range(1, RESYNC_WINDOW + 1):
            for p in range(k + 1):
                q = k - p
                if i + p < len(a) and j + q < len(b) and _agree(a, b, i + p, j + q):
                    found = (i + p, j + q)
                    break
            if found:
                break
        if found is None:
            i += 1  # this node has no eager call near here: it stays unmatched
        else:
            i, j = found
    return pairs


def _agree(a: list[str], b: list[str], i: int, j: int) -> bool:
    n = min(RESYNC_CONFIRM, len(a) - i, len(b) - j)
    return all(a[i + t] == b[j + t] for t in range(n))


def _outermost(events: list[tuple[str, float, float, float]]) -> list[tuple[str, float, float, float]]:
    """The calls that do work and are not inside another such call (events sorted by (start, -end))."""
    out, end = [], float("-inf")
    for e in events:
        if e[1] < end:
            continue
        if opclass.classify(e[0].replace("::", ".")) in ("view", "layout_view", "bookkeeping"):
            continue
        out.append(e)
        end = e[2]
    return out


def match_key(op: str) -> str:
    name = opclass.base_name(op)
    if opclass.is_attention(name):
        return "attention"
    return FAMILY_OF.get(name, name)


def _profile_eager(module, args, kwargs, device: str, iterations: int):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.no_grad():
        for _ in range(2):  # warm-up: lazy init, allocator, cuDNN autotuning settle
            module(*args, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            for _ in range(iterations + 1):  # the first forward under the profiler pays its set-up: dropped
                with record_function(FORWARD_RANGE):
                    module(*args, **kwargs)
                if device == "cuda":
                    torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CPU]
    ranges = sorted((e for e in events if e.name == FORWARD_RANGE), key=lambda e: e.time_range.start)[1:]
    runs, forward = [], []
    for r in ranges:
        inside = sorted((e for e in events if e.name.startswith("aten::") and e.thread == r.thread
                         and e.time_range.start >= r.time_range.start and e.time_range.end <= r.time_range.end),
                        key=lambda e: (e.time_range.start, -e.time_range.end))
        runs.append([(e.name, e.time_range.start, e.time_range.end, _event_us(e, device)) for e in inside])
        forward.append(_event_us(r, device))
    if not runs:
        raise RuntimeError("the profiler recorded no forward range")
    return runs, statistics.median(forward)


def _event_us(e, device: str) -> float:
    if device == "cuda":
        return float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0) or 0.0)
    return float(e.cpu_time_total)


def node_bytes(graph: Graph, n: GraphNode) -> int:
    """Bytes a node must move: its tensor inputs read once and its outputs written once (views: 0)."""
    if n.kind in ("view", "layout_view", "placeholder", "bookkeeping") or n.op == "getitem":
        return 0
    read = sum(spec_bytes(graph.nodes[i].outputs[0] if graph.nodes[i].outputs else None) for i in n.inputs)
    return read + sum(spec_bytes(o) for o in n.outputs)


def node_flops(graph: Graph, n: GraphNode) -> float:
    out = n.output
    if out is None or not n.inputs:
        return 0.0
    first = graph.nodes[n.inputs[0]].output
    if n.kind == "matmul" and first is not None and first.shape:
        return 2.0 * out.numel * first.shape[-1]
    if n.kind == "conv" and len(n.inputs) > 1:
        w = graph.nodes[n.inputs[1]].output
        if w is not None and w.shape:
            return 2.0 * out.numel * (w.numel // max(w.shape[0], 1))
    return 0.0


def estimate_times(graph: Graph, only_missing: bool = False) -> None:
    """Time from bytes moved (and flops) for every node without a profiled time."""
    measured = [node_bytes(graph, n) / n.time_us for n in graph.nodes.values()
                if n.time_source == "profile" and n.kind in ("pointwise", "reduction") and n.time_us > 0
                and node_bytes(graph, n) > 0]
    bw_bytes_per_us = statistics.median(measured) if measured else NOMINAL_BW_GBS.get(graph.device, 20.0) * 1e3
    flops_per_us = NOMINAL_GFLOPS.get(graph.device, 100.0) * 1e3
    for n in graph.nodes.values():
        if only_missing and n.time_source == "profile":
            continue
        if n.kind in ("placeholder", "bookkeeping"):
            continue
        n.time_us = max(node_bytes(graph, n) / bw_bytes_per_us, node_flops(graph, n) / flops_per_us)
        n.time_source = "estimate"
    if not only_missing:
        graph.time_source = "estimate"
