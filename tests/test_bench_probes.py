"""The standalone CUDA probes under bench/ must keep compiling: the next GPU call runs them first."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_pool_probe_compiles_for_hopper_without_spills(tmp_path):
    res = subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-o", str(tmp_path / "probe"),
                          str(ROOT / "bench" / "pool_probe.cu")], capture_output=True, text=True)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert "warning" not in log.lower(), log[-3000:]
    spills = [l for l in log.splitlines() if re.search(r"[1-9]\d* bytes spill (stores|loads)", l)]
    assert not spills, spills
    # every probe kernel reached ptxas (a template never instantiated would silently vanish)
    kernels = set(re.findall(r"Compiling entry function '_Z\d+(\w+?)I", log))
    wanted = {"read_flat", "read_persist", "tile_ld", "tile_cp", "tile_bulk", "tile_atomic", "warp_pipe"}
    assert wanted <= kernels, kernels


def test_kernel_sweeps_region_cases_build_every_listed_variant():
    """bench/kernel_sweep.py's region cases (for a GPU run): each captured region is a contiguous row region and
    every listed variant builds with the parameters it lists (a variant the family refused would be reported
    as invalid on the GPU instead of timed): the default layout (cached rows), MUFU exp and the other layouts."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import kernel_sweep as ks
    from forge_pack.search.templates_proposer import instantiate

    regions = [(text, variants) for op, text, variants in ks.SWEEPS if op == "region"]
    assert len(regions) == 2
    for make, variants in regions:
        sig = make()
        assert sig.param("kind") == "row"
        built = [instantiate("region", "cuda", family, params, sig).params for family, params in variants]
        assert built[0] == instantiate("region", "cuda", "row", None, sig).params and built[0]["cache"] == 1
        assert {p["fast_math"] for p in built} == {0, 1}
        assert {p["threads"] for p in built} == {128, 256, 512, 1024} and {p["vec"] for p in built} == {4, 8}
        assert len({tuple(sorted(p.items())) for p in built}) == len(built)  # no variant twice
        assert all(p == {**p, **params} for p, (_, params) in zip(built, variants))
