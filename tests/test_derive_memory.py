"""Derived verification sets of a large input cost chunk-sized float64 temporaries, not float64 copies of
the input (an H100 softmax of 1.6 GB took 2-4x its input in them: the largest part of an evaluation's
peak), and give the values the whole-tensor float64 computation gives. CPU."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from forge_pack.evaluate import verdict_rules as vr
from forge_pack.targets import ops, registry
from forge_pack.targets.sigparse import parse_signature

CHUNK = 256  # elements per chunk in these tests (the real one is 2^24): every case below spans many chunks

CASES = [  # (op, signature): rows that are views of x, rows that are copies (channels across samples), strides
    ("softmax", "x: f32[24,100], dim=-1"),
    ("softmax", "x: bf16[6,5,40], dim=1"),
    ("layer_norm", "x: f16[3,700], normalized_shape=(700,), weight: f16[700], bias: f16[700]"),
    ("batch_norm", "x: f32[4,6,7,5], running_mean: f32[6], running_var: f32[6], weight: f32[6], bias: f32[6]"),
    ("group_norm", "x: f32[2,8,9,9], num_groups=4, weight: f32[8], bias: f32[8]"),
    ("layer_norm", "x: f32[5,3,64]{strides=64,320,1}, normalized_shape=(64,), weight: f32[64], bias: f32[64]"),
]


def _whole_tensor(spec, params: dict, kind: str, source: dict, gen: torch.Generator) -> torch.Tensor:
    """The transform computed on a float64 copy of the whole main input, rounded once at the end: what the
    chunked code must equal (draws from ``gen`` in the same order)."""
    x = source["x"]
    xf = x.to(torch.float64)
    limit = torch.finfo(x.dtype).max / 64
    fin_all = xf[torch.isfinite(xf)]
    peak = max(float(fin_all.abs().max()) if fin_all.numel() else 0.0, 1e-30)
    others = {n: (v.clone() if v is not None else None) for n, v in source.items() if n != "x"}
    if kind == "scale":
        decades = vr._uniform(gen, 0.5, 2.5) * (1 if float(torch.rand(1, generator=gen)) < 0.5 else -1)
        xf = xf * min(10.0 ** decades, limit / peak)
    elif kind == "shift":
        spread = float(fin_all.std()) if fin_all.numel() > 1 else 1.0
        offset = vr._uniform(gen, 2.0, 8.0) * max(spread, 1e-3) * (1 if float(torch.rand(1, generator=gen)) < 0.5 else -1)
        xf = xf + max(min(offset, limit - peak), -(limit - peak))
    elif kind == "permute":
        xf = spec.permute(params, xf, others, gen)
    else:
        rows, back = spec.rows(params, xf)
        fin = torch.where(torch.isfinite(rows), rows, torch.zeros_like(rows))
        row_peak = fin.abs().amax(dim=1).clamp_min(1e-30)
        if kind == "mixed":
            factor = torch.minimum(10.0 ** vr._uniform(gen, -3.0, 3.0, rows.shape[0]), limit / row_peak)
        else:
            sign = torch.where(torch.rand(rows.shape[0], generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
            factor = torch.where(torch.isfinite(rows).all(dim=1), sign, torch.ones_like(row_peak))
        xf = back(rows * factor[:, None])
    return xf.to(x.dtype)


def _source(sig) -> dict:
    t = ops.make_inputs(sig, "fresh", torch.Generator().manual_seed(5), "cpu")
    t["x"][(0,) * t["x"].dim()] = float("-inf")  # a non-finite element: kept, and its row is not flipped
    return t


@pytest.mark.parametrize("kind", vr.DERIVED_KINDS)
@pytest.mark.parametrize("op,text", CASES)
def test_derived_sets_equal_the_whole_tensor_float64_transform(op, text, kind, monkeypatch):
    monkeypatch.setattr(vr, "_CHUNK", CHUNK)
    sig = ops.with_output(parse_signature(op, text))
    source = _source(sig)
    before = {n: (v.clone() if v is not None else None) for n, v in source.items()}
    got = ops.derive_inputs(sig, kind, source, torch.Generator().manual_seed(11))
    want = _whole_tensor(registry.spec_for(sig), dict(sig.params), kind, source, torch.Generator().manual_seed(11))
    assert got["x"].stride() == source["x"].stride() and got["x"].dtype == source["x"].dtype
    if kind == "shift":  # the spread is summed in chunks: the offset may differ in its last bits
        torch.testing.assert_close(got["x"].double(), want.double(), rtol=2 ** -7, atol=0, equal_nan=True)
    else:
        assert torch.equal(got["x"].nan_to_num(), want.nan_to_num()), (op, kind)
    for n, v in source.items():  # the source is left as it was
        assert v is None or torch.equal(v, before[n])


class _Float64Sizes(TorchDispatchMode):
    """The element count of every float64 tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("kind", vr.DERIVED_KINDS)
@pytest.mark.parametrize("op,text", [CASES[0], CASES[3]])
def test_a_derived_set_makes_no_float64_tensor_larger_than_a_chunk(op, text, kind, monkeypatch):
    monkeypatch.setattr(vr, "_CHUNK", CHUNK)
    sig = ops.with_output(parse_signature(op, text))
    source = _source(sig)
    n = source["x"].numel()
    with _Float64Sizes() as sizes:
        ops.derive_inputs(sig, kind, source, torch.Generator().manual_seed(11))
    rows = registry.spec_for(sig).rows(dict(sig.params), source["x"])[0]
    # a chunk, or a block of whole rows, or one float64 per row (the per-row factors)
    bound = max(CHUNK, rows.shape[1] * max(1, CHUNK // rows.shape[1]), rows.shape[0])
    assert sizes.largest <= bound < n / 2, (sizes.largest, bound, n)
