"""Compile a generated CUDA source the two ways a kernel is built: nvcc (the package's setup.py) and NVRTC
(the evaluator). For the no-GPU compile tests."""

from __future__ import annotations

import subprocess
from pathlib import Path


def nvcc(source: str, folder: str, name: str, with_nvcc: bool = True) -> tuple[int, str]:
    """Compile with nvcc (what the package's setup.py build uses) and, where libnvrtc is found, with
    NVRTC as the evaluator does (``compile._compile_cuda``): the two accept different sources
    (NVRTC has no ``__builtin_memcpy``, for one), and a kernel must build both ways. ``with_nvcc``
    False: NVRTC alone (5x faster; its ptxas report gives the spills too), nvcc where no NVRTC is found."""
    from forge_pack.evaluate import compile as fcompile

    rtc = fcompile.nvrtc()
    rc, log = 0, ""
    if with_nvcc or rtc is None:
        src = Path(folder) / f"{name}.cu"
        src.write_text(source)
        res = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-std=c++17", "-Xptxas", "-v", "-o", f"{src}.cubin",
                              str(src)], capture_output=True, text=True)
        rc, log = res.returncode, res.stdout + res.stderr
    if rtc is not None:
        options = ["--gpu-architecture=sm_90", *fcompile.NVRTC_FLAGS, *[f"-I{d}" for d in rtc.include_dirs]]
        ok, rtc_log, _ = rtc.compile(source, "kernel.cu", options)
        rc, log = rc or (0 if ok else 1), log + "\n[nvrtc]\n" + rtc_log
    return rc, log


def spills(log: str) -> bool:
    return any("spill" in line and " 0 bytes spill stores" not in line for line in log.splitlines())
