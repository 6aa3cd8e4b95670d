"""Graph capture: routes and their fallback, node specs, and per-node times from the eager profile."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from forge_pack.core.errors import ForgeError
from forge_pack.graph import opclass
from forge_pack.graph.capture import GraphNode, capture
from forge_pack.graph.timing import align, match

sys.path.insert(0, str(Path(__file__).resolve().parent / "models" / "regions"))
import conv_bn_block  # noqa: E402
import llama_regions  # noqa: E402
from torch_export import eval_dropout_is_a_clone  # noqa: E402


def test_capture_takes_the_export_route_with_named_placeholders_and_real_specs():
    g = capture(conv_bn_block.get_model(), conv_bn_block.get_inputs(), profile=False)
    assert g.route == "export" and g.attempts == [("export", "ok")]
    sources = [n.source for n in g.nodes.values() if n.kind == "placeholder"]
    assert "param:conv1.weight" in sources and "buffer:bn1.running_mean" in sources and sources[-1] == "input:0"
    conv = next(n for n in g.nodes.values() if n.kind == "conv")
    assert (conv.output.dtype, conv.output.shape, conv.output.strides) == ("float32", (2, 16, 8, 8), (1024, 64, 8, 1))
    assert conv.module == "conv1"
    assert g.output_check == "equal"  # the graph computes what the eager model does, bit for bit


def test_capture_records_channels_last_strides():
    model = conv_bn_block.get_model().to(memory_format=torch.channels_last)
    (x,) = conv_bn_block.get_inputs()
    g = capture(model, (x.to(memory_format=torch.channels_last),), profile=False)
    bn = next(n for n in g.nodes.values() if "batch_norm" in n.op)
    assert bn.output.strides == (1024, 1, 128, 16)
    assert bn.output.layout == "channels_last"


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a branch on a tensor's value: export cannot trace it, make_fx runs it
            return torch.relu(x) * 2
        return x.exp()


def test_capture_falls_back_to_make_fx_when_export_fails_on_data_dependent_flow():
    x = torch.ones(4, 8)
    g = capture(DataDependent(), (x,), profile=False)
    assert g.route == "make_fx"
    assert g.attempts[0][0] == "export" and g.attempts[0][1] != "ok"
    assert g.attempts[1] == ("make_fx", "ok")
    ops = [opclass.base_name(n.op) for n in g.nodes.values() if n.kind == "pointwise"]
    assert ops == ["relu", "mul"]  # the branch this input took, and only that one


class GraphBreak(nn.Module):
    def forward(self, x):
        y = torch.softmax(x, -1)
        torch._dynamo.graph_break()
        return torch.sigmoid(y) + 1


def test_dynamo_route_joins_the_graphs_around_a_break_with_their_real_inputs():
    x = torch.randn(4, 8)
    g = capture(GraphBreak(), (x,), routes=("dynamo",), profile=False)
    assert g.route == "dynamo" and g.values is not None
    ops = [opclass.base_name(n.op) for n in g.nodes.values() if n.kind in ("pointwise", "reduction")]
    assert ops == ["_softmax", "sigmoid", "add"]
    sigmoid = next(n for n in g.nodes.values() if n.op.endswith("sigmoid.default"))
    assert sigmoid.output.shape == (4, 8)
    # the second graph's input is the first one's output, as the eager call computed it
    torch.testing.assert_close(g.run(keep=[sigmoid.name])[sigmoid.name], torch.sigmoid(torch.softmax(x, -1)))
    assert g.output_check == "not compared: 2 graphs around graph breaks (their outputs include intermediates)"


CALLS = []


class CallCounter(nn.Module):
    def forward(self, x):
        CALLS.append(1)  # state outside the module (export restores the module's own attributes)
        return x * len(CALLS)  # the trace freezes the count it saw


def test_a_graph_that_computes_something_else_than_eager_is_reported():
    CALLS.clear()
    g = capture(CallCounter(), (torch.ones(3),), profile=False)
    assert g.output_check == "max abs diff 1"  # traced with calls == 1, eager ran with calls == 2
    from forge_pack.graph.report import format_regions

    assert "Captured graph vs eager outputs: max abs diff 1" in format_regions(g)


def test_capture_that_no_route_can_trace_is_a_forge_error():
    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    with pytest.raises(ForgeError, match="export: RuntimeError: boom"):
        capture(Broken(), (torch.ones(2),), routes=("export", "make_fx"), profile=False)


def test_every_compute_node_of_the_llama_block_gets_a_profiled_time():
    g = capture(llama_regions.get_model(), llama_regions.get_inputs(), iterations=1)
    compute = [n for n in g.nodes.values() if n.kind in ("pointwise", "reduction", "matmul")]
    # where export writes eval dropout as a clone (torch 2.11, 2.13), eager runs no kernel for it: estimated
    export_only = 1 if eval_dropout_is_a_clone() else 0
    estimated = [n for n in compute if n.time_source != "profile"]
    assert len(estimated) == export_only and all(n.op == "aten.clone.default" for n in estimated)
    assert g.time_source == ("profile+estimate" if export_only else "profile")
    assert export_only or g.profiled_fraction == 1.0
    assert all(n.time_us > 0 for n in compute)
    assert g.forward_us > 0


def test_without_a_profile_times_are_estimates_from_bytes_and_flops():
    g = capture(conv_bn_block.get_model(), conv_bn_block.get_inputs(), profile=False)
    assert g.time_source == "estimate"
    relu = next(n for n in g.nodes.values() if n.op == "aten.relu.default")
    conv = next(n for n in g.nodes.values() if n.kind == "conv")
    # relu reads and writes 2*16*8*8 floats (8192 bytes each way) at the nominal 20 GB/s
    assert relu.time_us == pytest.approx(16384 / 20e3)
    assert conv.time_us > relu.time_us


def _node(name: str, op: str, kind: str) -> GraphNode:
    return GraphNode(name, op, kind, (), (), ())


def test_match_takes_the_outer_composite_call_and_skips_its_internals():
    nodes = [_node("mm", "aten.addmm.default", "matmul"), _node("a", "aten.add.Tensor", "pointwise")]
    events = [("aten::linear", 0, 10, 9.0), ("aten::t", 1, 2, 0.5), ("aten::addmm", 2, 9, 8.0),
              ("aten::add", 3, 4, 0.2),  # internal to addmm: must not be taken by the graph's add
              ("aten::add", 11, 12, 1.0)]
    assert match(nodes, events) == {"mm": 9.0, "a": 1.0}


def test_match_aligns_by_longest_common_order_so_a_missing_call_shifts_nothing():
    nodes = [_node("s", "aten.silu.default", "pointwise"), _node("p", "aten.pow.Tensor_Scalar", "pointwise"),
             _node("m", "aten.mean.dim", "reduction")]
    events = [("aten::pow", 0, 1, 1.0), ("aten::mean", 2, 3, 2.0), ("aten::silu", 4, 5, 3.0)]
    assert match(nodes, events) == {"p": 1.0, "m": 2.0}


def test_match_survives_an_eager_fast_path_whose_internals_look_like_later_nodes():
    nodes = [_node("ln", "aten.layer_norm.default", "reduction"), _node("q", "aten.linear.default", "matmul"),
             _node("sdpa", "aten.scaled_dot_product_attention.default", "attention"),
             _node("o", "aten.linear.default", "matmul"), _node("add", "aten.add.Tensor", "pointwise"),
             _node("ln2", "aten.layer_norm.default", "reduction"), _node("fc", "aten.linear.default", "matmul"),
             _node("g", "aten.gelu.default", "pointwise")]
    events = [("aten::layer_norm", 0, 5, 1.0), ("aten::native_layer_norm", 1, 4, 0.9),
              ("aten::_native_multi_head_attention", 6, 20, 7.0), ("aten::mm", 7, 8, 1.0), ("aten::bmm", 9, 10, 1.0),
              ("aten::_softmax", 11, 12, 1.0), ("aten::addmm", 13, 14, 1.0), ("aten::add", 15, 16, 0.1),
              ("aten::add", 21, 22, 2.0), ("aten::layer_norm", 23, 25, 3.0), ("aten::linear", 26, 28, 4.0),
              ("aten::gelu", 29, 30, 5.0)]
    assert match(nodes, events) == {"ln": 1.0, "add": 2.0, "ln2": 3.0, "fc": 4.0, "g": 5.0}


def test_align_pairs_each_repeated_layer_with_its_own_layer():
    layer = ["rms", "mm", "mm", "softmax", "mm", "add", "rms", "mm", "silu", "mul", "mm", "add"]
    graph = layer * 4
    eager = []
    for _ in range(4):  # per layer, two calls the graph does not have
        eager += ["embedding"] + layer[:3] + ["dropout"] + layer[3:]
    pairs = align(graph, eager)
    assert len(pairs) == len(graph)
    assert all(i // len(layer) == j // (len(layer) + 2) for i, j in pairs)


def test_in_place_eager_calls_match_functional_graph_nodes():
    nodes = [_node("r", "aten.relu.default", "pointwise")]
    assert match(nodes, [("aten::relu_", 0, 1, 4.0)]) == {"r": 4.0}
