"""A fake toolkit for the search pipeline: no torch, no compiler, a slow CPU 'evaluator'.

Run as a script it is `forge-pack search` with the fakes swapped in, so tests can kill -9 it:
    python tests/pipeline_fakes.py MODEL_OR_- --run-dir DIR [--resume DIR] [--budget N] [--sleep S] [--json]
Every evaluate() call appends the candidate's hash to RUN_DIR/calls.log before it starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))

from forge_pack.core.hotspot import Hotspot  # noqa: E402
from forge_pack.search.pipeline import Toolkit  # noqa: E402
from forge_pack.core.signature import Signature, TensorSpec, contiguous_strides  # noqa: E402
from forge_pack.core.verdict import Baseline, Timing  # noqa: E402
from search_fakes import GridProposer, Landscape  # noqa: E402


def _sig(op: str, shape: tuple[int, ...], params=()) -> Signature:
    spec = TensorSpec("float32", shape, contiguous_strides(shape))
    return Signature(op, (("x", spec),), tuple(params), output=spec)


def fake_hotspots() -> list[Hotspot]:
    return [
        Hotspot(_sig("softmax", (64, 512), (("dim", 1),)), ("F.softmax",), 2, 600.0, 300.0, 0.6),
        Hotspot(_sig("log_softmax", (32, 256), (("dim", 1),)), ("torch.log_softmax",), 1, 200.0, 200.0, 0.2),
        Hotspot(_sig("softmax", (8, 16, 4), (("dim", 0),)), ("F.softmax",), 1, 100.0, 100.0, 0.1,
                unsupported="softmax over a dimension other than the last"),
        Hotspot(_sig("softmax", (4, 8), (("dim", 1),)), ("F.softmax",), 1, 5.0, 5.0, 0.005),
    ]


class FakeEvaluator:
    def __init__(self, run_dir: Path, sleep_s: float):
        self.log = Path(run_dir) / "calls.log"
        self.sleep_s = sleep_s
        self.closed = False

    def baseline(self, hotspot: Hotspot) -> Baseline:
        return Baseline(Timing(100.0, 2.0, 30, 98.0, "monotonic"), Timing(90.0, 2.0, 30, 88.0, "monotonic"),
                        floor_us=10.0, copy_bandwidth_gbs=20.0)

    def evaluate(self, cand, hotspot, baseline):
        with open(self.log, "a") as f:
            f.write(f"{hotspot.id} {cand.content_hash}\n")
        land = Landscape(len(hotspot.id), sleep_s=self.sleep_s)
        ev = land.evaluate(cand)
        if ev.verdict.ok:
            from dataclasses import replace

            ev = replace(ev, bandwidth_fraction=min(ev.speedup_vs_eager * 0.1, 1.0))
        return ev

    def close(self):
        self.closed = True


def fake_toolkit(sleep_s: float = 0.0, hotspots=None) -> Toolkit:
    hs = hotspots if hotspots is not None else fake_hotspots()
    return Toolkit(
        load=lambda model, device, dtype: SimpleNamespace(device="cpu", path=model, model_hash="fakehash",
                                                          dtype=dtype),
        profile=lambda target, run_dir, quiet: SimpleNamespace(hotspots=hs, forward_us=1000.0),
        evaluator=lambda config, run_dir, backend: FakeEvaluator(run_dir, sleep_s),
        proposers=lambda config, backend, store: [GridProposer()],
        roots=lambda hotspot, backend: [],
        env=lambda device: {"host": "test", "pid": os.getpid()},
    )


def main(argv=None) -> int:
    from forge_pack.cli.search import search_command
    from forge_pack.core.errors import ForgeError

    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--run-dir")
    ap.add_argument("--resume")
    ap.add_argument("--budget", type=int)
    ap.add_argument("--parallel", type=int)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        search_command(a.model, run_dir=Path(a.run_dir) if a.run_dir else None,
                       resume=Path(a.resume) if a.resume else None, budget=a.budget, parallel=a.parallel,
                       as_json=a.json, toolkit=fake_toolkit(a.sleep), stdout=print)
    except ForgeError as e:
        print(f"error: {e.message}\nhint: {e.hint}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    t = time.time()
    sys.exit(main())
