"""Probes of launch.GuardedBuffer on a real GPU, one per process (an illegal address poisons the
CUDA context for good). Run by tests/test_bounds_gpu.py; by hand:

    python tests/bounds_probe.py access --guard end --nbytes 16000 --at 16000 [--write]
    python tests/bounds_probe.py roundtrip

Prints one JSON object on its last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

PEEK_POKE = r"""
extern "C" __global__ void peek(long long addr, long long at, unsigned char* sink) {
  sink[0] = ((const volatile unsigned char*)addr)[at];
}
extern "C" __global__ void poke(long long addr, long long at, unsigned char* sink) {
  ((volatile unsigned char*)addr)[at] = 0x3C;
  sink[0] = 1;
}
extern "C" __global__ void where(const float* x, float* out, long long n, long long* seen) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * 2.0f;
  if (i == 0) { seen[0] = (long long)x; seen[1] = (long long)out; }
}
extern "C" __global__ void scribble(float* x, long long n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) x[n - 1] = 42.0f;
}
"""


def _module():
    from forge_pack.core.candidate import Candidate, parse_spec
    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.launch import load_module

    spec = parse_spec('{"kernels": [{"name": "peek", "args": ["x"], "grid": [1], "block": [1]}]}')
    build = compile_candidate(Candidate("softmax", "cuda", PEEK_POKE, spec, "bounds probe"))
    if not build.ok:
        raise SystemExit(f"probe kernels did not compile:\n{build.log}")
    return load_module("cuda", build.path, ["peek", "poke", "where", "scribble"])


def access(guard: str, nbytes: int, at: int, write: bool) -> dict:
    """Read (or write) one byte at payload + at of a guarded buffer; report the CUDA error code."""
    import torch

    from forge_pack.evaluate.launch import GuardedBuffer, Plan, PlannedLaunch

    module = _module()
    problem = module.driver.guard_problem()
    if problem:
        return {"guard_problem": problem}
    buf = GuardedBuffer(module.driver, nbytes, guard)
    report = {"guard_problem": "", "granularity": buf.granularity, "mapped": buf.mapped, "offset": buf.offset,
              "slack": buf.slack, "payload_ends_at_mapping_end": buf.ptr + nbytes == buf.start + buf.mapped,
              "payload_starts_at_mapping_start": buf.ptr == buf.start}
    module.driver.check(module.driver.vmm["cuMemsetD8"](buf.ptr, 0xA7, nbytes), "cuMemsetD8")
    sink = torch.zeros(1, dtype=torch.uint8, device="cuda")
    name = "poke" if write else "peek"
    p = Plan((PlannedLaunch(name, (("i64", buf.ptr), ("i64", at), ("ptr", "sink")), (1, 1, 1), (1, 1, 1), 0),), ())
    run = module.bind(p, {"sink": sink})
    run()
    code = module.driver.lib.cuCtxSynchronize()
    report.update(code=code, error=module.driver.error_text(code) if code else "")
    if not code:
        report["value"] = int(sink.item())
        buf.free()
    return report


def roundtrip() -> dict:
    """GuardedRun without faults: the kernel sees the guarded addresses, flush against the mapping
    edge; outputs and a write into an input come back into the caller's tensors."""
    import torch

    from forge_pack.evaluate.launch import Plan, PlannedLaunch

    module = _module()
    problem = module.driver.guard_problem()
    if problem:
        return {"guard_problem": problem}
    n = 1 << 20  # 4 MiB of float32: two whole 2 MiB granules
    report: dict = {"guard_problem": "", "supports_guard": module.supports_guard}
    for guard in ("end", "start"):
        x = torch.arange(n, dtype=torch.float32, device="cuda")
        out = torch.full((n,), -1.0, device="cuda")
        seen = torch.zeros(2, dtype=torch.int64, device="cuda")
        p = Plan((PlannedLaunch("where", (("ptr", "x"), ("ptr", "out"), ("i64", n), ("ptr", "seen")),
                                (n // 256, 1, 1), (256, 1, 1), 0),), ())
        with module.bind(p, {"x": x, "out": out, "seen": seen}, guard=guard) as run:
            run()
            bx, bout = run.buffers["x"][0], run.buffers["out"][0]
            edge = {"end": lambda b: b.ptr + b.nbytes == b.start + b.mapped,
                    "start": lambda b: b.ptr == b.start}[guard]
            report[guard] = {
                "out_is_2x": bool(torch.equal(out, x * 2)),
                "x_unchanged": bool(torch.equal(x, torch.arange(n, dtype=torch.float32, device="cuda"))),
                "kernel_saw_guarded_x": int(seen[0]) == bx.ptr, "kernel_saw_guarded_out": int(seen[1]) == bout.ptr,
                "x_flush": edge(bx), "out_flush": edge(bout), "slack": [bx.slack, bout.slack],
            }
            run()  # a second call copies in again: out is 2x the original x, not of the guarded copy's state
            report[guard]["second_call_same"] = bool(torch.equal(out, x * 2))
        m = torch.zeros(1000, device="cuda")
        p2 = Plan((PlannedLaunch("scribble", (("ptr", "x"), ("i64", 1000)), (1, 1, 1), (32, 1, 1), 0),), ())
        with module.bind(p2, {"x": m}, guard=guard) as run:
            run()
        report[guard]["input_write_copied_back"] = float(m[-1]) == 42.0 and float(m[:-1].abs().sum()) == 0.0
    return report


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("access")
    a.add_argument("--guard", choices=["end", "start"], required=True)
    a.add_argument("--nbytes", type=int, required=True)
    a.add_argument("--at", type=int, required=True, help="byte offset from the payload's first byte (may be < 0)")
    a.add_argument("--write", action="store_true")
    sub.add_parser("roundtrip")
    args = ap.parse_args(argv)
    report = access(args.guard, args.nbytes, args.at, args.write) if args.mode == "access" else roundtrip()
    print(json.dumps(report), flush=True)
    sys.stderr.flush()
    os._exit(0)  # skip torch's teardown: after a fault it would free memory in a poisoned context


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
