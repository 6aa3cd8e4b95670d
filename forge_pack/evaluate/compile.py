"""Compile candidates fast, without torch headers: NVRTC (or ``nvcc -cubin``) for CUDA, g++ for CPU.

``torch.utils.cpp_extension.load_inline`` took 55 s for a trivial kernel on the H200 box because
of the torch headers; a candidate here is plain device code compiled to a cubin in well under a
second (NVRTC through ctypes, no extra dependency) or plain C++ compiled to a shared object.

Builds are cached by content hash (source, backend, target arch, compiler identity and flags)
under ``$FORGE_PACK_CACHE/builds`` (default ``~/.cache/forge-pack/builds``); failures are cached
too. A compile error is data: ``Build.ok`` is False and ``Build.log`` holds the compiler output.
The resource usage ptxas reports (registers, spills, shared memory) is parsed for the dashboard.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from forge_pack.core.candidate import Candidate

CPU_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
NVRTC_FLAGS = ("-std=c++17", "--ptxas-options=-v")
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xptxas", "-v")
CUDA_HEADERS_NOTE = "candidates may include <cuda_bf16.h>, <cuda_fp16.h> (and <cuda_fp8.h>) only"


@dataclass(frozen=True)
class Build:
    ok: bool
    backend: str
    path: str  # the cubin or shared object ("" when the compile failed)
    log: str
    cmd: str
    compile_s: float  # time spent compiling now (0.0 on a cache hit)
    cached: bool
    key: str
    arch: str = ""
    resources: dict = field(default_factory=dict)  # kernel -> {registers, spill_stores, spill_loads, smem_bytes, ...}

    def to_json(self) -> dict:
        return asdict(self)


def cache_root() -> Path:
    root = os.environ.get("FORGE_PACK_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "forge-pack"


def templates_dir() -> Path:
    """templates/ (data) whether installed as forge_pack/templates or in a source checkout."""
    here = Path(__file__).resolve().parent.parent  # forge_pack/
    for cand in (here / "templates", here.parent / "templates"):
        if (cand / "kernels").is_dir():
            return cand
    try:
        from importlib.resources import files

        return Path(str(files("forge_pack.templates")))
    except Exception:  # pragma: no cover - broken install
        return here.parent / "templates"


def cpu_include_dir() -> Path:
    return templates_dir() / "kernels" / "cpu"


# ---------------------------------------------------------------- CUDA toolchain discovery


def cuda_arch() -> str:
    """sm_XX of the current GPU (``FORGE_PACK_CUDA_ARCH`` overrides, e.g. for compiling without a GPU)."""
    forced = os.environ.get("FORGE_PACK_CUDA_ARCH")
    if forced:
        return forced
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _site_dirs() -> list[Path]:
    dirs = []
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.append(Path(p))
    for p in sys.path:
        if p.endswith("site-packages"):
            dirs.append(Path(p))
    seen, out = set(), []
    for d in dirs:
        if d not in seen and d.is_dir():
            seen.add(d)
            out.append(d)
    return out


def _cuda_home() -> Path | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            return Path(os.environ[env])
    nvcc = shutil.which("nvcc")
    if nvcc:
        return Path(nvcc).resolve().parent.parent
    return Path("/usr/local/cuda") if Path("/usr/local/cuda").is_dir() else None


def _nvrtc_candidates() -> list[tuple[Path, Path | None]]:
    """(libnvrtc path, include dir shipped with it) in order of preference."""
    found: list[tuple[Path, Path | None]] = []
    if os.environ.get("FORGE_PACK_NVRTC"):
        found.append((Path(os.environ["FORGE_PACK_NVRTC"]), None))
    for site in _site_dirs():
        # nvidia-cuda-nvrtc wheels: nvidia/cu13/lib (CUDA 13) or nvidia/cuda_nvrtc/lib (CUDA 12)
        for lib in sorted(glob.glob(str(site / "nvidia" / "*" / "lib" / "libnvrtc.so*")), reverse=True):
            if "builtins" in lib or ".alt." in lib:
                continue
            inc = Path(lib).parent.parent / "include"
            found.append((Path(lib), inc if inc.is_dir() else None))
    home = _cuda_home()
    if home:
        for lib in sorted(glob.glob(str(home / "lib64" / "libnvrtc.so*")), reverse=True):
            if "builtins" not in lib and ".alt." not in lib:
                found.append((Path(lib), home / "include"))
    return found


class _NVRTC:
    def __init__(self, lib_path: Path, include_dir: Path | None):
        # libnvrtc dlopens libnvrtc-builtins by soname; preload it from the same folder so a wheel
        # install (not on LD_LIBRARY_PATH) works.
        for builtins in sorted(glob.glob(str(lib_path.parent / "libnvrtc-builtins.so*"))):
            if ".alt." not in builtins:
                try:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                    break
                except OSError:
                    pass
        self.lib = ctypes.CDLL(str(lib_path))
        self.path = lib_path
        self.include_dirs = self._includes(include_dir)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = f"{major.value}.{minor.value}"
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    @staticmethod
    def _includes(include_dir: Path | None) -> list[Path]:
        dirs = []
        if include_dir is not None and (include_dir / "cuda_fp16.h").is_file():
            dirs.append(include_dir)
        home = _cuda_home()
        if not dirs and home is not None and (home / "include" / "cuda_fp16.h").is_file():
            dirs.append(home / "include")
        return dirs

    def compile(self, source: str, name: str, options: list[str]) -> tuple[bool, str, bytes]:
        prog = ctypes.c_void_p()
        res = self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
        if res != 0:
            return False, f"nvrtcCreateProgram failed: {self.lib.nvrtcGetErrorString(res).decode()}", b""
        try:
            opts = [o.encode() for o in options]
            arr = (ctypes.c_char_p * len(opts))(*opts)
            res = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            if res != 0:
                err = self.lib.nvrtcGetErrorString(res).decode()
                return False, log or err, b""
            self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            if size.value == 0:
                return False, log + "\nNVRTC produced no cubin (is the arch a real sm_XX?)", b""
            cubin = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetCUBIN(prog, cubin)
            return True, log, cubin.raw
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


_nvrtc_lock = threading.Lock()
_nvrtc: _NVRTC | None | bool = False  # False: not looked up yet; None: unavailable


def nvrtc() -> _NVRTC | None:
    global _nvrtc
    with _nvrtc_lock:
        if _nvrtc is False:
            _nvrtc = None
            if os.environ.get("FORGE_PACK_NO_NVRTC") != "1":
                for lib, inc in _nvrtc_candidates():
                    try:
                        _nvrtc = _NVRTC(lib, inc)
                        break
                    except OSError:
                        continue
        return _nvrtc  # type: ignore[return-value]


_version_cache: dict[str, str] = {}


def _tool_version(cmd: list[str]) -> str:
    key = " ".join(cmd)
    if key not in _version_cache:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        _version_cache[key] = out.strip().splitlines()[-1] if out.strip() else "unknown"
    return _version_cache[key]


def _host_id() -> str:
    """-march=native binaries are only valid on the CPU model they were built for."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = re.search(r"model name\s*:\s*(.*)", text)
        flags = re.search(r"flags\s*:\s*(.*)", text)
        return (model.group(1) if model else "") + hashlib.sha256((flags.group(1) if flags else "").encode()).hexdigest()[:8]
    except OSError:
        import platform

        return platform.processor() or platform.machine()


# ---------------------------------------------------------------- the build cache


_key_locks: dict[str, threading.Lock] = {}
_key_locks_guard = threading.Lock()


def _lock_for(key: str) -> threading.Lock:
    with _key_locks_guard:
        return _key_locks.setdefault(key, threading.Lock())


def _toolchain(backend: str, arch: str) -> dict:
    if backend == "cpu":
        return {"cc": "g++ " + _tool_version(["g++", "-dumpfullversion"]),
                "flags": list(CPU_FLAGS), "host": _host_id(), "header": _headers_hash(cpu_include_dir())}
    rtc = nvrtc()
    if rtc is not None:
        return {"cc": f"nvrtc {rtc.version}", "flags": list(NVRTC_FLAGS), "arch": arch}
    return {"cc": _tool_version(["nvcc", "--version"]), "flags": list(NVCC_FLAGS), "arch": arch}


def _headers_hash(folder: Path) -> str:
    """Every header a kernel may #include from the include directory (forge_cpu.h, the prelude, ...):
    a build must not outlive a change to any of them."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.h")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def build_key(candidate: Candidate, arch: str = "") -> str:
    body = {"backend": candidate.backend, "source": candidate.source,
            "toolchain": _toolchain(candidate.backend, arch)}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def compile_candidate(candidate: Candidate, arch: str | None = None, cache_dir: str | Path | None = None) -> Build:
    """Compile (or fetch from the cache) one candidate's source. Never raises on a compile error."""
    backend = candidate.backend
    if backend == "cuda" and not arch:
        arch = cuda_arch()
    arch = arch or ""
    key = build_key(candidate, arch)
    folder = Path(cache_dir or cache_root() / "builds") / key[:2] / key
    with _lock_for(key):
        meta_file = folder / "meta.json"
        if meta_file.is_file():
            try:
                meta = json.loads(meta_file.read_text())
                if not meta["ok"] or Path(meta["path"]).is_file():
                    meta.update(cached=True, compile_s=0.0)
                    return Build(**meta)
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a torn or foreign entry: rebuild it
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if backend == "cpu":
            ok, log, cmd, path, final = _compile_cpu(candidate.source, folder)
        elif backend == "cuda":
            ok, log, cmd, path, final = _compile_cuda(candidate.source, folder, arch)
        else:
            ok, log, cmd, path, final = False, f"unknown backend {backend!r}", "", "", False
        build = Build(ok, backend, path, log.strip(), cmd, time.perf_counter() - t0, False, key, arch,
                      parse_resources(log) if backend == "cuda" else {})
        if ok or final:  # a compiler killed, timed out or missing says nothing about the source: retry next time
            _atomic_write(meta_file, json.dumps(build.to_json()).encode())
        return build


def compile_many(candidates: list[Candidate], arch: str | None = None, max_workers: int | None = None,
                 cache_dir: str | Path | None = None) -> list[Build]:
    """Compile in parallel (threads: NVRTC and g++ both run outside the GIL); results in input order."""
    if any(c.backend == "cuda" for c in candidates) and not arch:
        arch = cuda_arch()
    workers = max_workers or max(1, min(len(candidates), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda c: compile_candidate(c, arch, cache_dir), candidates))


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _compile_cpu(source: str, folder: Path) -> tuple[bool, str, str, str, bool]:
    """(ok, log, command, artifact, final): final when the result is the source's own (cacheable)."""
    src = folder / "kernel.cpp"
    _atomic_write(src, source.encode())
    out = folder / "kernel.so"
    tmp = folder / f".kernel.{os.getpid()}.{threading.get_ident()}.so"
    cmd = ["g++", *CPU_FLAGS, f"-I{cpu_include_dir()}", "-o", str(tmp), str(src)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        return False, "g++ not found on PATH", " ".join(cmd), "", False
    except subprocess.TimeoutExpired:
        return False, "g++ ran longer than 300 s", " ".join(cmd), "", False
    log = res.stdout + res.stderr
    if res.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        return False, log or f"g++ exited with {res.returncode}", " ".join(cmd), "", res.returncode > 0
    os.replace(tmp, out)
    return True, log, " ".join(cmd).replace(str(tmp), str(out)), str(out), True


def _compile_cuda(source: str, folder: Path, arch: str) -> tuple[bool, str, str, str, bool]:
    out = folder / "kernel.cubin"
    rtc = nvrtc()
    if rtc is not None:
        options = [f"--gpu-architecture={arch}", *NVRTC_FLAGS, *[f"-I{d}" for d in rtc.include_dirs]]
        cmd = f"nvrtc({rtc.path.name} {rtc.version}) " + " ".join(options)
        ok, log, cubin = rtc.compile(source, "kernel.cu", options)
        if ok:
            _atomic_write(out, cubin)
        return ok, log, cmd, str(out) if ok else "", True
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return False, "neither NVRTC (libnvrtc) nor nvcc was found", "", "", False
    src = folder / "kernel.cu"
    _atomic_write(src, source.encode())
    tmp = folder / f".kernel.{os.getpid()}.{threading.get_ident()}.cubin"
    cmd = [nvcc, "-cubin", f"-arch={arch}", *NVCC_FLAGS, "-o", str(tmp), str(src)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False, "nvcc ran longer than 300 s", " ".join(cmd), "", False
    log = res.stdout + res.stderr
    if res.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        return False, log or f"nvcc exited with {res.returncode}", " ".join(cmd), "", res.returncode > 0
    os.replace(tmp, out)
    return True, log, " ".join(cmd).replace(str(tmp), str(out)), str(out), True


# ---------------------------------------------------------------- ptxas -v parsing

_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_RE_PROPS = re.compile(r"Function properties for (\S+)")
_RE_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")


def parse_resources(log: str) -> dict[str, dict]:
    """Per kernel: registers, spill stores/loads, static shared memory, stack, from ``ptxas -v``."""
    out: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        m = _RE_ENTRY.search(line) or _RE_PROPS.search(line)
        if m:
            current = m.group(1)
            out.setdefault(current, {"registers": 0, "spill_stores": 0, "spill_loads": 0, "smem_bytes": 0,
                                     "stack_bytes": 0})
            continue
        if current is None:
            continue
        m = _RE_STACK.search(line)
        if m:
            out[current].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                                spill_loads=int(m.group(3)))
        m = _RE_USED.search(line)
        if m:
            out[current]["registers"] = int(m.group(1))
            s = _RE_SMEM.search(line)
            out[current]["smem_bytes"] = int(s.group(1)) if s else 0
    return out
