"""Render the LLM prompts from templates/prompts/ (the one source of truth). Pure Python, no torch.

Purposes: ``rewrite`` (make a working kernel faster), ``repair`` (fix a failed one) and
``new_family`` (write a kernel from scratch with a different approach). Every prompt carries the
op's PyTorch call, the exact signature and captured shapes, the candidate format, the op's ABI,
the hardware facts and the baseline; rewrite and repair add the parent's source, verdict, timing,
compile log and what was already tried from it.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from string import Template

from forge_pack import abi
from forge_pack.propose import NodeView, ProposeRequest
from forge_pack.signature import SHORT_DTYPE, Signature

PURPOSES = ("rewrite", "repair", "new_family")
MAX_SOURCE_CHARS = 24000  # a parent longer than this is cut: the model needs its shape, not every line
MAX_LOG_CHARS = 3000  # the first compiler errors are the ones that matter
MAX_DETAIL_CHARS = 1500
MAX_TRIED = 12


def templates_dir() -> Path:
    """forge_pack/templates in a wheel, the repository's templates/ in a source checkout."""
    here = Path(__file__).resolve().parent
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
            arch=_arch(request.gpu), cpu_helpers=_cpu_helpers() if backend == "cpu" else "").strip(),
    }
    system = Template(load("system.md")).substitute(values)
    user_values = {"context": context(request), "source_lang": values["source_lang"],
                   "tried": _tried(request, failures), "sm_hint": _sm_hint(request.gpu)}
    parent = request.parent
    if parent is not None:
        user_values.update(_parent_values(parent))
    user = Template(load(f"{purpose}.md")).substitute(user_values)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


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
        "abi_doc": abi.ABIS[sig.op].doc if sig.op in abi.ABIS else "(no ABI description)",
        "pretty": sig.pretty(),
        "tensors": _tensors(sig),
        "call_paths": ", ".join(hs.call_paths) or "the model",
        "calls_per_forward": f"{hs.calls_per_forward:g}",
        "time_share": f"{hs.time_share:.1%}",
        "tensor_names": ", ".join(f"`{n}`" for n in abi.tensor_names(sig)),
        "env": ", ".join(f"`{k}` = {v}" for k, v in env.items()),
        "scalars": ", ".join(f"`{k}` = {v:g}" for k, v in scalars.items()) or "none",
        "bytes_moved": f"{abi.bytes_moved(sig):,}",
        "hardware": _hardware(request),
        "baseline": _baseline(request),
    }
    return Template(load("context.md")).substitute(values).strip()


def torch_reference(sig: Signature) -> str:
    """The PyTorch call the kernel replaces, as code (tensors by their ABI names)."""
    args = []
    for i, (name, spec) in enumerate(sig.inputs):
        args.append(name if i == 0 else f"{name}={name if spec is not None else 'None'}")
    for name, value in sig.params:
        if name == "dtype" and isinstance(value, str):
            value = f"torch.{value}"
        elif isinstance(value, list):
            value = tuple(value)
        args.append(f"{name}={value}")
    return f"out = torch.nn.functional.{sig.op}({', '.join(args)})"


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


def _sm_hint(gpu: dict) -> str:
    sms = _gpu_get(gpu, "sm_count", "multiprocessors", "multi_processor_count")
    return f"the {sms} SMs" if sms else "the whole device"


def _hardware(request: ProposeRequest) -> str:
    gpu = dict(request.gpu or {})
    if not gpu:
        return f"{'a CUDA GPU' if request.backend == 'cuda' else 'the CPU'} (no details measured)"
    return "\n".join(f"- {k.replace('_', ' ')}: {_fmt(v)}" for k, v in gpu.items())


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
        "parent_spec": json.dumps(c.spec.to_json(), indent=1),
        "parent_timing": _timing_line(ev) if ev else "Not evaluated yet.",
        "parent_log": f"Compiler output:\n```\n{log[:MAX_LOG_CHARS]}\n```\n" if log else "",
        "reason": verdict.reason if verdict else "unknown",
        "reason_help": reason_help().get(verdict.reason, "") if verdict else "",
        "detail": ((verdict.detail or "(no details)") if verdict else "")[:MAX_DETAIL_CHARS],
    }
    return values


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
def _cpu_helpers() -> str:
    path = templates_dir() / "kernels" / "cpu" / "forge_cpu.h"
    if not path.is_file():
        return "\"forge_cpu.h\" is not available in this installation: convert 16-bit types by hand."
    decls = [line.strip().rstrip("{").strip() for line in path.read_text().splitlines()
             if re.match(r"\s*(static\s+)?inline\b", line)]
    return "\"forge_cpu.h\" provides:\n```cpp\n" + "\n".join(decls) + "\n```"


def prompt_text(messages: list[dict]) -> str:
    """The messages as one text for the run store."""
    return "\n\n".join(f"### {m['role']}\n{m['content']}" for m in messages)

