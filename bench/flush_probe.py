"""How the state the L2 flush leaves behind changes a kernel's time: the evaluator's protocol
(zero-write a buffer twice the L2 size, event, call, event) against a flush that reads the buffer
(L2 left clean), against no flush, and a back-to-back loop (launch costs hidden). Chosen template
kernels on the group_norm (1,128,1024,1024) benchmark shape; correctness is the evaluator's business, not this probe's.

    python bench/flush_probe.py OUT_DIR

Writes OUT_DIR/flush_probe.md and .json. Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GN_BIG = "x: bf16[1,128,1024,1024], num_groups=32, weight: bf16[128], bias: bf16[128]"
# the variants in bench/results/flush_probe.md, by their parameters; that file's `resident` rows were measured
# with a revision of the kernel 5-10 µs slower than bench/results/kernel_sweep.md's: the probe compares flush modes
KERNELS = [("split", {}), ("resident", {"bps": 2, "threads": 512, "stagger": 0}), ("resident", {"bps": 2, "threads": 512}),
           ("resident", {"stagger": 0}), ("resident", {}), ("resident", {"stagger": 8})]
REPS = 40


def main(argv: list[str]) -> int:
    import torch

    from forge_pack.targets import ops
    from forge_pack.evaluate.compile import compile_many
    from forge_pack.evaluate.launch import load_module, plan
    from forge_pack.targets.sigparse import parse_signature
    from forge_pack.search.templates_proposer import instantiate
    from forge_pack.evaluate.timing import _cuda_l2_bytes

    out_dir = Path(argv[0] if argv else "flush_probe")
    out_dir.mkdir(parents=True, exist_ok=True)
    sig = parse_signature("group_norm", GN_BIG)
    cands = [instantiate("group_norm", "cuda", f, p or None, sig) for f, p in KERNELS]
    builds = compile_many(cands)
    torch.manual_seed(0)
    x = torch.randn(sig.x.shape, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    buf = torch.empty(2 * _cuda_l2_bytes() // 4, dtype=torch.int32, device="cuda")
    flushes = {"zero-write (evaluator)": lambda: buf.zero_(), "read (clean L2)": lambda: buf.sum(),
               "none": lambda: None}
    rows = []
    for cand, build in zip(cands, builds):
        assert build.ok, build.log[-2000:]
        module = load_module("cuda", build.path, [k.name for k in cand.spec.kernels])
        p = plan(cand.spec, sig)
        out = ops.empty_like_spec(sig.output, "cuda")
        ws = {n: torch.empty(max(s, 1), dtype=torch.uint8, device="cuda") for n, s, _ in p.workspaces}
        zeroed = [ws[n] for n, _, z in p.workspaces if z]
        run = module.bind(p, {"x": x, "weight": w, "bias": b, "out": out, **ws})

        def call() -> None:
            for z in zeroed:
                z.zero_()
            run()

        row = {"kernel": cand.label}
        for name, flush in flushes.items():
            for _ in range(3):
                flush(); call()
            torch.cuda.synchronize()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
            for i in range(REPS):
                flush()
                starts[i].record()
                call()
                ends[i].record()
            torch.cuda.synchronize()
            row[name] = statistics.median(s.elapsed_time(e) * 1000 for s, e in zip(starts, ends))
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(REPS):
            call()
        e.record()
        torch.cuda.synchronize()
        row["back-to-back loop"] = s.elapsed_time(e) * 1000 / REPS
        module.close()
        rows.append(row)
        print(row, flush=True)
    cols = [*flushes, "back-to-back loop"]
    gpu = torch.cuda.get_device_name()
    lines = ["# L2 flush protocol probe (group_norm bf16 (1,128,1024,1024))", "",
             f"`python bench/flush_probe.py OUT`; {gpu}, torch {torch.__version__}; median of {REPS} (loop: mean)", "",
             "| kernel | " + " | ".join(f"{c} µs" for c in cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {r['kernel']} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + " |" for r in rows]
    (out_dir / "flush_probe.md").write_text("\n".join(lines) + "\n")
    (out_dir / "flush_probe.json").write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "rows": rows},
                                                         indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
