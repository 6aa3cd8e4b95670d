"""layer_norm on an x whose rows are each contiguous but not packed (torchvision's ViT hands its
encoder norm a (N, S, C) view of an (S, N, C) tensor: strides (C, N*C, 1)): targeted, read in place
by the strided_row(s) families, verified on inputs of the same strides, and refused to the
packed-row families, which would read the wrong rows."""

from __future__ import annotations

import pytest

from eval_helpers import hotspot
from forge_pack.evaluate.evaluator import Evaluator
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.search import families as registry
from forge_pack.search.templates_proposer import _build, _candidate, applicable_families, instantiate
from forge_pack.targets import abi
from forge_pack.targets.norm_common import row_layout
from forge_pack.targets.sigparse import parse_signature

VIT = "x: f32[64,197,768]{strides=768,49152,1}, normalized_shape=(768,), weight: f32[768], bias: f32[768]"
SMALL = "x: f32[8,50,256]{strides=256,2048,1}, normalized_shape=(256,), weight: f32[256], bias: f32[256]"


def test_vit_encoder_norm_view_is_targeted_with_its_row_starts():
    sig = parse_signature("layer_norm", VIT)
    assert abi.supports(sig) is None
    env = abi.env(sig)
    assert (env["rows"], env["cols"], env["x_inner"], env["x_so"], env["x_si"]) == (64 * 197, 768, 197, 768, 49152)


@pytest.mark.parametrize("text, layout", [
    ("x: f32[4,6,32], normalized_shape=(32,)", (24, 24 * 32, 32)),  # contiguous: packed rows
    ("x: f32[4,6,32]{strides=32,128,1}, normalized_shape=(32,)", (6, 32, 128)),  # transposed leading dims
    ("x: f32[4,6,32]{strides=384,64,1}, normalized_shape=(32,)", (24, 24 * 64, 64)),  # padded rows: one stride
    ("x: f32[4,6,8,4]{strides=32,128,4,1}, normalized_shape=(8,4)", (6, 32, 128)),  # 2-d normalized shape
    ("x: f32[2,3,4,32]{strides=32,256,64,1}, normalized_shape=(32,)", (12, 32, 64)),  # interleaved, merged
    ("x: f32[2,3,4,32]{strides=128,256,32,1}, normalized_shape=(32,)", None),  # three strides
    ("x: f32[4,32]{strides=16,1}, normalized_shape=(32,)", None),  # overlapping rows
    ("x: f32[4,32]{strides=1,4}, normalized_shape=(32,)", None),  # a strided row
])
def test_row_layout_merges_leading_dims_into_two_strides(text, layout):
    assert row_layout(parse_signature("layer_norm", text)) == layout


def test_strided_x_gets_only_the_strided_families_and_contiguous_x_never_does():
    strided = parse_signature("layer_norm", VIT)
    packed = parse_signature("layer_norm", "x: f32[64,197,768], normalized_shape=(768,)")
    assert [f.name for f in applicable_families(strided, "cuda")] == ["strided_row"]
    assert [f.name for f in applicable_families(strided, "cpu")] == ["strided_rows"]
    assert "strided_row" not in [f.name for f in applicable_families(packed, "cuda")]
    assert "strided_rows" not in [f.name for f in applicable_families(packed, "cpu")]
    rms = parse_signature("rms_norm", "x: f32[4,6,32]{strides=32,128,1}, normalized_shape=(32,)")
    assert abi.supports(rms) == "non-contiguous input"  # rms_norm's composite form keeps x's layout in out


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator("cpu", timing=TimingConfig(warmup=1, reps=3, flush=False, compile_baseline=False)) as ev:
        yield ev


def test_strided_rows_kernel_verifies_on_inputs_with_the_views_strides(evaluator):
    hs = hotspot("layer_norm", SMALL)
    sig = evaluator.signature(hs)
    assert sig.x.strides == (256, 2048, 1) and sig.output.is_contiguous
    e = evaluator.evaluate(instantiate("layer_norm", "cpu", "strided_rows", None, sig), hs, bounds=True)
    assert (e.verdict.ok, e.verdict.reason) == (True, "ok")
    assert e.timing is not None


def test_packed_row_kernel_on_a_transposed_view_is_a_mismatch(evaluator):
    hs = hotspot("layer_norm", SMALL)
    sig = evaluator.signature(hs)
    fam = registry.family("layer_norm", "cpu", "rows")
    cand = _candidate(fam, sig, _build(fam, sig, {"grain": 1}))  # forced past its applicability check
    e = evaluator.evaluate(cand, hs)
    assert (e.verdict.ok, e.verdict.reason) == (False, "mismatch")
    assert e.verdict.detail.startswith("fresh[0]")
