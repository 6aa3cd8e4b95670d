"""Turn an LLM reply into a candidate, or say exactly why not. Pure Python, no torch.

A reply must hold one fenced source block (```cuda / ```cpp) and one ```json launch spec. The
source is then checked statically, before anything is compiled: no torch/ATen/c10, no streams,
no kernel launches, no host allocations, no ``main``, every kernel the spec names defined as
``extern "C"``, and the spec's expressions evaluate for this signature. The same rules are in the
prompts (templates/prompts/backend_*.md), so a reply that follows the prompt passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from forge_pack import abi
from forge_pack.candidate import LaunchSpec, evaluate, parse_spec, split_typed_arg
from forge_pack.errors import ForgeError
from forge_pack.signature import Signature

SOURCE_LANGS = {"cuda": ("cuda", "cu", "cpp", "c++", "cxx", "c"), "cpu": ("cpp", "c++", "cxx", "cc", "c")}
CUDA_INCLUDES = ("cuda_bf16.h", "cuda_fp16.h")
CPU_INCLUDE_RE = re.compile(r"^(forge_cpu\.h|c?(math|stdint|stddef|string|float|limits|climits|cfloat|"
                            r"algorithm|cmath|cstdint|cstddef|cstring|numeric|type_traits|utility|array)(\.h)?|"
                            r"omp\.h|immintrin\.h|arm_neon\.h)$")
CUDA_THREAD_LIMIT = 1024  # threads per block on every NVIDIA GPU since Fermi


class ReplyError(Exception):
    """A reply that gives no candidate. ``outcome``: unparseable | refused | static_check."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


@dataclass(frozen=True)
class ParsedReply:
    source: str
    spec: LaunchSpec
    note: str  # the prose before the first block (the model's one-line explanation)


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_REFUSAL = re.compile(r"(?i)\b(i can(no|')t|i am unable|i'm unable|i won't|i will not|as an ai|sorry)\b")


def parse_reply(text: str, backend: str) -> ParsedReply:
    """Source and launch spec from a reply; ReplyError when there is none or it is malformed."""
    text = _THINK.sub("", text or "")  # reasoning models served by vLLM/Ollama think out loud first
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if not blocks:
        if text.startswith("[refusal]") or (_REFUSAL.search(text[:400]) and len(text) < 2000):
            raise ReplyError("refused", f"the model declined: {text.strip()[:200]!r}")
        raise ReplyError("unparseable", f"no fenced code block in the reply ({len(text)} characters)")
    sources = [body for lang, body in blocks if lang in SOURCE_LANGS[backend]]
    specs = [body for lang, body in blocks if lang == "json"]
    if not specs:  # tolerate an unlabelled spec block
        specs = [body for lang, body in blocks if not lang and body.lstrip().startswith("{")]
    if not sources:
        sources = [body for lang, body in blocks if not lang and not body.lstrip().startswith("{")]
    if not sources:
        langs = ", ".join(lang or "(none)" for lang, _ in blocks)
        raise ReplyError("unparseable", f"no ```{'cuda' if backend == 'cuda' else 'cpp'} source block "
                                        f"(block languages: {langs})")
    if not specs:
        raise ReplyError("unparseable", "no ```json launch spec block")
    # Several blocks: the longest source is the kernel (short ones are snippets); the last spec wins.
    source = max(sources, key=len).strip() + "\n"
    try:
        spec = parse_spec(specs[-1])
    except ForgeError as e:
        raise ReplyError("unparseable", f"launch spec: {e.message}")
    note = text[:text.find("```")].strip()[:300]
    return ParsedReply(source, spec, note)


def strip_comments_and_strings(source: str) -> str:
    """Source with comments and string/char literals blanked (extern "C" kept), lines preserved."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            i = n if j < 0 else j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * source.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            literal = source[i:j + 1]
            line_start = source.rfind("\n", 0, i) + 1
            keep = literal in ('"C"', '"C++"') or source[line_start:i].strip().replace(" ", "") == "#include"
            out.append(literal if keep else c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


_FORBIDDEN_COMMON = (
    (re.compile(r"#\s*include\s*[<\"](torch|ATen|aten|c10|pybind11|Python\.h)"), "includes torch/ATen/c10/Python headers"),
    (re.compile(r"\b(torch|at|c10|aten|pybind11)\s*::"), "calls into torch/ATen/c10"),
    (re.compile(r"\bmain\s*\("), "defines main()"),
    (re.compile(r"\b(malloc|calloc|realloc|free|aligned_alloc|posix_memalign)\s*\("), "allocates host memory"),
    (re.compile(r"\bnew\b\s*[A-Za-z_(\[]"), "allocates with new"),
    (re.compile(r"\bdelete\b\s*[A-Za-z_(\[]"), "frees with delete"),
    (re.compile(r"\b(system|popen|fork|exec[lv]p?e?|dlopen|fopen|getenv)\s*\("), "calls the operating system"),
)
_FORBIDDEN_CUDA = (
    (re.compile(r"\bcudaStream\w*|\bcudaEvent\w*|\bcuStream\w*"), "uses streams or events"),
    (re.compile(r"<<<"), "launches kernels itself (forge-pack launches them from the spec)"),
    (re.compile(r"\bcuda(Malloc|Free|HostAlloc|MallocManaged|MallocAsync|Memcpy|Memset)\w*"),
     "allocates or copies memory with the CUDA runtime"),
    (re.compile(r"\bcu(Mem|Launch|Ctx|Module|Graph|Init)\w*\s*\("), "calls the CUDA driver API"),
    (re.compile(r"\bcuda(DeviceSynchronize|LaunchKernel|GraphLaunch|SetDevice)\b"), "calls the CUDA runtime"),
)
_FORBIDDEN_CPU = (
    (re.compile(r"\bstd\s*::\s*(thread|async|jthread)\b|\bpthread_create\b"),
     "starts threads of its own (use OpenMP pragmas)"),
)


def static_check(source: str, spec: LaunchSpec, sig: Signature, backend: str) -> list[str]:
    """Everything wrong with the candidate that is visible without compiling; [] if nothing."""
    code = strip_comments_and_strings(source)
    problems: list[str] = []
    for pattern, why in _FORBIDDEN_COMMON + (_FORBIDDEN_CUDA if backend == "cuda" else _FORBIDDEN_CPU):
        m = pattern.search(code)
        if m:
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{why} (line {line}: {m.group(0).strip()!r})")
    for inc in re.findall(r"#\s*include\s*[<\"]([^>\"]+)[>\"]", code):
        if backend == "cuda" and inc not in CUDA_INCLUDES:
            problems.append(f"includes <{inc}>; CUDA kernels may include only {', '.join(CUDA_INCLUDES)}")
        elif backend == "cpu" and not CPU_INCLUDE_RE.match(inc):
            problems.append(f"includes <{inc}>; use standard C/C++ math headers, <omp.h> or \"forge_cpu.h\"")
    defined = extern_c_functions(code, backend)
    for k in spec.kernels:
        if k.name not in defined:
            kind = 'extern "C" __global__' if backend == "cuda" else 'extern "C"'
            problems.append(f"the spec launches {k.name!r}, but the source defines no {kind} function of that name"
                            + (f" (it defines: {', '.join(sorted(defined))})" if defined else ""))
    problems += check_spec(spec, sig, backend)
    return problems


def extern_c_functions(code: str, backend: str) -> set[str]:
    """Names of functions defined with C linkage (kernels only, on CUDA), in declarations or blocks."""
    names: set[str] = set()
    for m in re.finditer(r'extern\s+"C"\s*', code):
        rest = code[m.end():]
        if rest.startswith("{"):
            body = rest[1:_matching_brace(rest)]
            chunks = _top_level_decls(body)
        else:  # one declaration or definition: up to its body or its semicolon
            ends = [i for i in (rest.find("{"), rest.find(";")) if i >= 0]
            chunks = [rest[:min(ends) if ends else len(rest)]]
        for chunk in chunks:
            head = chunk.split("{", 1)[0]
            fm = re.search(r"([A-Za-z_]\w*)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*$", head.strip())
            if not fm:
                continue
            if backend == "cuda" and "__global__" not in head:
                continue
            names.add(fm.group(1))
    return names


def _matching_brace(text: str) -> int:
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "{") - (c == "}")
        if depth == 0:
            return i
    return len(text)


def _top_level_decls(body: str) -> list[str]:
    """The text before each top-level '{' in an extern "C" { ... } block: one per function definition."""
    heads, depth, start = [], 0, 0
    for i, c in enumerate(body):
        if c == "{":
            if depth == 0:
                heads.append(body[start:i])
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                start = i + 1
        elif c == ";" and depth == 0:
            start = i + 1
    return heads


def check_spec(spec: LaunchSpec, sig: Signature, backend: str) -> list[str]:
    """The spec's names exist and its expressions evaluate for this exact signature."""
    env: dict[str, float] = dict(abi.env(sig))
    scalars = abi.scalars(sig)
    tensors = set(abi.tensor_names(sig)) | {w.name for w in spec.workspaces}
    problems: list[str] = []

    def value(text: str, where: str):
        try:
            return evaluate(text, {**env, **scalars})
        except ForgeError as e:
            problems.append(f"{where}: {e.message}")
            return None

    for r in spec.requires:
        if value(r, "requires") is False:
            problems.append(f"requires {r!r} is false for this call, so the kernel would never run")
    for w in spec.workspaces:
        b = value(w.bytes, f"workspace {w.name}.bytes")
        if isinstance(b, (int, float)) and b < 0:
            problems.append(f"workspace {w.name} has negative size {b}")
    for k in spec.kernels:
        for a in k.args:
            prefix, expr = split_typed_arg(a)
            if prefix is None and (expr in tensors or expr in env or expr in scalars):
                continue
            if prefix is None and expr.isidentifier():
                problems.append(f"{k.name}: argument {expr!r} is not a tensor ({', '.join(sorted(tensors))}), a size "
                                f"variable or a scalar of this op")
                continue
            value(expr, f"{k.name} argument {a!r}")
        if backend != "cuda":
            continue
        dims = [value(e, f"{k.name}.grid") for e in k.grid] + [value(e, f"{k.name}.block") for e in k.block]
        if all(isinstance(d, (int, float)) for d in dims):
            if any(d < 1 for d in dims):
                problems.append(f"{k.name}: grid/block {dims[:3]}/{dims[3:]} has a dimension below 1")
            elif dims[3] * dims[4] * dims[5] > CUDA_THREAD_LIMIT:
                problems.append(f"{k.name}: {dims[3] * dims[4] * dims[5]} threads per block, over the limit of "
                                f"{CUDA_THREAD_LIMIT}")
            elif dims[1] > 65535 or dims[2] > 65535:
                problems.append(f"{k.name}: grid y/z {dims[1]}/{dims[2]} over the limit of 65535")
        value(k.shared_mem, f"{k.name}.shared_mem")
    return problems
