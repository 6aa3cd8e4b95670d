"""The end-to-end demo: build a package for a model, install it, apply it, show before and after.

    python -m forge_pack.cli.demo MODEL.py [--device cpu] [--budget N] [--out DIR] [--name PKG]
        forge-pack build (replacing DIR), then the whole-model gate's verdict. The gate writes a
        package only when the patched model is faster end to end by more than the noise
        (forge_pack.evaluate.model_gain); when it wrote none, the demo says so and why, installs
        nothing and exits 0. Otherwise pip install --no-build-isolation into this environment, then
        `show` in a fresh process (the package imported the way a user imports it).
    python -m forge_pack.cli.demo show PKG MODEL.py [--device cpu] [--dtype D] [--json]
        the model's outputs and latency, original vs patched with PKG, and revert checked bitwise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path


def _head(t) -> str:
    flat = t.detach().float().reshape(-1)[:6].tolist()
    return "[" + ", ".join(f"{v:.5g}" for v in flat) + (", ...]" if t.numel() > 6 else "]")


def show(package: str, model: str, device: str | None, dtype: str | None) -> dict:
    import torch

    from forge_pack.evaluate.confirm import _time_pair
    from forge_pack.evaluate.model_accuracy import compare_outputs, precise_reference, seeded_forward, tensors
    from forge_pack.profile.load import load

    pkg = importlib.import_module(package)
    target = load(model, device, dtype)
    cuda = target.device == "cuda"

    def run():  # seeded alike, on fresh inputs, output cloned: see confirm.compare_patched
        return seeded_forward(target.module, target.args, target.kwargs, target.device)

    with torch.inference_mode():
        before = run()
    gold, gold_note = precise_reference(target.module, target.args, target.kwargs, target.device)
    with torch.inference_mode():
        applied = pkg.apply(target.module)
        after = run()
        calls = pkg.status()["kernel_calls"]
        pkg.revert()
        reverted = run()
        t_eager, t_patched = _time_pair(target.forward, target.forward, lambda: pkg.apply(target.module), pkg.revert,
                                        cuda, budget_s=10.0, max_n=30)
    cmp = compare_outputs(before, after, gold, gold_note)
    out_a, out_b = tensors(before), tensors(after)
    return {"package": package, "model": model, "device": target.device, "applied": applied, "kernel_calls": calls,
            **cmp, "bitwise_after_revert": all(torch.equal(a, b) for a, b in zip(out_a, tensors(reverted))),
            "eager_ms": t_eager.median_us / 1e3, "patched_ms": t_patched.median_us / 1e3,
            "speedup": t_eager.median_us / max(t_patched.median_us, 1e-9),
            "eager": t_eager.to_json(), "patched": t_patched.to_json(),
            "before": [_head(t) for t in out_a[:3]], "after": [_head(t) for t in out_b[:3]]}


def print_show(r: dict) -> None:
    from forge_pack.evaluate.model_accuracy import describe

    print(f"{r['package']} on {r['model']} ({r['device']}): applied={r['applied']}, kernel calls {r['kernel_calls']}")
    for i, (a, b) in enumerate(zip(r["before"], r["after"])):
        print(f"  output {i} before: {a}")
        print(f"  output {i} after:  {b}")
    agree = f", argmax agreement {100 * r['argmax_agreement']:.2f}%" if r.get("argmax_agreement") is not None else ""
    print(f"  max abs difference {r['max_abs_diff']}{agree}, within tolerance: {r['within_tolerance']}; "
          f"after revert() bitwise identical: {r['bitwise_after_revert']}")
    acc = r.get("accuracy") or {}
    if describe(acc):
        print(f"  {describe(acc)} (tolerance basis: {acc['basis']})")
    elif acc.get("note"):
        print(f"  {acc['note']}")
    from forge_pack.evaluate.model_gain import judge_gain

    verdict = judge_gain(r)
    print(f"  latency: {r['eager_ms']:.3f} ms eager -> {r['patched_ms']:.3f} ms patched ({r['speedup']:.2f}x): "
          f"{'a gain' if verdict.gain else 'no gain'} here ({verdict.reason})")


def gate_lines(result) -> list[str]:
    """What the whole-model gate decided for a build, in the demo's words."""
    from forge_pack.evaluate.model_gain import judge_gain

    m = result.model_result
    if result.written:
        if m and m.get("eager"):
            return [f"demo: the whole-model gate passed: {judge_gain(m).reason}"]
        return ["demo: the package was written without a whole-model check"]
    if m and m.get("eager"):
        return [f"demo: the whole-model gate wrote no package: {judge_gain(m).reason}",
                "demo: nothing to install; the model stays as it is (the kernels' own gains are in the table "
                "above; they do not add up to a faster model on this machine)"]
    return [f"demo: no package written: {result.message}", "demo: nothing to install; the model stays as it is"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["show"]:
        p = argparse.ArgumentParser(prog="python -m forge_pack.cli.demo show")
        p.add_argument("package")
        p.add_argument("model")
        p.add_argument("--device", default=None)
        p.add_argument("--dtype", default=None)
        p.add_argument("--json", action="store_true")
        a = p.parse_args(argv[1:])
        r = show(a.package, a.model, a.device, a.dtype)
        if a.json:
            print(json.dumps(r))
        else:
            print_show(r)
        return 0
    p = argparse.ArgumentParser(prog="python -m forge_pack.cli.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--budget", type=int, default=12)
    p.add_argument("--out", default="out/demo_package")
    p.add_argument("--name", default=None)
    p.add_argument("--run-dir", default=None)
    a = p.parse_args(argv)
    from forge_pack.cli.build import build_command
    from forge_pack.core.errors import ForgeError
    from forge_pack.pack.packager import default_name

    name = a.name or default_name(a.model)
    try:
        result = build_command(a.model, Path(a.out), name=name, device=a.device, dtype=a.dtype, budget=a.budget,
                               force=True, run_dir=Path(a.run_dir) if a.run_dir else None, stdout=print)
    except ForgeError as e:
        print(f"error: {e.message}\nhint: {e.hint}", file=sys.stderr)
        return 1
    print()
    for line in gate_lines(result):
        print(line)
    if not result.written:
        return 0
    print(f"\n$ pip install --no-build-isolation {a.out}", flush=True)
    from forge_pack.core.progress_line import step

    with step("pip install (compiling the kernels)", stream=sys.stdout):
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                            "--force-reinstall", "-q", a.out])
    if r.returncode != 0:
        return r.returncode
    print(f"\n$ python -m forge_pack.cli.demo show {name} {a.model} --device {a.device}", flush=True)
    cmd = [sys.executable, "-m", "forge_pack.cli.demo", "show", name, a.model, "--device", a.device]
    if a.dtype:
        cmd += ["--dtype", a.dtype]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
