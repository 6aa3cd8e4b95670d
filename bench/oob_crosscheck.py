"""Cross-check of the out-of-bounds guard. Each CUDA fixture runs once unguarded (does a plain
run notice anything, and is the output right?), once per guard side with launch.GuardedBuffer
(every tensor flush against unmapped memory), and once unguarded under compute-sanitizer's
memcheck where the machine has a working one. The guard and memcheck must agree on which
fixtures touch memory outside their tensors. Not part of the product: a second opinion.

    python3 bench/oob_crosscheck.py [FIXTURE.cu ...] [--out DIR] [--timeout S]

Without fixtures: every tests/kernels/cuda_oob_*.cu and cuda_out_of_bounds.cu. Each run is its own
process (a fault poisons the CUDA context); memcheck runs with PyTorch's caching allocator off, so
it knows every tensor's exact bounds. Prints a table and writes oob_crosscheck.{md,json} to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "tests" / "kernels"
DEFAULT_SIGNATURE = "x: f32[512,2048], dim=-1"
SANITIZER_ERRORS = 86  # compute-sanitizer's exit code when it found errors (--error-exitcode)


def header(path: Path, key: str, default: str) -> str:
    m = re.search(rf"^// {key}: (.+)$", path.read_text(), flags=re.M)
    return m.group(1).strip() if m else default


# ---------------------------------------------------------------- one run (child process)


def run_one(path: Path, guard: str, op: str, text: str) -> dict:
    """Launch the fixture once on fresh inputs; report whether the device faulted."""
    import torch

    from forge_pack.targets import ops
    from forge_pack.core.candidate import load_candidate_files
    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.launch import GuardSetupError, LaunchError, load_module, plan
    from forge_pack.targets.sigparse import parse_signature

    cand = load_candidate_files(str(path), None, op, "cuda")
    sig = ops.with_output(parse_signature(op, text))
    build = compile_candidate(cand)
    if not build.ok:
        return {"result": "compile_error", "detail": build.log[-2000:]}
    module = load_module("cuda", build.path, [k.name for k in cand.spec.kernels])
    tensors = ops.make_inputs(sig, "fresh", torch.Generator().manual_seed(1), "cuda")
    p = plan(cand.spec, sig)
    ws = {name: torch.zeros(max(n, 1), dtype=torch.uint8, device="cuda") for name, n, _ in p.workspaces}
    out = ops.empty_like_spec(sig.output, "cuda")
    try:
        run = module.bind(p, {**tensors, "out": out, **ws}, guard=None if guard == "none" else guard)
        run()
        code = module.driver.lib.cuCtxSynchronize()
    except GuardSetupError as e:
        return {"result": "unavailable", "detail": str(e)}
    except LaunchError as e:
        return {"result": "fault", "detail": str(e), "code": getattr(e, "code", None)}
    if code:
        return {"result": "fault", "detail": module.driver.error_text(code), "code": code}
    ref = ops.eager(sig)(tensors)
    right = bool(torch.allclose(out.float(), ref.float(), rtol=1e-3, atol=1e-5, equal_nan=True))
    return {"result": "clean", "detail": "" if right else "output differs from eager", "output_right": right}


# ---------------------------------------------------------------- the parent


def child(path: Path, guard: str, op: str, text: str, timeout: float, sanitizer: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--run", str(path), "--guard", guard, "--op", op, "--signature", text]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    if sanitizer:
        cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", str(SANITIZER_ERRORS), "--print-limit", "4", *cmd]
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"  # one cudaMalloc per tensor: memcheck knows its bounds
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"result": "timeout", "detail": f"no answer within {timeout:.0f} s", "seconds": timeout}
    seconds = round(time.perf_counter() - t0, 1)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    try:
        report = json.loads(last)
    except ValueError:
        report = {"result": "no_report", "detail": (r.stdout + r.stderr)[-1500:]}
    if sanitizer:
        found = re.findall(r"=+ (Invalid __global__ (?:read|write|atomic)[^\n]*)", r.stdout + r.stderr)
        if r.returncode == SANITIZER_ERRORS or found:
            report = {"result": "errors", "detail": "; ".join(dict.fromkeys(found)) or "memcheck reported errors"}
        elif report.get("result") == "clean" and r.returncode == 0:
            report = {"result": "clean", "detail": ""}
        else:  # e.g. gVisor: "Device not supported", then error 999 at the first allocation
            report = {"result": "unavailable", "detail": (r.stdout + r.stderr)[-600:]}
    report["seconds"] = seconds
    return report


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fixtures", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds for one run (memcheck is slow)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds for everything: runs that would start later are reported as skipped")
    ap.add_argument("--no-sanitizer", action="store_true")
    ap.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--guard", default="none", choices=["none", "end", "start"], help=argparse.SUPPRESS)
    ap.add_argument("--op", default="softmax", help=argparse.SUPPRESS)
    ap.add_argument("--signature", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:
        print(json.dumps(run_one(args.run, args.guard, args.op, args.signature or DEFAULT_SIGNATURE)), flush=True)
        sys.stderr.flush()
        os._exit(0)  # skip torch's teardown: after a fault it would free memory in a poisoned context

    fixtures = args.fixtures or [*sorted(KERNELS.glob("cuda_oob_*.cu")), KERNELS / "cuda_out_of_bounds.cu"]
    sanitizer = None if args.no_sanitizer else shutil.which("compute-sanitizer")
    if sanitizer is None and not args.no_sanitizer:
        for cand in sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer")):
            sanitizer = str(cand)
    start = time.perf_counter()

    def budget() -> float:
        if args.deadline is None:
            return args.timeout
        return min(args.timeout, args.deadline - (time.perf_counter() - start))

    def timed(path: Path, guard: str, op: str, text: str, tool: str | None = None) -> dict:
        left = budget()
        if left < 10:  # too little time to start torch and CUDA in a child
            return {"result": "skipped", "detail": "the --deadline was reached"}
        return child(path, guard, op, text, left, tool)

    rows = []
    for path in fixtures:  # the guarded runs of every fixture first: they are fast, memcheck is not
        op = header(path, "op", "softmax")
        text = header(path, "signature", DEFAULT_SIGNATURE)
        row = {"fixture": path.stem, "expect": header(path, "expect", "?"), "signature": text, "op": op}
        row["unguarded"] = timed(path, "none", op, text)  # what a run without the guard sees
        for guard in ("end", "start"):
            row[f"vmm_{guard}"] = timed(path, guard, op, text)
        rows.append(row)
    for path, row in zip(fixtures, rows):
        row["memcheck"] = (timed(path, "none", row["op"], row["signature"], sanitizer) if sanitizer
                           else {"result": "unavailable", "detail": "compute-sanitizer not found"})
        vmm_fault = any(row[f"vmm_{g}"]["result"] == "fault" for g in ("end", "start"))
        mc = row["memcheck"]["result"]
        known = all(row[f"vmm_{g}"]["result"] in ("fault", "clean") for g in ("end", "start"))
        row["agree"] = vmm_fault == (mc == "errors") if known and mc in ("errors", "clean") else None
        print(f"{path.stem}: unguarded={row['unguarded']['result']} end={row['vmm_end']['result']} "
              f"start={row['vmm_start']['result']} memcheck={mc}", flush=True)

    lines = ["| fixture | expect | unguarded | guard end | guard start | memcheck | agree |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        agree = {None: "n/a", True: "yes", False: "NO"}[r["agree"]]
        plain = r["unguarded"]["result"] + (", output right" if r["unguarded"].get("output_right") else "")
        lines.append(f"| {r['fixture']} | {r['expect']} | {plain} | {r['vmm_end']['result']} | "
                     f"{r['vmm_start']['result']} | {r['memcheck']['result']} | {agree} |")
    def brief(res: dict) -> str:  # a traceback's end says most, an error message's start
        return res["detail"][-400:] if res["result"] in ("no_report", "unavailable") else res["detail"][:400]

    details = [f"- {r['fixture']} {k}: {brief(r[k])}" for r in rows
               for k in ("unguarded", "vmm_end", "vmm_start", "memcheck") if r[k].get("detail")]
    text = "\n".join(lines + ["", *details]) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "oob_crosscheck.md").write_text(text)
        (args.out / "oob_crosscheck.json").write_text(json.dumps(rows, indent=1))
    return 1 if any(r["agree"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
