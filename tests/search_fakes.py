"""Fakes for search tests: a synthetic reward landscape over a parameter grid and its proposer. No torch.

The landscape: a family f and three integer parameters (a, b, c). Each family has a smooth peak
(random centre and height per seed), evaluations carry a little multiplicative noise, and some
points fail (scattered compile errors, a crash corner, a mismatch strip) as real kernels do.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time

from forge_pack.core.candidate import Candidate, KernelLaunch, LaunchSpec
from forge_pack.search.propose import Move, ProposeRequest
from forge_pack.core.verdict import Evaluation, Timing, Verdict

SPEC = LaunchSpec((KernelLaunch("k", ("x", "out")),))
DIMS = {"f": 3, "a": 8, "b": 8, "c": 4}


def cand(params: dict, origin: str = "template") -> Candidate:
    return Candidate(op="softmax", backend="cpu", source="// " + json.dumps(params, sort_keys=True), spec=SPEC,
                     family=f"fam{params['f']}", params=dict(params), origin=origin)


def all_points():
    for f in range(DIMS["f"]):
        for a in range(DIMS["a"]):
            for b in range(DIMS["b"]):
                for c in range(DIMS["c"]):
                    yield {"f": f, "a": a, "b": b, "c": c}


def ok_eval(speedup: float) -> Evaluation:
    us = 100.0 / speedup
    return Evaluation(Verdict(True, "ok"), Timing(us, us * 0.02, 30, us * 0.98, "monotonic"),
                      speedup_vs_eager=speedup, speedup_vs_compile=speedup * 0.9)


def fail_eval(reason: str) -> Evaluation:
    return Evaluation(Verdict(False, reason, f"fake {reason}"))


class Landscape:
    def __init__(self, seed: int, noise: float = 0.03, sleep_s: float = 0.0):
        rng = random.Random(seed)
        self.seed, self.noise, self.sleep_s = seed, noise, sleep_s
        self.heights = [rng.uniform(0.9, 1.5) for _ in range(DIMS["f"])]
        self.heights[rng.randrange(DIMS["f"])] = 2.2  # one family clearly best
        self.centres = [(rng.randrange(DIMS["a"]), rng.randrange(DIMS["b"]), rng.randrange(DIMS["c"]))
                        for _ in range(DIMS["f"])]
        self.fail_mod = rng.randrange(7)
        self.calls: list[str] = []  # content hashes, in call order
        self.lock = threading.Lock()
        points = [p for p in all_points() if self.failure(p) is None]
        self.best_value = max(self.true_speedup(p) for p in points)

    def failure(self, p: dict) -> str | None:
        if (p["a"] + 2 * p["b"] + 3 * p["c"] + p["f"]) % 7 == self.fail_mod:
            return "compile_error"
        if p["a"] == 7 and p["b"] == 7:
            return "crash"
        if p["c"] == 3 and p["a"] < 2:
            return "mismatch"
        return None

    def true_speedup(self, p: dict) -> float:
        ca, cb, cc = self.centres[p["f"]]
        d = ((p["a"] - ca) ** 2 + (p["b"] - cb) ** 2) / 18.0 + (p["c"] - cc) ** 2 / 4.0
        return self.heights[p["f"]] * math.exp(-d)

    def evaluate(self, c: Candidate) -> Evaluation:
        with self.lock:
            self.calls.append(c.content_hash)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        p = dict(c.params)
        reason = self.failure(p)
        if reason:
            return fail_eval(reason)
        rng = random.Random(f"{self.seed}:{c.content_hash}")
        return ok_eval(self.true_speedup(p) * math.exp(rng.gauss(0.0, self.noise)))

    def is_best(self, p: dict) -> bool:
        return self.failure(p) is None and self.true_speedup(p) >= self.best_value * (1 - 1e-12)


class GridProposer:
    """Starting points: each family's middle point. Moves: one parameter +-1, or switch family."""

    name = "grid"

    def __init__(self):
        self.requests = 0

    def propose(self, request: ProposeRequest) -> list[Move]:
        self.requests += 1
        if request.parent is None:
            return [Move(cand({"f": f, "a": 3, "b": 3, "c": 1}), f"start fam{f}", "template")
                    for f in range(DIMS["f"])]
        p = dict(request.parent.candidate.params)
        moves = []
        for k in ("a", "b", "c", "f"):
            for step in (-1, 1):
                q = dict(p)
                q[k] = p[k] + step if k != "f" else (p[k] + step) % DIMS["f"]
                if 0 <= q[k] < DIMS[k]:
                    moves.append(Move(cand(q), f"{k} {p[k]}->{q[k]}", "template"))
        random.Random(json.dumps(p, sort_keys=True)).shuffle(moves)
        fresh = [m for m in moves if m.candidate.content_hash not in request.tried_hashes]
        return fresh[:request.max_moves]


class ListProposer:
    """Offers a fixed list of candidates once, at the root: runs dry after len(points)."""

    def __init__(self, points, name="list"):
        self.points, self.name = list(points), name

    def propose(self, request: ProposeRequest) -> list[Move]:
        if request.parent is None:
            return [Move(cand(p), f"point {i}") for i, p in enumerate(self.points)]
        return []
