"""The search's build and the package's build must compile the same program.

A candidate is compiled by NVRTC (CUDA) or g++ with the search's flags, and the very same source is
compiled again by the package's setup.py (nvcc or the torch extension's g++). A preprocessor test on a
macro that only one of them defines (`__CUDACC_RTC__`, `TORCH_EXTENSION_NAME`, `__NVCC__`, `NDEBUG`,
`__has_include(<torch/...>)`) would let a kernel be honest where it is judged and
do something else where it ships. So a conditional may not test a macro whose name is one a compiler, a
library or a build defines (even where the source defines it too: the test may come first): a reserved name (`__x`, `_X`)
other than `__CUDA_ARCH__` (the device architecture, the same in both builds) and the CPU
instruction-set macros (`__AVX2__`, ...: the same -march flags, and the package runs only on the
instruction sets it was verified on), or one of the build
systems' own (`NDEBUG`, which Python's extension builds pass; `TORCH_*`, `PYBIND11_*`, `CUDA_*`, ...).
A name of the candidate's own that it never defines (a template's optional knob) is undefined in
both builds alike and passes. The macros that expand to the build's path, date or a counter are
refused anywhere.
"""

from __future__ import annotations

import re

# The one predefined macro a conditional may test: the device code of both builds sees the same value.
ALLOWED = frozenset({"__CUDA_ARCH__"})
# CPU instruction-set macros: both builds use the same -march flags (recorded in the manifest) and the
# package runs its kernels only on a CPU with the instruction sets it was verified on (_patch.py)
_ISA = re.compile(r"^__(AVX\w*|FMA|F16C|SSE\w*|BMI2?|ARM_NEON|ARM_FEATURE_\w+|aarch64|x86_64)__$|^__ARM_NEON$")
# defined by one build and not the other: reserved names, and the build systems' own macros
_BUILD_MACRO = re.compile(r"^(_[A-Z_]\w*|NDEBUG|DEBUG|TORCH_\w*|PYBIND11_\w*|Py\w*|C10_\w*|AT_\w*|CUDA_\w*|CUDART_\w*|"
                          r"NVRTC_\w*|USE_\w*|WITH_\w*|linux|unix|i386)$")
_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|elifdef|elifndef)\b(.*)$", re.M)
_IDENT = re.compile(r"(?<!\w)[A-Za-z_]\w*")
# expand to what differs between the two builds (file path, time of the build, a per-unit counter)
_ANYWHERE = re.compile(r"\b(__FILE__|__BASE_FILE__|__FILE_NAME__|__DATE__|__TIME__|__TIMESTAMP__|__COUNTER__|"
                       r"__has_include|__has_include_next)\b")


def problem(code: str) -> str | None:
    """Why ``code`` (comments already stripped) could build differently in the package, else None."""
    m = _ANYWHERE.search(code)
    if m:
        return (f"line {code[:m.start()].count(chr(10)) + 1}: `{m.group(1)}` differs between the search's build "
                f"and the package's build: a kernel must compile to the same program in both")
    for m in _CONDITIONAL.finditer(code):
        names = [n for n in _IDENT.findall(m.group(2)) if n != "defined"]
        # a build macro stays foreign even where the source defines it: the test may come before the define
        foreign = [n for n in names if n not in ALLOWED and _BUILD_MACRO.match(n) and not _ISA.match(n)]
        if foreign:
            line = code[:m.start()].count("\n") + 1
            return (f"line {line}: `#{m.group(1)}` tests {', '.join(f'`{n}`' for n in dict.fromkeys(foreign))}, "
                    f"a macro a compiler or build defines: the search compiles with NVRTC "
                    f"or g++ and the package with nvcc or the torch extension's flags, so it could make the shipped "
                    f"kernel differ from the verified one (test only the source's own macros, and __CUDA_ARCH__)")
    return None
