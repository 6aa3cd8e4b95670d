"""The CUDA attention family on a real GPU: each candidate judged by the evaluator (float64
reference, fresh / large-logit / masked-row / derived / odd-length sets, NaN parity, a second run
bitwise equal) on causal, masked, GQA, head_dim 64/128/256/512 and both output layouts, over the
knobs that change the code path (stages, block sizes, o_split). Marker `gpu`: skipped without CUDA."""

import pytest

from forge_pack.evaluate.evaluator import Evaluator
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.search.templates_proposer import instantiate

from eval_helpers import hotspot

pytestmark = pytest.mark.gpu

CFG = TimingConfig(warmup=2, reps=10, flush=False, compile_baseline=False)

CASES = [  # (signature, knobs)
    ("x: bf16[1,8,300,128], k: bf16[1,2,300,128], v: bf16[1,2,300,128], causal=True, enable_gqa=True, "
     "scale=0.08838834764831845", {}),
    ("x: bf16[1,8,300,128], k: bf16[1,2,300,128], v: bf16[1,2,300,128], causal=True, enable_gqa=True, "
     "scale=0.08838834764831845", {"stages": 1, "block_m": 64, "block_n": 128}),
    ("x: f16[2,4,130,64], k: f16[2,4,97,64], v: f16[2,4,97,64], mask: f16[2,1,130,97], scale=0.125", {}),
    ("x: f16[2,4,130,64], k: f16[2,4,97,64], v: f16[2,4,97,64], mask: f16[2,1,130,97], scale=0.125",
     {"ldmatrix": 0}),
    ("x: f16[2,4,130,64], k: f16[2,4,97,64], v: f16[2,4,97,64], mask: f16[2,1,130,97], scale=0.125",
     {"ldmatrix": 1}),
    ("x: bf16[1,4,200,256], k: bf16[1,2,200,256], v: bf16[1,2,200,256], mask: bf16[1,1,200,200], "
     "enable_gqa=True, scale=0.0625, softcap=50.0, composite=True", {}),
    ("x: bf16[1,4,200,256], k: bf16[1,2,200,256], v: bf16[1,2,200,256], mask: bf16[1,1,200,200], "
     "enable_gqa=True, scale=0.0625, softcap=50.0, composite=True", {"o_split": 2}),
    ("x: bf16[1,1,1030,512], k: bf16[1,1,1030,512], v: bf16[1,1,1030,512], scale=0.044194173824159216", {}),
    ("x: bf16[1,1,1030,512], k: bf16[1,1,1030,512], v: bf16[1,1,1030,512], scale=0.044194173824159216",
     {"o_split": 4, "stages": 1}),
]
WINDOWED = [  # a sliding window (Gemma's and Mistral's sliding layers): tiles before it skipped, its edge cut per row
    ("x: bf16[1,8,300,128], k: bf16[1,2,300,128], v: bf16[1,2,300,128], causal=True, window=96, enable_gqa=True, "
     "scale=0.08838834764831845, composite=True", {}),
    ("x: bf16[1,8,300,128], k: bf16[1,2,300,128], v: bf16[1,2,300,128], causal=True, window=96, enable_gqa=True, "
     "scale=0.08838834764831845, composite=True", {"stages": 1, "block_m": 64, "block_n": 32}),
    ("x: bf16[1,4,333,256], k: bf16[1,2,333,256], v: bf16[1,2,333,256], causal=True, window=50, enable_gqa=True, "
     "scale=0.0625, softcap=50.0, composite=True", {}),
]
CASES += WINDOWED


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    ev = Evaluator("cuda", workers=1, timeout_s=60, timing=CFG, log_dir=tmp_path_factory.mktemp("workers"))
    yield ev
    ev.close()


@pytest.mark.parametrize("text, knobs", CASES)
def test_the_flash_family_matches_the_float64_reference(evaluator, text, knobs):
    h = hotspot("attention", text, device="cuda")
    cand = instantiate("attention", "cuda", "flash", knobs, h.signature)
    e = evaluator.evaluate(cand, h)
    assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)


def test_the_flash_family_without_its_causal_mask_is_rejected(evaluator):
    h = hotspot("attention", CASES[0][0], device="cuda")
    good = instantiate("attention", "cuda", "flash", {}, h.signature)
    from forge_pack.core.candidate import Candidate

    src = good.source.replace("(causal && (col > row", "(0 && (col > row")
    src = src.replace("const long long kv_end = causal ?", "const long long kv_end = 0 ?")
    assert src != good.source
    e = evaluator.evaluate(Candidate(good.op, good.backend, src, good.spec, good.family, dict(good.params), "user"), h)
    assert not e.verdict.ok and e.verdict.reason == "mismatch", e.verdict


@pytest.mark.parametrize("cut", ["(windowed && row - col >= window)", "(windowed && n0 + BLOCK_N",
                                 "const long long kv_begin = (windowed &&"])
def test_the_flash_family_without_its_window_is_rejected_or_equal(evaluator, cut):
    """Without the per-row cut at the window's edge the kernel is wrong (mismatch). Without a warp's skip of
    the tiles before its window, or without the block's start at its first row's window, the per-row cut
    still hides those keys: the same computation, which must verify."""
    from forge_pack.core.candidate import Candidate

    h = hotspot("attention", WINDOWED[1][0], device="cuda")
    good = instantiate("attention", "cuda", "flash", WINDOWED[1][1], h.signature)
    src = good.source.replace(cut, cut.replace("(windowed", "(0"))
    assert src != good.source
    e = evaluator.evaluate(Candidate(good.op, good.backend, src, good.spec, good.family, dict(good.params), "user"), h)
    if "row - col" in cut:
        assert not e.verdict.ok and e.verdict.reason == "mismatch", e.verdict
    else:
        assert e.verdict.ok, (e.verdict.reason, e.verdict.detail)
