"""Attention on the GPU: per shape, the eager region (HF's eager attention), torch.compile of it,
SDPA per backend (flash, efficient, cudnn, math) and forge-pack's `flash` family over a fixed sweep
of its knobs; TFLOP/s and % of the H200's dense bf16 peak. Each of our candidates is checked against
a float32 reference before it may count as the best.

    python3 bench/attention.py [OUT/attention]        # writes OUT/attention.{md,json}; ~4-6 min on an H200

Timing: CUDA events around each call, an L2 flush (a 256 MB write) before it, 5 warm-up calls and
the median of REPS timed calls. torch.compile uses mode="default" (max-autotune's matmul search
alone would take minutes per shape and the region's softmax is Inductor's fused reduction either
way). SDPA backends get k and v repeated to the query's heads outside the timed call where the
shape is grouped-query, so every backend sees the same work whether or not it takes enable_gqa.
A sliding-window shape (Gemma's sliding layers) gives the SDPA backends the window's additive mask (none
computes a window; flash takes no mask) and our kernel the window as its parameter (an eager chain's
signature: ``composite``, output [B, L, H, D]).
"""

from __future__ import annotations

import itertools
import math
import sys
import time

from _common import environment, out_path, write

import torch
import torch.nn.functional as F

from forge_pack.evaluate.compile import compile_candidate
from forge_pack.evaluate.launch import load_module, plan
from forge_pack.search.templates_proposer import instantiate
from forge_pack.targets import ops
from forge_pack.targets.attention import eager_attention

PEAK_TFLOPS = 989.0  # H200 dense bf16 tensor-core peak
REPS = 20
# (name, B, H, HKV, L, S, D, causal, mask) with mask "none", "additive" ([B, 1, L, S], as HF builds it) or
# "window:W" (causal within a sliding window of W keys: transformers' sliding-window mask)
SHAPES = [
    ("gemma_prefill_hd256_gqa", 1, 8, 4, 2048, 2048, 256, True, "none"),
    ("llama_prefill_hd128", 2, 16, 16, 2048, 2048, 128, True, "none"),
    ("vae_midblock_hd512", 1, 1, 1, 16384, 16384, 512, False, "none"),
    ("unseen_gqa_hd128_mask", 3, 12, 4, 1536, 1536, 128, False, "additive"),
    ("gemma_sliding_hd256_w512", 1, 8, 1, 2048, 2048, 256, True, "window:512"),
]
SWEEP = {"block_m": (64, 128), "block_n": (32, 64, 128), "stages": (1, 2), "o_split": (1, 2, 4),
         "ldmatrix": (1, 2)}  # 0 (plain shared loads) is the fallback the GPU tests cover


def _o_splits(d: int) -> tuple:
    """o_split recomputes the logits per slice: only worth it where the accumulators crowd the registers."""
    return (1,) if d <= 128 else (1, 2) if d <= 256 else (2, 4)
# fp32 reference, max |error| / max |reference|: a few bf16 ulps (probabilities and output rounded)
WRONG = 2e-2


def _flush_buffer():
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def _time(fn, flush) -> float:
    """Median microseconds of REPS calls, each after an L2 flush, by CUDA events."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(REPS):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _window(mask_kind: str) -> int:
    return int(mask_kind.split(":")[1]) if mask_kind.startswith("window:") else 0


def _flops(b, h, l_, s, d, causal, window=0) -> float:
    pairs = sum(min(i + 1, s, window or s) for i in range(l_)) if causal else l_ * s
    return 4.0 * b * h * pairs * d


def _inputs(b, h, hkv, l_, s, d, causal, mask_kind):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, l_, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    mask = None
    if _window(mask_kind):  # what SDPA is given: the window's additive mask, causal part included
        i = torch.arange(l_, device="cuda")[:, None]
        j = torch.arange(s, device="cuda")[None, :]
        hidden = (j > i) | (i - j >= _window(mask_kind))
        mask = torch.zeros(l_, s, device="cuda", dtype=torch.bfloat16).masked_fill(
            hidden, torch.finfo(torch.bfloat16).min)[None, None]
    if mask_kind == "additive":  # a padding mask: the last keys of each batch hidden, finfo.min as HF writes it
        mask = torch.zeros(b, 1, l_, s, device="cuda", dtype=torch.bfloat16)
        for i in range(b):
            mask[i, :, :, s - 97 * (i + 1):] = torch.finfo(torch.bfloat16).min
    return q, k, v, mask


def _eager_mask(l_, s, causal, mask, window=0):
    """The additive mask the eager region adds: HF's causal mask of finfo.min where causal (the window's
    mask, causal part included, where there is one)."""
    if not causal or window:
        return mask
    return torch.full((l_, s), torch.finfo(torch.bfloat16).min, device="cuda", dtype=torch.bfloat16).triu(1)[None, None]


def _ours(q, k, v, mask, causal, scale, window=0):
    """(label, callable, out [B, H, L, D], params) of every valid knob setting of the flash family. With a
    window: the eager chain's signature (causal, window, composite; no mask), its output [B, L, H, D]
    (returned as a [B, H, L, D] view)."""
    if window:
        call = {"attn_mask": None, "is_causal": True, "scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
        tensors, params = ops.normalize_call("attention", "F", (q, k, v), call)
        params = {**params, "window": window, "composite": True}
        out_blhd = torch.empty(q.shape[0], q.shape[2], q.shape[1], q.shape[3], device=q.device, dtype=q.dtype)
        sig, out, written = (ops.make_signature("attention", tensors, params, out_blhd), out_blhd.transpose(1, 2),
                             out_blhd)
    else:
        call = {"attn_mask": mask, "is_causal": causal, "scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
        tensors, params = ops.normalize_call("attention", "F", (q, k, v), call)
        out = written = torch.empty_like(q)
        sig = ops.make_signature("attention", tensors, params, out)
    seen = set()
    # stages 1 only where two stages' shared memory crowds the head_dim 512 plans
    sweep = {**SWEEP, "o_split": _o_splits(q.shape[-1]), "stages": (1, 2) if q.shape[-1] > 256 else (2,)}
    for values in itertools.product(*sweep.values()):
        knobs = dict(zip(sweep, values))
        try:
            cand = instantiate("attention", "cuda", "flash", knobs, sig)
        except ValueError:
            continue
        if cand.content_hash in seen:
            continue
        seen.add(cand.content_hash)
        build = compile_candidate(cand)
        if not build.ok:
            yield str(knobs), None, build.log[-400:], cand.params
            continue
        module = load_module("cuda", build.path, [l.name for l in cand.spec.kernels])
        run = module.bind(plan(cand.spec, sig), {**tensors, "out": written})
        yield (",".join(f"{k}={v}" for k, v in knobs.items()), run, out,
               {**cand.params, **build.resources.get("attention_flash", {})})


def _sdpa(q, k, v, mask, causal, scale, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = q.shape[1] // k.shape[1]
    kk, vv = (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) if g > 1 else (k, v)
    be = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
          "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]

    def fn():
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=causal, scale=scale)

    fn()  # raises where the backend does not take the shape
    return fn


def main() -> None:
    base = out_path("attention")
    t_start = time.time()
    flush = _flush_buffer()
    rows = []
    for name, b, h, hkv, l_, s, d, causal, mask_kind in SHAPES:
        q, k, v, mask = _inputs(b, h, hkv, l_, s, d, causal, mask_kind)
        scale = 1.0 / math.sqrt(d)
        window = _window(mask_kind)
        flops = _flops(b, h, l_, s, d, causal, window)
        emask = _eager_mask(l_, s, causal, mask, window)
        row = {"shape": name, "B": b, "H": h, "HKV": hkv, "L": l_, "S": s, "D": d, "causal": causal,
               "mask": mask_kind, "gflop": flops / 1e9, "times_us": {}, "errors": {}, "ours": []}

        def region(q_, k_, v_, m_):
            return eager_attention(q_, k_, v_, m_, scale, None)

        with torch.no_grad():
            ref = eager_attention(q.float(), k.float(), v.float(), emask.float() if emask is not None else None,
                                  scale, None).transpose(1, 2)  # fp32 math, [B, H, L, D]
            peak = float(ref.abs().max())
            row["times_us"]["eager"] = _time(lambda: region(q, k, v, emask), flush)
            compiled = torch.compile(region, mode="default", dynamic=False)
            compiled(q, k, v, emask)
            row["times_us"]["torch.compile"] = _time(lambda: compiled(q, k, v, emask), flush)
            for backend in ("flash", "efficient", "cudnn", "math"):
                try:
                    fn = _sdpa(q, k, v, mask, causal and not window, scale, backend)
                    row["times_us"][f"sdpa_{backend}"] = _time(fn, flush)
                except Exception as e:  # noqa: BLE001 - a backend that refuses the shape: recorded, not fatal
                    row["times_us"][f"sdpa_{backend}"] = None
                    row["errors"][f"sdpa_{backend}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                torch.cuda.empty_cache()
            for label, run, out, info in _ours(q, k, v, mask, causal, scale, window):
                if run is None:
                    row["ours"].append({"knobs": label, "error": out})
                    continue
                run()
                torch.cuda.synchronize()
                err = float((out.float() - ref).abs().max()) / max(peak, 1e-6)
                us = _time(run, flush)
                row["ours"].append({"knobs": label, "us": us, "rel_err": err, "ok": err <= WRONG,
                                    "registers": info.get("registers"), "spills": info.get("spill_stores")})
        good = [o for o in row["ours"] if o.get("ok")]
        best = min(good, key=lambda o: o["us"]) if good else None
        row["best"] = best
        if best:
            row["times_us"]["forge_flash"] = best["us"]
        row["tflops"] = {k: (flops / (t * 1e-6) / 1e12 if t else None) for k, t in row["times_us"].items()}
        rows.append(row)
        del q, k, v, mask, emask, ref
        torch.cuda.empty_cache()
        print(f"[{time.time() - t_start:.0f}s] {name}: {row['times_us']}", file=sys.stderr, flush=True)

    doc = {"command": "python3 bench/attention.py " + " ".join(sys.argv[1:]), "environment": environment(),
           "peak_tflops": PEAK_TFLOPS, "reps": REPS, "wall_s": time.time() - t_start, "rows": rows}
    write(base, doc, _markdown(doc))


def _markdown(doc: dict) -> str:
    cols = ["eager", "torch.compile", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "forge_flash"]
    env = doc["environment"]
    lines = ["# Attention: eager region, torch.compile, SDPA backends and forge-pack's flash family", "",
             f"Command: `{doc['command']}`; {env.get('gpu')}, torch {env.get('torch')}, CUDA {env.get('cuda')}; "
             f"median of {doc['reps']} calls after an L2 flush; {doc['wall_s']:.0f} s in all.", "",
             "Per shape: median µs, then TFLOP/s (% of the dense bf16 peak of "
             f"{doc['peak_tflops']:.0f} TFLOP/s). `-`: the backend refused the shape.", "",
             "| shape | " + " | ".join(cols) + " | ours vs flash | ours vs fastest SDPA | ours vs compile |",
             "| --- |" + " --- |" * (len(cols) + 3)]
    for r in doc["rows"]:
        t, f = r["times_us"], r["tflops"]
        cells = []
        for c in cols:
            if t.get(c):
                cells.append(f"{t[c]:.1f} µs<br>{f[c]:.0f} ({100 * f[c] / doc['peak_tflops']:.0f}%)")
            else:
                cells.append("-")
        ours = t.get("forge_flash")
        sdpa = [t[c] for c in cols if c.startswith("sdpa_") and t.get(c)]

        def ratio(other):
            return f"{other / ours:.2f}x" if ours and other else "-"

        lines.append(f"| {r['shape']} | " + " | ".join(cells) + f" | {ratio(t.get('sdpa_flash'))} | "
                     f"{ratio(min(sdpa) if sdpa else None)} | {ratio(t.get('torch.compile'))} |")
    lines += ["", "Shapes: " + "; ".join(f"{r['shape']} = B {r['B']}, H {r['H']} (kv {r['HKV']}), L {r['L']}, "
                                          f"S {r['S']}, D {r['D']}, causal {r['causal']}, mask {r['mask']}"
                                          for r in doc["rows"]), ""]
    for r in doc["rows"]:
        lines.append(f"## {r['shape']}: the sweep")
        lines.append("")
        lines.append("| knobs | µs | rel. error | registers | spill stores |")
        lines.append("| --- | --- | --- | --- | --- |")
        for o in sorted(r["ours"], key=lambda o: o.get("us") or 1e18):
            if "error" in o:
                lines.append(f"| {o['knobs']} | compile error | | | |")
            else:
                flag = "" if o["ok"] else " (wrong)"
                lines.append(f"| {o['knobs']} | {o['us']:.1f} | {o['rel_err']:.2e}{flag} | {o.get('registers')} | "
                             f"{o.get('spills')} |")
        for k, e in r["errors"].items():
            lines.append(f"\n{k}: {e}")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
