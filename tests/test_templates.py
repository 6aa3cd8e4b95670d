"""The template proposer and its kernel families (templates/kernels/{cuda,cpu}/).

- every family instantiates, for every op it serves, into a candidate that parses, round-trips
  through JSON and passes the static checks;
- every CUDA family compiles with ``nvcc -arch=sm_90 -cubin`` (defaults, and its knobs pushed to
  their low and high ends), without register spills at the defaults;
- every CPU family compiles with g++ and passes the evaluator's verification (fresh, adversarial
  and odd-size inputs against float64) in-process;
- proposer moves change exactly one parameter or the family, never repeat, respect max_moves;
- on a GPU (marker ``gpu``): every CUDA family verifies on the issue's shapes and on odd shapes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from forge_pack.evaluate import static_check
from forge_pack.core.candidate import Candidate, evaluate, parse_spec
from forge_pack.core.hotspot import Hotspot
from forge_pack.evaluate.launch import launch_env
from forge_pack.search.propose import NodeView, ProposeRequest
from forge_pack.targets.sigparse import parse_signature
from forge_pack.search import families as registry
from forge_pack.search.template_kit import H200, Family, Gpu, check_spec
from forge_pack.search.templates_proposer import (TemplateProposer, _build, _candidate, applicable_families, families,
                                                  instantiate)
from forge_pack.core.verdict import Evaluation, Verdict

# Signatures per op: several dtypes, layouts, optional inputs and sizes, so that every family
# applies to at least one of them (checked below).
SIGS = {
    "softmax": ["x: bf16[64,2048], dim=-1, dtype=float32", "x: bf16[256,256], dim=-1, dtype=float32",
                "x: f32[8,65536], dim=-1", "x: f16[33,1000], dim=-1"],
    "log_softmax": ["x: f32[64,1024], dim=-1", "x: bf16[4,40000], dim=-1, dtype=float32",
                    "x: f16[128,128], dim=-1"],
    "group_norm": ["x: bf16[1,64,128,128], num_groups=32, weight: bf16[64], bias: bf16[64]",
                   "x: f32[2,32,16,16], num_groups=8", "x: f16[2,64,15,15], num_groups=4, weight: f16[64], bias: f16[64]"],
    "instance_norm": ["x: f32[2,8,16,16], weight: f32[8], bias: f32[8]", "x: bf16[3,4,100]"],
    "batch_norm": ["x: bf16[8,64,28,28], running_mean: bf16[64], running_var: bf16[64], weight: bf16[64], bias: bf16[64]",
                   "x: f32[8,96,7,7], running_mean: f32[96], running_var: f32[96]",
                   "x: bf16[8,64,14,14]{channels_last}, running_mean: bf16[64], running_var: bf16[64], "
                   "weight: bf16[64], bias: bf16[64]"],
    "adaptive_avg_pool2d": ["x: bf16[16,256,7,7], output_size=(1,1)", "x: f32[4,64,32,32], output_size=(1,1)",
                            "x: f16[8,512,7,7]{channels_last}, output_size=(1,1)"],
    "layer_norm": ["x: bf16[64,4096], normalized_shape=(4096,), weight: bf16[4096], bias: bf16[4096]",
                   "x: f32[100,300], normalized_shape=(300,)", "x: f16[8,100000], normalized_shape=(100000,)",
                   "x: f32[6,7,100]{strides=100,600,1}, normalized_shape=(100,), weight: f32[100], bias: f32[100]"],
    "rms_norm": ["x: bf16[64,2048], normalized_shape=(2048,), weight: bf16[2048], eps=1e-6, weight_offset=1.0",
                 "x: f32[30,96], normalized_shape=(96,), eps=1e-6", "x: f16[4,70000], normalized_shape=(70000,), "
                 "weight: f32[70000], eps=1e-6"],
}
OPS = list(SIGS)
# Signatures for the families that apply to none of SIGS (whole-GPU kernels need huge groups); only
# those families are exercised on them: 2 groups (teams of half the grid), 8 groups (teams walking
# several groups each) and fp32 without affine.
LARGE_SIGS = {
    "group_norm": ["x: bf16[1,32,256,256], num_groups=2, weight: bf16[32], bias: bf16[32]",
                   "x: f16[2,64,256,256], num_groups=4, weight: f16[64], bias: f16[64]",
                   "x: f32[1,16,256,256], num_groups=1"],
    # 256 planes of 256 KB (256 MB): the whole-GPU families, resident among them (many planes far beyond L2)
    "instance_norm": ["x: f32[4,64,512,512]"],
}


def _sig(op: str, text: str):
    return parse_signature(op, text)


def _cases(backend: str):
    """(op, signature text, family name) for every family that applies to a listed signature."""
    out = []
    for op in OPS:
        for text in SIGS[op]:
            for fam in applicable_families(_sig(op, text), backend):
                out.append((op, text, fam.name))
    covered = {(op, name) for op, _, name in out}
    for op, texts in LARGE_SIGS.items():
        for text in texts:
            out += [(op, text, f.name) for f in applicable_families(_sig(op, text), backend)
                    if (op, f.name) not in covered]
    return out


def _variant(fam: Family, sig, base: dict, end: int) -> dict:
    """Push every knob toward one end of its domain (0: low, -1: high) while the result stays valid."""
    params = dict(base)
    for knob in fam.knobs:
        values = list(knob.values) if end == 0 else list(reversed(knob.values))
        for v in values:
            if not isinstance(_build(fam, sig, {**params, knob.name: v}), str):
                params[knob.name] = v
                break
    return params


def _variants(backend: str, extremes_everywhere: bool = True) -> list[tuple[str, str, Candidate]]:
    """(kind, where, candidate): defaults for every family x op x signature, plus the knobs' low
    and high ends (for every signature, or only the first one a family applies to)."""
    out, seen, extremes_done = [], set(), set()
    for op, text, name in _cases(backend):
        sig = _sig(op, text)
        fam = registry.family(op, backend, name)
        base = instantiate(op, backend, name, None, sig).params
        kinds = [("default", base)]
        if extremes_everywhere or (op, name) not in extremes_done:
            extremes_done.add((op, name))
            kinds += [("low", _variant(fam, sig, base, 0)), ("high", _variant(fam, sig, base, -1))]
        for kind, params in kinds:
            built = _build(fam, sig, params)
            assert not isinstance(built, str), (op, text, name, kind, built)
            cand = _candidate(fam, sig, built)
            if cand.source not in seen:
                seen.add(cand.source)
                out.append((kind, f"{op} {text} {name} {kind} {cand.label}", cand))
    return out


# ---------------------------------------------------------------- families and instantiation


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_every_op_has_families_and_every_family_applies_somewhere(backend):
    covered = {(op, name) for op, _, name in _cases(backend)}
    for op in OPS:
        infos = families(op, backend)
        assert infos, f"no {backend} family for {op}"
        for info in infos:
            assert (op, info.name) in covered, f"{backend} {op}/{info.name} applies to none of the test signatures"
            assert (Path(__file__).resolve().parent.parent / "templates" / "kernels" / backend / info.template).is_file()
            assert info.params and all(len(v) >= 2 for v in info.params.values()), info


def test_issue_families_exist():
    names = {op: {f.name for f in families(op, "cuda")} for op in OPS}
    assert {"warp_row", "block_row", "online", "multi_row", "split_row", "split_sync"} <= names["softmax"]
    assert names["log_softmax"] == names["softmax"]
    assert {"welford", "two_pass", "split", "split_sync", "split_flow", "resident"} <= names["group_norm"]
    assert {"nchw_plane", "nchw_flat", "nhwc"} <= names["batch_norm"]
    assert {"nchw_lanes", "nchw_tile", "nhwc"} <= names["adaptive_avg_pool2d"]
    assert names["rms_norm"] == {"warp_row", "block_row", "online", "split_row", "resident"}
    assert names["layer_norm"] == names["rms_norm"] | {"strided_row"}  # rms_norm takes no strided x
    knobs = {k for op in OPS for f in families(op, "cuda") for k in f.params}
    assert {"threads", "vec", "items", "lanes", "unroll", "fast_exp", "load_hint", "store_hint", "split"} <= knobs


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_every_family_instantiates_to_a_valid_candidate(backend):
    for op, text, name in _cases(backend):
        sig = _sig(op, text)
        cand = instantiate(op, backend, name, None, sig)
        assert cand.op == op and cand.backend == backend and cand.family == name and cand.origin == "template"
        assert "{{" not in cand.source and "#define" in cand.source
        assert Candidate.from_json(cand.to_json()).content_hash == cand.content_hash
        assert parse_spec(cand.spec.to_json()) == cand.spec
        assert check_spec(cand.spec, launch_env(sig), backend) is None
        verdict = static_check.check(cand, sig)
        assert verdict is None, (op, text, name, verdict.reason, verdict.detail)


def test_long_rows_are_split_over_many_blocks():
    """8 rows of 262,144 must not run on 8 blocks, nor 32 VAE groups on 32 blocks."""
    sig = _sig("softmax", "x: f32[8,262144], dim=-1")
    for name in ("split_row", "split_sync"):
        cand = instantiate("softmax", "cuda", name, None, sig)
        assert evaluate(cand.spec.kernels[0].grid[0], launch_env(sig)) >= 256, name
    vae = _sig("group_norm", "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]")
    for name in ("split", "split_sync", "split_flow"):
        cand = instantiate("group_norm", "cuda", name, None, vae)
        assert evaluate(cand.spec.kernels[0].grid[0], launch_env(vae)) >= 2 * 132, name


def test_few_long_norm_rows_are_split_over_many_blocks_and_tried_first():
    """16 layer_norm rows of 4 M elements (64x256x256 each) must not run on 16 blocks: the first two roots are
    split_row, with at least two blocks per SM, both its kernels covering every row's chunks, and resident (every
    SM's block holding a slice of a row)."""
    for op, text in (("layer_norm", "x: f32[16,4194304], normalized_shape=(4194304,), weight: f32[4194304], "
                                    "bias: f32[4194304]"),
                     ("rms_norm", "x: bf16[8,262144], normalized_shape=(262144,), weight: bf16[262144], eps=1e-6")):
        sig = _sig(op, text)
        roots = TemplateProposer().propose(_request(sig, max_moves=8))
        assert [r.candidate.family for r in roots[:2]] == ["split_row", "resident"], op
        assert evaluate(roots[1].candidate.spec.kernels[0].grid[0], launch_env(sig)) >= 128
        cand = roots[0].candidate
        env = launch_env(sig)
        split = cand.params["split"]
        assert [k.name for k in cand.spec.kernels] == [f"{op}_split_stats", f"{op}_split_norm"]
        assert evaluate(cand.spec.kernels[0].grid[0], env) == evaluate(cand.spec.kernels[1].grid[0], env) >= 2 * 132
        chunk = evaluate(cand.spec.kernels[0].args[-1].split(":", 1)[1], env)
        assert chunk * split >= env["cols"] > chunk * (split - 1) and chunk % cand.params["vec"] == 0
    many = _sig("layer_norm", "x: bf16[4096,8192], normalized_shape=(8192,)")
    assert TemplateProposer().propose(_request(many, max_moves=8))[0].candidate.family != "split_row"


def test_instantiate_rejects_inapplicable_family_and_bad_values():
    sig = _sig("batch_norm", "x: f32[8,96,7,7], running_mean: f32[96], running_var: f32[96]")
    with pytest.raises(ValueError):
        instantiate("batch_norm", "cuda", "nhwc", None, sig)  # the input is NCHW
    sm = _sig("softmax", "x: f32[8,300], dim=-1")
    with pytest.raises(ValueError):
        instantiate("softmax", "cuda", "block_row", {"vec": 8}, sm)  # 32 bytes per f32 load
    with pytest.raises(KeyError):
        instantiate("softmax", "cuda", "no_such_family", None, sm)


def test_the_family_registry_and_proposer_import_without_torch():
    code = ("import sys, forge_pack.search.families as r, forge_pack.search.templates_proposer; "
            "assert len(r.backend_families('cuda')) == 34 and len(r.backend_families('cpu')) == 15; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


def test_registry_finds_families_by_kind_or_op_and_reference_kernels_by_op():
    assert [f.name for f in registry.families("softmax", "cuda")] == \
        ["warp_row", "multi_row", "block_row", "online", "split_row", "split_sync", "resident"]
    assert registry.families("log_softmax", "cpu") == registry.families("softmax", "cpu")
    assert registry.families("adaptive_avg_pool2d", "cuda") == registry.families("avg_pool", "cuda")
    assert registry.kind_of("adaptive_avg_pool2d") == "avg_pool" and registry.kind_of("conv2d") is None
    assert registry.families("conv2d", "cuda") == () and registry.families("softmax", "rocm") == ()
    assert [(f.ops, f.name) for f in registry.backend_families("cuda") if f.co_resident] == \
        [(("softmax", "log_softmax"), "resident"), (("group_norm", "instance_norm"), "resident"),
         (("layer_norm",), "resident"), (("rms_norm",), "resident")]
    assert registry.is_co_resident("group_norm", "cuda", "resident")
    assert registry.is_co_resident("log_softmax", "cuda", "resident")
    assert not registry.is_co_resident("softmax", "cuda", "split_sync")
    assert not registry.is_co_resident("group_norm", "cuda", "split_sync")
    assert not registry.is_co_resident("group_norm", "cpu", "resident")
    assert registry.reference_ops() == ("softmax", "log_softmax", "group_norm", "adaptive_avg_pool2d")
    assert registry.reference_candidate(_sig("layer_norm", SIGS["layer_norm"][1]), "cpu") is None
    ref = registry.reference_candidate(_sig("log_softmax", SIGS["log_softmax"][0]), "cuda")
    assert (ref.op, ref.family, ref.origin) == ("log_softmax", "reference", "reference")
    assert ref.source.startswith("// forge-pack: element types for ") and "#define OUT_T float\n" in ref.source


# ---------------------------------------------------------------- compilation


def _nvcc_compile(cand: Candidate, folder: str) -> tuple[Candidate, int, str]:
    src = Path(folder) / f"{cand.content_hash[:16]}.cu"
    src.write_text(cand.source)
    res = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(src) + ".cubin", str(src)],
                         capture_output=True, text=True)
    return cand, res.returncode, res.stdout + res.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_every_cuda_family_compiles_with_nvrtc_and_nvcc():
    """Every variant (defaults, knobs' extremes) through NVRTC (the evaluator's compiler; its ptxas report
    gives the spills); nvcc (the package's setup.py) too for the first of each op and family: the two
    differ in what the language accepts (NVRTC has no ``__builtin_memcpy``), not per signature."""
    from cuda_build import nvcc

    items, firsts = [], set()
    for kind, where, cand in _variants("cuda", extremes_everywhere=False):
        key = (cand.op, cand.family)
        items.append((kind, where, cand, key not in firsts))
        firsts.add(key)
    assert sum(it[3] for it in items) == len(firsts) >= 20
    failures, spills = [], []
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda it: (it, nvcc(it[2].source, d, it[2].content_hash[:16], it[3])), items))
    for (kind, where, _, _), (rc, log) in results:
        if rc != 0 or "warning" in log:
            failures.append(f"{where}\n{log[-2000:]}")
        if kind == "default" and any("spill" in l and " 0 bytes spill stores" not in l for l in log.splitlines()):
            spills.append(where)
    assert not failures, "\n\n".join(failures[:5])
    assert not spills, spills


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_split_flow_minb_caps_registers_for_more_blocks_per_sm(tmp_path):
    """`minb` must reach ptxas: at unroll 4 split_flow takes more than 64 registers (2 blocks of 256
    threads per SM); minb 4 must fit it in 64 (4 blocks) without spilling."""
    import re

    sig = _sig("group_norm", "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]")
    regs = {}
    for minb in (0, 4):
        cand = instantiate("group_norm", "cuda", "split_flow", {"unroll": 4, "minb": minb}, sig)
        _, rc, log = _nvcc_compile(cand, str(tmp_path))
        assert rc == 0, log[-2000:]
        regs[minb] = int(re.search(r"Used (\d+) registers", log).group(1))
        if minb:
            assert " 0 bytes spill stores" in log, log
    assert regs[0] > 64 >= regs[4], regs


def _cpu_verify(cand: Candidate, sig, build):
    from forge_pack.evaluate.launch import load_module
    from forge_pack.evaluate.verify import fresh_sets, static_sets, verify

    assert build.ok, build.log[-3000:]
    module = load_module("cpu", build.path, [k.name for k in cand.spec.kernels])
    try:
        sets = fresh_sets(sig, "cpu", 0, cand.content_hash, False)
        sets += static_sets(sig, [], None, "cpu", 0, False)[0]
        return verify(module, cand, sets, "cpu")
    finally:
        module.close()


def _where_sig(where: str):
    op = where.split(" ", 1)[0]
    return _sig(op, next(t for t in SIGS[op] + LARGE_SIGS.get(op, []) if t in where))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
def test_every_cpu_family_compiles_and_matches_torch(tmp_path):
    from forge_pack.evaluate.compile import compile_many

    items = _variants("cpu", extremes_everywhere=False)
    builds = compile_many([c for _, _, c in items], cache_dir=tmp_path, max_workers=max(2, os.cpu_count() or 2))
    failures = []
    for (kind, where, cand), build in zip(items, builds):
        verdict = _cpu_verify(cand, _where_sig(where), build)
        if not verdict.ok:
            failures.append(f"{where}: {verdict.reason}: {verdict.detail}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- proposer behaviour


def _request(sig, backend="cuda", parent=None, tried=frozenset(), max_moves=4, evaluation=None, siblings=()):
    hs = Hotspot(sig, ("test",), 1.0, 100.0, 100.0, 0.5)
    node = NodeView(1, parent, evaluation, 1) if parent is not None else None
    return ProposeRequest(hs, backend, node, tried_hashes=frozenset(tried), max_moves=max_moves, siblings=siblings)


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_roots_cover_every_applicable_family_once(backend):
    for op in OPS:
        for text in SIGS[op]:
            sig = _sig(op, text)
            moves = TemplateProposer().propose(_request(sig, backend, max_moves=20))
            names = [m.candidate.family for m in moves]
            assert sorted(names) == sorted(f.name for f in applicable_families(sig, backend)), (op, text)
            assert len({m.candidate.content_hash for m in moves}) == len(moves)
            assert all(m.kind == "root" and m.label.startswith(m.candidate.family) for m in moves)


def test_roots_respect_max_moves_and_tried_hashes():
    sig = _sig("softmax", "x: bf16[256,256], dim=-1, dtype=float32")
    p = TemplateProposer()
    first = p.propose(_request(sig, max_moves=2))
    assert len(first) == 2
    rest = p.propose(_request(sig, max_moves=20, tried={m.candidate.content_hash for m in first}))
    assert not {m.candidate.content_hash for m in first} & {m.candidate.content_hash for m in rest}
    assert len(first) + len(rest) == len(applicable_families(sig, "cuda"))
    # the router shape starts with several short rows per warp
    assert first[0].candidate.family == "multi_row"


def _differs_by_one(a: Candidate, b: Candidate) -> bool:
    fam = registry.family(a.op, a.backend, a.family)
    changed = [k.name for k in fam.knobs if a.params.get(k.name) != b.params.get(k.name)]
    return len(changed) == 1


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_child_moves_change_one_parameter_or_the_family(backend):
    for op, text, name in _cases(backend):
        sig = _sig(op, text)
        parent = instantiate(op, backend, name, None, sig)
        moves = TemplateProposer().propose(_request(sig, backend, parent, tried={parent.content_hash}, max_moves=50))
        hashes = [m.candidate.content_hash for m in moves]
        assert len(set(hashes)) == len(hashes) and parent.content_hash not in hashes
        for m in moves:
            if m.label.startswith("family "):
                assert m.candidate.family != name and m.label == f"family {name}->{m.candidate.family}"
            else:
                knob, change = m.label.split(" ")
                old, new = change.split("->")
                assert m.candidate.family == name and _differs_by_one(parent, m.candidate), m.label
                assert str(parent.params[knob]) == old and str(m.candidate.params[knob]) == new


def test_moves_respect_max_moves_are_deterministic_and_diverse():
    sig = _sig("softmax", "x: bf16[64,2048], dim=-1, dtype=float32")
    parent = instantiate("softmax", "cuda", "block_row", None, sig)
    p = TemplateProposer()
    a = p.propose(_request(sig, parent=parent, tried={parent.content_hash}, max_moves=4))
    b = p.propose(_request(sig, parent=parent, tried={parent.content_hash}, max_moves=4))
    assert [m.label for m in a] == [m.label for m in b]
    assert len(a) == 4
    kinds = {m.label.split(" ")[0] for m in a}
    assert len(kinds) == 4, [m.label for m in a]  # four different knobs (or the family) first
    every = p.propose(_request(sig, parent=parent, tried={parent.content_hash}, max_moves=100))
    assert any(m.label.startswith("family ") for m in every)


def test_repeated_expansion_never_repeats_and_runs_dry():
    sig = _sig("group_norm", "x: f32[2,32,16,16], num_groups=8")
    parent = instantiate("group_norm", "cuda", "welford", None, sig)
    p, tried, total = TemplateProposer(), {parent.content_hash}, 0
    for _ in range(100):
        moves = p.propose(_request(sig, parent=parent, tried=tried, max_moves=3))
        if not moves:
            break
        assert len(moves) <= 3
        new = {m.candidate.content_hash for m in moves}
        assert not new & tried
        tried |= new
        total += len(moves)
    else:
        pytest.fail("the proposer never ran dry")
    assert total >= 5


def test_accuracy_failure_tries_the_accurate_exp_first():
    sig = _sig("softmax", "x: f32[64,1024], dim=-1")
    parent = instantiate("softmax", "cuda", "warp_row", {"fast_exp": 2}, sig)
    bad = Evaluation(Verdict(False, "mismatch", "fresh[0]: 3 elements out of tolerance"))
    moves = TemplateProposer().propose(_request(sig, parent=parent, tried={parent.content_hash}, max_moves=2,
                                                evaluation=bad))
    assert moves[0].label == "fast_exp 2->1"


def test_unsupported_signatures_get_no_moves():
    sig = _sig("softmax", "x: f32[64,1024], dim=0")
    assert TemplateProposer().propose(_request(sig)) == []
    assert TemplateProposer().propose(_request(sig, backend="cpu")) == []


# ---------------------------------------------------------------- on a GPU

ISSUE_SHAPES = [
    ("group_norm", "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]"),
    ("group_norm", "x: bf16[1,512,128,128], num_groups=32, weight: bf16[512], bias: bf16[512]"),
    ("softmax", "x: bf16[1,8,2048,2048], dim=-1, dtype=float32"),
    ("softmax", "x: bf16[2048,256], dim=-1, dtype=float32"),
    ("softmax", "x: bf16[4096,256], dim=-1, dtype=float32"),
    ("softmax", "x: f32[8,262144], dim=-1"),
    ("adaptive_avg_pool2d", "x: bf16[256,2048,7,7], output_size=(1,1)"),
    ("adaptive_avg_pool2d", "x: bf16[256,2048,7,7]{channels_last}, output_size=(1,1)"),
    ("batch_norm", "x: bf16[256,64,112,112], running_mean: f32[64], running_var: f32[64], weight: bf16[64], "
                   "bias: bf16[64]"),
    ("batch_norm", "x: bf16[256,2048,7,7], running_mean: f32[2048], running_var: f32[2048], weight: bf16[2048], "
                   "bias: bf16[2048]"),
    ("batch_norm", "x: bf16[256,256,56,56]{channels_last}, running_mean: f32[256], running_var: f32[256], "
                   "weight: bf16[256], bias: bf16[256]"),
    ("rms_norm", "x: bf16[4096,4096], normalized_shape=(4096,), weight: bf16[4096], eps=1e-6, weight_offset=1.0"),
    ("layer_norm", "x: bf16[4096,1024], normalized_shape=(1024,), weight: bf16[1024], bias: bf16[1024]"),
]


@pytest.fixture(scope="module")
def cuda_evaluator(tmp_path_factory):
    from forge_pack.evaluate.evaluator import Evaluator
    from forge_pack.evaluate.timing import TimingConfig

    ev = Evaluator("cuda", workers=1, timeout_s=120, timing=TimingConfig(warmup=3, reps=30, compile_baseline=False),
                   log_dir=tmp_path_factory.mktemp("workers"))
    yield ev
    ev.close()


def _evaluate_all(ev, items: list[tuple[str, Hotspot, Candidate]]) -> list[str]:
    """Evaluate every (where, hotspot, candidate); the failures. Compiles in parallel first (the
    build cache then serves the evaluator), and appends timings to $OUT/templates_gpu.jsonl."""
    import json

    from forge_pack.evaluate.compile import compile_many

    compile_many([c for _, _, c in items], arch=ev.arch or None)
    failures, log = [], []
    for where, hs, cand in items:
        e = ev.evaluate(cand, hs)
        if not e.verdict.ok:
            failures.append(f"{where}: {e.verdict.reason}: {e.verdict.detail[:800]}")
        log.append({"where": where, "signature": hs.signature.pretty(), "kernel": cand.label,
                    "reason": e.verdict.reason, "median_us": e.timing.median_us if e.timing else None,
                    "bandwidth_fraction": e.bandwidth_fraction})
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / "templates_gpu.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in log)
    return failures


@pytest.mark.gpu
@pytest.mark.parametrize("op,text", ISSUE_SHAPES, ids=lambda v: str(v)[:40])
def test_cuda_families_verify_on_the_issue_shapes(cuda_evaluator, op, text):
    """Every applicable family at its defaults, on the issue's shape (the evaluator also runs odd
    sizes and adversarial inputs of the same signature)."""
    sig = _sig(op, text)
    hs = Hotspot(sig, ("test",), 1.0, 100.0, 100.0, 0.5, (), "cuda")
    items = [(f.name, hs, instantiate(op, "cuda", f.name, None, sig)) for f in applicable_families(sig, "cuda")]
    assert items
    failures = _evaluate_all(cuda_evaluator, items)
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
def test_cuda_family_variants_verify_on_gpu(cuda_evaluator):
    """Defaults on every test signature (f32 / f16 / bf16, with and without affine, channels_last)
    and every knob pushed to its low and high end."""
    items = [(where, Hotspot(_where_sig(where), ("test",), 1.0, 100.0, 100.0, 0.5, (), "cuda"), cand)
             for _, where, cand in _variants("cuda", extremes_everywhere=False)]
    failures = _evaluate_all(cuda_evaluator, items)
    assert not failures, "\n".join(failures)


RESIDENT_CASES = [  # (signature, knobs): teams walking several groups, registers + shared memory
    ("x: f16[2,64,256,256], num_groups=4, weight: f16[64], bias: f16[64]",
     {"teams": 2, "bps": 1, "threads": 256, "regs": 4}),
    ("x: f16[2,64,256,256], num_groups=4, weight: f16[64], bias: f16[64]",
     {"teams": 3, "bps": 2, "threads": 256, "regs": 0}),
    ("x: bf16[1,32,256,256], num_groups=2, weight: bf16[32], bias: bf16[32]",
     {"teams": 1, "bps": 1, "threads": 1024, "regs": 0}),
    ("x: f32[1,16,256,256], num_groups=1", {"teams": 1, "bps": 1, "threads": 512, "regs": 4}),
    # two buffers per block: a team's groups alternate between them (4, and 3 / 3 / 2 groups per team)
    ("x: f16[2,64,256,256], num_groups=4, weight: f16[64], bias: f16[64]",
     {"teams": 2, "bufs": 2, "bps": 1, "threads": 256, "regs": 2}),
    ("x: f16[2,64,256,256], num_groups=4, weight: f16[64], bias: f16[64]",
     {"teams": 3, "bufs": 2, "bps": 2, "threads": 512, "regs": 0, "stagger": 2}),
]


def _roots(sig) -> list[str]:
    """The families of the search's first moves, in order."""
    h = Hotspot(sig, ("test",), 1.0, 100.0, 100.0, 0.5, (), "cuda")
    return [m.candidate.family for m in TemplateProposer().propose(ProposeRequest(h, "cuda", None, max_moves=50))]


def test_resident_group_norm_goes_first_for_huge_groups_few_or_many():
    """One read of each group: first for the VAE's 32 groups of 8 MB and for KernelBench's 896 (where a block
    per group, `welford`, read each twice); groups under RESIDENT_MIN_GROUP never see it."""
    for text in ("x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]",
                 "x: f32[112,64,512,512], num_groups=8, weight: f32[64], bias: f32[64]"):
        assert _roots(_sig("group_norm", text))[0] == "resident", text
    assert "resident" not in _roots(_sig("group_norm", "x: bf16[1,512,128,128], num_groups=32, weight: bf16[512], "
                                                       "bias: bf16[512]"))


def test_resident_fits_groups_on_chip_or_says_why():
    big = _sig("group_norm", "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]")
    cand = instantiate("group_norm", "cuda", "resident", None, big)
    assert cand.params["teams"] == 4  # 4 x 8 MB groups fill the H200's registers + shared memory
    fam = registry.family("group_norm", "cuda", "resident")
    assert "exceed shared memory" in _build(fam, big, {**cand.params, "teams": 8, "regs": 0})
    assert "registers per thread" in _build(fam, big, {**cand.params, "threads": 1024, "bps": 2})
    for text, knobs in RESIDENT_CASES:
        assert not isinstance(_build(fam, _sig("group_norm", text), {**cand.params, **knobs}), str), (text, knobs)


@pytest.mark.gpu
def test_resident_group_norm_variants_verify_on_gpu(cuda_evaluator):
    """Teams that walk several groups (the next group's loads refill registers and shared memory
    while this one is written), one team for the whole grid, and fp32."""
    fam = registry.family("group_norm", "cuda", "resident")
    items = []
    for text, knobs in RESIDENT_CASES:
        sig = _sig("group_norm", text)
        cand = _candidate(fam, sig, _build(fam, sig, {**fam.defaults(sig, H200), **knobs}))
        items.append((f"{text} {cand.label}", Hotspot(sig, ("test",), 1.0, 100.0, 100.0, 0.5, (), "cuda"), cand))
    failures = _evaluate_all(cuda_evaluator, items)
    assert not failures, "\n".join(failures)


# softmax / log_softmax rows held on chip: (op, signature, knobs). Teams walking several rows (ragged: 37 rows
# over 8 and 16 teams), two buffers, a row split into slices that leave the last blocks of a team empty,
# registers only and shared memory only, bf16 in and fp32 out.
SOFTMAX_RESIDENT_CASES = [
    ("softmax", "x: f32[37,98304], dim=-1", {"teams": 8, "bufs": 2, "bps": 1, "threads": 512, "regs": 2}),
    ("log_softmax", "x: f32[37,98304], dim=-1", {"teams": 16, "bps": 2, "threads": 512, "regs": 0}),
    ("softmax", "x: bf16[6,40000], dim=-1, dtype=float32", {"teams": 2, "bps": 1, "threads": 1024, "regs": 0}),
    ("log_softmax", "x: f16[5,4194304], dim=-1", {"teams": 1, "bps": 2, "threads": 256, "regs": 4}),
    ("softmax", "x: f32[64,32768], dim=-1", {"teams": 64, "bps": 1, "threads": 1024, "regs": 2}),
]


def test_softmax_resident_fits_rows_on_chip_orders_itself_by_row_size_or_says_why():
    """KernelBench's 4096 rows of 393216 fp32 (1.5 MB each): 16 teams of 8 blocks, 192 KB of a row per block
    (4 register vectors and 8 shared-memory vectors per thread), tried before `online`, which reads each row twice;
    rows of 128 KB stay with `online` (its second read hits L2); a row too long for the chip is refused."""
    fam = registry.family("softmax", "cuda", "resident")
    kb = _sig("softmax", "x: f32[4096,393216], dim=1")
    cand = instantiate("softmax", "cuda", "resident", None, kb)
    assert (cand.params["teams"], cand.params["regs"], cand.params["threads"], cand.params["bps"]) == (16, 4, 1024, 1)
    assert "#define SLOTS 8\n" in cand.source and "#define LOG 0\n" in cand.source
    assert int(evaluate(cand.spec.kernels[0].grid[0], launch_env(kb))) == 128
    assert _roots(kb)[:2] == ["resident", "online"]
    # 37 rows (a prime): 8 teams, each walking 4 or 5 rows, rather than the one team that divides them
    assert fam.defaults(_sig("softmax", "x: f32[37,98304], dim=-1"), H200)["teams"] == 8
    assert _roots(_sig("softmax", "x: f32[1024,32768], dim=-1"))[-1] == "resident"
    assert "block_row" in fam.applicable(_sig("softmax", "x: f32[1024,24576], dim=-1"), H200)
    assert "16-byte vector" in fam.applicable(_sig("softmax", "x: f32[1024,393217], dim=-1"), H200)
    assert "does not fit" in fam.applicable(_sig("softmax", "x: f32[4,67108864], dim=-1"), H200)
    assert "exceed shared memory" in _build(fam, kb, {**cand.params, "teams": 32, "regs": 0})
    assert "(at most 32)" in _build(fam, kb, {**cand.params, "teams": 64, "regs": 0})
    assert "64 teams for 37 rows" == _build(fam, _sig("softmax", SOFTMAX_RESIDENT_CASES[0][1]),
                                            {**cand.params, "teams": 64})
    for op, text, knobs in SOFTMAX_RESIDENT_CASES:
        sig = _sig(op, text)
        assert fam.applicable(sig, H200) is None, text
        assert not isinstance(_build(fam, sig, {**fam.defaults(sig, H200), **knobs}), str), (text, knobs)


def test_rownorm_resident_goes_first_for_many_rows_beyond_l2_reach_and_fits_kernelbenchs_layer_norm():
    """KernelBench's layer_norm (16 rows of 4M fp32, 16 MB each): 2 teams of 66 blocks, each holding 254 KB of a row,
    tried right after split_row (which won there on an H100: its second read of a row spread over the GPU hits L2);
    1024 rows of 1.5 MB: resident first; rows of 128 KB keep split_row first and resident last."""
    kb = _sig("layer_norm", "x: f32[16,64,256,256], normalized_shape=(64,256,256), weight: f32[64,256,256], "
                            "bias: f32[64,256,256]")
    cand = instantiate("layer_norm", "cuda", "resident", None, kb)
    assert (cand.params["teams"], cand.params["regs"], cand.params["threads"]) == (2, 4, 1024)
    assert "#define SLOTS 12\n" in cand.source and "#define RMS 0\n" in cand.source
    assert int(evaluate(cand.spec.kernels[0].grid[0], launch_env(kb))) == 132
    assert _roots(kb)[:2] == ["split_row", "resident"]
    many = _sig("layer_norm", "x: f32[1024,393216], normalized_shape=(393216,), weight: f32[393216], "
                              "bias: f32[393216]")
    assert _roots(many)[0] == "resident"
    rms = _sig("rms_norm", "x: f32[64,32768], normalized_shape=(32768,), eps=1e-6")
    assert _roots(rms)[0] == "split_row" and _roots(rms)[-1] == "resident"
    fam = registry.family("rms_norm", "cuda", "resident")
    assert "shorter than 32768" in fam.applicable(_sig("rms_norm", "x: f32[64,32760], normalized_shape=(32760,)"), H200)


@pytest.mark.gpu
def test_resident_softmax_variants_verify_on_gpu(cuda_evaluator):
    """Rows held on chip by teams of a persistent grid: every SOFTMAX_RESIDENT_CASES layout verified (the
    evaluator adds odd sizes, whose rows are no multiple of a vector: the element-wise path, and adversarial
    rows: -inf, NaN, huge values)."""
    fam = registry.family("softmax", "cuda", "resident")
    items = []
    for op, text, knobs in SOFTMAX_RESIDENT_CASES:
        sig = _sig(op, text)
        cand = _candidate(fam, sig, _build(fam, sig, {**fam.defaults(sig, H200), **knobs}))
        items.append((f"{op} {text} {cand.label}", Hotspot(sig, ("test",), 1.0, 100.0, 100.0, 0.5, (), "cuda"), cand))
    failures = _evaluate_all(cuda_evaluator, items)
    assert not failures, "\n".join(failures)


def test_persistent_grids_are_sized_for_the_gpu_the_search_runs_on():
    """The evaluator's device report reaches the template proposer: a 114-SM GPU gets a resident
    grid of at most 114 blocks per block-per-SM (132 on the H200, the default when nothing is known),
    and one search's GPU does not leak into the next request."""
    big = _sig("group_norm", "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]")
    h = Hotspot(big, ("test",), 1.0, 100.0, 100.0, 0.5, (), "cuda")

    def resident_grid(gpu: dict) -> int:
        moves = TemplateProposer().propose(ProposeRequest(h, "cuda", None, gpu=gpu, max_moves=50))
        cand = next(m.candidate for m in moves if m.candidate.family == "resident")
        blocks = int(evaluate(cand.spec.kernels[0].grid[0], launch_env(big)))
        return blocks // cand.params["bps"]

    assert resident_grid({}) == 132
    assert resident_grid({"sm_count": 132, "smem_optin_bytes": 232448}) == 132
    assert resident_grid({"sm_count": 114, "smem_optin_bytes": 232448}) <= 114
    assert resident_grid({}) == 132


def test_gpu_report_replaces_only_what_it_says():
    assert Gpu.from_report({}) == Gpu.from_report(None) == H200 == Gpu(132, 227 * 1024, 228 * 1024)
    assert Gpu.from_report({"sm_count": 132, "smem_optin_bytes": 232448}) == H200  # the H200's own report
    a100 = Gpu.from_report({"sm_count": 108, "smem_optin_bytes": 166912})
    assert (a100.sm_count, a100.smem_per_block, a100.smem_per_sm, a100.plan_smem) == (108, 166912, 167936, 166912)
    assert H200.plan_smem == 200 * 1024  # the families' planning cap, under the H200's 227 KB
    # implausible figures keep the default: 8 SMs or fewer, less than CUDA's 48 KB default
    assert Gpu.from_report({"sm_count": 8, "smem_optin_bytes": 1024}) == H200
    assert Gpu.from_report({"sm_count": "132"}) == H200


def test_shared_memory_above_the_gpus_block_limit_is_refused():
    """check_spec bounds dynamic shared memory by the GPU's per-block limit less the kernels'
    static shared memory (1 KB)."""
    sig = _sig("adaptive_avg_pool2d", "x: bf16[16,256,7,7], output_size=(1,1)")
    cand = instantiate("adaptive_avg_pool2d", "cuda", "nchw_tile", None, sig)
    smem = int(evaluate(cand.spec.kernels[0].shared_mem, launch_env(sig)))
    assert smem == 64 * 49 * 2  # 64 planes of 7x7 bf16
    fits = Gpu(132, smem + 1024, smem + 2048)
    assert check_spec(cand.spec, launch_env(sig), "cuda", fits) is None
    small = Gpu(132, smem + 1023, smem + 2048)
    assert check_spec(cand.spec, launch_env(sig), "cuda", small) == \
        "adaptive_avg_pool2d_nchw_tile: more dynamic shared memory than a block may have"


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
def test_cpu_channels_last_pool_is_as_accurate_as_eager_on_a_resnet_head(tmp_path):
    """One float sum per channel, value after value, failed the large-offset set on fp32
    (16,2048,7,7) channels_last: the family now accumulates in double."""
    from forge_pack.evaluate.compile import compile_candidate

    sig = _sig("adaptive_avg_pool2d", "x: f32[16,2048,7,7]{channels_last}, output_size=(1,1)")
    cand = instantiate("adaptive_avg_pool2d", "cpu", "nhwc", {"cblock": 64}, sig)
    verdict = _cpu_verify(cand, sig, compile_candidate(cand, cache_dir=tmp_path))
    assert verdict.ok, verdict.detail
