"""The examples in docs/candidate-format.md are real candidates that pass."""

import os
import re
import shutil
from pathlib import Path

import pytest

from forge_pack.evaluate import compile as fcompile
from forge_pack.core.candidate import Candidate, extract_embedded_spec, parse_spec
from forge_pack.evaluate.static_check import check

from eval_helpers import hotspot

DOC = Path(__file__).resolve().parent.parent / "docs" / "candidate-format.md"


def _example(lang: str) -> str:
    blocks = re.findall(r"```" + lang + r"\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, f"no {lang} example in {DOC.name}"
    return blocks[0]


def test_doc_json_spec_parses():
    spec = parse_spec(re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S)[0])
    assert spec.kernels[0].name == "softmax_rows" and spec.requires == ("cols % 4 == 0",)


@pytest.mark.slow  # > 10 s on 2 cores
def test_doc_cpu_example_passes_the_evaluator(tmp_path, monkeypatch):
    from forge_pack.evaluate.evaluator import Evaluator
    from forge_pack.evaluate.timing import TimingConfig

    monkeypatch.setenv("FORGE_PACK_CPU_THREADS", "1")
    src = _example("cpp")
    cand = Candidate("group_norm", "cpu", src, parse_spec(extract_embedded_spec(src)), "doc")
    h = hotspot("group_norm", "x: f32[2,32,8,8], num_groups=4, weight: f32[32], bias: f32[32]")
    with Evaluator("cpu", timeout_s=20, timing=TimingConfig(warmup=1, reps=3, flush=False,
                                                            compile_baseline=False), log_dir=tmp_path) as ev:
        e = ev.evaluate(cand, h)
    assert e.verdict.ok, e.verdict.detail


@pytest.mark.skipif(fcompile.nvrtc() is None and shutil.which("nvcc") is None, reason="no CUDA compiler")
def test_doc_cuda_example_passes_static_checks_and_compiles(tmp_path):
    src = _example("cuda")
    cand = Candidate("softmax", "cuda", src, parse_spec(extract_embedded_spec(src)), "doc")
    h = hotspot("softmax", "x: bf16[64,1000], dim=-1, dtype=float32")
    assert check(cand, h.signature) is None
    build = fcompile.compile_candidate(cand, arch="sm_90", cache_dir=tmp_path)
    assert build.ok, build.log
    assert os.path.getsize(build.path) > 0
