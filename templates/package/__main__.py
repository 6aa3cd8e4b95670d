"""python -m <package> verify | bench | info

verify  runs every kernel on the shipped fixtures (the model's own tensors) and on fresh random
        inputs, compares with a float64 reference within the manifest's tolerance; exit 1 on failure.
bench   times each kernel against the original PyTorch op on this machine.
info    what the package accelerates, where it was measured, and whether it loads here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from . import _PATCHER
from ._patch import DTYPES, ORIGINALS

HERE = Path(__file__).resolve().parent
# Eager PyTorch has its own rounding error; a kernel may be off by up to this multiple of it
# (on top of the manifest tolerance), the same slack forge-pack's verifier allows.
EAGER_SLACK = 2.0


def _orig(owner: str, attr: str):
    return ORIGINALS[(owner, attr)]


def _params(t: dict) -> dict:
    return {k: v for k, v in t["signature"]["params"]}


def eager_call(t: dict, x: dict) -> torch.Tensor:
    """The original PyTorch op (never a patched one) on named tensors."""
    op, p = t["op"], _params(t)
    if op in ("softmax", "log_softmax"):
        dtype = DTYPES[p["dtype"]] if p.get("dtype") else None
        return _orig("torch", op)(x["x"], p["dim"], dtype=dtype)
    if op == "layer_norm":
        return _orig("torch.nn.functional", "layer_norm")(x["x"], p["normalized_shape"], x.get("weight"),
                                                          x.get("bias"), p["eps"])
    if op == "rms_norm" and not p.get("composite"):
        return _orig("torch.nn.functional", "rms_norm")(x["x"], p["normalized_shape"], x.get("weight"), p["eps"])
    if op == "rms_norm":
        out_dtype = DTYPES[t["signature"]["output"]["dtype"]]
        x32 = x["x"].float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + p["eps"])
        w = x.get("weight")
        if w is None:
            out = y
        elif p.get("weight_offset"):
            out = y * (p["weight_offset"] + w.float())
        else:
            out = w * y.to(x["x"].dtype)
        return out.to(out_dtype)
    if op == "group_norm":
        return _orig("torch.nn.functional", "group_norm")(x["x"], p["num_groups"], x.get("weight"), x.get("bias"),
                                                          p["eps"])
    if op == "batch_norm":
        return _orig("torch.nn.functional", "batch_norm")(x["x"], x["running_mean"], x["running_var"],
                                                          x.get("weight"), x.get("bias"), False, 0.0, p["eps"])
    if op == "adaptive_avg_pool2d":
        return _orig("torch.nn.functional", "adaptive_avg_pool2d")(x["x"], tuple(p["output_size"]))
    raise KeyError(op)


def reference64(t: dict, x: dict) -> torch.Tensor:
    """The op in float64: the yardstick the kernel was verified against."""
    op, p = t["op"], _params(t)
    d = {k: (v.double() if v is not None else None) for k, v in x.items()}
    if op == "softmax":
        return _orig("torch", "softmax")(d["x"], p["dim"])
    if op == "log_softmax":
        return _orig("torch", "log_softmax")(d["x"], p["dim"])
    if op == "rms_norm":
        dims = tuple(range(-len(p["normalized_shape"]), 0))
        y = d["x"] * torch.rsqrt(d["x"].pow(2).mean(dims, keepdim=True) + p["eps"])
        w = d.get("weight")
        return y if w is None else y * (w + p.get("weight_offset", 0.0))
    return eager_call({**t, "signature": {**t["signature"], "output": {"dtype": "float64"}}}, d)


def _empty(spec: dict, device) -> torch.Tensor:
    return torch.empty_strided(spec["shape"], spec["strides"], dtype=DTYPES[spec["dtype"]], device=device)


def fresh_inputs(t: dict, seed: int, device) -> dict:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in t["signature"]["inputs"]:
        if spec is None:
            out[name] = None
            continue
        values = torch.randn(spec["shape"], generator=gen)
        if name == "running_var":
            values = (values * 0.2 + 1.0).abs() + 0.05  # a variance is positive
        elif name == "weight":
            values = values * 0.2 + 1.0
        elif name != "x":
            values = values * 0.2
        tensor = _empty(spec, device)
        tensor.copy_(values)
        out[name] = tensor
    return out


def fixture_inputs(t: dict, rel: str, device) -> dict:
    from safetensors.torch import load_file

    raw = load_file(str(HERE / rel))
    out = {}
    for name, spec in t["signature"]["inputs"]:
        if spec is None:
            out[name] = None
            continue
        tensor = _empty(spec, device)
        tensor.copy_(raw[f"in.{name}"].view(spec["shape"]))
        out[name] = tensor
    return out


def compare(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[bool, float, float, str]:
    o, r = out.double().reshape(-1), ref.double().reshape(-1)
    if o.shape != r.shape:
        return False, float("inf"), float("inf"), f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o_nan, r_nan, o_inf, r_inf = o.isnan(), r.isnan(), o.isinf(), r.isinf()
    fin = ~(r_nan | r_inf) & ~(o_nan | o_inf)
    special = (o_nan != r_nan) | (r_inf & (o != r)) | (~(r_nan | r_inf) & o_inf)
    err = torch.where(fin, (o - r).abs(), torch.zeros_like(o))
    bad = (fin & (err > atol + rtol * r.abs())) | special
    max_abs = float(err.max()) if fin.any() else 0.0
    max_rel = float((err / r.abs().clamp_min(max(atol, 1e-300))).max()) if fin.any() else 0.0
    first = ""
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        first = f"flat index {i}: got {float(o[i]):.6g}, expected {float(r[i]):.6g}"
    return not bool(bad.any()), max_abs, max_rel, first


def _device() -> str:
    if _PATCHER.backend != "cuda":
        return "cpu"
    for i, ok in sorted(_PATCHER._caps.items()):
        if ok:
            return f"cuda:{i}"
    return "cuda"


def _kernel(t: dict):
    return next(p for p in _PATCHER.targets if p.id == t["id"]).fn


def _present(t: dict, x: dict) -> list:
    return [x[n] for n, s in t["signature"]["inputs"] if s is not None]


def cmd_verify(args) -> int:
    if not _PATCHER.load():
        print(f"FAIL: cannot verify on this machine: {_PATCHER.load_error}")
        return 1
    device = _device()
    failures = 0
    print(f"{'target':<8} {'input':<22} {'max abs err':>12} {'max rel err':>12} {'atol':>9} {'rtol':>9}  result")
    for t in _PATCHER.manifest["targets"]:
        tol = t["tolerance"]
        cases = [(f"fixture:{Path(rel).stem}", lambda rel=rel: fixture_inputs(t, rel, device)) for rel in t["fixtures"]]
        cases += [(f"fresh[seed={s}]", lambda s=s: fresh_inputs(t, 1000 + s, device)) for s in range(args.random)]
        out_spec = t["signature"]["output"]
        for label, make in cases:
            x = make()
            with torch.inference_mode():
                out = _kernel(t)(*_present(t, x))
                eager = eager_call(t, x)
                ref = reference64(t, x)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            _, eager_err, _, _ = compare(eager, ref, float("inf"), 0.0)
            atol = max(tol["atol"], EAGER_SLACK * eager_err)
            ok, max_abs, max_rel, first = compare(out, ref, atol, tol["rtol"])
            layout_ok = (str(out.dtype).replace("torch.", "") == out_spec["dtype"]
                         and list(out.shape) == out_spec["shape"] and list(out.stride()) == out_spec["strides"])
            ok = ok and layout_ok
            failures += not ok
            why = "" if ok else ("  " + (first or f"output layout {out.dtype}{list(out.shape)} differs"))
            print(f"{t['id']:<8} {label:<22} {max_abs:>12.3e} {max_rel:>12.3e} {atol:>9.1e} {tol['rtol']:>9.1e}  "
                  f"{'ok' if ok else 'FAIL'}{why}")
    print(f"{'PASS' if failures == 0 else 'FAIL'}: {len(_PATCHER.manifest['targets'])} kernels, "
          f"{failures} failing checks on {device}")
    return 0 if failures == 0 else 1


def _time(fn, device: str, n: int, warmup: int) -> dict:
    cuda = device.startswith("cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    q = lambda f: times[min(int(f * (len(times) - 1) + 0.5), len(times) - 1)]  # noqa: E731
    return {"median_us": q(0.5), "iqr_us": q(0.75) - q(0.25), "n": n}


def cmd_bench(args) -> int:
    if not _PATCHER.load():
        print(f"cannot benchmark on this machine: {_PATCHER.load_error}")
        return 1
    device = _device()
    state, message = _PATCHER.integrity
    edited = state == "edited"  # the manifest's own figures are not shown as measured
    rows = []
    for t in _PATCHER.manifest["targets"]:
        x = fresh_inputs(t, 7, device)
        kernel, present = _kernel(t), _present(t, x)
        with torch.inference_mode():
            e = _time(lambda: eager_call(t, x), device, args.n, args.warmup)
            k = _time(lambda: kernel(*present), device, args.n, args.warmup)
        rows.append({"id": t["id"], "signature": t["signature"]["pretty"], "eager": e, "kernel": k,
                     "speedup": e["median_us"] / max(k["median_us"], 1e-9),
                     "measured_speedup": None if edited else t["speedup"]["vs_eager"]})
    if args.json:
        print(json.dumps({"device": device, "targets": rows,
                          "integrity": {"state": state, "message": message}}, indent=2))
        return 0
    if edited:
        print(f"WARNING: {message}; the 'at build' column is left out")
    print(f"{'target':<6} {'eager us':>10} {'kernel us':>10} {'speedup':>8} {'at build':>9}  signature")
    for r in rows:
        at_build = "edited".rjust(9) if edited else f"{r['measured_speedup']:>8.2f}x"
        print(f"{r['id']:<6} {r['eager']['median_us']:>10.2f} {r['kernel']['median_us']:>10.2f} "
              f"{r['speedup']:>7.2f}x {at_build}  {r['signature']}")
    return 0


def cmd_info(args) -> int:
    m = _PATCHER.manifest
    loaded = _PATCHER.load()
    state, message = _PATCHER.integrity
    if args.json:
        print(json.dumps({"manifest": m, "status": _PATCHER.status(),
                          "integrity": {"state": state, "message": message}}, indent=2))
        return 0
    if state == "edited":  # said first, and the edited figures are not shown as measured below
        print(f"WARNING: {message}")
    env = m["environment"]
    print(f"{m['package']['name']} {m['package']['version']} (forge-pack {m['forge_pack_version']}, {m['created_at']})")
    print(f"model: {m['model']['name']} ({m['model']['path']}), device {m['model']['device']}")
    where = env["gpu_name"] or env.get("cpu") or "cpu"
    cc = f", compute capability {env['compute_capability']}" if env["compute_capability"] else ""
    cuda = f", CUDA {env['cuda']}" if m["backend"] == "cuda" else ""  # a CPU package's torch may have CUDA too
    print(f"measured on: {where}{cc}, torch {env['torch']}{cuda}")
    here = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU"
    print(f"this machine: torch {torch.__version__}, {here}")
    print(f"extension: {'loaded' if loaded else 'NOT loaded: ' + str(_PATCHER.load_error)}")
    print(f"figures: {state}: {message}")
    edited = state == "edited"
    for t in m["targets"]:
        s = t["speedup"]
        vc = f"{s['vs_compile']:.2f}x" if s["vs_compile"] else "n/a"
        figures = ("speedups not shown (edited after the build)" if edited else
                   f"{s['vs_eager']:.2f}x vs eager, {vc} vs torch.compile, {100 * t['time_share']:.1f}% of model time")
        print(f"  {t['id']}: {t['signature']['pretty']}  {figures}, via {', '.join(t['call_paths'])}")
    r = m["model_result"]
    if r and edited:
        print("whole model: not shown (edited after the build)")
    elif r:
        print(f"whole model: {r['eager']['median_us'] / 1e3:.3f} ms -> {r['patched']['median_us'] / 1e3:.3f} ms "
              f"({r['speedup']:.2f}x), max output difference {r['max_abs_diff']}")
        acc = r.get("accuracy") or {}
        if acc.get("eager_max_error") is not None:
            print(f"  error against the model in {acc.get('reference_dtype', 'float32')}: "
                  f"eager {acc['eager_max_error']:.3g}, "
                  f"patched {acc['patched_max_error']:.3g} (tolerance basis: {acc['basis']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {_PATCHER.package}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check every kernel against a float64 reference")
    v.add_argument("--random", type=int, default=3, help="fresh random inputs per kernel (default 3)")
    b = sub.add_parser("bench", help="time each kernel against the original op")
    b.add_argument("--n", type=int, default=50, help="timed calls (default 50)")
    b.add_argument("--warmup", type=int, default=10)
    b.add_argument("--json", action="store_true")
    i = sub.add_parser("info", help="what the package accelerates and whether it loads here")
    i.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    return {"verify": cmd_verify, "bench": cmd_bench, "info": cmd_info}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
