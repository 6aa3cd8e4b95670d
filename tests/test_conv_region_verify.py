"""``python -m <pkg> verify`` on conv epilogue regions (templates/package/_verify.py): each build
instance's folded path against the float64 chain of the same folded tensors, within the forward error
bound; a wrong bias, a dropped residual, a wrong layout or a changed folded file fails its row; the
runtime op runs the original ops when a folded file is not the one the manifest records."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "pack"))

import compile_fakes as cf  # noqa: E402
from test_conv_regions import CL, _block, _conv_patcher, base_doc  # noqa: E402,F401
from test_package_verify_checks import _import_verify  # noqa: E402


def _ops(base_doc, tmp_path, fmt=torch.contiguous_format, dtype=torch.float32):
    model, x = _block(fmt, dtype)
    p, regions = _conv_patcher(base_doc, model, x, tmp_path)
    ops = [cf.COMPILE._register_conv_region(cf.COMPILE._Region(r, p.namespace), p) for r in regions]
    return p, regions, ops, model, x


@pytest.mark.parametrize("fmt,dtype", [(torch.contiguous_format, torch.float32), (CL, torch.float32),
                                       (CL, torch.bfloat16)], ids=["nchw-f32", "cl-f32", "cl-bf16"])
def test_every_instance_of_the_block_passes(base_doc, tmp_path, fmt, dtype):
    pv = _import_verify()
    _, regions, ops, _, _ = _ops(base_doc, tmp_path, fmt, dtype)
    assert {r["conv"]["pattern"] for r in regions} == {"conv+batch_norm+relu", "conv+batch_norm+add+relu"}
    for r, op in zip(regions, ops):
        for i, inst in enumerate(r["conv"]["instances"]):
            assert inst["sha256"] and len(inst["sha256"]) == 64
            row = pv.check_conv_instance(op, inst["digest"], "cpu", 1234 + i)
            assert row["reason"] is None, row
            assert row["max_abs"] > 0 and row["excess"] < 0, row


def _residual_op(ops):
    return next(op for op in ops if op.ir is not None)


def test_a_wrong_bias_channel_is_a_mismatch(base_doc, tmp_path):
    pv = _import_verify()
    _, regions, ops, _, _ = _ops(base_doc, tmp_path, CL)
    op = ops[0]
    digest = regions[0]["conv"]["instances"][0]["digest"]
    real = op.run_folded

    def wrong_bias(d, x, r):  # the run adds one output channel's bias off by 0.05; the float64 chain the file's
        key = (d, str(x.device))
        w, b, b_cast = op.folded(d, x.device)
        bad = b.clone()
        bad.view(-1)[3] += 0.05
        op._tensors[key] = (w, bad, bad.to(w.dtype))
        try:
            return real(d, x, r)
        finally:
            op._tensors[key] = (w, b, b_cast)

    op.run_folded = wrong_bias
    row = pv.check_conv_instance(op, digest, "cpu", 7)
    assert row["reason"] == "mismatch", row
    assert "above its bound" in row["detail"]


def test_a_dropped_residual_is_a_mismatch(base_doc, tmp_path):
    pv = _import_verify()
    _, regions, ops, _, _ = _ops(base_doc, tmp_path, CL)
    op = _residual_op(ops)
    digest = op.conv["instances"][0]["digest"]
    real = op.run_folded
    op.run_folded = lambda d, x, r: real(d, x, torch.zeros_like(r))
    row = pv.check_conv_instance(op, digest, "cpu", 7)
    assert row["reason"] == "mismatch", row


def test_an_output_in_another_layout_is_a_layout_failure(base_doc, tmp_path):
    pv = _import_verify()
    _, regions, ops, _, _ = _ops(base_doc, tmp_path, CL)
    op = ops[0]
    digest = op.conv["instances"][0]["digest"]
    real = op.run_folded
    op.run_folded = lambda d, x, r: real(d, x, r).contiguous()
    row = pv.check_conv_instance(op, digest, "cpu", 7)
    assert row["reason"] == "layout", row


def test_a_changed_folded_file_fails_verify_and_runs_the_original_ops(base_doc, tmp_path):
    pv = _import_verify()
    p, regions, ops, model, x = _ops(base_doc, tmp_path, CL)
    op = ops[0]
    inst = regions[0]["conv"]["instances"][0]
    path = Path(inst["file"])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of the last tensor byte
    path.write_bytes(bytes(data))
    op._tensors.clear()
    row = pv.check_conv_instance(op, inst["digest"], "cpu", 7)
    assert row["reason"] == "integrity" and "sha256" in row["detail"], row
    # the op itself: the model's parameters match the digest, the file does not -> the original ops, warned
    form_inputs = [t for t in _chain_inputs(model, x, regions[0])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            op(*form_inputs)
    assert op.calls == {"folded": 0, "original": 1}
    assert any("sha256" in str(w.message) for w in caught)


def _chain_inputs(model, x, region):
    """The region's inputs in form order for the block's first conv chain (conv1 -> bn1 -> relu)."""
    roles = region["conv"]["roles"]
    by_role = {"x": x, "weight": model.conv1.weight, "conv_bias": model.conv1.bias, "bn_weight": model.bn1.weight,
               "bn_bias": model.bn1.bias, "running_mean": model.bn1.running_mean, "running_var": model.bn1.running_var}
    return [by_role[r] for r in roles]


def test_run_prints_a_row_per_instance_and_counts_failures(base_doc, tmp_path, monkeypatch):
    pv = _import_verify()
    p, regions, ops, _, _ = _ops(base_doc, tmp_path, CL)
    monkeypatch.setattr(pv, "_PATCHER", p)
    # one _compile module, as inside a package (the ops above were registered through it)
    monkeypatch.setitem(sys.modules, "templates.package._compile", cf.COMPILE)
    monkeypatch.setattr(sys.modules["templates.package"], "_compile", cf.COMPILE, raising=False)
    lines: list[str] = []
    checks, failures = pv._verify_conv_regions({"regions": regions}, "cpu", 5, say=lines.append)
    n = sum(len(r["conv"]["instances"]) for r in regions)
    assert (checks, failures) == (n, 0), lines
    assert len([ln for ln in lines if "PASS" in ln]) == n
    regions[1]["compile"]["use"] = False
    lines.clear()
    checks, _ = pv._verify_conv_regions({"regions": regions}, "cpu", 5, say=lines.append)
    assert checks == len(regions[0]["conv"]["instances"]) and any("skipped: not used" in ln for ln in lines)
