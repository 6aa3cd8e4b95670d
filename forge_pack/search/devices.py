"""Which devices a search evaluates on: ``--gpus all|0,1,...`` (one worker per GPU of this host) or
``--ray ADDRESS`` (one Ray actor per GPU of a cluster), and the evaluator built for them.

Without either flag nothing here is used and the evaluator is the single-pool one it always was.
No torch import at module level (``visible_gpus`` imports it only when CUDA_VISIBLE_DEVICES is unset).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from forge_pack.core.errors import ForgeError

GPUS_HINT = "e.g. --gpus all, or --gpus 0,1 (nvidia-smi's indices)"


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch CUDA at all: no GPU to give
        return []


def parse_gpus(spec: str, visible: list[str]) -> list[str]:
    """``--gpus`` as a list of GPU ids, each one visible and named once (two workers on one GPU
    would time two candidates on it at once)."""
    text = (spec or "").strip()
    if not visible:
        raise ForgeError("--gpus needs CUDA GPUs, and none is visible here",
                         "check nvidia-smi and CUDA_VISIBLE_DEVICES, or search on the CPU without --gpus")
    if text == "all":
        return list(visible)
    ids = [p.strip() for p in text.split(",")]
    if not text or any(not p for p in ids):
        raise ForgeError(f"--gpus takes 'all' or a comma-separated list of GPU indices, got {spec!r}", GPUS_HINT)
    dup = sorted({p for p in ids if ids.count(p) > 1})
    if dup:
        raise ForgeError(f"--gpus names GPU {', '.join(dup)} more than once",
                         "each GPU gets one worker, so that no two candidates are timed on it at once; "
                         "name each once")
    unknown = [p for p in ids if p not in visible]
    if unknown:
        raise ForgeError(f"--gpus names GPU {', '.join(unknown)}, which is not visible here "
                         f"(visible: {', '.join(visible)})", GPUS_HINT)
    return ids


def check_flags(gpus: str | None, ray: str | None, device: str | None, workers: int | None) -> None:
    """The flag combinations that cannot work, refused before anything runs."""
    if gpus is not None and device == "cpu" and ray is None:
        raise ForgeError("--gpus spreads a CUDA search over GPUs, and this run is on the cpu",
                         "drop --gpus, or --device cuda")
    if gpus is not None and workers is not None:
        raise ForgeError("--gpus and --workers both choose the workers",
                         "with --gpus each GPU named gets one worker; drop --workers")
    if ray is not None and gpus is not None and gpus.strip() != "all":
        raise ForgeError("--gpus with a list of indices chooses GPUs of this host, and --ray uses the cluster's",
                         "with --ray, cap the GPUs used with --workers N (or pass --gpus all)")
    if ray is not None and not ray.strip():
        raise ForgeError("--ray needs the cluster's address", "e.g. --ray auto (the cluster this node belongs to) "
                                                              "or --ray ray://head:10001")


def make_evaluator(config: Any, run_dir: Path, backend: str):
    """The run's evaluator: one worker per GPU (``--gpus``), Ray actors (``--ray``), or the plain pool."""
    from forge_pack.evaluate.evaluator import Evaluator

    pool = None
    log_dir = str(Path(run_dir) / "workers")
    ray_address = getattr(config, "ray", None)
    gpus = getattr(config, "gpus", None)
    if ray_address:
        from forge_pack.evaluate.judge import Startup
        from forge_pack.evaluate.ray_pool import RayPool

        pool = RayPool(ray_address, backend, config.workers if config.workers > 1 else None, Startup(), log_dir)
    elif gpus:
        if backend != "cuda":
            raise ForgeError(f"--gpus spreads a CUDA search over GPUs, and this run searches {backend} kernels",
                             "drop --gpus, or search with --device cuda")
        from forge_pack.evaluate.device_pool import DevicePool, cuda_devices
        from forge_pack.evaluate.judge import Startup

        pool = DevicePool(cuda_devices(parse_gpus(gpus, visible_gpus())), Startup(), log_dir)
    return Evaluator(backend=backend, workers=config.workers, timeout_s=config.timeout_s, seed=config.seed,
                     run_dir=run_dir, pool=pool)


def slots_of(evaluator: Any) -> int:
    """How many evaluations the evaluator's pool runs at once (1 for a plain pool of one worker)."""
    pool = getattr(evaluator, "pool", None)
    slots = getattr(pool, "slots", None)
    if isinstance(slots, int) and slots > 0:
        return slots
    return max(1, len(getattr(pool, "workers", []) or [None]))
