"""Checks before compiling: what the source may contain, and whether the launch spec fits the kernels.

Cheap and in the parent process. A failed check is a ``Verdict`` (``static_check``, ``aliasing``
or ``inapplicable``) with a message written for whoever wrote the kernel (often an LLM), never
an exception. Parameter lists are parsed from the ``extern "C"`` declarations; a declaration the
parser does not understand (macros) is skipped rather than rejected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from forge_pack.targets import abi
from forge_pack.evaluate import build_parity
from forge_pack.core.candidate import Candidate
from forge_pack.core.errors import ForgeError
from forge_pack.evaluate.launch import check_dims, check_requires, plan
from forge_pack.core.signature import Signature
from forge_pack.core.verdict import Verdict

CUDA_INCLUDES = {"cuda_bf16.h", "cuda_fp16.h", "cuda_fp8.h"}
CPU_INCLUDES_DENIED = re.compile(r"^(thread|future|fstream|pthread\.h|unistd\.h|dlfcn\.h|sys/.*|torch/.*|ATen/.*|"
                                 r"c10/.*|pybind11/.*|Python\.h|cuda.*)$")

# Host work a candidate must never do: the tool writes all host code, and every launch goes on the
# current stream (side streams and deferred work would escape the timing and the checks).
CUDA_FORBIDDEN = [
    (re.compile(r"<<<"), "launches a kernel from device code (dynamic parallelism): side-stream / deferred work"),
    (re.compile(r"\bcuda(Stream|Event|Graph|Malloc|Free|Memcpy|Memset|Launch|DeviceSynchronize)\w*"),
     "calls the CUDA runtime (streams, allocation, launches): the tool writes all host code"),
    (re.compile(r"\bcu(Stream|Launch|Mem)\w*\s*\("), "calls the CUDA driver API: the tool writes all host code"),
    (re.compile(r"\bint\s+main\s*\("), "defines main(): candidates are kernels only"),
]
CPU_FORBIDDEN = [
    (re.compile(r"\bstd::(thread|jthread|async)\b|\bpthread_create\b"),
     "starts its own threads (work that outlives the call escapes the checks): use OpenMP"),
    (re.compile(r"\b(fork|vfork|system|popen|exec[lv]p?e?|dlopen)\s*\("), "runs processes or loads code"),
    (re.compile(r"\bfopen\s*\(|\b[io]?fstream\b|\bopen\s*\(\s*\""), "does file I/O (results cached across runs?)"),
    (re.compile(r"\bint\s+main\s*\("), "defines main(): candidates are kernels only"),
]

_I32 = {"int", "signed", "signed int", "unsigned", "unsigned int", "int32_t", "uint32_t"}
_I64 = {"long", "long int", "long long", "long long int", "unsigned long", "unsigned long long",
        "unsigned long long int", "int64_t", "uint64_t", "size_t", "ptrdiff_t", "ssize_t", "intptr_t"}
_PTR_DTYPES = {
    "float": {"float32"}, "float2": {"float32"}, "float4": {"float32"}, "double": {"float64"},
    "__nv_bfloat16": {"bfloat16"}, "nv_bfloat16": {"bfloat16"}, "__nv_bfloat162": {"bfloat16"},
    "__half": {"float16"}, "half": {"float16"}, "__half2": {"float16"},
    "uint16_t": {"bfloat16", "float16"}, "unsigned short": {"bfloat16", "float16"},
    "forge_bf16": {"bfloat16"}, "forge_f16": {"float16"},
}


@dataclass(frozen=True)
class Param:
    text: str
    name: str
    kind: str  # ptr | i32 | i64 | f32 | f64 | other
    base: str  # the pointee / value type without qualifiers
    const: bool  # for pointers: the pointee is const (read-only)


def strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), source, flags=re.S)
    return re.sub(r"//[^\n]*", "", source)


def kernel_params(source: str, name: str) -> list[Param] | None:
    """The parameters of ``void name(...)`` in the source, or None if not found or not parseable."""
    code = strip_comments(source)
    m = re.search(r"\bvoid\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?" + re.escape(name) + r"\s*\(", code)
    if not m:
        return None
    depth, i = 1, m.end()
    while i < len(code) and depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    inner = code[m.end():i - 1].strip()
    if not inner or inner == "void":
        return []
    params = []
    for raw in _split_top(inner):
        p = _parse_param(raw)
        if p is None:
            return None
        params.append(p)
    return params


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _parse_param(raw: str) -> Param | None:
    text = raw.split("=")[0].strip()
    if not text or "(" in text or "..." in text:
        return None
    is_ptr = "*" in text or text.endswith("]")
    cleaned = re.sub(r"\[[^\]]*\]", "", text).replace("*", " * ").replace("&", " & ")
    tokens = [t for t in cleaned.split() if t not in ("__restrict__", "__restrict", "restrict", "volatile",
                                                      "__grid_constant__", "&", "struct")]
    if len(tokens) < 2:
        return None
    name = tokens[-1]
    if not name.isidentifier():
        return None
    type_tokens = tokens[:-1]
    star = type_tokens.index("*") if "*" in type_tokens else len(type_tokens)
    const = "const" in type_tokens[:star]  # const before the first * qualifies the pointee
    base = " ".join(t for t in type_tokens if t not in ("const", "*"))
    base = base.replace("std::", "")
    if is_ptr:
        kind = "ptr"
    elif base in _I32:
        kind = "i32"
    elif base in _I64:
        kind = "i64"
    elif base == "float":
        kind = "f32"
    elif base == "double":
        kind = "f64"
    else:
        kind = "other"
    return Param(raw, name, kind, base, const)


def check_source(candidate: Candidate) -> str | None:
    code = strip_comments(candidate.source)
    for m in re.finditer(r'#\s*include\s*[<"]([^>"]+)[>"]', code):
        header = m.group(1).strip()
        if candidate.backend == "cuda" and header not in CUDA_INCLUDES:
            return (f"#include <{header}> is not allowed: CUDA candidates may include only "
                    f"{', '.join(sorted(CUDA_INCLUDES))} (no torch headers, no host code)")
        if candidate.backend == "cpu" and CPU_INCLUDES_DENIED.match(header):
            return f"#include <{header}> is not allowed in a CPU candidate (no threads, files, torch or CUDA)"
    for pattern, why in (CUDA_FORBIDDEN if candidate.backend == "cuda" else CPU_FORBIDDEN):
        m = pattern.search(code)
        if m:
            line = code[:m.start()].count("\n") + 1
            return f"line {line}: `{m.group(0).strip()}` {why}"
    return build_parity.problem(code)


def check(candidate: Candidate, sig: Signature) -> Verdict | None:
    """A rejecting verdict, or None when the candidate may be compiled and run on this signature."""
    if candidate.backend not in ("cuda", "cpu"):
        return Verdict(False, "static_check", f"unknown backend {candidate.backend!r}")
    if candidate.op != sig.op:
        return Verdict(False, "static_check", f"candidate is for op {candidate.op!r}, target is {sig.op!r}")
    why = abi.supports(sig)
    if why:
        return Verdict(False, "inapplicable", f"forge-pack does not target this signature: {why}")
    try:
        failed = check_requires(candidate.spec, sig)
        if failed is not None:
            return Verdict(False, "inapplicable", f"requires `{failed}` is false for {sig.pretty()}")
        p = plan(candidate.spec, sig)
    except ForgeError as e:
        return Verdict(False, "static_check", f"launch spec: {e.message}" + (f" ({e.hint})" if e.hint else ""))
    problem = check_source(candidate)
    if problem:
        return Verdict(False, "static_check", problem)
    if not any(kind == "ptr" and v == "out" for l in p.launches for kind, v in l.args):
        return Verdict(False, "static_check", "no kernel receives `out`: pass \"out\" in some kernel's args")
    dtypes = {n: s.dtype for n, s in sig.inputs if s is not None}
    if sig.output is not None:
        dtypes["out"] = sig.output.dtype
    inputs = set(abi.tensor_inputs(sig))
    for i, launch in enumerate(p.launches):
        problem = check_dims(launch, candidate.backend)
        if problem:
            return Verdict(False, "launch_error", problem)
        params = kernel_params(candidate.source, launch.name)
        if params is None:
            continue
        where = f"kernels[{i}] {launch.name}"
        if len(params) != len(launch.args):
            return Verdict(False, "static_check",
                           f"{where} declares {len(params)} parameters but the launch spec passes "
                           f"{len(launch.args)} arguments ({', '.join(launch.arg_texts)})")
        for param, (kind, value), text in zip(params, launch.args, launch.arg_texts):
            problem = _arg_problem(param, kind, value, text, dtypes)
            if problem:
                return Verdict(False, "static_check", f"{where}: {problem}")
            if kind == "ptr" and value in inputs and not param.const:
                return Verdict(False, "aliasing",
                               f"{where}: input `{value}` is bound to the writable parameter `{param.text.strip()}`: "
                               f"the kernel may write into its input (output aliases an input); declare inputs "
                               f"`const T*` and write only to `out` or workspaces")
    return None


def _arg_problem(param: Param, kind: str, value, text: str, dtypes: dict[str, str]) -> str | None:
    if param.kind == "other":
        return None
    if kind == "ptr":
        if param.kind != "ptr":
            return f"argument {text!r} is a tensor pointer but parameter `{param.text}` is not a pointer"
        allowed = _PTR_DTYPES.get(param.base)
        if allowed and value in dtypes and dtypes[value] not in allowed:
            return (f"tensor `{value}` is {dtypes[value]} but parameter `{param.text}` points to {param.base}")
        return None
    if param.kind == "ptr":
        return f"argument {text!r} is a {kind} value but parameter `{param.text}` is a pointer"
    if param.kind == "f64":
        return f"parameter `{param.text}` is double: scalars are passed as float (f32) or integers"
    if param.kind != kind:
        names = {"i32": "32-bit int", "i64": "64-bit int (long long)", "f32": "float"}
        expr = text.split(":", 1)[-1] if text.split(":", 1)[0] in ("i32", "i64", "f32") else text
        return (f"argument {text!r} is passed as {names[kind]} but parameter `{param.text}` is "
                f"{names[param.kind]}: write \"{param.kind}:{expr}\" in the spec or change the parameter type")
    return None
