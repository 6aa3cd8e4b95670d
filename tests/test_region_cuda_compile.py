"""Generated CUDA region kernels compile for sm_90 with nvcc and with NVRTC (the evaluator's compiler), and the pointwise skeleton's vector
path is what the layout allows: vector loads for stride-1 operands, one load per run for
broadcasts, per-element reads otherwise (no GPU needed: the code and the PTX are inspected).

- every CUDA family of every region of tests/models/regions/*.py and tests/models/*.py (as the
  files define them, and cast to bfloat16) compiles without warnings and, at the defaults,
  without register spills (slow: two hundred NVRTC builds, nvcc for the first source of each
  family, model and dtype; the fast test below compiles the pointwise knobs' extremes on one region);
- the leaf classes over a run of ``vec`` elements, exactly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from forge_pack.search.region_vector import classify
from forge_pack.search.templates_proposer import applicable_families, instantiate

from cuda_build import nvcc as _nvcc, spills as _spills

MODELS = Path(__file__).resolve().parent / "models"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _signatures(path: Path, dtype: str | None) -> list:
    from forge_pack.graph.capture import capture
    from forge_pack.graph.regions import find_regions
    from forge_pack.profile.load import load
    from forge_pack.targets.region_target import signature

    t = load(path, "cpu", dtype)
    out, seen = [], set()
    for r in find_regions(capture(t.module, t.args, t.kwargs, profile=False)):
        if r.key not in seen:
            seen.add(r.key)
            out.append(signature(r))
    return out


def _bn_block_signature(size: int = 56, dtype: str = "bfloat16", channels_last: bool = False):
    """The batch_norm + add + relu region of a basic block, NCHW or channels_last."""
    import torch

    from forge_pack.graph.capture import capture
    from forge_pack.graph.regions import find_regions
    from forge_pack.targets.region_target import signature

    sys.path.insert(0, str(MODELS / "regions"))
    import conv_bn_block

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = conv_bn_block.get_model().to(getattr(torch, dtype)).to(memory_format=fmt)
    x = conv_bn_block.get_inputs(size)[0].to(getattr(torch, dtype)).contiguous(memory_format=fmt)
    (region,) = [r for r in find_regions(capture(model, (x,), profile=False)) if r.pattern == "batch_norm+add+relu"]
    return signature(region)


def test_leaf_classes_over_a_run_follow_the_layout():
    nchw = (4, 16, 56, 56)
    assert classify(nchw, (50176, 3136, 56, 1), 8) == "contig"  # the activations
    assert classify(nchw, (0, 1, 0, 0), 8) == "uniform"  # a per-channel parameter: 3136 % 8 == 0
    assert classify((4, 16, 7, 7), (0, 1, 0, 0), 8) == "lane"  # 49 % 8: the channel changes inside a run
    assert classify((4, 16, 7, 7), (784, 49, 7, 1), 8) == "contig"  # dense: runs never cross a row
    assert classify((4, 7, 7, 16), (0, 0, 0, 1), 8) == "contig"  # channels_last per-channel: C % 8 == 0
    assert classify((4, 7, 7, 12), (0, 0, 0, 1), 8) == "lane"  # C = 12: a run would wrap
    assert classify((4, 7, 7, 12), (0, 0, 0, 1), 4) == "contig"
    assert classify((6, 100), (300, 1), 4) == "contig"  # a slice of a wider buffer: rows 300 apart
    assert classify((6, 100), (301, 1), 4) == "lane"  # rows not 4-aligned
    assert classify((6, 100), (1, 6), 4) == "lane"  # transposed


@needs_nvcc
def test_pointwise_vector_path_loads_16_bytes_and_broadcasts_once_per_run(tmp_path):
    """bf16 NCHW batch_norm + add + relu at the defaults (vec 8, ilp 2): two operands of 8 x bf16
    in one 16-byte load each per run, the output in one 16-byte store, the four per-channel
    parameters loaded once per run and one rsqrt per run (the affine's, shared by the 8 lanes)."""
    sig = _bn_block_signature()
    cand = instantiate("region", "cuda", "pointwise", None, sig)
    assert (cand.params["vec"], cand.params["ilp"]) == (8, 2)
    assert "u0=contig, u1=uniform, u2=uniform, u3=uniform, u4=uniform, u5=contig; output contig" in cand.source
    src = tmp_path / "bn.cu"
    src.write_text(cand.source)
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-std=c++17", "-o", f"{src}.ptx", str(src)], check=True)
    ptx = Path(f"{src}.ptx").read_text()
    # the scalar path (a loop, not unrolled) reads the 6 operands of its element with b16 loads
    assert len(re.findall(r"ld\.global\.nc\.v4\.u32", ptx)) == 2 * 2  # 2 operands x ilp 2
    assert len(re.findall(r"st\.global\.v4\.u32", ptx)) == 2  # ilp 2
    # (16-bit reads are plain loads: ld.global.nc where the compiler proves them read-only, ld.global otherwise)
    assert len(re.findall(r"ld\.global(?:\.nc)?\.[bu]16", ptx)) == 4 * 2 + 6  # params per run + scalar path
    assert len(re.findall(r"rsqrt\.approx", ptx)) == 2 + 1  # one per run + the scalar path's
    rc, log = _nvcc(cand.source, str(tmp_path), "bn_cubin")
    assert rc == 0 and "warning" not in log and not _spills(log), log


@needs_nvcc
def test_pointwise_knob_extremes_compile_without_warnings(tmp_path):
    sigs = {"nchw_bf16": _bn_block_signature(), "cl_bf16": _bn_block_signature(channels_last=True),
            "nchw_f32_7x7": _bn_block_signature(7, "float32")}
    items = []
    for name, sig in sigs.items():
        fp32 = name.endswith("7x7")
        for vec in (1, 2, 4) if fp32 else (1, 2, 4, 8):
            for ilp, threads, gs in ((1, 64, 0), (4, 1024, 1)):
                p = {"vec": vec, "ilp": ilp, "threads": threads, "grid_stride": gs}
                items.append((f"{name}_v{vec}_i{ilp}", instantiate("region", "cuda", "pointwise", p, sig)))
    with pytest.raises(ValueError, match="32 bytes of output per access"):
        instantiate("region", "cuda", "pointwise", {"vec": 8}, sigs["nchw_f32_7x7"])
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda it: (it[0], _nvcc(it[1].source, str(tmp_path), it[0])), items))
    bad = [(name, log[-1500:]) for name, (rc, log) in results if rc != 0 or "warning" in log]
    assert not bad, bad


def _cached_row(sig):
    """The row family with cache 1 at its default layout, or at one row per 1024 threads when a lane would hold too
    many elements there; None when neither builds."""
    for extra in ({}, {"threads": 1024, "rows_per_block": 1}):
        try:
            return instantiate("region", "cuda", "row", {"cache": 1, **extra}, sig)
        except ValueError:
            continue
    return None


@pytest.mark.slow
@needs_nvcc
def test_every_generated_cuda_region_kernel_compiles_with_nvrtc_and_nvcc():
    files = sorted((MODELS / "regions").glob("*.py")) + sorted(MODELS.glob("*.py"))
    items, seen, nvcc_groups = [], set(), set()
    for path in files:
        for dtype in (None, "bfloat16"):
            for sig in _signatures(path, dtype):
                for fam in applicable_families(sig, "cuda"):
                    cand = instantiate("region", "cuda", fam.name, None, sig)
                    if cand.content_hash in seen:
                        continue
                    seen.add(cand.content_hash)
                    # every source through NVRTC (the evaluator's compiler); nvcc too for the first of each
                    # family, model and dtype: the two differ in what the language accepts, not per shape
                    group = (fam.name, path.stem, dtype)
                    items.append((f"{path.stem}/{dtype}/{sig.slug()}/{fam.name}", cand, group not in nvcc_groups))
                    nvcc_groups.add(group)
                    if fam.name == "row":  # both paths: the cached one's generated fp_run, the passes that re-read
                        cached = cand.params["cache"]
                        other = instantiate("region", "cuda", "row", {"cache": 0}, sig) if cached else _cached_row(sig)
                        if other is not None and other.content_hash not in seen:
                            seen.add(other.content_hash)
                            items.append((f"{path.stem}/{dtype}/{sig.slug()}/row-{'uncached' if cached else 'cache'}",
                                          other, False))
    assert len(items) > 40, len(items)
    rows = [(name, cand) for name, cand, _ in items if name.endswith(("/row", "/row-cache", "/row-uncached"))]
    assert sum(cand.params["cache"] == 1 for _, cand in rows) > 10
    assert sum(cand.params["cache"] == 0 for _, cand in rows) > 10
    assert sum(it[2] for it in items) > 20
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda it: (it[0], _nvcc(it[1].source, d, it[1].content_hash[:16], it[2])), items))
    failures = [f"{name}\n{log[-2000:]}" for name, (rc, log) in results if rc != 0 or "warning" in log]
    spills = [name for name, (rc, log) in results if _spills(log)]
    assert not failures, "\n\n".join(failures[:5])
    assert not spills, spills


def _stem_signature(size: int = 64, dtype: str = "bfloat16", channels_last: bool = True):
    """The batch_norm + relu + max_pool2d(3, 2, 1) window region of a ResNet stem."""
    import torch

    from forge_pack.graph.capture import capture
    from forge_pack.graph.regions import find_regions
    from forge_pack.targets.region_target import signature

    sys.path.insert(0, str(MODELS / "regions"))
    import resnet_stem

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = resnet_stem.get_model().to(getattr(torch, dtype)).to(memory_format=fmt)
    x = resnet_stem.get_inputs(size)[0].to(getattr(torch, dtype)).contiguous(memory_format=fmt)
    (region,) = find_regions(capture(model, (x,), profile=False))
    return signature(region)


@needs_nvcc
def test_window_vector_path_loads_each_cell_once_per_channel_run(tmp_path):
    """bf16 channels_last stem at the defaults (vec 8 along C): one 16-byte load per window cell
    (9, unrolled) and one per per-channel parameter (4, before the window loops); the affine's
    rsqrt once per lane (8) plus the scalar path's one, not once per cell; one 16-byte store."""
    sig = _stem_signature()
    cand = instantiate("region", "cuda", "window", None, sig)
    assert cand.params == {"threads": 256, "vec": 8, "ilp": 1, "wrun": 1}
    assert "window reads in0 contig, in3 contig, in4 contig, in1 contig, in2 contig; output contig" in cand.source
    src = tmp_path / "stem.cu"
    src.write_text(cand.source)
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-std=c++17", "-o", f"{src}.ptx", str(src)], check=True)
    ptx = Path(f"{src}.ptx").read_text()
    assert len(re.findall(r"ld\.global\.nc\.v4\.u32", ptx)) == 9 + 4
    assert len(re.findall(r"rsqrt\.approx", ptx)) == 8 + 1
    assert len(re.findall(r"st\.global\.wb\.v4\.u32", ptx)) == 1  # the run's 8 outputs in one 16-byte store


@needs_nvcc
def test_window_knob_extremes_compile_without_warnings(tmp_path):
    sigs = {"cl_bf16": _stem_signature(), "nchw_f32": _stem_signature(18, "float32", False),
            "cl_f16": _stem_signature(18, "float16")}
    items = []
    for name, sig in sigs.items():
        for vec in {"cl_bf16": (1, 8), "nchw_f32": (1,), "cl_f16": (2,)}[name]:
            for ilp, threads in ((1, 64), (4, 1024))[:1 if name == "cl_f16" else 2]:
                p = {"vec": vec, "ilp": ilp, "threads": threads}
                items.append((f"{name}_v{vec}_i{ilp}", instantiate("region", "cuda", "window", p, sig)))
    with pytest.raises(ValueError, match="the innermost output dim is pooled"):
        instantiate("region", "cuda", "window", {"vec": 2}, sigs["nchw_f32"])
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda it: (it[0], _nvcc(it[1].source, str(tmp_path), it[0])), items))
    bad = [(name, log[-1500:]) for name, (rc, log) in results if rc != 0 or "warning" in log or _spills(log)]
    assert not bad, bad


@needs_nvcc
@pytest.mark.parametrize("wrun,cells", [(1, 9), (2, 15), (4, 27)])
def test_window_runs_along_w_read_each_cell_of_the_overlapping_windows_once(tmp_path, wrun, cells):
    """bf16 NCHW stem (3x3 / 2): a run of wrun outputs along W reads 3 rows of (wrun - 1) * 2 + 3
    columns, each once (9, 15, 27 loads), the 4 per-channel parameters once, one rsqrt, wrun stores;
    and it compiles without warnings or spills with nvcc and NVRTC at the knobs' extremes."""
    sig = _stem_signature(64, "bfloat16", False)
    cand = instantiate("region", "cuda", "window", {"wrun": wrun}, sig)
    src = tmp_path / "stem.cu"
    src.write_text(cand.source)
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-std=c++17", "-o", f"{src}.ptx", str(src)], check=True)
    ptx = Path(f"{src}.ptx").read_text()
    assert len(re.findall(r"ld\.global\.nc\.\w+", ptx)) == cells + 4
    assert len(re.findall(r"rsqrt\.approx", ptx)) == 1
    assert len(re.findall(r"st\.global\.\w+", ptx)) == wrun
    for ilp, threads in ((1, 64), (4, 1024)):
        knobs = {"wrun": wrun, "ilp": ilp, "threads": threads}
        rc, log = _nvcc(instantiate("region", "cuda", "window", knobs, sig).source, str(tmp_path), f"w{wrun}_{ilp}")
        assert rc == 0 and "warning" not in log and not _spills(log), log[-2000:]


@needs_nvcc
def test_16_bit_loads_do_not_use_the_speculable_asm_overloads(tmp_path):
    """cuda_bf16.h's and cuda_fp16.h's own __ldg overloads are plain ``asm`` (no ``volatile``): the
    compiler may run them ahead of the condition that guards them, and a window kernel's reads of
    padding cells (``ok ? fp_ld(..) : 0``) were hoisted that way, reading before the input's start
    (an illegal address on the H100, wrun 4); _region.cuh now reads 16-bit elements with plain loads. Every load the kernel headers make goes through a
    probe that rejects a 16-bit float element type: fp_ld and fp_ldv of _region.cuh, load1 and ld_raw
    of _prelude.cuh, for float, bf16 and fp16."""
    kernels = Path(__file__).resolve().parent.parent / "templates" / "kernels" / "cuda"
    probe = """#include <cuda_fp16.h>
#include <cuda_bf16.h>
template <typename T> struct fp_probe_ok { static constexpr bool v = true; };
template <> struct fp_probe_ok<__nv_bfloat16> { static constexpr bool v = false; };
template <> struct fp_probe_ok<__half> { static constexpr bool v = false; };
template <> struct fp_probe_ok<__nv_bfloat162> { static constexpr bool v = false; };
template <> struct fp_probe_ok<__half2> { static constexpr bool v = false; };
#define FP_PROBE(name) template <typename T> __device__ T fp_probe_##name(const T* p) { \\
  static_assert(fp_probe_ok<T>::v, #name " of a 16-bit float: a non-volatile asm the compiler may speculate"); \\
  return name(p); }
FP_PROBE(__ldg) FP_PROBE(__ldcg) FP_PROBE(__ldca) FP_PROBE(__ldcs) FP_PROBE(__ldlu) FP_PROBE(__ldcv)
#define __ldg fp_probe___ldg
#define __ldcg fp_probe___ldcg
#define __ldca fp_probe___ldca
#define __ldcs fp_probe___ldcs
#define __ldlu fp_probe___ldlu
#define __ldcv fp_probe___ldcv
"""
    body = "\n".join(f"template __device__ void fp_probe_use<{t}>(const {t}*, float*);"
                     for t in ("float", "__nv_bfloat16", "__half"))
    src = (probe + (kernels / "_region.cuh").read_text() + "\n"
           + (kernels / "_prelude.cuh").read_text() + "\n"
           + """template <typename T> __device__ void fp_probe_use(const T* p, float* y) {
  y[0] = fp_ld(p) + load1(p);
  fp_ldv<2>(p, y + 1);
  typedef typename Raw<sizeof(T)>::type R;
  y[3] = (float)ld_raw<1>(reinterpret_cast<const R*>(p)) + (float)ld_raw<2>(reinterpret_cast<const R*>(p));
}
""" + body + "\n")
    rc, log = _nvcc(src, str(tmp_path), "probe")
    assert rc == 0, log[-3000:]
    # the probe bites: cuda_bf16.h's own overload, called as the header used to, is rejected
    bad = src + "__device__ float fp_probe_old(const __nv_bfloat16* p) { return __bfloat162float(__ldg(p)); }\n"
    rc, log = _nvcc(bad, str(tmp_path), "probe_bad")
    assert rc != 0 and "non-volatile asm" in log, log[-3000:]


def _channel_rms_signature(n: int, size: int, channels: int = 8):
    """KernelBench's RMS norm over the channels of NCHW (8 channels unless told): a strided region of n * size^2
    rows."""
    import torch

    from forge_pack.graph.capture import capture
    from forge_pack.graph.regions import find_regions
    from forge_pack.targets.region_target import signature

    sys.path.insert(0, str(MODELS.parent.parent / "bench" / "kernelbench"))
    from l1_36_rms_norm import Model

    (region,) = find_regions(capture(Model(channels), (torch.randn(n, channels, size, size),), profile=False))
    return signature(region)


@needs_nvcc
def test_a_strided_region_with_rows_to_fill_the_gpu_reduces_one_row_per_thread(tmp_path):
    """KernelBench's RMS norm over channels ran at 57% of copy bandwidth with 8 lanes per row (a warp read 4
    neighbours per channel: half of every sector unused): with enough rows, the default is one row per thread,
    and it compiles without warnings or spills; with few rows, lanes still share a row."""
    from forge_pack.search.families import region as fam
    from forge_pack.search.template_kit import H200

    many = _channel_rms_signature(2, 512)  # 524 288 rows
    few = _channel_rms_signature(1, 64)  # 4 096 rows
    assert many.param("kind") == few.param("kind") == "strided"
    assert 2 * 512 * 512 >= fam.STRIDED_ROWS_PER_SM * H200.sm_count > 64 * 64
    cand = instantiate("region", "cuda", "row", None, many)
    assert cand.params["threads"] == cand.params["rows_per_block"] == 256 and cand.params["cache"] == 1
    small = instantiate("region", "cuda", "row", None, few)
    assert small.params["threads"] // small.params["rows_per_block"] > 1
    rc, log = _nvcc(cand.source, str(tmp_path), "rms_one_row_per_thread")
    assert rc == 0 and "warning" not in log and not _spills(log), log


def _ptx(source: str, folder: Path, name: str) -> str:
    src = folder / f"{name}.cu"
    src.write_text(source)
    res = subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-std=c++17", "-o", f"{src}.ptx", str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return Path(f"{src}.ptx").read_text()


@needs_nvcc
def test_a_cached_row_reads_its_inputs_once_for_every_pass_and_the_epilogue(tmp_path):
    """KernelBench's channel RMS norm (64 channels, fp32), at the strided default (one row per thread, cache): the
    row's 64 elements are loaded once each (64 ld.global in the PTX: the mean of squares and the division share
    them) and stored once, without spills; with cache 0 the same layout loads in two loops (the pass, unrolled by
    2, and the epilogue). Past the group's cap of elements a lane may hold, cache is refused."""
    from forge_pack.search.families import region as fam

    sig = _channel_rms_signature(2, 384, channels=64)  # 294 912 rows
    assert sig.param("kind") == "strided"
    cand = instantiate("region", "cuda", "row", None, sig)
    assert cand.params["cache"] == 1 and cand.params["threads"] == cand.params["rows_per_block"]
    ptx = _ptx(cand.source, tmp_path, "cached")
    assert len(re.findall(r"\bld\.global", ptx)) == 64, ptx[-3000:]
    assert len(re.findall(r"\bst\.global", ptx)) == 64
    rc, log = _nvcc(cand.source, str(tmp_path), "cached_build")
    assert rc == 0 and "warning" not in log and not _spills(log), log
    uncached = instantiate("region", "cuda", "row", {"cache": 0}, sig)
    assert len(re.findall(r"\bld\.global", _ptx(uncached.source, tmp_path, "uncached"))) < 64
    wide = _channel_rms_signature(1, 8, channels=fam.CACHE_ELEMS + 8)
    with pytest.raises(ValueError, match=f"at most {fam.CACHE_ELEMS} elements"):
        instantiate("region", "cuda", "row", {"cache": 1, "threads": 128, "rows_per_block": 128}, wide)


def _rms_row_signature(cols: int = 2048):
    """An RMS norm written inline over the last dim of 64 bf16 rows (an LLM's), with a weight: a contiguous row
    region (bench/kernel_sweep.py's region case)."""
    sys.path.insert(0, str(MODELS.parent.parent / "bench"))
    from kernel_sweep import row_region

    return row_region("rms", 64, cols)


def test_the_contiguous_row_default_caches_a_row_its_lanes_can_hold():
    """cache=1 is the contiguous rows' default where each lane's runs fit CACHE_ELEMS (as fast or faster in every pair
    of bench/results/kernel_sweep_region.md); a row of 393 216 bf16 columns (KernelBench's softmax) is 384 per lane
    at the default's 1024 threads of 8: not cached, and a cached build of it is refused."""
    from forge_pack.search.families import region as fam

    for cols in (2048, 65536):
        p = instantiate("region", "cuda", "row", None, _rms_row_signature(cols)).params
        assert p["cache"] == 1 and fam.cached_elements(cols, p) <= fam.CACHE_ELEMS, (cols, p)
    huge = _rms_row_signature(393216)
    p = instantiate("region", "cuda", "row", None, huge).params
    assert p["cache"] == 0 and (p["threads"], p["rows_per_block"], p["vec"]) == (1024, 1, 8)
    with pytest.raises(ValueError, match=f"at most {fam.CACHE_ELEMS} elements"):
        instantiate("region", "cuda", "row", {"cache": 1}, huge)


@needs_nvcc
@pytest.mark.parametrize("threads,rows_per_block,runs", [(256, 1, 1), (256, 8, 8), (256, 16, 16)])
def test_lanes_sharing_a_cached_row_load_each_run_once(tmp_path, threads, rows_per_block, runs):
    """A bf16 RMS norm of 2048 columns, 8 per vector: with cache each lane reads its runs of x and of the weight
    once (2 x runs 16-byte loads in the PTX), the mean of squares and the epilogue computing from registers; the
    group reduction's shuffles sit between them, which kept the compiler from merging the epilogue's reloads of x
    (3 x runs when the kernel only unrolled them). Compiles without spills at 16 runs of 8 per lane."""
    from forge_pack.search.families import region as fam

    sig = _rms_row_signature()
    p = {"threads": threads, "rows_per_block": rows_per_block, "vec": 8, "cache": 1}
    assert fam.cached_elements(2048, p) == runs * 8
    cand = instantiate("region", "cuda", "row", p, sig)
    ptx = _ptx(cand.source, tmp_path, "row_cached")
    assert len(re.findall(r"\bld\.global\.nc\.v4", ptx)) == 2 * runs, ptx[-3000:]
    rc, log = _nvcc(cand.source, str(tmp_path), "row_cached_build", with_nvcc=False)
    assert rc == 0 and "warning" not in log and not _spills(log), log
