"""Compilation during search: fast, cached by content, parallel, errors as data."""

import shutil
import time
from pathlib import Path

import pytest

from forge_pack.evaluate import compile as fcompile
from forge_pack.core.candidate import Candidate, parse_spec
from forge_pack.evaluate.compile import compile_candidate, compile_many, parse_resources

from eval_helpers import KERNELS, expected_reasons, load_fixture

TEMPLATES = Path(__file__).resolve().parent.parent / "templates" / "kernels"
SPEC = parse_spec('{"kernels": [{"name": "k", "args": ["x", "out", "rows", "cols"]}]}')
CPU_OK = 'extern "C" void k(const float* x, float* out, long long rows, long long cols) { out[0] = x[0]; }\n'
HAS_CUDA_COMPILER = fcompile.nvrtc() is not None or shutil.which("nvcc") is not None


def cpu_candidate(source: str) -> Candidate:
    return Candidate("softmax", "cpu", source, SPEC)


def test_cpu_compile_produces_a_shared_object_and_caches_it(tmp_path):
    cand = cpu_candidate(CPU_OK + "// unique 1\n")
    first = compile_candidate(cand, cache_dir=tmp_path)
    assert first.ok and not first.cached and Path(first.path).is_file()
    assert "g++" in first.cmd and "-fopenmp" in first.cmd
    again = compile_candidate(cand, cache_dir=tmp_path)
    assert again.ok and again.cached and again.path == first.path and again.compile_s == 0.0


def test_cpu_compile_error_is_data_with_the_log(tmp_path):
    build = compile_candidate(cpu_candidate("extern \"C\" void k( { syntax"), cache_dir=tmp_path)
    assert not build.ok and build.path == ""
    assert "error" in build.log
    cached = compile_candidate(cpu_candidate("extern \"C\" void k( { syntax"), cache_dir=tmp_path)
    assert cached.cached and not cached.ok  # failures are cached too


def test_compile_many_runs_in_parallel_and_keeps_order(tmp_path):
    cands = [cpu_candidate(CPU_OK + f"// variant {i}\n") for i in range(4)] + [cpu_candidate("broken(")]
    t0 = time.perf_counter()
    builds = compile_many(cands, max_workers=4, cache_dir=tmp_path)
    assert [b.ok for b in builds] == [True, True, True, True, False]
    assert len({b.key for b in builds}) == 5
    assert time.perf_counter() - t0 < 60


def test_forge_cpu_header_is_on_the_include_path(tmp_path):
    src = '#include "forge_cpu.h"\nextern "C" void k(const forge_bf16* x, float* out, long long r, long long c) ' \
          '{ out[0] = to_float(x[0]); }\n'
    assert compile_candidate(cpu_candidate(src), cache_dir=tmp_path).ok


def test_parse_resources_reads_ptxas_verbose_output():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'softmax_rows' for 'sm_90'
ptxas info    : Function properties for softmax_rows
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 384 bytes cmem[0]
"""
    res = parse_resources(log)
    assert res == {"softmax_rows": {"registers": 40, "spill_stores": 4, "spill_loads": 4, "smem_bytes": 1024,
                                    "stack_bytes": 8}}


def _cuda_sources():
    files = sorted((TEMPLATES / "cuda").glob("reference_*.cu"))
    files += [p for p in sorted(KERNELS.glob("cuda_*.cu")) if not expected_reasons(p) & {"compile_error"}
              and "<<<" not in p.read_text()]
    return files


@pytest.mark.skipif(not HAS_CUDA_COMPILER, reason="neither NVRTC nor nvcc available")
@pytest.mark.parametrize("path", _cuda_sources(), ids=lambda p: p.name)
def test_cuda_sources_compile_for_sm90(path, tmp_path):
    from forge_pack.search.template_kit import CUDA_TYPES

    sources = [path.read_text()]
    if path.name.startswith("reference_"):  # every dtype prelude the reference kernels get: the op kinds'
        # floating dtypes (bool and the integers in CUDA_TYPES are for generated region code only)
        floats = [CUDA_TYPES[d] for d in ("float32", "bfloat16", "float16")]
        sources = [f"#define IN_T {i}\n#define OUT_T {o}\n" + path.read_text() for i in floats for o in floats]
    for src in sources:
        build = compile_candidate(Candidate("softmax", "cuda", src, SPEC), arch="sm_90", cache_dir=tmp_path)
        assert build.ok, build.log
        assert build.resources, "ptxas -v resource usage should be in the log"


@pytest.mark.skipif(fcompile.nvrtc() is None, reason="NVRTC not available")
def test_nvrtc_compiles_a_reduction_kernel_in_well_under_two_seconds(tmp_path):
    src = (TEMPLATES / "cuda" / "reference_softmax.cu").read_text()
    t0 = time.perf_counter()
    build = compile_candidate(Candidate("softmax", "cuda", "#define IN_T __nv_bfloat16\n" + src, SPEC), arch="sm_90",
                              cache_dir=tmp_path)
    assert build.ok and build.cmd.startswith("nvrtc")
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.skipif(not HAS_CUDA_COMPILER, reason="neither NVRTC nor nvcc available")
def test_cuda_compile_error_is_data(tmp_path):
    cand = load_fixture(KERNELS / "cuda_compile_error.cu")
    build = compile_candidate(cand, arch="sm_90", cache_dir=tmp_path)
    assert not build.ok and "expected an expression" in build.log


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_nvcc_fallback_when_nvrtc_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(fcompile, "_nvrtc", None)
    src = "#define IN_T __half\n" + (TEMPLATES / "cuda" / "reference_softmax.cu").read_text()
    build = compile_candidate(Candidate("softmax", "cuda", src, SPEC), arch="sm_90", cache_dir=tmp_path)
    assert build.ok and "nvcc" in build.cmd and build.resources


def test_a_killed_compiler_is_not_cached_as_the_sources_failure(tmp_path, monkeypatch):
    """g++ killed (OOM killer, a signal) or timed out says nothing about the source: the next compile
    must try again, not replay the failure forever."""
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "g++").write_text("#!/bin/sh\nkill -9 $$\n")
    (fake / "g++").chmod(0o755)
    cand = cpu_candidate('extern "C" void k(float* out) { out[0] = 1.f; }')
    real_path = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{real_path}")
    killed = compile_candidate(cand, cache_dir=tmp_path / "cache")
    assert not killed.ok and "-9" in killed.log
    monkeypatch.setenv("PATH", real_path)
    again = compile_candidate(cand, cache_dir=tmp_path / "cache")
    assert again.ok and not again.cached


def test_the_cpu_build_key_covers_every_header_of_the_include_dir(tmp_path, monkeypatch):
    (tmp_path / "forge_cpu.h").write_text("// a\n")
    (tmp_path / "_cpu_prelude.h").write_text("// b\n")
    monkeypatch.setattr(fcompile, "cpu_include_dir", lambda: tmp_path)
    cand = cpu_candidate(CPU_OK)
    before = fcompile.build_key(cand)
    (tmp_path / "_cpu_prelude.h").write_text("// b changed\n")
    assert fcompile.build_key(cand) != before


def test_every_cuda_fixture_meant_to_run_compiles_with_nvrtc_without_a_gpu():
    """NVRTC, not nvcc, builds candidates in the evaluator: a fixture that only nvcc accepts (e.g. one
    using the host macro INFINITY) would be a compile_error on the GPU and prove nothing there."""
    from eval_helpers import expected_reasons, fixture_files, load_fixture

    from forge_pack.evaluate.compile import compile_candidate

    for path in fixture_files("cuda_"):
        if expected_reasons(path) & {"compile_error", "static_check"}:
            continue
        b = compile_candidate(load_fixture(path), arch="sm_90")
        if not b.cmd.startswith("nvrtc"):
            pytest.skip("NVRTC is not loadable here (the build used: " + b.cmd.split()[0] + ")")
        assert b.ok, (path.name, b.log[-2000:])
