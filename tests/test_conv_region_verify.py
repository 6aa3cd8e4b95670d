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


# --- each piece of the conv-region verify, exactly (bench/mutation.sh package_verify) -----------------------

Z = torch.linspace(-4.0, 4.0, 101, dtype=torch.float64)


@pytest.mark.parametrize("name, want", [
    ("relu", Z.clamp_min(0.0)), ("silu", torch.nn.functional.silu(Z)), ("gelu", torch.nn.functional.gelu(Z)),
    ("gelu_tanh", torch.nn.functional.gelu(Z, approximate="tanh")), ("", Z)])
def test_the_float64_chain_applies_each_activation(name, want):
    pv = _import_verify()
    assert torch.equal(pv._activation64(name, Z), want)


def test_the_float64_chain_refuses_an_unknown_activation():
    pv = _import_verify()
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        pv._activation64("swish", Z)


def test_a_drawn_activation_follows_its_spec_and_its_generator():
    pv = _import_verify()
    spec = {"dtype": "bfloat16", "shape": [2, 3, 4, 5], "strides": [60, 1, 15, 3]}
    a, b = (pv._drawn(spec, torch.Generator().manual_seed(7), "cpu") for _ in range(2))
    c = pv._drawn(spec, torch.Generator().manual_seed(8), "cpu")
    assert a.dtype == torch.bfloat16 and a.stride() == (60, 1, 15, 3) and a.shape == (2, 3, 4, 5)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_a_passing_row_is_reproducible_from_its_seed(base_doc, tmp_path):
    pv = _import_verify()
    _, _, ops, _, _ = _ops(base_doc, tmp_path, CL)
    op = _residual_op(ops)  # draws the residual too
    digest = op.conv["instances"][0]["digest"]
    rows = [pv.check_conv_instance(op, digest, "cpu", s) for s in (11, 11, 12)]
    assert rows[0] == rows[1] and rows[0]["max_abs"] != rows[2]["max_abs"]
    assert set(rows[0]) == {"reason", "detail", "max_abs", "excess"}
    assert rows[0]["reason"] is None and rows[0]["detail"] == ""


def _one(base_doc, tmp_path):
    _, _, ops, _, _ = _ops(base_doc, tmp_path, CL, torch.bfloat16)
    op = ops[0]
    return op, op.conv["instances"][0]["digest"], op.run_folded


def test_a_failing_call_is_an_error_row(base_doc, tmp_path):
    pv = _import_verify()
    op, digest, _ = _one(base_doc, tmp_path)

    def boom(d, x, r):
        raise RuntimeError("boom")

    op.run_folded = boom
    row = pv.check_conv_instance(op, digest, "cpu", 3)
    assert (row["reason"], row["detail"]) == ("error", "RuntimeError: boom")


def test_an_output_of_another_dtype_alone_is_a_layout_failure(base_doc, tmp_path):
    pv = _import_verify()
    op, digest, real = _one(base_doc, tmp_path)
    op.run_folded = lambda d, x, r: real(d, x, r).float()  # same shape and strides, float32 for bf16
    row = pv.check_conv_instance(op, digest, "cpu", 3)
    o = op.entry["output"]
    got = f"torch.float32 {tuple(o['shape'])} strides {tuple(o['strides'])}"
    assert row["reason"] == "layout" and row["detail"] == (
        f"{got}, the region's {o['dtype']} {tuple(o['shape'])} strides {tuple(o['strides'])}")


def test_a_call_that_changes_its_input_is_caught(base_doc, tmp_path):
    pv = _import_verify()
    op, digest, real = _one(base_doc, tmp_path)

    def mutating(d, x, r):
        out = real(d, x, r)
        x.add_(1)
        return out

    op.run_folded = mutating
    row = pv.check_conv_instance(op, digest, "cpu", 3)
    assert (row["reason"], row["detail"]) == ("input_mutated", "an input changed")


def test_a_nan_the_chain_does_not_have_is_caught(base_doc, tmp_path):
    pv = _import_verify()
    op, digest, real = _one(base_doc, tmp_path)

    def nan(d, x, r):
        out = real(d, x, r)
        out[0, 1, 0, 2] = float("nan")
        return out

    op.run_folded = nan
    row = pv.check_conv_instance(op, digest, "cpu", 3)
    assert (row["reason"], row["detail"]) == ("nan", "NaN/Inf where the float64 chain has none, or the other way round")


def test_an_output_with_no_finite_element_passes_with_no_error(base_doc, tmp_path, monkeypatch):
    """Where the float64 chain is Inf everywhere and so is the output, nothing is compared: 0 error, no excess."""
    pv = _import_verify()
    op, digest, real = _one(base_doc, tmp_path)
    op.run_folded = lambda d, x, r: torch.full_like(real(d, x, r), float("inf"))
    monkeypatch.setattr(pv, "conv_bound", lambda o, d, x, r: (torch.full(tuple(o.entry["output"]["shape"]),
                                                                         float("inf"), dtype=torch.float64),) * 2)
    row = pv.check_conv_instance(op, digest, "cpu", 3)
    assert row == {"reason": None, "detail": "", "max_abs": 0.0, "excess": float("-inf")}


def test_an_error_exactly_at_its_bound_passes(base_doc, tmp_path, monkeypatch):
    pv = _import_verify()
    op, digest, real = _one(base_doc, tmp_path)
    # the chain's value is the output itself and every bound 0: the excess is exactly 0, which is within
    monkeypatch.setattr(pv, "conv_bound", lambda o, d, x, r: (real(d, x, r).double(),
                                                              torch.zeros(tuple(o.entry["output"]["shape"]),
                                                                          dtype=torch.float64)))
    row = pv.check_conv_instance(op, digest, "cpu", 3)
    assert row["reason"] is None and row["excess"] == 0.0


@pytest.mark.parametrize("fmt,dtype", [(torch.contiguous_format, torch.float32), (CL, torch.bfloat16)])
def test_the_bound_is_the_documented_forward_error_bound(base_doc, tmp_path, fmt, dtype):
    """conv_bound on the CPU (no TF32) against the formula of docs/package.md written out here."""
    pv = _import_verify()
    _, _, ops, _, _ = _ops(base_doc, tmp_path, fmt, dtype)
    op = _residual_op(ops)
    digest = op.conv["instances"][0]["digest"]
    form = op.entry["form"]["inputs"]
    gen = torch.Generator().manual_seed(4)
    x, r = pv._drawn(form[op.ix], gen, "cpu"), pv._drawn(form[op.ir], gen, "cpu")
    out, bound = pv.conv_bound(op, digest, x, r)
    w, b, _ = op.folded(digest, x.device)
    conv = torch.ops.aten.convolution.default
    y = conv(x.double(), w.double(), None, *op.args)
    mag = conv(x.double().abs(), w.double().abs(), None, *op.args)
    b64 = b.reshape(-1).double().view(1, -1, 1, 1)
    z = y + b64 + r.double()
    want_out = pv._activation64(op.conv["activation"], z)
    u = pv.UNIT_ROUNDOFF[op.entry["output"]["dtype"]]
    size = y.abs() + b64.abs() + r.double().abs()
    want = (pv.rules.TABLE[op.entry["output"]["dtype"]].atol
            + pv.ACTIVATION_SLOPE[op.conv["activation"]] * (u * 3 * size + w[0].numel() * 2.0 ** -24 * mag)
            + u * want_out.abs())
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(bound, want, rtol=1e-12, atol=0)


def _rows_patch(pv, monkeypatch, rows):
    """check_conv_instance replaced by one returning `rows` in turn, recording its arguments."""
    calls = []

    def fake(op, digest, device, seed):
        calls.append((digest, device, seed))
        return rows[(len(calls) - 1) % len(rows)]

    monkeypatch.setattr(pv, "check_conv_instance", fake)
    return calls


def _verify_setup(pv, base_doc, tmp_path, monkeypatch):
    p, regions, ops, _, _ = _ops(base_doc, tmp_path, CL)
    monkeypatch.setattr(pv, "_PATCHER", p)
    monkeypatch.setitem(sys.modules, "templates.package._compile", cf.COMPILE)
    monkeypatch.setattr(sys.modules["templates.package"], "_compile", cf.COMPILE, raising=False)
    return regions


def test_each_instance_row_reads_its_own_seed_and_its_format(base_doc, tmp_path, monkeypatch):
    pv = _import_verify()
    regions = _verify_setup(pv, base_doc, tmp_path, monkeypatch)
    for r in regions:
        r.pop("compile", None)  # no compile record: checked (only a region compile mode does not use is skipped)
    regions[0]["conv"]["candidate"] = "library:cudnn_convolution_add_relu"  # a label longer than its column
    regions[0]["conv"]["instances"][0]["module"] = "layer1.0.conv1"
    regions[1]["conv"]["instances"][0]["module"] = ""
    ok = {"reason": None, "detail": "", "max_abs": 1.5e-3, "excess": -1.0}
    bad = {"reason": "mismatch", "detail": "|out - ref| 1 above its bound 0.5", "max_abs": 1.0, "excess": 0.5}
    calls = _rows_patch(pv, monkeypatch, [ok, bad])
    lines: list[str] = []
    checks, failures = pv._verify_conv_regions({"regions": regions}, "cpu", 5, say=lines.append)
    n = sum(len(r["conv"]["instances"]) for r in regions)
    assert (checks, failures) == (n, n // 2)
    assert [c[2] for c in calls] == [pv._seed(5, r["id"], i) for r in regions for i in range(len(r["conv"]["instances"]))]
    assert [c[:2] for c in calls] == [(inst["digest"], "cpu") for r in regions for inst in r["conv"]["instances"]]
    r0 = regions[0]
    assert lines[0] == (f"{r0['id']:<7} library:cudnn_convolutio  1.50e-03  PASS  ({r0['conv']['pattern']}, "
                        "layer1.0.conv1)")
    expected, j = [], 0
    for r in regions:
        for i, inst in enumerate(r["conv"]["instances"]):
            row = (ok, bad)[j % 2]
            status = "PASS" if row is ok else "FAIL mismatch: |out - ref| 1 above its bound 0.5"
            expected.append(f"{r['id']:<7} {(r['conv']['candidate'] + f' #{i}')[:24]:<24} {pv._fmt(row['max_abs'], 9)}"
                            f"  {status}  ({r['conv']['pattern']}, {inst.get('module') or inst['digest'][:12]})")
            j += 1
    assert lines == expected
    assert regions[1]["conv"]["instances"][0]["digest"][:12] in lines[len(r0["conv"]["instances"])]


def test_a_region_not_used_or_not_loading_is_one_row_and_the_next_is_still_checked(base_doc, tmp_path, monkeypatch):
    pv = _import_verify()
    regions = _verify_setup(pv, base_doc, tmp_path, monkeypatch)
    ok = {"reason": None, "detail": "", "max_abs": 0.0, "excess": -1.0}
    _rows_patch(pv, monkeypatch, [ok])
    regions[0]["compile"] = {"use": False, "reason": "not faster compiled"}
    lines: list[str] = []
    checks, failures = pv._verify_conv_regions({"regions": regions}, "cpu", 5, say=lines.append)
    assert (checks, failures) == (len(regions[1]["conv"]["instances"]), 0)
    assert lines[0] == f"{regions[0]['id']:<7} {'conv region':<24} skipped: not used (not faster compiled)"
    regions[0]["compile"] = {"use": False}  # a record without its reason
    lines.clear()
    pv._verify_conv_regions({"regions": regions}, "cpu", 5, say=lines.append)
    assert lines[0] == f"{regions[0]['id']:<7} {'conv region':<24} skipped: not used ()"
    regions[0].pop("compile")
    real = cf.COMPILE._register_conv_region

    def refuse(r, p):
        if r.id == regions[0]["id"]:
            raise OSError("no conv runtime")
        return real(r, p)

    monkeypatch.setattr(cf.COMPILE, "_register_conv_region", refuse)
    lines.clear()
    checks, failures = pv._verify_conv_regions({"regions": regions}, "cpu", 5, say=lines.append)
    assert (checks, failures) == (len(regions[1]["conv"]["instances"]), 1)
    assert lines[0] == f"{regions[0]['id']:<7} {'conv region':<24} FAIL load: OSError: no conv runtime"
    monkeypatch.setattr(cf.COMPILE, "_register_conv_region", lambda r, p: (_ for _ in ()).throw(OSError("none")))
    assert pv._verify_conv_regions({"regions": regions}, "cpu", 5, say=lambda line: None) == (0, len(regions))


def test_run_adds_the_conv_rows_to_its_totals(tmp_path, monkeypatch):
    from test_package_verify_checks import FakePatcher

    import hashlib

    pv = _import_verify()
    body = b"# the rules\n"  # the package's copy of the rules, as its digest in the manifest says
    (tmp_path / "_verdict_rules.py").write_bytes(b"# header\n" + pv.HEADER_END + body)
    patcher = FakePatcher()
    patcher.manifest = {"targets": [], "regions": [{"id": "c0", "conv": {}}],
                        "verify_rules": {"source_sha256": hashlib.sha256(body).hexdigest()}}
    monkeypatch.setattr(pv, "_PATCHER", patcher)
    monkeypatch.setattr(pv, "HERE", tmp_path)
    seen = []

    def conv_rows(m, device, seed, say):
        seen.append((m, device, seed, say))
        say("c0 row")
        return 3, 1

    monkeypatch.setattr(pv, "_verify_conv_regions", conv_rows)
    lines: list[str] = []
    assert pv.run("cpu", fresh=1, seed=9, say=lines.append) == 1
    assert seen and seen[0][:3] == (patcher.manifest, "cpu", 9) and "c0 row" in lines
    assert lines[-1] == "FAIL: 0 kernels, 1 failing checks on cpu (3 input sets, seed 9)"


def test_the_bound_counts_one_output_channels_products():
    """K in the bound is the products per output element (in channels / groups x kernel area), not the output
    channels: a 3 -> 5 channel 3x3 convolution with a SiLU, through a stand-in op."""
    from types import SimpleNamespace

    pv = _import_verify()
    gen = torch.Generator().manual_seed(2)
    w, b = torch.randn(5, 3, 3, 3, generator=gen), torch.randn(5, generator=gen)
    op = SimpleNamespace(folded=lambda d, device: (w, b, None), args=([1, 1], [1, 1], [1, 1], False, [0, 0], 1),
                         conv={"activation": "silu"}, entry={"output": {"dtype": "float32"}})
    x = torch.randn(1, 3, 6, 6, generator=gen)
    out, bound = pv.conv_bound(op, "d", x, None)
    conv = torch.ops.aten.convolution.default
    y = conv(x.double(), w.double(), None, *op.args)
    mag = conv(x.double().abs(), w.double().abs(), None, *op.args)
    b64 = b.double().view(1, -1, 1, 1)
    u = 2.0 ** -24
    want = pv.rules.TABLE["float32"].atol + pv.ACTIVATION_SLOPE["silu"] * (
        u * 3 * (y.abs() + b64.abs()) + 27 * 2.0 ** -24 * mag) + u * torch.nn.functional.silu(y + b64).abs()
    torch.testing.assert_close(bound, want, rtol=1e-12, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,dtype", [(torch.contiguous_format, torch.float32), (CL, torch.bfloat16)],
                         ids=["nchw-f32", "cl-bf16"])
def test_every_instance_passes_on_the_gpu(base_doc, tmp_path, fmt, dtype):
    """The CUDA side of the conv-region verify: activations drawn on the GPU, the folded tensors moved there,
    cuDNN's float32 convolution (TF32 where cuDNN allows it, which the bound's TF32 term covers)."""
    pv = _import_verify()
    _, regions, ops, _, _ = _ops(base_doc, tmp_path, fmt, dtype)
    for r, op in zip(regions, ops):
        for i, inst in enumerate(r["conv"]["instances"]):
            row = pv.check_conv_instance(op, inst["digest"], "cuda", 99 + i)
            assert row["reason"] is None and row["excess"] < 0, row
