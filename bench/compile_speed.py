"""Compile + load time per candidate (target: median <= 2 s for a reduction kernel).

    python bench/compile_speed.py [OUT_BASE]     # writes OUT_BASE.md and OUT_BASE.json

Each sample is a distinct source (a comment makes the content hash new) compiled with an empty
build cache, then loaded into the CUDA context (cuModuleLoadData + cuModuleGetFunction), as the
search does. Reference softmax, log_softmax, group_norm and adaptive_avg_pool2d kernels; NVRTC
(the default) and a few nvcc -cubin samples for comparison. Needs a CUDA GPU for the load step.
"""

from __future__ import annotations

import tempfile
import time

from _common import environment, out_path, stats, write

SAMPLES = 10
NVCC_SAMPLES = 3
SIGS = [("softmax", "x: bf16[1,8,2048,2048], dim=-1, dtype=float32"),
        ("log_softmax", "x: f32[4096,256], dim=-1"),
        ("group_norm", "x: bf16[1,512,128,128], num_groups=32, weight: bf16[512], bias: bf16[512]"),
        ("adaptive_avg_pool2d", "x: f32[256,2048,7,7], output_size=(1,1)")]


def main() -> None:
    import torch

    from forge_pack.evaluate import compile as fcompile
    from forge_pack.core.candidate import Candidate
    from forge_pack.evaluate.launch import CudaModule
    from forge_pack.search.families import reference_candidate
    from forge_pack.targets.sigparse import parse_signature

    base = out_path("compile_speed")
    has_gpu = torch.cuda.is_available()
    arch = fcompile.cuda_arch() if has_gpu else "sm_90"
    rows, doc = [], {"environment": environment(), "arch": arch, "results": []}
    for op, text in SIGS:
        ref = reference_candidate(parse_signature(op, text), "cuda")
        for tool in ("nvrtc", "nvcc"):
            if tool == "nvcc":
                saved = fcompile._nvrtc
                fcompile._nvrtc = None  # force the fallback
            compile_s, load_s, total_s = [], [], []
            try:
                n = SAMPLES if tool == "nvrtc" else NVCC_SAMPLES
                for i in range(n):
                    cand = Candidate(op, "cuda", ref.source + f"\n// sample {tool} {i} {time.time()}\n", ref.spec)
                    with tempfile.TemporaryDirectory() as cache:
                        t0 = time.perf_counter()
                        build = fcompile.compile_candidate(cand, arch=arch, cache_dir=cache)
                        t1 = time.perf_counter()
                        assert build.ok, build.log
                        if has_gpu:
                            mod = CudaModule(open(build.path, "rb").read(), [k.name for k in cand.spec.kernels])
                            mod.close()
                        t2 = time.perf_counter()
                    compile_s.append(t1 - t0)
                    load_s.append(t2 - t1)
                    total_s.append(t2 - t0)
            finally:
                if tool == "nvcc":
                    fcompile._nvrtc = saved
            r = {"op": op, "tool": tool, "compile_s": stats(compile_s), "load_s": stats(load_s),
                 "total_s": stats(total_s), "cmd": build.cmd}
            doc["results"].append(r)
            rows.append(f"| {op} | {tool} | {r['compile_s']['median']:.3f} | {r['load_s']['median']:.4f} | "
                        f"{r['total_s']['median']:.3f} | {r['total_s']['max']:.3f} | {r['total_s']['n']} |")
    nvrtc_medians = [r["total_s"]["median"] for r in doc["results"] if r["tool"] == "nvrtc"]
    doc["target_s"] = 2.0
    doc["pass"] = bool(nvrtc_medians) and max(nvrtc_medians) <= 2.0
    md = [f"# Compile + load time per candidate ({doc['environment'].get('gpu', 'no GPU: load not measured')}, {arch})",
          "", "Each sample: a new source (new content hash), empty build cache, compile, then load into the CUDA "
          "context. Target: median <= 2 s per reduction kernel (torch load_inline took 55 s).", "",
          "| kernel | compiler | compile s (median) | load s (median) | total s (median) | total s (max) | n |",
          "| --- | --- | --- | --- | --- | --- | --- |", *rows, "",
          f"**{'PASS' if doc['pass'] else 'FAIL'}**: worst NVRTC median {max(nvrtc_medians):.3f} s (target 2 s).",
          "", f"Environment: {doc['environment']}"]
    write(base, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
