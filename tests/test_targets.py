"""The target registry as a whole: every kind is complete and tested, the shipped runtime is
self-contained, and the torch-free parts stay torch-free."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from forge_pack.evaluate import verdict_rules
from forge_pack.targets import inputs, registry

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "forge_pack" / "targets"


@pytest.mark.parametrize("module", ["forge_pack.search.mcts", "forge_pack.core.signature, forge_pack.core.candidate, "
                                    "forge_pack.core.hotspot, forge_pack.core.verdict, forge_pack.core.errors",
                                    "forge_pack.targets.registry, forge_pack.targets.abi", "forge_pack.llm.prompts"])
def test_the_search_the_core_the_abi_and_the_prompts_import_no_torch(module):
    code = (f"import sys, {module}; from forge_pack.targets import registry, abi; "
            "[abi.ABIS[n].doc for n in registry.NAMES]; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; assert not bad, bad[:5]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_kind_has_its_own_test_file():
    for module in registry.KIND_MODULES:
        name = module.__name__.rpartition(".")[2]
        assert (ROOT / "tests" / "targets" / f"test_{name}.py").is_file(), name


@pytest.mark.parametrize("name", registry.NAMES)
def test_every_kind_is_complete_and_consistent(name):
    s = registry.get(name)
    assert s.tensors[0] == "x" and len(set(s.tensors)) == len(s.tensors)
    assert set(s.own_params) <= set(s.params) and set(s.scalars) <= set(s.params)
    assert set(s.tolerances) <= set(verdict_rules.TABLE) and all(r.reason for r in s.tolerances.values())
    assert s.adversarial and set(s.adversarial) <= set(inputs.ADVERSARIAL) | set(inputs.ADVERSARIAL_SETS)
    assert set(s.draws) <= set(s.tensors)
    assert s.doc and s.bind is not None
    labels = [p.label for p in s.call_paths]
    assert labels[0].startswith("F.") and len(set(labels)) == len(labels)
    for p in s.call_paths:  # nn.* modules reach the kind through its F.* path, which is patched
        assert p.style != "module" or p.via == labels[0]


def test_kind_names_are_unique_across_modules():
    names = [s.name for m in registry.KIND_MODULES for s in m.SPECS]
    assert len(names) == len(set(names)) == len(registry.SPECS)
    with pytest.raises(KeyError, match="unknown target kind 'conv2d'"):
        registry.get("conv2d")


def _relative_imports(module: str) -> set[str]:
    tree = ast.parse((TARGETS / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
    return found


def test_the_shipped_runtime_is_closed_under_its_own_imports():
    shipped = set(registry.RUNTIME_MODULES)
    for module in shipped:
        missing = _relative_imports(module) - shipped
        assert not missing, (module, missing)
    # forge-pack's own views (over Signature) are not shipped: they import forge_pack
    assert not {"abi", "ops", "sigparse"} & shipped


def test_a_kind_defined_outside_the_registry_runs_through_the_rules_like_any_other():
    """A region (a fused chain from the model's graph) is one more TargetSpec: the rules, the input
    generators and the derived sets take it by value, never by name."""
    import torch

    from forge_pack.targets.inputs import dim_rows, permute_rows_and_columns
    from forge_pack.targets.spec import TargetSpec, Tolerance

    def reference(params, t, lookup):
        return torch.softmax(t["x"] * params["scale"] + t["mask"], -1)

    def eager(params, out_dtype, lookup):
        return lambda t: torch.softmax(t["x"].float() * params["scale"] + t["mask"], -1)

    region = TargetSpec(
        name="scale_mask_softmax", tensors=("x", "mask"), scalars=("scale",), params=("scale",), own_params=(),
        doc="out = softmax(x * scale + mask) over the last dim", size_vars=lambda sig: {}, supports=lambda sig: None,
        float64_reference=reference, eager_call=eager,
        tolerances={"float32": Tolerance(1e-8, 1e-4, "probabilities ~1/cols can be tiny")}, draws={},
        adversarial=("large", "neg_inf_rows"), rows=lambda p, xf: dim_rows(xf, -1),
        permute=lambda p, xf, others, gen: permute_rows_and_columns(lambda v: dim_rows(v, -1), xf, others, gen),
        odd_shapes=lambda sig: [])
    plain = [("x", ("float32", (6, 16), (16, 1))), ("mask", ("float32", (6, 16), (16, 1)))]
    params = {"scale": 0.125}
    for kind in ("fresh", *region.adversarial):
        t = region.make_inputs(plain, kind, torch.Generator().manual_seed(1), "cpu")
        ref = region.reference64(params, t)
        out = region.eager(params, "float32")(t)
        mag = verdict_rules.magnitude(region, t)
        allow = verdict_rules.allowance(out, ref, "float32", region, mag)
        if allow is None:  # eager itself breaks NaN/Inf parity (a fully masked row): skipped, as for any kind
            continue
        check, reason, _ = verdict_rules.judge_output(out, ref, "float32", region, allow, kind, mag)
        assert reason is None and check.atol == 1e-8, kind
    for kind in verdict_rules.DERIVED_KINDS:
        src = region.make_inputs(plain, "fresh", torch.Generator().manual_seed(2), "cpu")
        d = verdict_rules.derive_inputs(region, params, kind, src, torch.Generator().manual_seed(3))
        assert set(d) == {"x", "mask"} and d["x"].shape == (6, 16), kind
    assert verdict_rules.tolerance(region, "bfloat16") == verdict_rules.TABLE["bfloat16"]


@pytest.mark.parametrize("op, text, cols", [
    ("layer_norm", "x: f32[3,4,96,96], weight: f32[4,96,96], bias: f32[4,96,96], normalized_shape=[4,96,96]", 36864),
    ("layer_norm", "x: f32[5,4,96,96], normalized_shape=[4,96,96]", 36864),
    ("group_norm", "x: f32[2,8,96,96], weight: f32[8], bias: f32[8], num_groups=2", 36864),
    ("group_norm", "x: f32[2,8,96,96], num_groups=2", 36864),
])
def test_a_long_row_float64_reference_is_the_fused_ops_result_and_leaves_its_inputs_alone(op, text, cols):
    """Rows of LONG_ROW elements or more are normalised by torch's reductions (the fused kernel puts
    one block on each row: a few huge rows crawl); the result must be the fused op's, affine included."""
    import torch
    import torch.nn.functional as F

    from forge_pack.targets import norm_common
    from forge_pack.targets.sigparse import parse_signature

    assert cols >= norm_common.LONG_ROW
    sig = parse_signature(op, text)
    g = torch.Generator().manual_seed(1)
    t = {n: (torch.randn(s.shape, generator=g, dtype=torch.float64) * 3 + 1 if s is not None else None)
         for n, s in sig.inputs}
    before = {n: v.clone() for n, v in t.items() if v is not None}
    called = []
    ref = registry.spec_for(sig).reference64(dict(sig.params), t, lookup=lambda *a: called.append(a))
    assert not called  # the fused op was not used
    p = dict(sig.params)
    want = (F.layer_norm(t["x"], tuple(p["normalized_shape"]), t.get("weight"), t.get("bias"), p["eps"])
            if op == "layer_norm" else F.group_norm(t["x"], p["num_groups"], t.get("weight"), t.get("bias"), p["eps"]))
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)
    assert all(torch.equal(t[n], v) for n, v in before.items())


@pytest.mark.parametrize("op, text, fused", [
    ("layer_norm", "x: f32[2,32768], normalized_shape=[32768]", False),  # exactly LONG_ROW: reductions
    ("layer_norm", "x: f32[2,32767], normalized_shape=[32767]", True),
    ("group_norm", "x: f32[1,1,32768], num_groups=1", False),  # one sample, one group of LONG_ROW
    ("group_norm", "x: f32[2,2,8192], num_groups=2", True),  # groups of 8192 over 2 samples
])
def test_the_long_row_reference_starts_at_long_row_elements_per_row(op, text, fused):
    import torch

    from forge_pack.targets import norm_common
    from forge_pack.targets.sigparse import parse_signature

    assert norm_common.LONG_ROW == 32768
    sig = parse_signature(op, text)
    t = {n: (torch.randn(s.shape, dtype=torch.float64) if s is not None else None) for n, s in sig.inputs}
    called = []

    def lookup(module, name):
        called.append(name)
        return getattr(torch.nn.functional, name)

    registry.spec_for(sig).reference64(dict(sig.params), t, lookup=lookup)
    assert called == ([op] if fused else [])
