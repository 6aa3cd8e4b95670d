"""What every template family and reference kernel produces for a fixed set of signatures and GPUs.

`snapshot()` walks every family of every op and backend: applicability, defaults, score, the
build at the defaults and at every knob moved one notch from them, the instantiated candidate,
the proposer's root moves and a parent's child moves, and the reference kernel. The result is
compared with tests/fixtures/family_outputs.json (tests/test_family_outputs.py), so a change to
the family code that alters a launch spec, a define, a default or a move shows up as a diff.
Regenerate the fixture only for an intended change: `python tests/family_snapshot.py`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from forge_pack.core.hotspot import Hotspot
from forge_pack.search.propose import NodeView, ProposeRequest
from forge_pack.targets.sigparse import parse_signature

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "family_outputs.json"

SIGNATURES = {
    "softmax": ["x: bf16[64,2048], dim=-1, dtype=float32", "x: bf16[256,256], dim=-1, dtype=float32",
                "x: f32[8,65536], dim=-1", "x: f16[33,1000], dim=-1", "x: f32[8,262144], dim=-1",
                "x: bf16[1,8,2048,2048], dim=-1, dtype=float32", "x: bf16[2048,256], dim=-1, dtype=float32",
                "x: bf16[4096,256], dim=-1, dtype=float32", "x: f32[2,1000000], dim=-1", "x: bf16[3,24576], dim=-1",
                "x: f32[100,7], dim=-1", "x: f64[8,128], dim=-1", "x: f32[64,1024], dim=0"],
    "log_softmax": ["x: f32[64,1024], dim=-1", "x: bf16[4,40000], dim=-1, dtype=float32",
                    "x: f16[128,128], dim=-1", "x: f32[1,131072], dim=-1"],
    "group_norm": ["x: bf16[1,64,128,128], num_groups=32, weight: bf16[64], bias: bf16[64]",
                   "x: f32[2,32,16,16], num_groups=8", "x: f16[2,64,15,15], num_groups=4, weight: f16[64], bias: f16[64]",
                   "x: bf16[1,32,256,256], num_groups=2, weight: bf16[32], bias: bf16[32]",
                   "x: f16[2,64,256,256], num_groups=4, weight: f16[64], bias: f16[64]",
                   "x: f32[1,16,256,256], num_groups=1",
                   "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]",
                   "x: bf16[1,512,128,128], num_groups=32, weight: bf16[512], bias: bf16[512]",
                   "x: f32[4,256,64,64], num_groups=32, weight: f32[256], bias: f32[256]",
                   "x: bf16[1,256,512,512], num_groups=32, weight: bf16[256], bias: bf16[256]",
                   "x: f32[1,64,1024,1024], num_groups=8"],
    "instance_norm": ["x: f32[2,8,16,16], weight: f32[8], bias: f32[8]", "x: bf16[3,4,100]",
                      "x: f32[112,64,512,512]", "x: bf16[8,128,128,128], weight: bf16[128], bias: bf16[128]"],
    "batch_norm": ["x: bf16[8,64,28,28], running_mean: bf16[64], running_var: bf16[64], weight: bf16[64], bias: bf16[64]",
                   "x: f32[8,96,7,7], running_mean: f32[96], running_var: f32[96]",
                   "x: bf16[8,64,14,14]{channels_last}, running_mean: bf16[64], running_var: bf16[64], "
                   "weight: bf16[64], bias: bf16[64]",
                   "x: bf16[256,64,112,112], running_mean: f32[64], running_var: f32[64], weight: bf16[64], "
                   "bias: bf16[64]",
                   "x: bf16[256,2048,7,7], running_mean: f32[2048], running_var: f32[2048], weight: bf16[2048], "
                   "bias: bf16[2048]",
                   "x: bf16[256,256,56,56]{channels_last}, running_mean: f32[256], running_var: f32[256], "
                   "weight: bf16[256], bias: bf16[256]",
                   "x: f16[4,3,33,33]{channels_last}, running_mean: f16[3], running_var: f16[3]"],
    "adaptive_avg_pool2d": ["x: bf16[16,256,7,7], output_size=(1,1)", "x: f32[4,64,32,32], output_size=(1,1)",
                            "x: f16[8,512,7,7]{channels_last}, output_size=(1,1)",
                            "x: bf16[256,2048,7,7], output_size=(1,1)",
                            "x: bf16[256,2048,7,7]{channels_last}, output_size=(1,1)",
                            "x: f32[2,3,100,100], output_size=(1,1)", "x: f32[16,2048,7,7]{channels_last}, output_size=(1,1)"],
    "layer_norm": ["x: bf16[64,4096], normalized_shape=(4096,), weight: bf16[4096], bias: bf16[4096]",
                   "x: f32[100,300], normalized_shape=(300,)", "x: f16[8,100000], normalized_shape=(100000,)",
                   "x: bf16[4096,1024], normalized_shape=(1024,), weight: bf16[1024], bias: bf16[1024]",
                   "x: f32[7,33], normalized_shape=(33,)",
                   "x: f32[16,4194304], normalized_shape=(4194304,), weight: f32[4194304], bias: f32[4194304]",
                   "x: bf16[64,197,768]{strides=768,49152,1}, normalized_shape=(768,), weight: bf16[768], "
                   "bias: bf16[768]"],
    "rms_norm": ["x: bf16[64,2048], normalized_shape=(2048,), weight: bf16[2048], eps=1e-6, weight_offset=1.0",
                 "x: f32[30,96], normalized_shape=(96,), eps=1e-6", "x: f16[4,70000], normalized_shape=(70000,), "
                 "weight: f32[70000], eps=1e-6",
                 "x: bf16[4096,4096], normalized_shape=(4096,), weight: bf16[4096], eps=1e-6, weight_offset=1.0",
                 "x: bf16[8,262144], normalized_shape=(262144,), weight: bf16[262144], eps=1e-6, weight_offset=1.0"],
}
# GPU device reports as the evaluator sends them: none (the H200 defaults), the H200's own, a
# 114-SM H100 PCIe, an A100 (164 KB opt-in) and a small GPU (99 KB opt-in).
GPUS = {"default": {}, "h200": {"sm_count": 132, "smem_optin_bytes": 232448},
        "h100_pcie": {"sm_count": 114, "smem_optin_bytes": 232448},
        "a100": {"sm_count": 108, "smem_optin_bytes": 166912},
        "small": {"sm_count": 28, "smem_optin_bytes": 101376}}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _built(b) -> dict | str:
    if isinstance(b, str):
        return b
    return {"params": dict(b.params), "defines": dict(b.defines), "spec": b.spec.to_json()}


def _cand(c) -> dict:
    return {"family": c.family, "params": dict(c.params), "spec": c.spec.to_json(),
            "source_sha": hashlib.sha256(c.source.encode()).hexdigest()[:16], "hash": c.content_hash[:16]}


def _families(api, op: str, backend: str, sig, gpu_name: str) -> dict:
    out = {}
    for fam in api.families(backend):
        if op not in fam.ops:
            continue
        entry: dict = {"applicable": api.applicable(fam, sig)}
        try:
            defaults = api.defaults(fam, sig)
        except Exception as e:  # noqa: BLE001 - some defaults assume an applicable signature
            entry["defaults"] = f"raises {type(e).__name__}"
            out[fam.name] = entry
            continue
        entry["defaults"] = defaults
        entry["score"] = api.score(fam, sig)
        entry["build"] = _built(api.build(fam, sig, defaults))
        moves = {}
        for knob in fam.knobs:
            cur = defaults.get(knob.name)
            if cur not in knob.values:
                continue
            i = knob.values.index(cur)
            for j in (i - 1, i + 1):
                if 0 <= j < len(knob.values):
                    b = api.build(fam, sig, {**defaults, knob.name: knob.values[j]})
                    moves[f"{knob.name}={knob.values[j]}"] = b if isinstance(b, str) else _digest(_built(b))
        entry["moves"] = moves
        if entry["applicable"] is None:
            try:
                entry["candidate"] = _cand(api.instantiate(op, backend, fam.name, sig))
            except ValueError as e:
                entry["candidate"] = f"ValueError: {e}"
        out[fam.name] = entry
    return out


def _proposals(api, sig, backend: str, gpu: dict) -> dict:
    hs = Hotspot(sig, ("test",), 1.0, 100.0, 100.0, 0.5, (), backend)
    roots = api.propose(ProposeRequest(hs, backend, None, gpu=gpu, max_moves=50))
    out = {"roots": [[m.label, m.candidate.content_hash[:16]] for m in roots]}
    if roots:
        parent = NodeView(1, roots[0].candidate, None, 1)
        kids = api.propose(ProposeRequest(hs, backend, parent, gpu=gpu, max_moves=50,
                                          tried_hashes=frozenset({roots[0].candidate.content_hash})))
        out["children"] = [[m.label, m.candidate.content_hash[:16]] for m in kids]
    return out


def snapshot(api) -> dict:
    """{"families": metadata per backend and op, "cases": one entry per backend/GPU/op/signature}."""
    meta = {}
    for backend in ("cuda", "cpu"):
        for op in SIGNATURES:
            meta[f"{backend}|{op}"] = [{"name": f.name, "template": f.template, "doc": f.doc,
                                        "knobs": [[k.name, list(k.values), k.doc] for k in f.knobs]}
                                       for f in api.families(backend) if op in f.ops]
    cases = {}
    for backend in ("cuda", "cpu"):
        for gpu_name, gpu in (GPUS.items() if backend == "cuda" else [("default", {})]):
            for op, texts in SIGNATURES.items():
                for text in texts:
                    sig = parse_signature(op, text)
                    api.use(gpu)
                    fams = _families(api, op, backend, sig, gpu_name)
                    if gpu_name != "default":  # a digest per family keeps the fixture small
                        fams = {name: _digest(e) for name, e in fams.items()}
                    entry = {"families": fams, **_proposals(api, sig, backend, gpu)}
                    if gpu_name == "default":
                        ref = api.reference(sig, backend)
                        entry["reference"] = None if ref is None else _cand(ref)
                    cases[f"{backend}|{gpu_name}|{op}|{text}"] = entry
    return {"families": meta, "cases": cases}


class RegistryApi:
    """The family registry as the snapshot reads it."""

    def __init__(self):
        from forge_pack.search import families as registry
        from forge_pack.search import templates_proposer as tp
        from forge_pack.search.template_kit import Gpu

        self.registry, self.tp, self.Gpu, self.gpu = registry, tp, Gpu, Gpu()

    def use(self, report: dict) -> None:
        self.gpu = self.Gpu.from_report(report)

    def families(self, backend):
        return self.registry.backend_families(backend)

    def applicable(self, fam, sig):
        return fam.applicable(sig, self.gpu)

    def defaults(self, fam, sig):
        return fam.defaults(sig, self.gpu)

    def score(self, fam, sig):
        return fam.score(sig, self.gpu)

    def build(self, fam, sig, params):
        return self.tp._build(fam, sig, params, self.gpu)

    def instantiate(self, op, backend, name, sig):
        return self.tp.instantiate(op, backend, name, None, sig, gpu=self.gpu)

    def propose(self, request):
        return self.tp.TemplateProposer().propose(request)

    def reference(self, sig, backend):
        return self.registry.reference_candidate(sig, backend)


def write(snap: dict) -> None:
    """One case per line: a diff names the signature."""
    lines = ["{", ' "families": ' + json.dumps(snap["families"], sort_keys=True) + ",", ' "cases": {']
    items = sorted(snap["cases"].items())
    lines += [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" + ("," if i < len(items) - 1 else "")
              for i, (k, v) in enumerate(items)]
    FIXTURE.write_text("\n".join(lines + [" }", "}"]) + "\n")


def main() -> int:
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    write(snapshot(RegistryApi()))
    print(f"wrote {FIXTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
