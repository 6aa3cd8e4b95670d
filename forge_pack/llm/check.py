"""Turn an LLM reply into a candidate, or say exactly why not. Pure Python, no torch.

A reply must hold one fenced source block (```cuda / ```cpp) and one ```json launch spec. The
source is then checked statically, before anything is compiled: the evaluator's own checks
(``forge_pack.evaluate.static_check``: includes, streams, launches, ``main``, the spec against the kernels'
parameters) plus what an LLM is prone to write (torch calls, host allocations) and every kernel the
spec names defined as ``extern "C"``. The same rules are in the prompts (templates/prompts/backend_*.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from forge_pack.core.candidate import Candidate, LaunchSpec, extract_embedded_spec, parse_spec
from forge_pack.core.errors import ForgeError
from forge_pack.core.signature import Signature

SOURCE_LANGS = {"cuda": ("cuda", "cu", "cpp", "c++", "cxx", "c"), "cpu": ("cpp", "c++", "cxx", "cc", "c")}


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
    if not isinstance(text, str):  # the client joins a server's content parts; anything else is no reply
        raise ReplyError("unparseable", f"the reply is not text ({type(text).__name__})")
    text = _THINK.sub("", text)  # reasoning models served by vLLM/Ollama think out loud first
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
    # Several blocks: the longest source is the kernel (short ones are snippets); the last spec wins.
    source = max(sources, key=len).strip() + "\n"
    if not specs:  # the format also allows the spec embedded at the end of the source
        embedded = extract_embedded_spec(source)
        if embedded is None:
            raise ReplyError("unparseable", "no ```json launch spec block")
        specs = [embedded]
    try:
        spec = parse_spec(specs[-1])
    except ForgeError as e:
        raise ReplyError("unparseable", f"launch spec: {e.message}")
    except (TypeError, ValueError, AttributeError, RecursionError, MemoryError) as e:
        # parse_spec names what is wrong; this is the net under it, so that a spec of a shape nobody
        # foresaw is still a rejected reply (with a fix turn), not a crashed move
        raise ReplyError("unparseable", f"launch spec is malformed ({type(e).__name__}: {str(e)[:200]})")
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


# What the evaluator's checks (forge_pack.evaluate.static_check) leave out and an LLM is prone to write: host
# allocation, torch calls, OS calls. Rules about includes, streams, launches, main and the spec are
# the evaluator's, applied here too (one source of truth).
_FORBIDDEN_EXTRA = (
    (re.compile(r"\b(torch|at|c10|aten|pybind11)\s*::"), "calls into torch/ATen/c10: the kernel must stand alone"),
    (re.compile(r"\b(malloc|calloc|realloc|free|aligned_alloc|posix_memalign)\s*\("),
     "allocates host memory: scratch memory is a spec workspace"),
    (re.compile(r"\bnew\b\s*[A-Za-z_(\[]"), "allocates with new: scratch memory is a spec workspace"),
    (re.compile(r"\bdelete\b\s*[A-Za-z_(\[]"), "frees with delete: the kernel allocates nothing"),
    (re.compile(r"\bcuda(Malloc|Free|HostAlloc)\w*"),
     "allocates with the CUDA runtime: scratch memory is a spec workspace"),
    (re.compile(r"\b(system|popen|fork|getenv|fopen)\s*\("), "calls the operating system"),
)


def static_check(source: str, spec: LaunchSpec, sig: Signature, backend: str) -> list[str]:
    """Everything wrong with the candidate that is visible without compiling; [] if nothing."""
    from forge_pack.evaluate import static_check as evaluator_checks

    problems: list[str] = []
    verdict = evaluator_checks.check(Candidate(sig.op, backend, source, spec), sig)
    if verdict is not None:
        problems.append(f"{verdict.reason}: {verdict.detail}")
    code = strip_comments_and_strings(source)
    for pattern, why in _FORBIDDEN_EXTRA:
        m = pattern.search(code)
        if m:
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"line {line}: `{m.group(0).strip()}` {why}")
    defined = extern_c_functions(code, backend)
    for k in spec.kernels:
        if k.name not in defined:
            kind = 'extern "C" __global__' if backend == "cuda" else 'extern "C"'
            problems.append(f"the spec launches {k.name!r}, but the source defines no {kind} function of that name"
                            + (f" (it defines: {', '.join(sorted(defined))})" if defined else ""))
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
