"""Run every cheating-kernel fixture of tests/kernels through the evaluator and record its verdict.

    python bench/trust_table.py cpu  bench/results/trust_cpu      # no GPU needed
    python bench/trust_table.py cuda bench/results/trust_cuda     # on a GPU machine

Each fixture says what it expects (`// expect: reason ...`) and, optionally, its signature
(`// signature: ...`), op (`// op: ...`) and the cheat class it belongs to (`// class: ...`).
Every fixture is evaluated as the search's final confirmation is (`final=True`: other seeds,
bounds checks), and the honest reference kernel of the default signature is evaluated as a
control. Writes <stem>.md and <stem>.json; exits 1 when any fixture gets a verdict it does not
expect or the reference is rejected.
"""

from __future__ import annotations

import json
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

DEFAULT_SIGNATURE = {"cpu": "x: f32[64,1000], dim=-1", "cuda": "x: f32[512,2048], dim=-1"}


def _marker(text: str, name: str) -> str | None:
    m = re.search(rf"^// {name}: (.+)$", text, flags=re.M)
    return m.group(1).strip() if m else None


def _summary(text: str) -> str:
    """The fixture's first comment sentence after its markers: what it does."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        body = line[2:].strip()
        if re.match(r"^(expect|signature|op|class|mode|final):", body):
            continue
        lines.append(body)
    words = " ".join(lines)
    return words.split(". ")[0][:160]


def main(argv: list[str]) -> int:
    backend, stem = argv[0], Path(argv[1])
    import torch

    from forge_pack.core.candidate import load_candidate_files
    from forge_pack.evaluate.evaluator import Evaluator
    from forge_pack.search.families import reference_candidate
    from forge_pack.evaluate.timing import TimingConfig

    from eval_helpers import hotspot

    prefix, suffix = ("cuda_", ".cu") if backend == "cuda" else ("cpu_", ".cpp")
    paths = sorted((ROOT / "tests" / "kernels").glob(prefix + "*" + suffix))
    cfg = TimingConfig(warmup=3, reps=20, compile_baseline=False)
    rows, failures = [], 0
    with Evaluator(backend, workers=1, timeout_s=30, timing=cfg) as ev:
        ref_h = hotspot("softmax", DEFAULT_SIGNATURE[backend], device=backend)
        ref = ev.evaluate(reference_candidate(ref_h.signature, backend), ref_h, final=True)
        for path in paths:
            text = path.read_text()
            expect = set((_marker(text, "expect") or "").split())
            op = _marker(text, "op") or "softmax"
            sig = _marker(text, "signature") or DEFAULT_SIGNATURE[backend]
            t0 = time.perf_counter()
            e = ev.evaluate(load_candidate_files(str(path), None, op, backend), hotspot(op, sig, device=backend),
                            final=True)
            got = "ok" if e.verdict.ok else e.verdict.reason
            caught = got in expect
            failures += not caught
            rows.append({"fixture": path.name, "class": _marker(text, "class") or "", "what": _summary(text),
                         "expected": sorted(expect), "verdict": got, "as_expected": caught,
                         "detail": (e.verdict.detail or "").splitlines()[0][:200] if e.verdict.detail else "",
                         "eval_s": round(time.perf_counter() - t0, 2)})
            print(f"{'ok  ' if caught else 'MISS'} {path.name}: {got} (expected {' '.join(sorted(expect))})",
                  flush=True)
        env = {"backend": backend, "torch": torch.__version__, "cuda": torch.version.cuda,
               "device": ev.device_info().get("name", platform.processor() or "cpu"),
               "python": platform.python_version(), "command": "python bench/trust_table.py " + " ".join(argv)}
    ref_row = {"verdict": "ok" if ref.verdict.ok else ref.verdict.reason,
               "median_us": ref.timing.median_us if ref.timing else None}
    failures += not ref.verdict.ok
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps({"env": env, "reference": ref_row, "fixtures": rows}, indent=2))
    lines = [f"# Cheating fixtures on {backend}: verdicts", "",
             f"`{env['command']}` on {env['device']}, torch {env['torch']}"
             + (f", CUDA {env['cuda']}" if backend == "cuda" else "") + f", Python {env['python']}.", "",
             f"Control: the reference kernel of `{DEFAULT_SIGNATURE[backend]}`: **{ref_row['verdict']}**.", "",
             f"{sum(r['as_expected'] for r in rows)} of {len(rows)} fixtures got an expected verdict.", "",
             "| fixture | class | what it does | expected | verdict | |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| `{r['fixture']}` | {r['class']} | {r['what']} | {' '.join(r['expected'])} | {r['verdict']} "
                     f"| {'caught' if r['as_expected'] else '**MISSED**'} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
