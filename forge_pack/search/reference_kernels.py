"""Reference kernels: simple, correct starting points for the search (one per op and backend).

Sources live in templates/kernels/{cuda,cpu}/reference_<op>.{cu,cpp} with their launch spec in
reference_<op>.json. Element types are chosen per signature by a short ``#define`` prelude
(IN_T, OUT_T, W_T) prepended to the source, so one file covers every dtype combination and the
candidate source still stands alone (it builds verbatim in the emitted package). Pure Python.
"""

from __future__ import annotations

from forge_pack.targets import abi
from forge_pack.core.candidate import Candidate, parse_spec
from forge_pack.evaluate.compile import templates_dir
from forge_pack.core.signature import Signature

REFERENCE_OPS = ("softmax", "log_softmax", "group_norm", "adaptive_avg_pool2d")
CUDA_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
CPU_TYPES = {"float32": "float", "bfloat16": "forge_bf16", "float16": "forge_f16"}


def output_dtype(sig: Signature) -> str:
    if sig.output is not None:
        return sig.output.dtype
    if sig.op in ("softmax", "log_softmax") and sig.param("dtype"):
        return str(sig.param("dtype"))
    return sig.x.dtype


def dtype_prelude(sig: Signature, backend: str) -> str | None:
    """`#define` lines for the element types, or None if a dtype has no kernel type."""
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


def reference_candidate(op: str | Signature, backend: str, sig: Signature | None = None) -> Candidate | None:
    """The reference kernel for this op/backend/signature, or None when there is none.

    Also callable as ``reference_candidate(sig, backend)``.
    """
    if isinstance(op, Signature):
        op, sig = op.op, op
    if sig is None:
        return None
    if op not in REFERENCE_OPS or backend not in ("cuda", "cpu") or sig.op != op:
        return None
    if abi.supports(sig) is not None:
        return None
    prelude = dtype_prelude(sig, backend)
    if prelude is None:
        return None
    folder = templates_dir() / "kernels" / backend
    ext = "cu" if backend == "cuda" else "cpp"
    src_file, spec_file = folder / f"reference_{op}.{ext}", folder / f"reference_{op}.json"
    if not src_file.is_file() or not spec_file.is_file():
        return None
    return Candidate(op=op, backend=backend, source=prelude + src_file.read_text(),
                     spec=parse_spec(spec_file.read_text()), family="reference", params={}, origin="reference")
