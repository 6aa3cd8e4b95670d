"""A synthetic, recorded search run for the dashboard's tests, screenshots and scale test.

``make_run(run_dir, n_candidates=...)`` writes a run store through forge_pack.store.run_store exactly as a
search would (hotspots with baselines, a tree of nodes per hotspot, evaluations including every
kind of failure, node_stats, LLM calls, events), with timestamps spread over a simulated search.
``append_evaluations`` adds more, as a live search does. Also a script for a demo run:

    python tests/ui_fixtures.py /tmp/demo-run --candidates 5000 && forge-pack ui /tmp/demo-run
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

from forge_pack.core.candidate import Candidate, KernelLaunch, LaunchSpec
from forge_pack.core.hotspot import Hotspot
from forge_pack.core.signature import Signature, TensorSpec, contiguous_strides
from forge_pack.store.run_store import Store
from forge_pack.core.verdict import Baseline, Check, Evaluation, Timing, Verdict

ENV = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "torch": "2.11.0+cu128", "cuda": "12.8",
       "driver": "570.86.15", "host": "gpu-box-07", "python": "3.12.3"}
CONFIG = {"search": {"budget": 50, "exploration": 0.3, "max_weight": 0.9, "seed": 0, "parallel": 2},
          "llm": {"model": "kernel-coder", "api_key": "***"}}

# (op, shape, dtype, params, time share, eager us, compile us)
HOTSPOTS = [
    ("softmax", (1, 8, 2048, 2048), "bfloat16", (("dim", -1),), 0.41, 212.0, 148.0),
    ("rms_norm", (8, 2048, 4096), "bfloat16", (("eps", 1e-6),), 0.22, 96.0, 61.0),
    ("layer_norm", (8, 2048, 1024), "float32", (("eps", 1e-5),), 0.12, 71.0, 44.0),
    ("group_norm", (16, 256, 64, 64), "float16", (("eps", 1e-5), ("num_groups", 32)), 0.07, 58.0, 40.0),
]

SOURCE = """#include <cuda_bf16.h>
// {family}: one block per row, {threads} threads, {vec}-wide loads
extern "C" __global__ void {name}(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out,
                                 long long rows, long long cols) {{
    long long row = blockIdx.x;
    if (row >= rows) return;
    const __nv_bfloat16* in = x + row * cols;
    __shared__ float red[{warps}];
    float m = -INFINITY;
    for (long long i = threadIdx.x * {vec}; i < cols; i += {threads} * {vec}) {{
        for (int k = 0; k < {vec}; ++k) m = fmaxf(m, __bfloat162float(in[i + k]));
    }}
{reduce_max}
    float s = 0.f;
    for (long long i = threadIdx.x * {vec}; i < cols; i += {threads} * {vec}) {{
        for (int k = 0; k < {vec}; ++k) s += __expf(__bfloat162float(in[i + k]) - m);
    }}
{reduce_sum}
    for (long long i = threadIdx.x * {vec}; i < cols; i += {threads} * {vec}) {{
        for (int k = 0; k < {vec}; ++k)
            out[row * cols + i + k] = __float2bfloat16(__expf(__bfloat162float(in[i + k]) - m) / s);
    }}
}}
"""
REDUCE_SHARED = """    red[threadIdx.x / 32] = {var};
    __syncthreads();
    if (threadIdx.x == 0) {{ for (int w = 1; w < {warps}; ++w) red[0] = {op}; }}
    __syncthreads();
    {var} = red[0];"""
REDUCE_SHUFFLE = """    for (int o = 16; o > 0; o >>= 1) {var} = {shfl};
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = {var};
    __syncthreads();
    {var} = red[0];
    for (int w = 1; w < {warps}; ++w) {var} = {op2};"""

FAILURES = [  # (reason, detail template) ; weights below
    ("compile_error", "kernel.cu(14): error: identifier \"{name}_tmp\" is undefined\n1 error detected in the "
                      "compilation of \"kernel.cu\"."),
    ("mismatch", "output mismatch on fresh[0]: index (0, 3, {i}, {j}): got {got}, expected {exp}"),
    ("nan", "NaN at index (0, 0, {i}, {j}) where the reference is finite (adversarial:neg_inf_rows)"),
    ("timeout", "evaluation exceeded 30 s; worker killed and restarted"),
    ("launch_error", "cudaErrorInvalidConfiguration: too many resources requested for launch "
                     "(block {threads} x {vec})"),
    ("crash", "worker died with signal 11 (CUDA illegal memory access at 0x7f{i}a0)"),
    ("nondeterministic", "two runs on the same input differ at {i} elements"),
]
FAILURE_WEIGHTS = [5, 6, 2, 1, 2, 1, 1]
# Markup in every text a kernel, a compiler or an LLM can put in the store; the dashboard must show it as text.
PAYLOAD = ('</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
           '&lt;b&gt; "quoted" \u2028 end')


def _signature(op, shape, dtype, params) -> Signature:
    spec = TensorSpec(dtype, tuple(shape), contiguous_strides(tuple(shape)))
    return Signature(op, (("x", spec),), tuple(params), spec)


def _source(name: str, family: str, threads: int, vec: int, shuffle: bool) -> str:
    warps = max(1, threads // 32)
    if shuffle:
        rmax = REDUCE_SHUFFLE.format(var="m", warps=warps, shfl="fmaxf(m, __shfl_xor_sync(0xffffffff, m, o))",
                                     op2="fmaxf(m, red[w])")
        rsum = REDUCE_SHUFFLE.format(var="s", warps=warps, shfl="s + __shfl_xor_sync(0xffffffff, s, o)",
                                     op2="s + red[w]")
    else:
        rmax = REDUCE_SHARED.format(var="m", warps=warps, op="fmaxf(red[0], red[w])")
        rsum = REDUCE_SHARED.format(var="s", warps=warps, op="red[0] + red[w]")
    return SOURCE.format(name=name, family=family, threads=threads, vec=vec, warps=warps, reduce_max=rmax,
                         reduce_sum=rsum)


def _candidate(op: str, family: str, threads: int, vec: int, shuffle: bool, origin: str, extra: str = "") -> Candidate:
    name = f"{op}_rows"
    spec = LaunchSpec((KernelLaunch(name, ("x", "out", "rows", "cols"), ("rows", "1", "1"),
                                    (str(threads), "1", "1"), "0"),))
    return Candidate(op, "cuda", _source(name, family, threads, vec, shuffle) + extra, spec, family,
                     {"threads": threads, "vec": vec, "shuffle": shuffle}, origin)


class _Sim:
    """Deterministic pretend search over one run store."""

    def __init__(self, store: Store, seed: int):
        self.store = store
        self.rng = random.Random(seed)
        self.nodes: dict[str, list[dict]] = {}  # hotspot id -> [{id, parent, depth, params, speedup}]
        self.stats: dict[int, list[float]] = {}  # node id -> [visits, value_sum]
        self.parents: dict[int, int | None] = {}
        self.eager: dict[str, tuple[float, float]] = {}
        self.counter = 0

    def add_hotspot(self, run_id: int, rank: int, row, budget: int = 50) -> str:
        op, shape, dtype, params, share, eager_us, compile_us = row
        sig = _signature(op, shape, dtype, params)
        per_call = eager_us
        hs = Hotspot(sig, (f"F.{op}", f"nn.{op.title().replace('_', '')}"), 32.0, per_call * 32, per_call, share,
                     (f"inputs/{sig.slug()}_0.safetensors",), "cuda")
        hid = self.store.add_hotspot(run_id, rank, hs.to_json(), budget=budget)
        base = Baseline(Timing(eager_us, eager_us * 0.02, 100), Timing(compile_us, compile_us * 0.03, 100),
                        floor_us=eager_us * 0.28, copy_bandwidth_gbs=4250.0)
        self.store.set_baseline(hid, base.to_json())
        self.eager[hid] = (eager_us, compile_us)
        self.nodes[hid] = []
        return hid

    def step(self, hid: str, running_last: bool = False) -> int:
        """Expand one node of hotspot `hid` and (unless running_last) record its evaluation."""
        rng, op = self.rng, hid.rsplit("_", 1)[0]
        nodes = self.nodes[hid]
        if not nodes:
            parent, depth, kind, move = None, 0, "root", "root: rows_baseline"
            threads, vec, shuffle, base_s = 256, 1, False, 0.9
        else:
            ok_nodes = [n for n in nodes if n["speedup"]]
            pool = ok_nodes if ok_nodes and rng.random() < 0.8 else nodes
            weights = [(n["speedup"] or 0.5) ** 4 for n in pool]
            p = rng.choices(pool, weights)[0]
            parent, depth, base_s = p["id"], p["depth"] + 1, p["speedup"] or 0.9
            threads, vec, shuffle = p["threads"], p["vec"], p["shuffle"]
            if rng.random() < 0.25:
                kind, move, shuffle = "llm", "llm rewrite: warp-shuffle reductions", True
            else:
                kind = "template"
                if rng.random() < 0.5:
                    new = rng.choice([t for t in (128, 256, 512, 1024) if t != threads])
                    move, threads = f"block_threads {threads}->{new}", new
                else:
                    new = rng.choice([v for v in (1, 2, 4, 8) if v != vec])
                    move, vec = f"vec_width {vec}->{new}", new
        self.counter += 1
        extra = f"// variant {self.counter}\n" if kind == "llm" else ""
        cand = _candidate(op, "rows_shuffle" if shuffle else "rows_shared", threads, vec, shuffle,
                          "llm" if kind == "llm" else "template", extra)
        nid = self.store.add_node(hid, parent, depth, move, kind, cand.to_json())
        self.parents[nid] = parent
        node = {"id": nid, "parent": parent, "depth": depth, "threads": threads, "vec": vec, "shuffle": shuffle,
                "speedup": None}
        nodes.append(node)
        if kind == "llm":  # recorded as llm_proposer does: node_id = the node expanded, cand_hash = the result
            prompt = (f"Rewrite this {op} kernel to be faster on an H200. Parent verdict: ok, {base_s:.2f}x eager.\n"
                      f"```cuda\n{_source(op + '_rows', 'parent', threads, vec, False)}```")
            self.store.record_llm_call(hotspot_id=hid, node_id=parent, model="kernel-coder", purpose="rewrite",
                                       prompt=prompt, reply=f"Use warp shuffles for both reductions.\n```cuda\n"
                                       f"{cand.source}```\n<launch spec omitted>", prompt_tokens=1800 + nid % 300,
                                       completion_tokens=900 + nid % 200, latency_s=4.2, cost_usd=0.0061,
                                       outcome="ok", cand_hash=cand.content_hash)
        self.store.mark_evaluating(nid, hid)
        if running_last:
            return nid
        self.evaluate(hid, node, base_s, cand)
        return nid

    def evaluate(self, hid: str, node: dict, base_s: float, cand: Candidate) -> None:
        rng = self.rng
        eager_us, compile_us = self.eager[hid]
        fail = node["depth"] > 0 and rng.random() < 0.35
        checks = (Check("captured[0]", 0.0039, 0.0078, 0, 0.0078, 0.016),
                  Check("fresh[0]", 0.0041, 0.0079, 0, 0.0078, 0.016),
                  Check("adversarial:neg_inf_rows", 0.0, 0.0, 0, 0.0078, 0.016))
        log = (f"ptxas info    : Compiling entry function '{cand.spec.kernels[0].name}' for 'sm_90'\n"
               f"ptxas info    : Function properties for {cand.spec.kernels[0].name}\n"
               f"    0 bytes stack frame, {0 if node['vec'] < 8 else 24} bytes spill stores, "
               f"{0 if node['vec'] < 8 else 24} bytes spill loads\n"
               f"ptxas info    : Used {24 + 8 * node['vec']} registers, {4 * max(1, node['threads'] // 32)} bytes "
               f"smem, 384 bytes cmem[0]\n")
        cmd = "nvcc -arch=sm_90 -O3 -cubin -Xptxas -v -o kernel.cubin kernel.cu"
        if fail:
            reason, tmpl = rng.choices(FAILURES, FAILURE_WEIGHTS)[0]
            detail = tmpl.format(name=cand.spec.kernels[0].name, i=rng.randint(0, 2047), j=rng.randint(0, 2047),
                                 got=round(rng.uniform(0, 1), 4), exp=round(rng.uniform(0, 1), 4),
                                 threads=node["threads"], vec=node["vec"])
            if reason == "mismatch":
                checks = (checks[0], Check("fresh[0]", 0.37, 1.9, 4096, 0.0078, 0.016, detail.split(": ", 1)[1],
                                           passed=False), checks[2])
            elif reason == "nan":
                checks = (checks[0], checks[1], Check("adversarial:neg_inf_rows", float("nan"), float("nan"), 2048,
                                                      0.0078, 0.016, "index (0, 0, 5, 0): got nan, expected 0.0",
                                                      nan_count=2048, passed=False))
            else:
                checks = ()
            if reason == "compile_error":
                log = detail
            ev = Evaluation(Verdict(False, reason, detail, checks=checks), None, 0.4, log, cmd, 1.1)
            reward = -1.0
        else:
            s = max(0.2, base_s * math.exp(rng.gauss(0.04, 0.12)))
            s = min(s, 3.2)
            med = eager_us / s
            ev = Evaluation(Verdict(True, "ok", "", 0.0041, 0.0079, checks), Timing(med, med * 0.03, 60, med * 0.97),
                            0.38, log, cmd, 2.3, s, compile_us / med, min(1.0, 0.28 * s))
            node["speedup"] = s
            reward = math.log(s)
        self.store.record_evaluation(node["id"], hid, ev.to_json(), reward)
        cur: int | None = node["id"]
        touched = []
        while cur is not None:
            st = self.stats.setdefault(cur, [0, 0.0])
            st[0] += 1
            st[1] += reward
            touched.append((cur, st[0], st[1]))
            cur = self.parents[cur]
        self.store.set_node_stats(touched)


def make_run(run_dir: str | Path, n_candidates: int = 60, seed: int = 0, running: bool = False,
             hotspots: int = 3, duration_s: float = 2400.0) -> dict:
    """Write a recorded run; returns {hotspot ids, node ids, run_id}. With running=True the run stays
    'running' with a fresh heartbeat and the last node of the first hotspot under evaluation."""
    store = Store(run_dir)
    try:
        run_id = store.start_run("tests/models/tiny_llama.py", "sha256:3f9a0c", "cuda", "bfloat16", ENV, CONFIG)
        sim = _Sim(store, seed)
        rows = HOTSPOTS[:hotspots]
        per = [n_candidates // len(rows) + (1 if i < n_candidates % len(rows) else 0) for i in range(len(rows))]
        # budget: a search that is at 80% of its evaluations (or the default 50, whichever is larger)
        hids = [sim.add_hotspot(run_id, i + 1, row, max(50, math.ceil(per[i] / 0.8)))
                for i, row in enumerate(rows)]
        for i, hid in enumerate(hids):
            store.set_hotspot_status(hid, "searching")
            for k in range(per[i]):
                last = running and i == 0 and k == per[i] - 1
                sim.step(hid, running_last=last)
            if not running or i > 0:
                store.set_hotspot_status(hid, "done")
        _spread_times(store, duration_s)
        if running:
            store.heartbeat(run_id)
        else:
            store.finish_run(run_id)
        return {"run_id": run_id, "hotspots": hids, "sim": sim}
    finally:
        store.close()


def _spread_times(store: Store, duration_s: float) -> None:
    """Pretend the search took `duration_s`: evaluations and events spaced out before now."""
    now = time.time()
    t0 = now - duration_s
    store.execute("UPDATE runs SET created_at=?", (t0,))
    n = store.query("SELECT COUNT(*) FROM nodes")[0][0] or 1
    store.execute("UPDATE nodes SET created_at=?+(id*?)", (t0, duration_s / (n + 1)))
    store.execute("UPDATE evaluations SET finished_at=?+(node_id*?)+1", (t0, duration_s / (n + 1)))
    store.execute("UPDATE events SET at=?+(COALESCE(node_id,0)*?)", (t0, duration_s / (n + 1)))


def append_evaluations(run_dir: str | Path, hotspot_id: str, k: int, seed: int = 1) -> list[int]:
    """Add k evaluated nodes to a hotspot of an existing run (as a live search would)."""
    store = Store(run_dir)
    try:
        sim = _Sim(store, seed)
        rows = store.nodes(hotspot_id)
        evs = {r["node_id"]: r for r in store.evaluations(hotspot_id)}
        stats = {r["node_id"]: [r["visits"], r["value_sum"]] for r in store.query("SELECT * FROM node_stats")}
        sim.stats.update(stats)
        base = store.query("SELECT baseline_json FROM hotspots WHERE id=?", (hotspot_id,))[0][0]
        b = Baseline.from_json(json.loads(base))
        sim.eager[hotspot_id] = (b.eager.median_us, b.compiled.median_us if b.compiled else b.eager.median_us)
        nodes = []
        for r in rows:
            p = json.loads(r["params_json"] or "{}")
            e = evs.get(r["id"])
            sim.parents[r["id"]] = r["parent_id"]
            nodes.append({"id": r["id"], "parent": r["parent_id"], "depth": r["depth"],
                          "threads": p.get("threads", 256), "vec": p.get("vec", 1), "shuffle": p.get("shuffle", False),
                          "speedup": e["speedup_vs_eager"] if e is not None and e["ok"] else None})
        sim.nodes[hotspot_id] = nodes
        sim.counter = len(rows) + 1000 * seed
        run_id = store.query("SELECT id FROM runs ORDER BY id DESC LIMIT 1")[0][0]
        out = [sim.step(hotspot_id) for _ in range(k)]
        store.heartbeat(run_id)
        return out
    finally:
        store.close()


def add_markup_node(run_dir: str | Path) -> int:
    """A node whose source and move carry markup, with NaN/Inf in every numeric place that can hold one."""
    store = Store(run_dir)
    try:
        hid = store.hotspots()[0]["id"]
        root = store.nodes(hid)[0]["id"]
        cand = json.loads(store.nodes(hid)[0]["candidate_json"])
        cand["source"] = "// " + PAYLOAD + "\n" + cand["source"]
        cand["hash"] = "poison"
        nid = store.add_node(hid, root, 1, "move <b>bold</b>" + PAYLOAD, "llm", cand)
        ev = {"verdict": {"ok": True, "reason": "ok", "detail": PAYLOAD, "max_abs_err": math.nan,
                          "max_rel_err": math.inf,
                          "checks": [{"input_kind": "fresh[0]<i>", "max_abs_err": math.nan, "max_rel_err": -math.inf,
                                      "mismatches": 0, "atol": 1e-2, "rtol": 1e-2, "first_mismatch": PAYLOAD,
                                      "nan_count": 0, "inf_count": 0, "passed": True}]},
              "timing": {"median_us": math.inf, "iqr_us": math.nan, "n": 30, "min_us": 0.0, "clock": "cuda_events"},
              "compile_s": 0.1, "compile_log": PAYLOAD, "compile_cmd": "nvcc " + PAYLOAD, "eval_s": 1.0,
              "speedup_vs_eager": math.inf, "speedup_vs_compile": math.nan, "bandwidth_fraction": math.inf,
              "extra": {}}
        store.record_evaluation(nid, hid, ev, reward=0.5)
        # REAL columns the writer does not sanitise can still hold infinities: force some in.
        store.execute("UPDATE evaluations SET median_us=?, iqr_us=?, speedup_vs_eager=?, max_abs_err=? WHERE node_id=?",
                      (math.inf, -math.inf, math.inf, math.inf, nid))
        store.set_node_stats([(nid, 1, math.inf)])
        store.record_llm_call(hotspot_id=hid, node_id=nid, model="m", purpose="rewrite", prompt=PAYLOAD,
                              reply=PAYLOAD, prompt_tokens=1, completion_tokens=1, latency_s=math.nan,
                              cost_usd=math.inf, outcome="ok")
        return nid
    finally:
        store.close()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--hotspots", type=int, default=3)
    ap.add_argument("--running", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t = time.time()
    info = make_run(a.run_dir, a.candidates, a.seed, a.running, a.hotspots)
    print(f"wrote {a.run_dir} ({a.candidates} candidates, {len(info['hotspots'])} hotspots) in {time.time() - t:.1f}s",
          file=sys.stderr)
