"""Build the compiled kernels of this forge-pack package (generic: driven by the manifest).

Install with torch already present, without build isolation (the extension compiles against
the torch you run):

    pip install --no-build-isolation .

The CUDA architectures come from the manifest (the GPU the kernels were verified on); nvcc's
CUDA major version must match torch's. The C++ standard is torch's own (never hard-coded here).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
PACKAGE = "PACKAGE_NAME"
MANIFEST = json.loads((HERE / PACKAGE / "manifest.json").read_text())


def fail(message: str) -> None:
    sys.exit(f"error: {message}")


def find_cuda_home() -> str | None:
    """A CUDA toolkit with headers. torch guesses it from nvcc's parent folder, which is wrong when
    nvcc on PATH is a wrapper script or a symlink outside the toolkit; CUDA_HOME always wins."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return None
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
    candidates += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
    for home in candidates:
        if (home / "include" / "cuda_runtime_api.h").is_file() and (home / "bin" / "nvcc").exists():
            return str(home)
    return None


if MANIFEST["backend"] == "cuda" and find_cuda_home():
    os.environ["CUDA_HOME"] = find_cuda_home()

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    fail("torch is not importable while building this package: install torch first, then "
         "`pip install --no-build-isolation .` (the kernels must compile against the torch you run)")


def nvcc_version() -> str | None:
    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else "nvcc"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def cpu_features() -> list[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere): a -march=native build runs
    only where every instruction-set flag among them exists (_patch.py checks before loading)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, flags=re.M)
    return sorted(set(m.group(1).split())) if m else []


def extension():
    build = MANIFEST["build"]
    sources = build["sources"]
    name = f"{PACKAGE}._C"
    if MANIFEST["backend"] != "cuda":
        native = any(f.startswith("-march=native") or f.startswith("-mcpu=native") for f in build["cxx_flags"])
        return cpp_extension.CppExtension(name, sources, extra_compile_args={"cxx": build["cxx_flags"]},
                                          extra_link_args=build["ldflags"]), ({"cpu_features": cpu_features()}
                                                                              if native else {})
    if torch.version.cuda is None:
        fail("these are CUDA kernels but the installed torch has no CUDA; install a CUDA build of torch")
    nvcc = nvcc_version()
    if nvcc is None:
        fail("nvcc was not found (set CUDA_HOME to a CUDA toolkit whose major version matches torch's "
             f"CUDA {torch.version.cuda})")
    if nvcc.split(".")[0] != torch.version.cuda.split(".")[0]:
        fail(f"nvcc is CUDA {nvcc} but torch was built with CUDA {torch.version.cuda}: the major versions must "
             "match; point CUDA_HOME at a matching toolkit")
    arch = build["cuda_arch_list"]
    if os.environ.get("TORCH_CUDA_ARCH_LIST", arch) != arch:
        print(f"note: building for {arch} (the GPU the kernels were verified on), not TORCH_CUDA_ARCH_LIST="
              f"{os.environ['TORCH_CUDA_ARCH_LIST']}", file=sys.stderr)
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    ext = cpp_extension.CUDAExtension(name, sources, extra_compile_args={"cxx": build["cxx_flags"],
                                                                         "nvcc": build["nvcc_flags"]},
                                      extra_link_args=build["ldflags"])
    return ext, {"nvcc": nvcc, "cuda_arch_list": arch}


ext, extra = extension()
# What the extension is compiled against: _patch.py refuses to load it under another torch.
(HERE / PACKAGE / "_build_info.json").write_text(json.dumps(
    {"torch": torch.__version__, "cuda": torch.version.cuda, **extra}, indent=2) + "\n")

setup(
    # _targets: the target registry the runtime binds calls with; _graph: the region matcher of compile mode
    packages=[PACKAGE, PACKAGE + "._targets", PACKAGE + "._graph"],
    package_data={PACKAGE: ["manifest.json", "manifest.schema.json", "_build_info.json", "fixtures/*.safetensors"]},
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    zip_safe=False,
)
