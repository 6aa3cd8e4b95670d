"""Render the LLM prompts from templates/prompts/ (the one source of truth). Pure Python, no torch.

Purposes: ``rewrite`` (make a working kernel faster), ``repair`` (fix a failed one) and
``new_family`` (write a kernel from scratch with a different approach). Every prompt carries the
op's PyTorch call, the exact signature and captured shapes, the candidate format, the op's ABI,
the hardware facts and the baseline; rewrite and repair add the parent's source, verdict, timing,
compile log and what was already tried from it.
"""

from __future__ import annotations

import ast
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from string import Template

from forge_pack.targets import abi, registry
from forge_pack.search.propose import NodeView, ProposeRequest
from forge_pack.core.signature import SHORT_DTYPE, Signature

PURPOSES = ("rewrite", "repair", "new_family")
MAX_SOURCE_CHARS = 24000  # a parent longer than this is cut: the model needs its shape, not every line
MAX_LOG_CHARS = 3000  # the first compiler errors are the ones that matter
MAX_DETAIL_CHARS = 1500
MAX_TRIED = 12


def templates_dir() -> Path:
    """forge_pack/templates in a wheel, the repository's templates/ in a source checkout."""
    here = Path(__file__).resolve().parent.parent  # forge_pack/
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "prompts").is_dir():
            return candidate
    raise FileNotFoundError("forge-pack's templates/prompts directory is missing from the installation")


@lru_cache(maxsize=None)
def load(name: str) -> str:
    return (templates_dir() / "prompts" / name).read_text()


@lru_cache(maxsize=None)
def reason_help() -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^- `(\w+)`: (.+)$", load("reasons.md"), re.M)}


def render(purpose: str, request: ProposeRequest, failures: tuple[str, ...] = ()) -> list[dict]:
    """The chat messages (system + user) for one LLM move."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}")
    backend = request.backend
    values = {
        "backend_title": "CUDA" if backend == "cuda" else "CPU (C++/OpenMP)",
        "source_lang": source_lang(backend),
        "candidate_format": load("candidate_format.md").strip(),
        "backend_rules": Template(load(f"backend_{backend}.md")).substitute(
            arch=_arch(request.gpu), cpu_helpers=_cpu_helpers() if backend == "cpu" else "",
            cpu_compiler=_cpu_compiler()).strip(),
    }
    system = Template(load("system.md")).substitute(values)
    user_values = {"context": context(request), "source_lang": values["source_lang"],
                   "tried": _tried(request, failures), "templates": template_families(request.hotspot.op, backend),
                   **_hints(request)}
    parent = request.parent
    if parent is not None:
        user_values.update(_parent_values(parent))
    user = Template(load(f"{purpose}.md")).substitute(user_values)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def fix_reply(messages: list[dict], reply: str, problem: str, backend: str) -> list[dict]:
    """The conversation continued: the rejected reply, then why it was rejected."""
    text = Template(load("fix_reply.md")).substitute(problem=problem, source_lang=source_lang(backend))
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": text}]


def source_lang(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpp"


def context(request: ProposeRequest) -> str:
    hs = request.hotspot
    sig = hs.signature
    env = abi.env(sig)
    scalars = abi.scalars(sig)
    values = {
        "op": sig.op,
        "reference": torch_reference(sig),
        "abi_doc": _abi_doc(sig),
        "pretty": sig.pretty(),
        "tensors": _tensors(sig),
        "call_paths": ", ".join(hs.call_paths) or "the model",
        "calls_per_forward": f"{hs.calls_per_forward:g} call{'s' if hs.calls_per_forward != 1 else ''}",
        "pointer_kind": "device pointers" if request.backend == "cuda" else "pointers",
        "time_share": f"{hs.time_share:.1%}",
        "tensor_names": ", ".join(f"`{n}`" for n in abi.tensor_names(sig)),
        "env": ", ".join(f"`{k}` = {v}" for k, v in env.items()),
        "scalars": ", ".join(f"`{k}` = {v:g}" for k, v in scalars.items()) or "none",
        "bytes_moved": f"{abi.bytes_moved(sig):,}",
        "tolerance": tolerance_line(sig),
        "hardware": _hardware(request),
        "baseline": _baseline(request),
    }
    return Template(load("context.md")).substitute(values).strip()


def tolerance_line(sig: Signature) -> str:
    """The tolerance this call is verified with. The candidate format's line is generic (per dtype);
    per-op overrides (softmax's tiny atol, group_norm's 1e-4) are what a kernel must actually meet."""
    dtype = sig.output.dtype if sig.output is not None else sig.x.dtype
    tables, slack = _tolerance_tables()
    tol = tables.get((sig.op, dtype)) or tables.get(("", dtype))
    if tol is None:
        return f"within the {dtype} tolerance of the candidate format (How a candidate is judged)"
    text = f"`|out - ref| <= atol + rtol*|ref|` with atol = {tol[0]:g}, rtol = {tol[1]:g} (output {dtype})"
    if slack:
        text += (f"; atol is raised to {slack:g}x eager PyTorch's own error on elements of the same or smaller "
                 f"magnitude where that is larger")
    return text


@lru_cache(maxsize=1)
def _tolerance_tables() -> tuple[dict[tuple[str, str], tuple[float, float]], float | None]:
    """{(op, dtype) or ("", dtype): (atol, rtol)} and EAGER_SLACK: each kind's own rows from the
    target registry, the generic table and the slack read from forge_pack/evaluate/verdict_rules.py's
    source: importing it imports torch, which the LLM side must not (it runs without a GPU stack)."""
    tables: dict[tuple[str, str], tuple[float, float]] = {
        (spec.name, dtype): (row.atol, row.rtol) for spec in registry.SPECS.values()
        for dtype, row in spec.tolerances.items()}
    slack = None
    try:
        tree = ast.parse((Path(__file__).resolve().parent.parent / "evaluate" / "verdict_rules.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return tables, slack
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        name, value = getattr(target, "id", ""), getattr(node, "value", None)
        if name == "EAGER_SLACK":
            slack = _literal(value)
        elif name == "TABLE" and isinstance(value, ast.Dict):
            for k, v in zip(value.keys, value.values):
                key, tol = _literal(k), _tolerance_args(v)
                key = ("", key) if isinstance(key, str) else key
                if isinstance(key, tuple) and len(key) == 2 and tol is not None:
                    tables[key] = tol
    return tables, slack if isinstance(slack, (int, float)) else None


def _literal(node) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _tolerance_args(node) -> tuple[float, float] | None:
    """(atol, rtol) of a ``Tolerance(atol, rtol, reason)`` call, positional or by keyword."""
    if not isinstance(node, ast.Call):
        return None
    args = dict(zip(("atol", "rtol"), node.args))
    args.update({k.arg: k.value for k in node.keywords if k.arg in ("atol", "rtol")})
    atol, rtol = _literal(args.get("atol")), _literal(args.get("rtol"))
    if isinstance(atol, (int, float)) and isinstance(rtol, (int, float)):
        return float(atol), float(rtol)
    return None


def _abi_doc(sig: Signature) -> str:
    if sig.op in registry.SPECS or sig.op == "region":
        return registry.spec_for(sig).doc
    return "(no ABI description)"


def torch_reference(sig: Signature) -> str:
    """The PyTorch call the kernel replaces, as code (tensors by their ABI names); for a region,
    its subgraph rebuilt from the canonical form (the ATen ops, called with in0..inK)."""
    if sig.op == "region":
        from forge_pack.graph.canonical import rebuild

        return "# out = forward(in0, ..., inK): the fused region, one kernel\n" + rebuild(sig.param("form")).code.strip()
    args, extra = [], []
    for i, (name, spec) in enumerate(sig.inputs):
        args.append(name if i == 0 else f"{name}={name if spec is not None else 'None'}")
    # forge-pack's own params (e.g. rms_norm's weight_offset for (1 + weight) variants) are listed apart
    spec = registry.SPECS.get(sig.op)
    known = tuple(p for p in spec.params if p not in spec.own_params) if spec is not None else None
    for name, value in sig.params:
        if name == "dtype" and isinstance(value, str):
            value = f"torch.{value}"
        elif isinstance(value, list):
            value = tuple(value)
        (args if known is None or name in known else extra).append(f"{name}={value}")
    text = f"out = torch.nn.functional.{sig.op}({', '.join(args)})"
    if extra:
        text += f"  # and forge-pack's own parameters: {', '.join(extra)} (see Math)"
    return text


def _tensors(sig: Signature) -> str:
    lines = []
    for name, spec in list(sig.inputs) + [("out", sig.output)]:
        if spec is None:
            if name != "out":
                lines.append(f"- `{name}`: absent (None)")
            continue
        lines.append(f"- `{name}`: {SHORT_DTYPE.get(spec.dtype, spec.dtype)} shape {list(spec.shape)} strides "
                     f"{list(spec.strides)} ({spec.layout}), {spec.nbytes:,} bytes")
    return "\n".join(lines)


def _gpu_get(gpu: dict, *keys: str):
    for k in keys:
        if gpu.get(k) not in (None, ""):
            return gpu[k]
    return None


def _arch(gpu: dict) -> str:
    cc = _gpu_get(gpu, "compute_capability", "capability", "cc", "arch")
    if cc is None:
        return "the GPU below"
    if isinstance(cc, (list, tuple)):
        return f"sm_{cc[0]}{cc[1]}"
    text = str(cc)
    return text if text.startswith("sm_") else "sm_" + text.replace(".", "")


def _hints(request: ProposeRequest) -> dict[str, str]:
    """Backend-specific wording of what usually limits a kernel and what else to try."""
    if request.backend == "cpu":
        return {"limits": "too little parallelism across the cores, inner loops the compiler cannot vectorise, "
                          "extra passes over memory, exp or division in the inner loop, false sharing",
                "approaches": "a different split of rows across threads, one fused pass with online statistics, "
                              "explicit SIMD with <immintrin.h>, blocking for the cache"}
    sms = _gpu_get(request.gpu, "sm_count", "multiprocessors", "multi_processor_count")
    return {"limits": f"launch overhead, too few blocks for {f'the {sms} SMs' if sms else 'the whole device'}, "
                      "uncoalesced or narrow loads, extra passes over memory, reductions, occupancy",
            "approaches": "a different split of the work across threads, warps and blocks, single-pass online "
                          "statistics, several blocks per row or group with a second small kernel, vectorised "
                          "16-byte loads"}


def _cpu_compiler() -> str:
    try:
        from forge_pack.evaluate.compile import CPU_FLAGS
    except ImportError:
        return "g++ -O3 -fopenmp -shared -fPIC"
    return "g++ " + " ".join(CPU_FLAGS)


def _hardware(request: ProposeRequest) -> str:
    gpu = {k: v for k, v in (request.gpu or {}).items() if k not in _NOT_HARDWARE}
    lines = [f"- {_label(k)}: {_fmt(v)}" for k, v in gpu.items()]
    if request.backend == "cpu":
        lines.append(_cpu_facts())
    return "\n".join(lines) or "a CUDA GPU (no details measured)"


_NOT_HARDWARE = {"pid", "host", "hostname", "backend", "time", "started_at"}


_UNITS = {"_gbs": " (GB/s)", "_bytes": " (bytes)", "_kb": " (KiB)", "_mb": " (MiB)", "_us": " (µs)", "_mhz": " (MHz)"}


def _label(key: str) -> str:
    for suffix, unit in _UNITS.items():
        if key.endswith(suffix):
            return key[:-len(suffix)].replace("_", " ") + unit
    return key.replace("_", " ")


@lru_cache(maxsize=None)
def _cpu_facts() -> str:
    """This machine's CPU (the search evaluates CPU kernels where it runs)."""
    lines = [f"- logical cores: {os.cpu_count()}"]
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "\n".join(lines)
    model = re.search(r"model name\s*:\s*(.*)", info)
    flags = set((re.search(r"flags\s*:\s*(.*)", info) or [None, ""])[1].split())
    if model:
        lines.insert(0, f"- CPU: {model.group(1).strip()}")
    simd = [f for f in ("avx512f", "avx512bw", "avx512_bf16", "avx2", "fma", "f16c") if f in flags]
    if simd:
        lines.append(f"- SIMD: {', '.join(simd)}")
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _baseline(request: ProposeRequest) -> str:
    b = request.baseline
    if b is None:
        return "not measured yet"
    lines = [f"- PyTorch eager: median {b.eager.median_us:.2f} µs (IQR {b.eager.iqr_us:.2f}, n={b.eager.n})"]
    if b.compiled is not None:
        lines.append(f"- torch.compile: median {b.compiled.median_us:.2f} µs (IQR {b.compiled.iqr_us:.2f})")
    elif b.compile_error:
        lines.append(f"- torch.compile: failed ({b.compile_error[:200]})")
    if b.floor_us:
        lines.append(f"- bandwidth floor: {b.floor_us:.2f} µs (all bytes once at {b.copy_bandwidth_gbs:,.0f} GB/s, "
                     "the measured copy bandwidth)")
    return "\n".join(lines)


def _parent_values(parent: NodeView) -> dict:
    c, ev = parent.candidate, parent.evaluation
    source = c.source if len(c.source) <= MAX_SOURCE_CHARS else c.source[:MAX_SOURCE_CHARS] + "\n// [cut]\n"
    verdict = ev.verdict if ev else None
    log = (ev.compile_log or "").strip() if ev else ""
    values = {
        "node_id": parent.node_id,
        "label": c.label,
        "parent_source": source.rstrip(),
        "parent_spec": spec_json(c.spec.to_json()),
        "parent_timing": _timing_line(ev) if ev else "Not evaluated yet.",
        "parent_log": f"Compiler output:\n```\n{log[:MAX_LOG_CHARS]}\n```\n" if log else "",
        "reason": verdict.reason if verdict else "unknown",
        "reason_help": reason_help().get(verdict.reason, "") if verdict else "",
        "detail": ((verdict.detail or "(no details)") if verdict else "")[:MAX_DETAIL_CHARS],
    }
    return values


def spec_json(spec: dict) -> str:
    """A launch spec as JSON with one line per kernel: compact for the model, easy to read."""
    parts = []
    for key, items in spec.items():
        if isinstance(items, list) and items:
            inner = ",\n".join("    " + json.dumps(i) for i in items)
            parts.append(f'  "{key}": [\n{inner}\n  ]')
        else:
            parts.append(f'  "{key}": {json.dumps(items)}')
    return "{\n" + ",\n".join(parts) + "\n}"


def _timing_line(ev) -> str:
    if ev.timing is None:
        return f"Verdict {ev.verdict.reason}; not timed."
    t = ev.timing
    parts = [f"Median {t.median_us:.2f} µs (IQR {t.iqr_us:.2f}, n={t.n})"]
    if ev.speedup_vs_eager is not None:
        parts.append(f"{ev.speedup_vs_eager:.2f}x vs eager")
    if ev.speedup_vs_compile is not None:
        parts.append(f"{ev.speedup_vs_compile:.2f}x vs torch.compile")
    if ev.bandwidth_fraction is not None:
        parts.append(f"{ev.bandwidth_fraction:.0%} of the copy bandwidth")
    return "; ".join(parts) + "."


def _tried(request: ProposeRequest, failures: tuple[str, ...]) -> str:
    lines = []
    views = list(request.siblings)
    if request.parent is not None and not request.siblings and request.parent.depth == 0:
        views = [request.parent]
    for v in views[:MAX_TRIED]:
        lines.append(f"- {v.candidate.label} ({v.candidate.origin}): {_outcome(v)}")
    lines += [f"- LLM attempt: {f}" for f in failures[-MAX_TRIED:]]
    return "\n".join(lines) or "Nothing yet."


def _outcome(v: NodeView) -> str:
    ev = v.evaluation
    if ev is None:
        return "not evaluated yet"
    if ev.verdict.ok:
        return _timing_line(ev)
    first = (ev.verdict.detail or "").strip().splitlines()
    return f"failed, {ev.verdict.reason}" + (f": {first[0][:200]}" if first else "")


@lru_cache(maxsize=None)
def template_families(op: str, backend: str) -> str:
    """One line per built-in template of this op: its file name and the first sentence of its header."""
    folder = templates_dir() / "kernels" / backend
    lines = []
    for path in sorted(folder.glob("*.cu" if backend == "cuda" else "*.cpp")) if folder.is_dir() else []:
        if path.name.startswith("_"):
            continue
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("//"):
                break
            header.append(line.lstrip("/ ").strip())
        text = " ".join(h for h in header if not h.startswith("{{"))
        if not re.search(rf"\b{re.escape(op)}\b", text):
            continue
        sentence = re.split(r"(?<!e\.g)(?<!i\.e)\.\s", text, maxsplit=1)[0]
        if len(sentence) > 240:
            sentence = sentence[:240].rsplit(" ", 1)[0] + " ..."
        lines.append(f"- `{path.stem}`: {sentence}")
    return "\n".join(lines) or "None for this op."


@lru_cache(maxsize=None)
def _cpu_helpers() -> str:
    path = templates_dir() / "kernels" / "cpu" / "forge_cpu.h"
    if not path.is_file():
        return "\"forge_cpu.h\" is not available in this installation: convert 16-bit types by hand."
    decls = [line.split("{", 1)[0].strip() + ";" for line in path.read_text().splitlines()
             if re.match(r"\s*(static\s+)?inline\b", line)]
    types = [line.strip() for line in path.read_text().splitlines() if re.match(r"struct forge_\w+ \{", line)]
    decls = types + decls
    return "\"forge_cpu.h\" provides:\n```cpp\n" + "\n".join(decls) + "\n```"


def prompt_text(messages: list[dict]) -> str:
    """The messages as one text for the run store."""
    return "\n\n".join(f"### {m['role']}\n{m['content']}" for m in messages)

