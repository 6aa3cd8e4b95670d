"""Building blocks of the template kernel families. Pure Python, no torch import.

A family is one parameterised kernel source in ``templates/kernels/{cuda,cpu}/`` plus the Python
that knows, for one call signature, whether it applies, which parameter values are sensible,
which are valid, and the launch spec. Parameters become ``#define`` lines at the template's
``//{{PARAMS}}`` marker, and ``//{{INCLUDE file}}`` markers are replaced by that file, so a
candidate's source stands alone and ships verbatim in the emitted package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from forge_pack.core.candidate import KernelLaunch, LaunchSpec, Workspace, evaluate
from forge_pack.evaluate.compile import templates_dir
from forge_pack.search.reference_kernels import output_dtype
from forge_pack.core.signature import ELEMENT_BYTES, Signature

CUDA_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
CPU_TYPES = {"float32": "float", "bfloat16": "forge_bf16", "float16": "forge_f16"}
GRID_MAX = (2**31 - 1, 65535, 65535)
# Dynamic shared memory per block: above 48 KB the launchers opt in (cuFuncSetAttribute); 227 KB on
# H100/H200, less on older GPUs (a launch error there is a verdict, not a crash).
SMEM_MAX = 227 * 1024


@dataclass(frozen=True)
class Knob:
    """A tunable parameter: its values in order (a move goes one notch up or down)."""

    name: str
    values: tuple
    doc: str


@dataclass(frozen=True)
class Built:
    """A family instantiated for one signature: every parameter (tuned and derived), the extra
    compile-time constants, and the launch spec."""

    params: dict
    defines: dict
    spec: LaunchSpec


@dataclass(frozen=True)
class Family:
    ops: tuple[str, ...]
    backend: str
    name: str
    template: str  # file name under templates/kernels/<backend>/
    knobs: tuple[Knob, ...]
    doc: str
    applicable: Callable[[Signature], str | None]  # None, or why the family cannot serve the signature
    defaults: Callable[[Signature], dict]  # sensible tuned-parameter values for the signature
    build: Callable[[Signature, dict], "Built | str"]  # Built, or why these values are invalid here
    score: Callable[[Signature], float]  # root order: lower first (the best guess for this shape)

    def knob(self, name: str) -> Knob | None:
        return next((k for k in self.knobs if k.name == name), None)


# ---------------------------------------------------------------- small helpers


def pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def elem_bytes(dtype: str) -> int:
    return ELEMENT_BYTES[dtype]


def out_dtype(sig: Signature) -> str:
    return output_dtype(sig)


def best_vec(dtype: str, divides: int, cap_bytes: int = 16) -> int:
    """The widest power-of-two vector (<= cap_bytes) whose length divides `divides`."""
    v = max(1, cap_bytes // elem_bytes(dtype))
    while v > 1 and divides % v:
        v //= 2
    return v


def nearest(values: tuple, v: Any) -> Any:
    """The domain value closest to v (keeps a parameter when switching family)."""
    if v in values:
        return v
    try:
        return min(values, key=lambda x: (abs(x - v), x))
    except TypeError:
        return values[0]


def present(sig: Signature, name: str) -> bool:
    try:
        return sig.input(name) is not None
    except KeyError:
        return False


def dtype_defines(sig: Signature, backend: str) -> dict | None:
    """T_<NAME> for every ABI tensor (float for absent ones), T_OUT, and HAS_<NAME> flags."""
    types = CUDA_TYPES if backend == "cuda" else CPU_TYPES
    d: dict[str, str | int] = {}
    for name, spec in sig.inputs:
        if spec is None:
            d[f"T_{name.upper()}"] = "float"
            d[f"HAS_{name.upper()}"] = 0
        else:
            t = types.get(spec.dtype)
            if t is None:
                return None
            d[f"T_{name.upper()}"] = t
            d[f"HAS_{name.upper()}"] = 1
    t = types.get(out_dtype(sig))
    if t is None:
        return None
    d["T_OUT"] = t
    return d


def launch(name: str, args: list[str], grid: list, block: list, shared_mem: Any = 0) -> KernelLaunch:
    g = [str(x) for x in grid] + ["1"] * (3 - len(grid))
    b = [str(x) for x in block] + ["1"] * (3 - len(block))
    return KernelLaunch(name, tuple(args), tuple(g), tuple(b), str(shared_mem))  # type: ignore[arg-type]


def spec(kernels: list[KernelLaunch], workspaces: list[Workspace] = (), requires: list[str] = ()) -> LaunchSpec:
    return LaunchSpec(tuple(kernels), tuple(workspaces), tuple(requires))


def check_spec(s: LaunchSpec, env: Mapping[str, int | float], backend: str) -> str | None:
    """Why the spec cannot launch on this signature (a false `requires`, a grid or block beyond the
    limits, too much dynamic shared memory), else None."""
    for r in s.requires:
        if not evaluate(r, env):
            return f"requires {r} is false"
    if backend != "cuda":
        return None
    for k in s.kernels:
        grid = [int(evaluate(g, env)) for g in k.grid]
        block = [int(evaluate(b, env)) for b in k.block]
        if any(g < 1 or g > m for g, m in zip(grid, GRID_MAX)):
            return f"{k.name}: grid {grid} outside 1..{GRID_MAX}"
        if block[0] * block[1] * block[2] > 1024 or min(block) < 1:
            return f"{k.name}: block {block} has more than 1024 threads"
        if int(evaluate(k.shared_mem, env)) > SMEM_MAX - 4096:  # leave room for static shared memory
            return f"{k.name}: more dynamic shared memory than a block may have"
    return None


# ---------------------------------------------------------------- sources


@lru_cache(maxsize=None)
def _read(backend: str, name: str) -> str:
    return (templates_dir() / "kernels" / backend / name).read_text()


def _inline(backend: str, text: str, depth: int = 0) -> str:
    if depth > 4:
        raise RuntimeError("template includes nest too deeply")
    return re.sub(r"^//\{\{INCLUDE (\S+)\}\}\s*$",
                  lambda m: _inline(backend, _read(backend, m.group(1)), depth + 1).rstrip("\n"),
                  text, flags=re.M)


def render(backend: str, template: str, title: str, defines: Mapping[str, Any]) -> str:
    """The stand-alone source: the template with its parameter block and includes filled in."""
    text = _read(backend, template)
    block = "\n".join([f"// forge-pack template {title}: compile-time parameters"] +
                      [f"#define {k} {_c_value(v)}" for k, v in defines.items()])
    if "//{{PARAMS}}" not in text:
        raise RuntimeError(f"template {template} has no //{{{{PARAMS}}}} marker")
    return _inline(backend, text.replace("//{{PARAMS}}", block, 1))


def _c_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)
