"""The stages a search run drives, injectable: tests run the whole pipeline with fakes.

The defaults import the real stages (model loading, profiling, the evaluator, the proposers)
lazily, so this module itself imports no torch.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from forge_pack.core.candidate import Candidate
from forge_pack.core.errors import ForgeError
from forge_pack.core.hotspot import Hotspot
from forge_pack.core.verdict import Baseline
from forge_pack.search.config import RunConfig
from forge_pack.store.run_store import Store


def _default_load(model: str, device: str | None, dtype: str | None):
    from forge_pack.profile.load import load

    return load(model, device, dtype)


def _default_profile(target, run_dir: Path, quiet: bool):
    from forge_pack.profile.profiler import profile

    return profile(target, run_dir, quiet=quiet)


def region_profile(target, run_dir: Path, quiet: bool):
    from forge_pack.graph.region_hotspots import profile_regions

    return profile_regions(target, run_dir, quiet)


def _default_evaluator(config: RunConfig, run_dir: Path, backend: str):
    from forge_pack.search.devices import make_evaluator

    return make_evaluator(config, run_dir, backend)  # --gpus / --ray pools; otherwise the plain one


def _default_proposers(config: RunConfig, backend: str, store: Store) -> list:
    from forge_pack.search.templates_proposer import TemplateProposer

    proposers: list = [TemplateProposer()]
    from forge_pack.llm.options import build_llm_proposer

    # --llm MODEL, or [llm] model in ./forge.toml; None when neither asks for an LLM
    llm = build_llm_proposer(config.llm_model, config.llm_budget_usd, config.llm_budget_tokens, store=store)
    if llm is not None:
        proposers.append(llm)
    return proposers


def _default_roots(hotspot: Hotspot, backend: str) -> list[Candidate]:
    try:
        from forge_pack.search.families import reference_candidate
    except ImportError:
        return []
    cand = reference_candidate(hotspot.signature, backend)
    return [cand] if cand is not None else []


def _default_env(device: str) -> dict:
    env = {"python": platform.python_version(), "host": platform.node(), "platform": platform.platform(),
           "cpu_count": os.cpu_count()}
    try:
        import torch

        env.update(torch=torch.__version__, cuda=torch.version.cuda)
        if device == "cuda" and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env.update(gpu=p.name, compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                       gpu_memory_bytes=p.total_memory)
    except Exception as e:  # noqa: BLE001 - the environment record is informative only
        env["env_error"] = str(e)
    return env


def _default_check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ForgeError(f"this run searches CUDA kernels, but {why}", "resume it on the machine with the GPU")


@dataclass
class Toolkit:
    load: Callable = _default_load  # (model, device, dtype) -> Target (.device, .path, .model_hash, .dtype)
    profile: Callable = _default_profile  # (target, run_dir, quiet) -> Profile (.hotspots, .forward_us)
    evaluator: Callable = _default_evaluator  # (config, run_dir, backend) -> .baseline(h), .evaluate(c, h, b)
    proposers: Callable = _default_proposers  # (config, backend, store) -> [Proposer]
    roots: Callable = _default_roots  # (hotspot, backend) -> [Candidate]: starting points (reference kernels)
    env: Callable = _default_env  # (device) -> dict
    check_device: Callable = _default_check_device  # (device) -> None; ForgeError when it cannot be used here


def gpu_info(env: dict, baseline: Baseline | None, evaluator: "LazyEvaluator") -> dict:
    """What proposers may know of the device: the evaluator's report (name, capability, SMs, shared
    memory, L2) when it has started, else the environment record; plus the measured copy bandwidth."""
    info = {k: env[k] for k in ("gpu", "compute_capability", "sm_count") if k in env}
    device_info = getattr(evaluator.obj, "device_info", None)
    if callable(device_info):
        try:
            info.update(device_info())
        except Exception:  # noqa: BLE001 - informative only
            pass
    if baseline is not None and baseline.copy_bandwidth_gbs:
        info["copy_bandwidth_gbs"] = baseline.copy_bandwidth_gbs
    return info


class LazyEvaluator:
    """The evaluator starts its worker processes only when something needs evaluating."""

    def __init__(self, make: Callable[[], Any]):
        self.make, self.obj = make, None

    def get(self):
        if self.obj is None:
            self.obj = self.make()
        return self.obj

    def close(self) -> None:
        if self.obj is not None:
            for name in ("close", "shutdown"):
                fn = getattr(self.obj, name, None)
                if callable(fn):
                    fn()
                    break
