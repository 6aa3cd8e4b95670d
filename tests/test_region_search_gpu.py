"""Region kernels on the GPU: every CUDA family of the test models' regions verifies (captured
shapes moved to CUDA, the same input sets as on the CPU), each timed against eager."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from forge_pack.core.hotspot import Hotspot
from forge_pack.evaluate.evaluator import Evaluator
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.graph.capture import capture
from forge_pack.graph.regions import find_regions
from forge_pack.search.templates_proposer import applicable_families, instantiate
from forge_pack.targets.region_target import signature

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parent / "models" / "regions"))
import conv_bn_block  # noqa: E402
import llama_regions  # noqa: E402
import pool_variants  # noqa: E402
import resnet_stem  # noqa: E402
import vae_resblock  # noqa: E402

CFG = TimingConfig(warmup=2, reps=10, flush=False, compile_baseline=False)


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ev = Evaluator("cuda", workers=1, timeout_s=60, timing=CFG, log_dir=tmp_path_factory.mktemp("workers"))
    yield ev
    ev.close()


def _cuda_regions():
    out = []
    for mod in (llama_regions, vae_resblock, conv_bn_block, resnet_stem, pool_variants):
        model = mod.get_model().cuda()
        inputs = [x.cuda() if hasattr(x, "cuda") else x for x in mod.get_inputs()]
        seen = set()
        for r in find_regions(capture(model, inputs, profile=False)):
            if r.key not in seen:
                seen.add(r.key)
                out.append(r)
    return out


def test_every_cuda_region_family_verifies(evaluator):
    failures = []
    for region in _cuda_regions():
        sig = signature(region)
        h = Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda")
        fams = applicable_families(sig, "cuda")
        assert fams, region.name
        for fam in fams:
            e = evaluator.evaluate(instantiate("region", "cuda", fam.name, None, sig), h)
            if not e.verdict.ok:
                failures.append((region.name, fam.name, e.verdict.reason, e.verdict.detail[:300]))
    assert not failures, failures


# ---------------------------------------------------------------- the pointwise vector path

def _bn_add_relu(dtype: str, size: int, channels_last: bool = False, batch: int = 4):
    """The batch_norm + add + relu region of a basic block on CUDA: (signature, hotspot)."""
    import torch

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = conv_bn_block.get_model().to(getattr(torch, dtype)).to(memory_format=fmt).cuda()
    x = torch.randn(batch, 16, size, size).to(getattr(torch, dtype)).contiguous(memory_format=fmt).cuda()
    (region,) = [r for r in find_regions(capture(model, (x,), profile=False)) if r.pattern == "batch_norm+add+relu"]
    sig = signature(region)
    return sig, Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda")


# (dtype, H = W, channels_last, knobs): vec 8 on bf16 (per-channel parameters once per run: 56*56 % 8
# == 0), vec 4 on fp32, channels_last (parameters as vector loads: C = 16), H*W = 225 with a partial
# last tile (the scalar tail) and parameters read per lane (225 % 8), grid-stride and ilp extremes
VECTOR_CASES = [
    ("bfloat16", 56, False, {"vec": 8, "ilp": 2}),
    ("bfloat16", 56, False, {"vec": 8, "ilp": 4, "threads": 1024, "grid_stride": 1}),
    ("bfloat16", 56, False, {"vec": 2, "ilp": 1, "threads": 64}),
    ("float32", 56, False, {"vec": 4, "ilp": 2}),
    ("float32", 15, False, {"vec": 4, "ilp": 1}),
    ("bfloat16", 15, False, {"vec": 8, "ilp": 2}),
    ("bfloat16", 14, True, {"vec": 8, "ilp": 2}),
    ("float16", 28, True, {"vec": 4, "ilp": 4, "grid_stride": 1}),
]


@pytest.mark.parametrize("dtype,size,cl,knobs", VECTOR_CASES,
                         ids=[f"{c[0]}-{c[1]}{'-cl' if c[2] else ''}-v{c[3]['vec']}i{c[3]['ilp']}" for c in VECTOR_CASES])
def test_vectorised_pointwise_region_verifies(evaluator, dtype, size, cl, knobs):
    sig, h = _bn_add_relu(dtype, size, cl)
    cand = instantiate("region", "cuda", "pointwise", knobs, sig)
    e = evaluator.evaluate(cand, h)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


def test_a_misaligned_input_takes_the_scalar_path_and_verifies(tmp_path):
    """An input whose data starts 2 bytes past a 16-byte boundary (an offset view, as a caller may
    pass one): the kernel's run-time alignment check sends it down the scalar path, and the result
    still matches the float64 reference; the aligned set through the same module verifies too."""
    import torch

    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.launch import load_module
    from forge_pack.evaluate.verify import fresh_sets, make_set, verify

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sig, _ = _bn_add_relu("bfloat16", 56)
    cand = instantiate("region", "cuda", "pointwise", {"vec": 8, "ilp": 2}, sig)
    build = compile_candidate(cand, cache_dir=tmp_path)
    assert build.ok, build.log[-2000:]
    module = load_module("cuda", build.path, [k.name for k in cand.spec.kernels])
    try:
        (aligned,) = fresh_sets(sig, "cuda", 0, cand.content_hash, False)
        tensors = dict(aligned.tensors)
        for name in ("in0", "in5"):  # the two activations, the operands the vector path loads as uint4
            t = tensors[name]
            buf = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
            view = buf[1:1 + t.numel()].view(t.shape)
            view.copy_(t)
            assert view.data_ptr() % 16 == 2
            tensors[name] = view
        shifted = make_set("misaligned", sig, tensors, "cuda")
        v = verify(module, cand, [aligned, shifted], "cuda")
        assert v.ok, (v.reason, v.detail)
        assert [c.input_kind for c in v.checks] == [aligned.kind, "misaligned"]
    finally:
        module.close()


def _sliced_softmax(vec_cols: int = 1003, width: int = 1008):
    """softmax over a column slice of a wider bf16 buffer: rows 16-byte aligned (width % 8 == 0),
    a row length that leaves a tail of vec_cols % 8 columns, an fp32 output stored per element."""
    import torch

    class SlicedSoftmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x[:, :vec_cols].float() * 0.5, -1)

    x = torch.randn(64, width).to(torch.bfloat16).cuda()
    (region,) = find_regions(capture(SlicedSoftmax(), (x,), profile=False))
    sig = signature(region)
    return sig, Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda")


@pytest.mark.parametrize("knobs", [{"vec": 8}, {"vec": 4, "threads": 256, "rows_per_block": 2}, {"vec": 2}],
                         ids=["v8", "v4-rpb2", "v2"])
def test_vectorised_row_region_with_a_tail_verifies(evaluator, knobs):
    sig, h = _sliced_softmax()
    cand = instantiate("region", "cuda", "row", knobs, sig)
    assert "reduction 0: u0=contig" in cand.source
    e = evaluator.evaluate(cand, h)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("vec", [2, 4, 8])
def test_vectorised_rms_norm_row_verifies(evaluator, vec):
    model = llama_regions.get_model().cuda()  # bf16: 64 columns, the weight a vector operand too
    inputs = [x.cuda() if hasattr(x, "cuda") else x for x in llama_regions.get_inputs()]
    regions = [r for r in find_regions(capture(model, inputs, profile=False)) if r.pattern == "rms_norm"]
    assert regions
    sig = signature(regions[0])
    h = Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda")
    e = evaluator.evaluate(instantiate("region", "cuda", "row", {"vec": vec}, sig), h)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


# one row per thread held in registers (cache): KernelBench's RMS norm over NCHW's channels (fp32, bf16; rows not a
# multiple of the block: the grid-stride loop's last block is partial), a per-row output (the channel mean) and a
# two-pass norm (instance-norm-like variance over channels after the mean)
def _channel_region(kind: str, dtype: str, n: int = 3, c: int = 64, size: int = 45):
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "kernelbench"))
    from l1_36_rms_norm import Model as ChannelRms

    class ChannelMean(torch.nn.Module):
        def forward(self, x):
            return x.float().mean(1, keepdim=True)

    class ChannelNorm(torch.nn.Module):
        def forward(self, x):
            m = x.mean(1, keepdim=True)
            d = x - m
            return d * torch.rsqrt((d * d).mean(1, keepdim=True) + 1e-5)

    model = {"rms": ChannelRms(c), "mean": ChannelMean(), "norm": ChannelNorm()}[kind]
    x = torch.randn(n, c, size, size).to(getattr(torch, dtype)).cuda()
    (region,) = find_regions(capture(model, (x,), profile=False))
    sig = signature(region)
    assert sig.param("kind") == "strided", sig.param("kind")
    return sig, Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda")


@pytest.mark.parametrize("kind,dtype,knobs", [
    ("rms", "float32", {"threads": 256}),
    ("rms", "bfloat16", {"threads": 128}),
    ("mean", "float16", {"threads": 64}),
    ("norm", "float32", {"threads": 32}),
], ids=["rms-f32", "rms-bf16", "mean-f16", "norm-f32"])
def test_cached_rows_verify(evaluator, kind, dtype, knobs):
    sig, h = _channel_region(kind, dtype)
    cand = instantiate("region", "cuda", "row", {**knobs, "rows_per_block": knobs["threads"], "cache": 1}, sig)
    e = evaluator.evaluate(cand, h)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("knobs", [{"threads": 256, "rows_per_block": 8}, {"threads": 256, "rows_per_block": 1},
                                   {"threads": 128, "rows_per_block": 8}], ids=["group32", "group256", "group16"])
def test_cached_contiguous_rows_verify(evaluator, knobs):
    """Lanes sharing a row, each holding its runs in registers (cache): a bf16 RMS norm with a weight over 2048
    columns on 45 rows (the last block's dead rows read the last row and store nothing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from kernel_sweep import row_region  # the same region kernel_sweep times

    sig = row_region("rms", 45, 2048)
    cand = instantiate("region", "cuda", "row", {**knobs, "vec": 8, "cache": 1}, sig)
    e = evaluator.evaluate(cand, Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda"))
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


def test_a_cached_row_with_a_partial_run_and_a_tail_verifies(evaluator):
    """softmax over 1003 of 1008 bf16 columns (two reductions), 64 lanes a row at vec 8: a lane's second run is
    past the 1000 vector columns for most lanes (the clamped, dropped read) and 3 columns are the scalar tail."""
    sig, h = _sliced_softmax()
    cand = instantiate("region", "cuda", "row", {"vec": 8, "threads": 256, "rows_per_block": 4, "cache": 1}, sig)
    assert "fp_load_run" in cand.source
    e = evaluator.evaluate(cand, h)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


# ---------------------------------------------------------------- the window kind

def _window_region(mod, dtype: str, channels_last: bool, **inputs):
    """Every window region of a model on CUDA: [(signature, hotspot)]."""
    import torch

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = mod.get_model().to(getattr(torch, dtype)).to(memory_format=fmt).cuda()
    x = mod.get_inputs(**inputs)[0].to(getattr(torch, dtype)).contiguous(memory_format=fmt).cuda()
    out = []
    for r in find_regions(capture(model, (x,), profile=False)):
        assert r.kind == "window", r.pattern
        sig = signature(r)
        out.append((sig, Hotspot(sig, ("region",), 1.0, 1.0, 1.0, 0.5, device="cuda")))
    return out


# (dtype, input size, channels_last, knobs) of the ResNet stem (bn + relu + max_pool2d(3, 2, 1)):
# vec along channels_last's C (16 channels: vec 8 bf16 / 4 fp32 / 2 fp16), ilp and block extremes,
# NCHW one element per thread, and size 30 (pool 8x8: a partial last tile takes the scalar path)
WINDOW_CASES = [
    ("bfloat16", 224, True, {}),
    ("bfloat16", 224, True, {"vec": 8, "ilp": 4, "threads": 1024}),
    ("float32", 224, True, {"vec": 4, "ilp": 2}),
    ("float16", 224, True, {"vec": 2, "ilp": 1, "threads": 64}),
    ("bfloat16", 224, False, {}),
    ("float32", 224, False, {"ilp": 4}),
    ("bfloat16", 30, True, {"vec": 8}),
    # runs along NCHW's W (the pooled output is 56 wide at 224, 8 at 30; the NCHW defaults are wrun 4)
    ("bfloat16", 224, False, {"wrun": 1}),
    ("bfloat16", 224, False, {"wrun": 2}),
    ("bfloat16", 224, False, {"wrun": 4, "ilp": 2}),
    ("float32", 30, False, {"wrun": 4, "threads": 64}),
]


@pytest.mark.parametrize("dtype,size,cl,knobs", WINDOW_CASES,
                         ids=[f"{c[0]}-{c[1]}{'-cl' if c[2] else ''}-{'-'.join(f'{k}{v}' for k, v in c[3].items()) or 'defaults'}"
                              for c in WINDOW_CASES])
def test_window_region_verifies(evaluator, dtype, size, cl, knobs):
    ((sig, h),) = _window_region(resnet_stem, dtype, cl, size=size)
    e = evaluator.evaluate(instantiate("region", "cuda", "window", knobs, sig), h)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


@pytest.mark.parametrize("dtype,cl", [("bfloat16", True), ("float16", False), ("float32", True)])
def test_pool_variant_windows_verify(evaluator, dtype, cl):
    """max with ceil_mode over negative values, avg with and without the padding counted, a
    divisor override, adaptive windows: each at its default knobs (vec 8 along C = 8 for bf16)."""
    failures = []
    for sig, h in _window_region(pool_variants, dtype, cl, size=33):
        e = evaluator.evaluate(instantiate("region", "cuda", "window", None, sig), h)
        if not e.verdict.ok:
            failures.append((sig.slug(), e.verdict.reason, e.verdict.detail[:300]))
    assert not failures, failures


def test_pool_variant_windows_verify_in_runs_along_w(evaluator):
    """The fixed-window pools of pool_variants (NCHW, 15x15 input: pooled W 8) at wrun 2 and 4: the
    ceil-mode last windows, the count without padding, the divisor override, the epilogue input."""
    failures, runs = [], 0
    for sig, h in _window_region(pool_variants, "bfloat16", False, size=15):
        for wrun in (2, 4):
            try:
                cand = instantiate("region", "cuda", "window", {"wrun": wrun}, sig)
            except ValueError:
                continue  # the adaptive pool: windows of varying size
            runs += 1
            e = evaluator.evaluate(cand, h)
            if not e.verdict.ok:
                failures.append((sig.slug(), wrun, e.verdict.reason, e.verdict.detail[:300]))
    assert runs >= 8 and not failures, (runs, failures)


def test_a_misaligned_window_input_takes_the_scalar_path_and_verifies(tmp_path):
    """The stem's activations starting 2 bytes past a 16-byte boundary: the vector path's alignment
    check sends every tile down the scalar path, and the result still matches float64."""
    import torch

    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.launch import load_module
    from forge_pack.evaluate.verify import fresh_sets, make_set, verify

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ((sig, _),) = _window_region(resnet_stem, "bfloat16", True, size=64)
    cand = instantiate("region", "cuda", "window", {"vec": 8}, sig)
    build = compile_candidate(cand, cache_dir=tmp_path)
    assert build.ok, build.log[-2000:]
    module = load_module("cuda", build.path, [k.name for k in cand.spec.kernels])
    try:
        (aligned,) = fresh_sets(sig, "cuda", 0, cand.content_hash, False)
        tensors = dict(aligned.tensors)
        t = tensors["in0"]
        buf = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
        view = buf[1:1 + t.numel()].as_strided(t.shape, t.stride())
        view.copy_(t)
        assert view.data_ptr() % 16 == 2
        tensors["in0"] = view
        shifted = make_set("misaligned", sig, tensors, "cuda")
        v = verify(module, cand, [aligned, shifted], "cuda")
        assert v.ok, (v.reason, v.detail)
    finally:
        module.close()
