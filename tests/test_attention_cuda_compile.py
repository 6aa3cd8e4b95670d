"""The CUDA attention family's kernels compile for sm_90 with nvcc and with NVRTC (the evaluator's
compiler), without warnings, and at the family's defaults without register spills: every code path
the GPU tests judge (causal, a read mask, GQA, a soft cap, a sliding window, head_dim 64 to 512 with
o_split), checked here without a GPU, so a kernel that does not build is found before device time.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from forge_pack.search.templates_proposer import instantiate

from cuda_build import nvcc, spills
from eval_helpers import hotspot
from test_attention_gpu import CASES

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _candidates():
    """One candidate per distinct source of the GPU tests' cases, and whether it is at the defaults."""
    out = {}
    for text, knobs in CASES:
        cand = instantiate("attention", "cuda", "flash", knobs, hotspot("attention", text, device="cuda").signature)
        name = cand.content_hash[:12]
        out[name] = (text, cand, not knobs or (name in out and out[name][2]))
    return out


def test_every_flash_code_path_compiles_both_ways_and_spills_nothing_at_its_defaults(tmp_path):
    cands = _candidates()
    assert len(cands) >= 10, len(cands)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda kv: (kv[0], nvcc(kv[1][1].source, str(tmp_path), kv[0])), cands.items()))
    bad = [(cands[n][0], cands[n][1].params, log[-1500:]) for n, (rc, log) in results if rc != 0 or "warning" in log]
    assert not bad, bad
    spilled = [(cands[n][0], cands[n][1].params) for n, (_, log) in results if cands[n][2] and spills(log)]
    assert not spilled, spilled
    # the window's code is compiled in exactly where the signature has a window
    assert {n for n, (text, _, _) in cands.items() if "window=" in text} == \
        {n for n, (_, c, _) in cands.items() if "#define WINDOWED 1" in c.source} != set()
