"""A search run's configuration: the flags, how they are saved in RUN_DIR/config.json and read back
on ``--resume``. No torch import."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from forge_pack.core.errors import ForgeError
from forge_pack.search.mcts import SearchConfig
from forge_pack.search.redaction import redact
from forge_pack.store.run_store import STORE_FILE, check_store

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class RunConfig:
    model: str
    device: str | None = None  # None: cuda when present
    dtype: str | None = None
    budget: int = 50  # evaluations per hotspot
    time_limit_s: float | None = None  # per hotspot
    top: int = 3
    min_share: float = 0.01  # hotspots under 1% of the forward cannot move the total
    seed: int = 0
    workers: int = 1
    parallel: int = 1
    timeout_s: float = 60.0  # per candidate evaluation
    run_dir: str = ""
    llm_model: str | None = None
    llm_budget_usd: float | None = None
    llm_budget_tokens: int | None = None
    search: dict = field(default_factory=dict)  # SearchConfig overrides (exploration, widen_c, ...)
    gpus: str | None = None  # --gpus: "all" or "0,1,..."; one worker per GPU (search/devices.py)
    ray: str | None = None  # --ray: the Ray cluster's address ("auto"); one actor per GPU
    parallel_auto: bool = False  # --parallel not given with --gpus/--ray: one evaluation per device
    regions: bool = False  # search the graph's regions (fused chains) instead of single ops

    def search_config(self) -> SearchConfig:
        return SearchConfig(budget=self.budget, time_limit_s=self.time_limit_s, parallel=self.parallel,
                            seed=self.seed, **self.search)

    def to_json(self) -> dict:
        """The effective configuration, secrets redacted, with the search's own knobs spelled out."""
        d = asdict(self)
        d["search"] = asdict(self.search_config())
        return redact(d)

    @staticmethod
    def from_json(d: dict) -> "RunConfig":
        known = {f for f in RunConfig.__dataclass_fields__}
        d = {k: v for k, v in d.items() if k in known}
        search_defaults = asdict(SearchConfig())
        own = {"budget", "time_limit_s", "parallel", "seed"}
        d["search"] = {k: (tuple(map(tuple, v)) if k == "proposer_weights" else v)
                       for k, v in (d.get("search") or {}).items()
                       if k in search_defaults and k not in own and v != search_defaults[k]}
        return RunConfig(**d)


def with_overrides(config: RunConfig, **overrides: Any) -> RunConfig:
    """The config with the given non-None values replaced (flags given again on --resume)."""
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


def save_config(run_dir: Path, config: RunConfig) -> None:
    """config.json, replaced atomically: a run killed while writing it keeps the previous one."""
    tmp = run_dir / f".{CONFIG_FILE}.tmp"
    tmp.write_text(json.dumps(config.to_json(), indent=2, sort_keys=True))
    os.replace(tmp, run_dir / CONFIG_FILE)


def load_config(run_dir: str | Path) -> RunConfig:
    path = Path(run_dir) / CONFIG_FILE
    if not (Path(run_dir) / STORE_FILE).is_file() or not path.is_file():
        raise ForgeError(f"{run_dir} is not a forge-pack run directory (no run.db and config.json)",
                         "pass the directory an earlier `forge-pack search` wrote (its path is printed at the end)")
    check_store(run_dir)  # an emptied or damaged store is an error here, never a fresh start over it
    try:
        return RunConfig.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise ForgeError(f"cannot read {path}: {e}", "the run directory may be from another forge-pack version")


def stored_llm_model(run_dir: Path) -> str | None:
    """The LLM model of the configuration a run was last started with (None: templates only)."""
    try:
        return load_config(run_dir).llm_model or None
    except ForgeError:
        return None
