"""Build the compiled kernels of this forge-pack package (generic: driven by the manifest).

Install with torch already present, without build isolation (the extension compiles against
the torch you run):

    pip install --no-build-isolation .

The CUDA architectures come from the manifest (the GPU the kernels were verified on); nvcc's
CUDA major version must match torch's. The C++ standard is torch's own (never hard-coded here).

For deployment (``pip wheel --no-build-isolation .``) the wheel is made to move between machines:
- it requires exactly the torch it was compiled against (``torch==<version+build>``: torch's C++ ABI
  changes between releases and builds);
- the binding needs only CPython's stable ABI (PyModule_Create), so where the torch in use supports
  ``py_limited_api`` the extension is compiled with Py_LIMITED_API and the wheel is tagged
  ``cp3X-abi3``: one wheel for every CPython from torch's minimum on;
- the C++ code is compiled for the CPU instruction set the manifest names (build.cpu_isa), and
  _build_info.json lists the CPU features that requires, checked before loading;
- paths of the build machine are mapped away in the compiled code (-ffile-prefix-map), so neither
  debug information nor assertion messages carry them.
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


# The /proc/cpuinfo flags each x86-64 micro-architecture level adds (the psABI's levels, as GCC's
# -march=x86-64-vN enables them): a wheel built for a level loads only on a CPU that has them all.
X86_LEVELS = {
    "x86-64": [],
    "x86-64-v2": ["cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"],
    "x86-64-v3": ["avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"],
    "x86-64-v4": ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"],
}


def isa_features(isa: str | None) -> list[str]:
    """The CPU features the chosen instruction set needs (native: every feature of this CPU)."""
    if isa == "native":
        return cpu_features()
    if isa in X86_LEVELS:
        need, order = [], list(X86_LEVELS)
        for level in order[: order.index(isa) + 1]:
            need += X86_LEVELS[level]
        return sorted(need)
    return []


def limited_api() -> str | None:
    """The stable-ABI Python tag (cp310 for torch's 0x030A0000) when this torch's extension helpers
    can build with Py_LIMITED_API, else None (then the wheel is for this CPython only)."""
    import inspect

    try:
        supported = "py_limited_api" in inspect.getsource(cpp_extension.CppExtension)
    except (OSError, TypeError):
        supported = False
    version = getattr(cpp_extension, "min_supported_cpython", None)
    if not supported or not version:
        return None
    hexv = int(version, 16)
    return f"cp{hexv >> 24}{(hexv >> 16) & 0xFF}"


def prefix_maps() -> list[str]:
    """-ffile-prefix-map flags for the folders of this machine that would otherwise be compiled in:
    the package folder (debug info's compilation directory), torch's headers (__FILE__ in inline
    checks) and the home folder. GCC applies the last matching map, so the most specific comes last."""
    dirs = [(os.path.expanduser("~"), "~"), (str(Path(torch.__file__).resolve().parent), "torch"),
            (str(HERE), ".")]
    return [f"-ffile-prefix-map={d}={to}" for d, to in dirs if d and d != "/"]


def extension(abi3: str | None):
    build = MANIFEST["build"]
    sources = build["sources"]
    name = f"{PACKAGE}._C"
    maps = prefix_maps()
    cxx = build["cxx_flags"] + maps
    # an older manifest names no ISA: its -march flag (if any) says which
    isa = build.get("cpu_isa") or next((f.split("=", 1)[1] for f in build["cxx_flags"]
                                        if f.startswith(("-march=", "-mcpu="))), None)
    features = isa_features(isa)
    extra = {"cpu_isa": isa, **({"cpu_features": features} if features else {})}
    limited = {"py_limited_api": True} if abi3 else {}
    if MANIFEST["backend"] != "cuda":
        return cpp_extension.CppExtension(name, sources, extra_compile_args={"cxx": cxx},
                                          extra_link_args=build["ldflags"], **limited), extra
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
    nvcc_flags = build["nvcc_flags"] + [x for m in maps for x in ("-Xcompiler", m)]
    ext = cpp_extension.CUDAExtension(name, sources, extra_compile_args={"cxx": cxx, "nvcc": nvcc_flags},
                                      extra_link_args=build["ldflags"], **limited)
    return ext, {**extra, "nvcc": nvcc, "cuda_arch_list": arch}


ABI3 = limited_api()
ext, extra = extension(ABI3)
# What the extension is compiled against: _patch.py refuses to load it under another torch.
(HERE / PACKAGE / "_build_info.json").write_text(json.dumps(
    {"torch": torch.__version__, "cuda": torch.version.cuda,
     "python_abi": f"{ABI3}-abi3" if ABI3 else f"cp{sys.version_info[0]}{sys.version_info[1]}", **extra},
    indent=2) + "\n")

setup(
    # _targets: the target registry the runtime binds calls with; _graph: the region matcher of compile mode
    packages=[PACKAGE, PACKAGE + "._targets", PACKAGE + "._graph"],
    package_data={PACKAGE: ["manifest.json", "manifest.schema.json", "_build_info.json", "fixtures/*.safetensors",
                          "conv/*.safetensors"]},
    ext_modules=[ext],
    # exactly this torch (version and build, e.g. 2.14.1+cu130): the extension refuses any other
    install_requires=[f"torch=={torch.__version__}", "jsonschema>=4.0", "safetensors>=0.4"],
    options={"bdist_wheel": {"py_limited_api": ABI3}} if ABI3 else {},
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    zip_safe=False,
)
