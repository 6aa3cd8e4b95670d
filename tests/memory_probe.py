"""Peak memory of one CPU evaluation, measured in a fresh process (tests/test_eval_memory.py).

Run as ``python tests/memory_probe.py OP SIGNATURE FAMILY``: it compiles the family's candidate,
then judges it in this process (``judge.judge``, as a worker does) and prints one JSON line with
the peak resident memory the evaluation added (``/proc/self/status`` VmHWM, reset through
``/proc/self/clear_refs`` just before the evaluation), the part of it that was the sandbox arena
(the runner's copies of the bound tensors: the CPU's stand-in for the kernel's own arguments, which
on CUDA are the judge's tensors themselves), and the signature's inputs + outputs. glibc is told
to map every allocation of 1 MiB or more on its own (``MALLOC_MMAP_THRESHOLD_``, set by the
caller), so a freed tensor leaves the resident set at once and the peak is the peak of live data.
"""

from __future__ import annotations

import json
import re
import sys


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), flags=re.M).group(1)) * 1024


def main(op: str, text: str, family: str, reps: int = 5, scaled: bool = True) -> dict:
    """``scaled``: treat the small signature as the planner treats a large one (static sets not
    cached, references in slices of 256 KiB, comparisons in chunks of 128 KiB of float64, one timing
    copy), so the large path is what is measured."""
    import torch

    from forge_pack.evaluate import judge as judge_mod
    from forge_pack.evaluate import memory_plan, sandbox, verdict_rules
    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.evaluate.timing import TimingConfig
    from forge_pack.search.templates_proposer import instantiate
    from forge_pack.targets import abi
    from forge_pack.targets.ops import with_output
    from forge_pack.targets.sigparse import parse_signature

    torch.set_num_threads(1)
    sig = with_output(parse_signature(op, text))
    cand = instantiate(op, "cpu", family, None, sig)
    build = compile_candidate(cand)
    assert build.ok, build.log
    arena = [0]
    grow = sandbox.RemoteCpuModule._grow

    def tracked_grow(self, size):  # the arena's extent: what the runner's copies can hold at most
        arena[0] = max(arena[0], size)
        return grow(self, size)

    sandbox.RemoteCpuModule._grow = tracked_grow
    if scaled:
        # the fixed-size chunks scale with the data too (a comparison chunk of 1 << 22 elements holds ~256 MiB)
        memory_plan.CACHE_BYTES, memory_plan.SLICE_BYTES, verdict_rules._CHUNK = 0, 1 << 18, 1 << 14
    cfg = TimingConfig(warmup=1, reps=reps, flush=False, compile_baseline=False, rotate=1 if scaled else 4)
    session = judge_mod.Session("cpu")
    job = judge_mod.JudgeCandidate(judge_mod.LoadInputs("probe", sig), cand, build.path, cfg)
    session.bandwidth(cfg)  # the worker's once-per-process copy-bandwidth probe: a fixed size, not this evaluation's
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    judged = judge_mod.judge(session, job)
    peak = _status("VmHWM") - before
    return {"reason": judged.verdict.reason, "detail": judged.verdict.detail[:300], "peak": peak, "arena": arena[0],
            "data": abi.bytes_moved(sig)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4], scaled=sys.argv[4:5] != ["unscaled"])))
