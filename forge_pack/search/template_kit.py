"""Building blocks of the template kernel families. Pure Python, no torch import.

A family is one parameterised kernel source in ``templates/kernels/{cuda,cpu}/`` plus the Python
that knows, for one call signature and GPU, whether it applies, which parameter values are
sensible, which are valid, and the launch spec. Parameters become ``#define`` lines at the
template's ``//{{PARAMS}}`` marker, and ``//{{INCLUDE file}}`` markers are replaced by that file,
so a candidate's source stands alone and ships verbatim in the emitted package. The families
themselves live in ``forge_pack/search/families/<kind>.py``; this module holds what they share:
the GPU description, knobs, vector and register checks, spec limits, rendering, reference kernels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from forge_pack.targets import abi
from forge_pack.core.candidate import Candidate, KernelLaunch, LaunchSpec, Workspace, evaluate, parse_spec
from forge_pack.evaluate.compile import templates_dir
from forge_pack.core.signature import ELEMENT_BYTES, Signature

# bool and integer tensors are read by region kernels only (masks, indices); op kinds reject them earlier
CUDA_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half", "bool": "bool",
              "int64": "long long", "int32": "int"}
CPU_TYPES = {"float32": "float", "bfloat16": "forge_bf16", "float16": "forge_f16", "bool": "bool",
             "int64": "long long", "int32": "int"}
GRID_MAX = (2**31 - 1, 65535, 65535)
MAX_THREADS = 1024  # threads per block on every CUDA GPU
# Static __shared__ memory a template kernel may add to its dynamic shared memory: the families
# use at most ~0.4 KB (a float[96] reduction buffer, a few flags and a ticket).
STATIC_SMEM = 1024
# The shared-memory families (group_norm split_sync with stage 1, resident) plan at most 200 KB per
# block, 27 KB under the H200's 227 KB: their H200 measurements were made under this cap, and a plan
# between it and the limit is a shape nobody measured.
PLAN_SMEM_CAP = 200 * 1024
SMEM_BLOCK_RESERVE = 1024  # shared memory the CUDA runtime reserves per resident block
MAX_REG_ELEMS = 64  # fp32 values a thread keeps in registers at most (beyond: spills)


@dataclass(frozen=True)
class Gpu:
    """The GPU a search sizes its kernels for: persistent grids take one block or more per SM, and
    shared-memory plans must fit a block and an SM. The defaults are the H200's (132 SMs, 227 KB
    opt-in shared memory per block, 228 KB per SM), the GPU the families were measured on; the
    evaluator's device report replaces them (`from_report`)."""

    sm_count: int = 132
    smem_per_block: int = 227 * 1024  # opt-in maximum, static plus dynamic (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    smem_per_sm: int = 227 * 1024 + SMEM_BLOCK_RESERVE  # per SM: the per-block maximum plus the runtime's reserve

    @classmethod
    def from_report(cls, report: Mapping[str, Any] | None) -> "Gpu":
        """The GPU the evaluator reports (`sm_count`, `smem_optin_bytes`); the H200 figures stay for
        whatever it does not say. A grid sized for more SMs than the GPU has would stall on its
        barriers until their timeouts."""
        report = report or {}
        gpu = cls()
        sms, optin = report.get("sm_count"), report.get("smem_optin_bytes")
        if isinstance(sms, int) and sms > 8:  # 8 SMs or fewer: not a whole GPU's report, keep the default
            gpu = cls(sms, gpu.smem_per_block, gpu.smem_per_sm)
        if isinstance(optin, int) and optin >= 48 * 1024:  # below CUDA's 48 KB default: not a real report
            gpu = cls(gpu.sm_count, optin, optin + SMEM_BLOCK_RESERVE)
        return gpu

    @property
    def plan_smem(self) -> int:
        """Dynamic shared memory per block a family may plan for."""
        return min(PLAN_SMEM_CAP, self.smem_per_block)


H200 = Gpu()


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
    code: str = ""  # generated source for the template's //{{CODE}} marker (region kernels)


@dataclass(frozen=True)
class Family:
    ops: tuple[str, ...]
    backend: str
    name: str
    template: str  # file name under templates/kernels/<backend>/
    knobs: tuple[Knob, ...]
    doc: str
    applicable: Callable[[Signature, Gpu], str | None]  # None, or why the family cannot serve the signature
    defaults: Callable[[Signature, Gpu], dict]  # sensible tuned-parameter values for the signature
    build: Callable[[Signature, dict, Gpu], "Built | str"]  # Built, or why these values are invalid here
    score: Callable[[Signature, Gpu], float]  # root order: lower first (the best guess for this shape)
    co_resident: bool = False  # the whole grid waits on itself: sized to every SM of the search GPU

    def knob(self, name: str) -> Knob | None:
        return next((k for k in self.knobs if k.name == name), None)


def always(sig: Signature, gpu: Gpu) -> str | None:
    """`applicable` for a family that serves every signature its op supports."""
    return None


def first(sig: Signature, gpu: Gpu) -> float:
    """`score` for a family with no preferred shape."""
    return 0


# ---------------------------------------------------------------- CUDA knobs several kinds share

THREADS = Knob("threads", (64, 128, 256, 512, 1024), "threads per block")
VEC = Knob("vec", (1, 2, 4, 8), "elements per vector access (16 bytes at most per load)")
UNROLL = Knob("unroll", (1, 2, 4, 8), "vector loads in flight per thread and loop trip")
FAST_EXP = Knob("fast_exp", (0, 1, 2), "exp: 0 expf, 1 __expf (MUFU), 2 exp2f of the difference times log2(e)")
LOAD_HINT = Knob("load_hint", (0, 1, 2), "loads: 0 plain, 1 read-only __ldg, 2 streaming __ldcs (evict-first)")
STORE_HINT = Knob("store_hint", (0, 1), "stores: 0 plain, 1 streaming __stcs")
HINTS = (LOAD_HINT, STORE_HINT)
LANES_ALL = Knob("lanes", (4, 8, 16, 32), "threads per row or plane (shuffle reductions only)")
SPLIT = Knob("split", (4, 8, 16, 32, 64, 128, 256), "blocks per row / group (partials in a workspace)")
ITEMS = Knob("items", (1, 2, 4, 8, 16), "vectors per thread kept in registers (chunk = threads*vec*items)")

# ---------------------------------------------------------------- CPU knob every kind has

GRAIN = Knob("grain", (1, 4, 16, 64, 256), "rows / groups / planes per OpenMP chunk (schedule(static, grain))")


def grain_default(units: int) -> int:
    """Chunks of roughly units / 64, so static scheduling still balances a few cores."""
    g = 1
    while g * 4 <= 256 and g * 4 * 64 <= units:
        g *= 4
    return g


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


def output_dtype(sig: Signature) -> str:
    """The dtype the kernel writes: the signature's output, softmax's `dtype=`, else the input's."""
    if sig.output is not None:
        return sig.output.dtype
    if sig.op in ("softmax", "log_softmax") and sig.param("dtype"):
        return str(sig.param("dtype"))
    return sig.x.dtype


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
    t = types.get(output_dtype(sig))
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


def check_spec(s: LaunchSpec, env: Mapping[str, int | float], backend: str, gpu: Gpu = H200) -> str | None:
    """Why the spec cannot launch on this signature and GPU (a false `requires`, a grid or block
    beyond the limits, too much dynamic shared memory), else None."""
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
        if block[0] * block[1] * block[2] > MAX_THREADS or min(block) < 1:
            return f"{k.name}: block {block} has more than {MAX_THREADS} threads"
        if int(evaluate(k.shared_mem, env)) > gpu.smem_per_block - STATIC_SMEM:
            return f"{k.name}: more dynamic shared memory than a block may have"
    return None


# ---------------------------------------------------------------- CUDA validity checks


def vec_ok(sig: Signature, p: dict) -> str | None:
    """A vector access reads at most 16 bytes of input and writes at most 32 bytes of output."""
    v = p.get("vec", 1)
    if v * elem_bytes(sig.x.dtype) > 16:
        return f"vec {v} of {sig.x.dtype} exceeds 16 bytes"
    if v * elem_bytes(output_dtype(sig)) > 32:
        return f"vec {v} of {output_dtype(sig)} output exceeds 32 bytes"
    return None


def regs_ok(threads: int, floats: int, overhead: int = 40) -> str | None:
    """Values kept in registers per thread must fit the per-thread budget of a full block (65536
    registers per SM, 255 per thread at most, `overhead` for the kernel's own variables)."""
    budget = min(255, 65536 // threads) - overhead
    if floats > min(MAX_REG_ELEMS, budget):
        return f"{floats} register values per thread exceed the budget at {threads} threads"
    return None


def stream_ok(sig: Signature, p: dict, per_thread_floats: int = 0, loads: int | None = None) -> str | None:
    """Streaming kernels: `loads` raw vectors in flight (default: unroll) plus some fp32 values per
    thread must fit the register budget (beyond it ptxas spills)."""
    n = p.get("unroll", 1) if loads is None else loads
    raw = n * cdiv(p.get("vec", 1) * elem_bytes(sig.x.dtype), 4)
    return vec_ok(sig, p) or regs_ok(p["threads"], raw + per_thread_floats)


def full_vec(sig: Signature) -> int:
    """Elements of the input in one 16-byte vector."""
    return 16 // elem_bytes(sig.x.dtype)


def vec_default(sig: Signature, divides: int) -> int:
    """The widest vector of at most 16 bytes of input whose length divides `divides`."""
    v = full_vec(sig)
    while v > 1 and divides % v:
        v //= 2
    return v


def rows_items(cols: int, group: int, vec: int) -> int:
    """Vectors per thread that hold a row of `cols` spread over `group` threads."""
    return max(1, cdiv(cols, group * vec))


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


def render(backend: str, template: str, title: str, defines: Mapping[str, Any], code: str = "") -> str:
    """The stand-alone source: the template with its parameter block, includes and generated code
    (``//{{CODE}}``, where the template has the marker) filled in."""
    text = _read(backend, template)
    if "//{{CODE}}" in text:
        text = text.replace("//{{CODE}}", code.rstrip("\n"), 1)
    block = "\n".join([f"// forge-pack template {title}: compile-time parameters"] +
                      [f"#define {k} {_c_value(v)}" for k, v in defines.items()])
    if "//{{PARAMS}}" not in text:
        raise RuntimeError(f"template {template} has no //{{{{PARAMS}}}} marker")
    return _inline(backend, text.replace("//{{PARAMS}}", block, 1))


def _c_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


# ---------------------------------------------------------------- reference kernels


@dataclass(frozen=True)
class ReferenceKernel:
    """A simple, correct starting point for the search: templates/kernels/<backend>/reference_<op>.
    {cu,cpp} with its launch spec in reference_<op>.json. Element types are chosen per signature by a
    short ``#define`` prelude (IN_T, OUT_T, W_T), so one file covers every dtype combination and the
    candidate source still stands alone (it builds verbatim in the emitted package)."""

    op: str

    def candidate(self, sig: Signature, backend: str) -> Candidate | None:
        """The reference candidate for this signature, or None when there is none."""
        if backend not in ("cuda", "cpu") or sig.op != self.op or abi.supports(sig) is not None:
            return None
        prelude = dtype_prelude(sig, backend)
        if prelude is None:
            return None
        folder = templates_dir() / "kernels" / backend
        ext = "cu" if backend == "cuda" else "cpp"
        src_file, spec_file = folder / f"reference_{self.op}.{ext}", folder / f"reference_{self.op}.json"
        if not src_file.is_file() or not spec_file.is_file():
            return None
        return Candidate(op=self.op, backend=backend, source=prelude + src_file.read_text(),
                         spec=parse_spec(spec_file.read_text()), family="reference", params={}, origin="reference")


def dtype_prelude(sig: Signature, backend: str) -> str | None:
    """`#define` lines for a reference kernel's element types, or None if a dtype has no kernel type."""
    types = CUDA_TYPES if backend == "cuda" else CPU_TYPES
    in_t, out_t = types.get(sig.x.dtype), types.get(output_dtype(sig))
    if in_t is None or out_t is None:
        return None
    lines = [f"#define IN_T {in_t}", f"#define OUT_T {out_t}"]
    for name in ("weight", "bias"):
        try:
            spec = sig.input(name)
        except KeyError:
            continue
        if spec is not None:
            w_t = types.get(spec.dtype)
            if w_t is None:
                return None
            lines.append(f"#define W_T {w_t}")
            break
    return "// forge-pack: element types for " + sig.pretty() + "\n" + "\n".join(lines) + "\n"
