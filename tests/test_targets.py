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
    assert s.adversarial and set(s.adversarial) <= set(inputs.ADVERSARIAL)
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
