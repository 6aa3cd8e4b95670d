"""The package manifest: one JSON document per emitted package, validated by JSON Schema.

The manifest is the package's single source of truth: ``_patch.py`` patches exactly the
targets it lists, with the launch values and guards it records, and ``README.md`` is rendered
from it. The schema (``manifest.schema.json``, next to this file) ships inside every package;
forge-pack validates the document before writing it, the package validates it again on load,
so a hand-edited or corrupted manifest is refused with the path of the first bad field.

Figures edited by hand can still match the schema: from schema version 2 on, ``write`` seals the
document with an integrity digest of its measured content (``templates/package/_integrity.py``,
shipped in every package), and ``load`` refuses a document whose digest does not match. A
version-1 manifest (no digest) loads; its figures are "not checked".
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from forge_pack.core.errors import ForgeError
from forge_pack.store.run_store import finite

SCHEMA_VERSION = 3  # 2: the integrity digest; 3: compile mode's fields (1 and 2 still load)
SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")


@lru_cache(maxsize=1)
def _integrity():
    """The package's own _integrity.py, loaded from the templates: one definition of the digest."""
    import importlib.util

    from forge_pack.evaluate.compile import templates_dir

    path = templates_dir() / "package" / "_integrity.py"
    spec = importlib.util.spec_from_file_location("_forge_pack_integrity", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def integrity(doc: dict) -> tuple[str, str]:
    """("ok" | "not checked" | "edited", a sentence): whether the figures are the measured ones."""
    return _integrity().status(doc)


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def problems(doc: Any) -> list[str]:
    """Every schema violation as 'path: message' (empty when the document is valid)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    out = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        out.append(f"{where}: {err.message}")
    return out


def validate(doc: Any, where: str = "manifest") -> None:
    errs = problems(doc)
    if errs:
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise ForgeError(f"{where} does not match the manifest schema: {errs[0]}{more}",
                         "the manifest is written by forge-pack; rebuild the package instead of editing it")


def dumps(doc: dict) -> str:
    return json.dumps(finite(doc), indent=2, sort_keys=False, allow_nan=False) + "\n"


def write(path: str | Path, doc: dict) -> None:
    """Seal (a version-2 document gets its integrity digest), validate, then write. An invalid
    document is never written."""
    clean = finite(doc)
    if clean.get("schema_version", SCHEMA_VERSION) >= 2:
        clean = _integrity().seal(clean)
    validate(clean, str(path))
    Path(path).write_text(dumps(clean))


def load(path: str | Path, allow_edited: bool = False) -> dict:
    """Read, validate, and check the integrity digest: figures edited after the build are a
    ForgeError unless ``allow_edited`` (then ``integrity(doc)`` says so)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ForgeError(f"cannot read manifest {p}: {e.strerror or e}", "is this a forge-pack package directory?")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ForgeError(f"manifest {p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})",
                         "the file is corrupted; rebuild the package with forge-pack")
    validate(doc, f"manifest {p}")
    state, message = integrity(doc)
    if state == "edited" and not allow_edited:
        raise ForgeError(f"manifest {p}: {message}",
                         "rebuild the package with forge-pack (or reinstall it as built) instead of editing it")
    return doc


# ------------------------------------------------------------------ environment


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""
    return line or None


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(device: str, run_env: dict | None = None) -> dict:
    """Where the kernels were measured: the run's recorded environment, completed from this process."""
    import torch

    run_env = run_env or {}

    def pick(*names: str) -> Any:
        for n in names:
            if run_env.get(n) not in (None, ""):
                return run_env[n]
        return None

    env = {
        "torch": str(pick("torch", "torch_version") or torch.__version__),
        "cuda": pick("cuda", "cuda_version") or torch.version.cuda,
        "gpu_name": pick("gpu_name", "gpu"),
        "compute_capability": pick("compute_capability", "capability", "cc"),
        "driver": pick("driver", "driver_version"),
        "python": str(pick("python") or platform.python_version()),
        "platform": str(pick("platform") or f"{platform.system()} {platform.machine()}"),
        "cpu": pick("cpu") or _cpu_name(),
    }
    if device == "cuda" and torch.cuda.is_available():
        idx = torch.cuda.current_device()
        if not env["gpu_name"]:
            env["gpu_name"] = torch.cuda.get_device_name(idx)
        if not env["compute_capability"]:
            major, minor = torch.cuda.get_device_capability(idx)
            env["compute_capability"] = f"{major}.{minor}"
        if not env["driver"]:
            env["driver"] = _driver_version()
    cc = env["compute_capability"]
    if isinstance(cc, (list, tuple)):
        env["compute_capability"] = f"{cc[0]}.{cc[1]}"
    elif cc is not None:
        env["compute_capability"] = str(cc)
    out = {k: (str(v) if v is not None else None) for k, v in env.items()}
    sms = pick("sm_count")
    if sms is None and device == "cuda" and torch.cuda.is_available():
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    if sms is not None:  # persistent kernels size their grids to it: the package needs at least as many
        out["sm_count"] = int(sms)
    return out


def forge_version() -> str:
    from forge_pack import __version__

    return __version__

