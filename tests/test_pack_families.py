"""Every CPU kernel family the search starts from, packed into one package, built, and checked by the
package's own `python -m <pkg> verify` against a float64 reference: the generated launchers call
each family correctly (argument order and types, optional inputs, layouts, dtypes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pack"))
import helpers  # noqa: E402

from forge_pack.core.hotspot import Hotspot  # noqa: E402
from forge_pack.core.signature import Signature, TensorSpec, channels_last_strides, contiguous_strides  # noqa: E402


def _spec(dtype, shape, channels_last=False):
    return TensorSpec(dtype, shape, channels_last_strides(shape) if channels_last else contiguous_strides(shape))


def cpu_signatures() -> list[Signature]:
    vec = lambda n, d="float32": _spec(d, (n,))  # noqa: E731
    return [
        Signature("softmax", (("x", _spec("float32", (64, 1000))),), (("dim", 1), ("dtype", None))),
        Signature("softmax", (("x", _spec("bfloat16", (32, 512))),), (("dim", 1), ("dtype", "float32"))),
        Signature("log_softmax", (("x", _spec("float32", (4, 4, 300))),), (("dim", 2), ("dtype", None))),
        Signature("layer_norm", (("x", _spec("float32", (64, 256))), ("weight", vec(256)), ("bias", vec(256))),
                  (("eps", 1e-5), ("normalized_shape", [256]))),
        Signature("layer_norm", (("x", _spec("float32", (8, 96))), ("weight", None), ("bias", None)),
                  (("eps", 1e-5), ("normalized_shape", [96]))),
        Signature("rms_norm", (("x", _spec("bfloat16", (64, 256))), ("weight", vec(256, "bfloat16"))),
                  (("composite", True), ("eps", 1e-6), ("normalized_shape", [256]), ("weight_offset", 1.0))),
        Signature("rms_norm", (("x", _spec("float32", (64, 256))), ("weight", vec(256))),
                  (("composite", False), ("eps", 1e-6), ("normalized_shape", [256]), ("weight_offset", 0.0))),
        Signature("group_norm", (("x", _spec("float32", (2, 32, 8, 8))), ("weight", vec(32)), ("bias", vec(32))),
                  (("eps", 1e-5), ("num_groups", 8))),
        Signature("batch_norm", (("x", _spec("float32", (4, 16, 8, 8), channels_last=True)),
                                 ("running_mean", vec(16)), ("running_var", vec(16)), ("weight", vec(16)),
                                 ("bias", vec(16))), (("eps", 1e-5), ("training", False))),
        Signature("batch_norm", (("x", _spec("float32", (4, 16, 8, 8))), ("running_mean", vec(16)),
                                 ("running_var", vec(16)), ("weight", None), ("bias", None)),
                  (("eps", 1e-5), ("training", False))),
        Signature("adaptive_avg_pool2d", (("x", _spec("float32", (4, 64, 7, 7))),), (("output_size", [1, 1]),)),
        Signature("adaptive_avg_pool2d", (("x", _spec("float32", (4, 64, 7, 7), channels_last=True)),),
                  (("output_size", [1, 1]),)),
    ]


@pytest.mark.slow
def test_every_cpu_family_packs_builds_and_verifies(tmp_path):
    from forge_pack.pack.packager import RunInfo, Winner, stage_package
    from forge_pack.search.propose import ProposeRequest
    from forge_pack.search.families import reference_candidate
    from forge_pack.search.templates_proposer import TemplateProposer
    from forge_pack.core.verdict import Baseline, Timing

    proposer = TemplateProposer()
    winners = []
    for sig in cpu_signatures():
        h = Hotspot(sig, ("F.x",), 1.0, 1.0, 1.0, 0.05, (), "cpu", "tests:FakeNorm" if sig.param("composite") else "")
        cands = [m.candidate for m in proposer.propose(ProposeRequest(h, "cpu", None, max_moves=8))]
        ref = reference_candidate(sig, "cpu")
        for cand in cands + ([ref] if ref is not None else []):
            winners.append(Winner(h, len(winners), len(winners), cand, helpers._evaluation(2.0),
                                  Baseline(Timing(10.0, 0.1, 30), Timing(12.0, 0.1, 30)),
                                  {"evaluations": 1, "verdicts": {"ok": 1}}))
    families = {(w.hotspot.op, w.candidate.family) for w in winners}
    assert len(families) >= 10, families
    info = RunInfo(tmp_path, str(helpers.TINY_MODEL), None, "cpu", None, {}, {}, None)
    out = tmp_path / "cpu_families"
    stage_package(out, "cpu_families", info, winners, {}, [])
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=out, capture_output=True, text=True,
                       env=dict(os.environ, MAX_JOBS="2"), timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-8000:]
    # A fixed seed keeps the run reproducible (these kernels never went through the search).
    r = subprocess.run([sys.executable, "-m", "cpu_families", "verify", "--random", "2", "--seed", "1"],
                       capture_output=True, text=True, env=helpers.env_with(out), timeout=900)
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-3000:]
    assert f"PASS: {len(winners)} kernels" in r.stdout
