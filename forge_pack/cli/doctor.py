"""``forge-pack doctor [--llm MODEL] [--json]``: is this machine ready to search and build?

Checks torch and the GPU it sees, the CUDA compilers (NVRTC for the search, nvcc for the package
build), g++ with OpenMP (the cpu backend and CppExtension builds), and with ``--llm`` whether the
endpoint answers and serves the model. Exit 1 when a check fails, so scripts can gate on it; a
missing GPU is only a warning (the cpu backend works without one).
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import typer

from forge_pack import __version__
from forge_pack.core.errors import ForgeError


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    hint: str = ""


def _run(cmd: list[str], timeout: float = 60) -> tuple[int, str]:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, f"{cmd[0]} not found"
    except subprocess.TimeoutExpired:
        return 124, f"{cmd[0]} ran longer than {timeout:g} s"
    return res.returncode, (res.stdout + res.stderr).strip()


def check_torch() -> tuple[list[Check], dict]:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - an import failure of any kind is the finding
        return [Check("torch", "fail", f"cannot import torch: {e}", "pip install torch")], {}
    info = {"torch": torch.__version__, "cuda": torch.version.cuda}
    checks = [Check("torch", "ok", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")]
    try:
        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_gpu = False
    if has_gpu:
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, capability=f"{p.major}.{p.minor}")
        checks.append(Check("gpu", "ok", f"{p.name}, compute capability {p.major}.{p.minor}, "
                                         f"{p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs"
                                         + (f" (+{torch.cuda.device_count() - 1} more)"
                                            if torch.cuda.device_count() > 1 else "")))
    else:
        checks.append(Check("gpu", "warn", "no CUDA GPU visible to torch: only the cpu backend can run",
                            "use --device cpu, or check the driver with nvidia-smi"))
    info["has_gpu"] = has_gpu
    return checks, info


def check_cuda_compilers(info: dict) -> list[Check]:
    checks = []
    has_gpu = info.get("has_gpu", False)
    try:
        from forge_pack.evaluate.compile import nvrtc

        rtc = nvrtc()
    except Exception as e:  # noqa: BLE001
        rtc, err = None, str(e)
    else:
        err = ""
    nvcc = shutil.which("nvcc")
    if rtc is not None:
        checks.append(Check("nvrtc", "ok", f"NVRTC {getattr(rtc, 'version', '')} (fast compiles during search)"))
    else:
        status = "warn" if (nvcc or not has_gpu) else "fail"
        checks.append(Check("nvrtc", status, "NVRTC not found" + (f" ({err})" if err else "")
                            + ("; the search falls back to nvcc -cubin (slower)" if nvcc else ""),
                            "pip install nvidia-cuda-nvrtc-cu12 (or the CUDA toolkit), or set FORGE_PACK_NVRTC"))
    if nvcc:
        _, out = _run([nvcc, "--version"])
        line = next((x for x in out.splitlines() if "release" in x), out.splitlines()[-1] if out else "")
        detail, status, hint = f"{nvcc}: {line.strip()}", "ok", ""
        torch_cuda = info.get("cuda")
        if torch_cuda and "release" in line:
            nv_major = line.split("release")[1].strip().split(".")[0]
            if nv_major != str(torch_cuda).split(".")[0]:
                status = "warn"
                hint = (f"torch was built with CUDA {torch_cuda}: the emitted package's setup.py needs an nvcc "
                        f"of the same major version")
        checks.append(Check("nvcc", status, detail, hint))
    else:
        checks.append(Check("nvcc", "fail" if has_gpu else "warn",
                            "nvcc not on PATH: emitted CUDA packages cannot be built here",
                            "install the CUDA toolkit and put its bin/ on PATH (or set CUDA_HOME)"))
    return checks


def check_gxx() -> list[Check]:
    gxx = shutil.which("g++")
    if not gxx:
        return [Check("g++", "fail", "g++ not on PATH: the cpu backend and package builds need it",
                      "apt-get install g++")]
    _, version = _run([gxx, "-dumpfullversion"])
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "omp.cpp"
        src.write_text('#include <omp.h>\nextern "C" int forge_threads() { return omp_get_max_threads(); }\n')
        rc, out = _run([gxx, "-O3", "-fopenmp", "-shared", "-fPIC", "-o", str(Path(tmp) / "omp.so"), str(src)])
    if rc != 0:
        return [Check("g++", "fail", f"g++ {version} cannot build an OpenMP shared library: {out[:300]}",
                      "install libgomp (apt-get install g++ libgomp1)")]
    return [Check("g++", "ok", f"g++ {version} with OpenMP")]


def check_llm(model: str) -> list[Check]:
    from forge_pack.llm.client import LLMClient, _import_openai, api_key_from_env, redact
    from forge_pack.llm.options import llm_config

    try:
        config = llm_config(model)
        _import_openai()
    except ForgeError as e:
        return [Check("llm", "fail", e.message, e.hint)]
    assert config is not None
    key, key_env = api_key_from_env()
    checks = [Check("llm key", "ok" if key else "warn",
                    f"from {key_env}" if key else "no FORGE_LLM_API_KEY or OPENAI_API_KEY set",
                    "" if key else "a local vLLM/Ollama server needs none; OpenAI's API does")]
    try:
        ok, message = LLMClient(config, key).probe()
    except Exception as e:  # noqa: BLE001
        ok, message = False, f"{type(e).__name__}: {e}"
    checks.append(Check("llm endpoint", "ok" if ok else "fail", redact(message),
                        "" if ok else "see docs/llm.md (FORGE_LLM_BASE_URL, the model name, the key)"))
    return checks


def doctor(llm: str | None = None) -> list[Check]:
    checks = [Check("python", "ok", f"{platform.python_version()} ({platform.machine()}), forge-pack {__version__}")]
    torch_checks, info = check_torch()
    checks += torch_checks
    checks += check_cuda_compilers(info)
    checks += check_gxx()
    if llm:
        checks += check_llm(llm)
    return checks


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        llm: str | None = typer.Option(None, "--llm", metavar="MODEL",
                                       help="Also check that the LLM endpoint answers and serves MODEL."),
        json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
    ) -> None:
        """Check torch, the GPU, the CUDA and C++ compilers, and (with --llm) the LLM endpoint."""
        checks = doctor(llm)
        if json_out:
            typer.echo(json.dumps({"ok": all(c.status != "fail" for c in checks),
                                   "checks": [asdict(c) for c in checks]}, indent=2))
        else:
            width = max(len(c.name) for c in checks)
            for c in checks:
                typer.echo(f"{c.status.upper():4}  {c.name:<{width}}  {c.detail}")
                if c.hint and c.status != "ok":
                    typer.echo(f"{'':4}  {'':<{width}}  hint: {c.hint}")
        if any(c.status == "fail" for c in checks):
            raise typer.Exit(1)
