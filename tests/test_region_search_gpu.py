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
    for mod in (llama_regions, vae_resblock, conv_bn_block):
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
