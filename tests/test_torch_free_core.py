"""The torch-free core, enforced: these modules import with torch made unimportable.

The search, the run store, the LLM proposer and the dashboard run where torch is absent or
broken (a login node, the dashboard beside a run on another machine); a stray top-level
``import torch`` in any of them would break that without any other test noticing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Whole packages (every module in them) and single modules that must not need torch.
TORCH_FREE_PACKAGES = ("forge_pack.core", "forge_pack.store", "forge_pack.ui")
TORCH_FREE_MODULES = (
    "forge_pack.search.mcts", "forge_pack.search.propose", "forge_pack.search.pipeline",
    "forge_pack.search.config", "forge_pack.search.redaction", "forge_pack.search.run_lock",
    "forge_pack.search.heartbeat", "forge_pack.search.toolkit", "forge_pack.search.run_plan",
    "forge_pack.search.store_hooks", "forge_pack.search.report", "forge_pack.search.control",
    "forge_pack.llm.check", "forge_pack.llm.prompts", "forge_pack.llm.proposer", "forge_pack.llm.client",
)

# Runs in a fresh interpreter: a finder first on sys.meta_path refuses torch and records who asked.
PROBE = r"""
import importlib, json, pkgutil, sys, traceback

class NoTorch:
    attempts = []
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            NoTorch.attempts.append((name, "".join(traceback.format_stack(limit=12)[:-1])))
            raise ImportError(f"torch is not importable here ({name})")
        return None

sys.meta_path.insert(0, NoTorch())
packages, modules = json.loads(sys.argv[1])
names = list(modules)
for pkg in packages:
    mod = importlib.import_module(pkg)
    names.append(pkg)
    names += [m.name for m in pkgutil.walk_packages(mod.__path__, pkg + ".")]
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
print(json.dumps({"imported": names, "failed": failed, "attempts": NoTorch.attempts,
                  "loaded": [m for m in sys.modules if m == "torch" or m.startswith("torch.")]}))
"""


def probe(packages=TORCH_FREE_PACKAGES, modules=TORCH_FREE_MODULES) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps([list(packages), list(modules)])], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_core_store_search_llm_and_dashboard_import_without_torch():
    r = probe()
    assert "forge_pack.store.run_store" in r["imported"] and "forge_pack.ui.data" in r["imported"]
    assert r["failed"] == {}
    assert r["attempts"] == [], "\n\n".join(f"{name} imported from:\n{stack}" for name, stack in r["attempts"])
    assert r["loaded"] == []


def test_the_probe_catches_a_module_that_imports_torch():
    r = probe(packages=(), modules=("forge_pack.profile.capture",))
    assert r["attempts"], "forge_pack.profile.capture imports torch: the finder must have seen it"
    assert "torch is not importable here" in r["failed"]["forge_pack.profile.capture"]
