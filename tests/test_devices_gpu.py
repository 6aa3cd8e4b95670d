"""--gpus on real GPUs: each worker evaluates on its own GPU, and the evaluation names it.
On one GPU this is `--gpus 0`; with two or more visible, the first two."""

from __future__ import annotations

import threading

import pytest

from forge_pack.core.candidate import Candidate
from forge_pack.evaluate.device_pool import DevicePool, cuda_devices
from forge_pack.evaluate.evaluator import Evaluator
from forge_pack.evaluate.judge import Startup
from forge_pack.evaluate.timing import TimingConfig
from forge_pack.search.devices import visible_gpus
from forge_pack.search.families import reference_candidate

from eval_helpers import CUDA_SIGNATURE, hotspot

pytestmark = pytest.mark.gpu


def _variant(cand: Candidate, i: int) -> Candidate:
    return Candidate(cand.op, cand.backend, cand.source + f"\n// variant {i}\n", cand.spec, "reference", {"i": i})


def test_each_gpu_worker_evaluates_on_its_own_gpu_and_the_evaluation_names_it(tmp_path):
    ids = visible_gpus()[:2]
    h = hotspot("softmax", CUDA_SIGNATURE, device="cuda")
    ref = reference_candidate(h.signature, "cuda")
    pool = DevicePool(cuda_devices(ids), Startup(), str(tmp_path))
    with Evaluator("cuda", timeout_s=60, timing=TimingConfig(warmup=5, reps=30, compile_baseline=False),
                   pool=pool) as ev:
        assert ev.device_info()["devices"] == [f"cuda:{i}" for i in ids]
        results = {}

        def run(i):
            results[i] = ev.evaluate(_variant(ref, i), h)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4 * len(ids))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert all(e.verdict.ok for e in results.values()), {i: e.verdict.reason for i, e in results.items()}
    assert {e.extra["device"] for e in results.values()} == {f"cuda:{i}" for i in ids}
