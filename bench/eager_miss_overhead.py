"""What eager ``apply()`` costs a call its kernels were not built for: the model run on its own inputs
and on the same inputs cut to a few rows (a decode step after the prefill the package was built on),
each without and with the package applied, in alternating rounds of one process.

On the cut inputs no kernel matches (the script says so from the package's counters), so the
difference is the patched wrappers' guard work alone: binding each call, comparing its tensors with
the verified ones, falling back. A package must not make such calls slower by more than noise.

    python bench/eager_miss_overhead.py [OUT] --model tests/models/norm_head.py --package norm_head_forge
        [--device cpu|cuda] [--rows 1] [--rounds 30] [--calls 200]

Writes OUT.{md,json} (default bench/results/eager_miss_overhead).
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import statistics
import sys
import time

from _common import commit, environment, out_path, write


def _cut(v, rows: int):
    import torch

    if isinstance(v, torch.Tensor):
        return v[:rows].contiguous() if v.dim() >= 1 and v.shape[0] > rows else v
    if isinstance(v, (list, tuple)):
        return type(v)(_cut(x, rows) for x in v)
    if isinstance(v, dict):
        return {k: _cut(x, rows) for k, x in v.items()}
    return v


def _shapes(args: tuple, kwargs: dict) -> list:
    import torch

    return [list(v.shape) for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]


def _per_call_us(model, args, kwargs, calls: int, cuda: bool) -> float:
    import torch

    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        model(*args, **kwargs)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def measure(model, pkg, args, kwargs, rounds: int, calls: int, cuda: bool) -> dict:
    """Alternating rounds, unpatched then patched; the package's counters over the patched rounds."""
    plain, patched = [], []
    for _ in range(3):  # warm-up: the first calls pay allocation and lazy loading
        model(*args, **kwargs)
    before = pkg.status()
    kernel0, fall0 = dict(before.get("kernel_calls", {})), dict(before.get("fallback_calls", {}))
    for _ in range(rounds):
        pkg.revert()
        plain.append(_per_call_us(model, args, kwargs, calls, cuda))
        pkg.apply(model)
        patched.append(_per_call_us(model, args, kwargs, calls, cuda))
    pkg.revert()
    after = pkg.status()
    kernels = {k: v - kernel0.get(k, 0) for k, v in after.get("kernel_calls", {}).items() if v - kernel0.get(k, 0)}
    falls = {k: v - fall0.get(k, 0) for k, v in after.get("fallback_calls", {}).items() if v - fall0.get(k, 0)}
    p, q = statistics.median(plain), statistics.median(patched)
    return {"shapes": _shapes(args, kwargs), "unpatched_us": p, "patched_us": q, "ratio": q / p,
            "unpatched_iqr_us": _iqr(plain), "patched_iqr_us": _iqr(patched),
            "kernel_calls": kernels, "fallback_calls": falls, "rounds": rounds, "calls_per_round": calls}


def _iqr(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--model", required=True)
    ap.add_argument("--package", required=True, help="the installed accelerator package's import name")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--rows", type=int, default=1, help="the cut inputs keep this many rows of dimension 0")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads on the CPU")
    a = ap.parse_args()
    base = out_path("eager_miss_overhead")

    import torch

    from forge_pack.profile.load import load

    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    target = load(a.model, a.device, a.dtype)
    model, args, kwargs = target.module, tuple(target.args), dict(target.kwargs)
    pkg = importlib.import_module(a.package)
    cuda = a.device.startswith("cuda")
    rows = {}
    with torch.inference_mode():
        for name, (ar, kw) in (("built inputs", (args, kwargs)), (f"cut to {a.rows} row(s)", _cut((args, kwargs), a.rows))):
            print(f"{name}: {_shapes(ar, kw)}", flush=True)
            rows[name] = measure(model, pkg, ar, kw, a.rounds, a.calls, cuda)
            print(f"  {rows[name]['unpatched_us']:.2f} us unpatched, {rows[name]['patched_us']:.2f} us patched "
                  f"({rows[name]['ratio']:.3f}x), kernel calls {rows[name]['kernel_calls']}", flush=True)
    cmd = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    doc = {"command": cmd, "commit": commit(), "environment": environment(), "device": a.device,
           "model": a.model, "package": a.package, "threads": a.threads if a.device == "cpu" else None, "cases": rows}
    lines = [f"# Eager apply() on calls its kernels were not built for ({a.device})", "",
             f"`{cmd}`; commit {doc['commit']}; env {doc['environment']}", "",
             "Per forward, median of alternating rounds in one process (IQR in brackets). On the cut inputs no "
             "kernel matches: the difference is the wrappers' guard work.", "",
             "| inputs | shapes | unpatched µs | patched µs | patched / unpatched | kernel calls | fall-backs |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['shapes']} | {r['unpatched_us']:.2f} ({r['unpatched_iqr_us']:.2f}) | "
                     f"{r['patched_us']:.2f} ({r['patched_iqr_us']:.2f}) | {r['ratio']:.3f}x | "
                     f"{sum(r['kernel_calls'].values())} | {sum(r['fallback_calls'].values())} |")
    write(base, doc, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
