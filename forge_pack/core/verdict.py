"""What an evaluation says about a candidate. Pure Python, no torch import.

A Verdict is data, never an exception: the search, the run store, the dashboard and the
package all read the same record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

REASONS = (
    "ok",
    "compile_error",
    "static_check",
    "launch_error",
    "crash",
    "timeout",
    "mismatch",
    "nan",
    "unwritten_output",
    "input_mutated",
    "aliasing",
    "nondeterministic",
    "implausible_speedup",
    "out_of_bounds",  # touched memory outside its tensors (guard page or canary; CPU and CUDA)
    "work_after_return",  # kept running after its call returned (CPU: the runner was not idle)
    "inapplicable",  # the candidate's `requires` rule excludes this signature
    "out_of_memory",  # the evaluation does not fit the device's memory (memory_plan): a fact about the signature
    "internal_error",  # a fault of forge-pack itself, recorded rather than raised
)


@dataclass(frozen=True)
class Timing:
    median_us: float
    iqr_us: float
    n: int
    min_us: float = 0.0
    clock: str = "cuda_events"  # cuda_events | monotonic

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict | None) -> "Timing | None":
        return Timing(**d) if d else None


@dataclass(frozen=True)
class Check:
    """One verification input: which input set, and how the candidate's output compared."""

    input_kind: str  # captured[i] | fresh[i] | adversarial:<what> | odd:<shape>
    max_abs_err: float
    max_rel_err: float
    mismatches: int
    atol: float
    rtol: float
    first_mismatch: str = ""  # "index (2, 17): got 0.51, expected 0.49"
    nan_count: int = 0
    inf_count: int = 0
    passed: bool = True
    nonfinite_mismatches: int = 0  # positions where NaN/Inf differ from the reference (the `nan` reason)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    detail: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    checks: tuple[Check, ...] = ()

    def __post_init__(self):
        if self.reason not in REASONS:
            raise ValueError(f"unknown verdict reason {self.reason!r}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["checks"] = [c.to_json() for c in self.checks]
        return d

    @staticmethod
    def from_json(d: dict) -> "Verdict":
        checks = tuple(Check(**c) for c in d.get("checks", ()))
        return Verdict(d["ok"], d["reason"], d.get("detail", ""), d.get("max_abs_err"), d.get("max_rel_err"),
                       checks)


@dataclass(frozen=True)
class Baseline:
    """How fast the op is without forge-pack, timed in the same worker as the candidates."""

    eager: Timing
    compiled: Timing | None  # torch.compile(max-autotune-no-cudagraphs); None if it failed
    compile_error: str = ""
    floor_us: float = 0.0  # bytes moved / measured copy bandwidth
    copy_bandwidth_gbs: float = 0.0

    def to_json(self) -> dict:
        return {"eager": self.eager.to_json(), "compiled": self.compiled.to_json() if self.compiled else None,
                "compile_error": self.compile_error, "floor_us": self.floor_us,
                "copy_bandwidth_gbs": self.copy_bandwidth_gbs}

    @staticmethod
    def from_json(d: dict) -> "Baseline":
        return Baseline(Timing.from_json(d["eager"]), Timing.from_json(d.get("compiled")),  # type: ignore[arg-type]
                        d.get("compile_error", ""), d.get("floor_us", 0.0), d.get("copy_bandwidth_gbs", 0.0))


@dataclass(frozen=True)
class Evaluation:
    """Everything one evaluation of one candidate produced."""

    verdict: Verdict
    timing: Timing | None = None
    compile_s: float = 0.0
    compile_log: str = ""
    compile_cmd: str = ""
    eval_s: float = 0.0
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    bandwidth_fraction: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"verdict": self.verdict.to_json(), "timing": self.timing.to_json() if self.timing else None,
                "compile_s": self.compile_s, "compile_log": self.compile_log, "compile_cmd": self.compile_cmd,
                "eval_s": self.eval_s, "speedup_vs_eager": self.speedup_vs_eager,
                "speedup_vs_compile": self.speedup_vs_compile, "bandwidth_fraction": self.bandwidth_fraction,
                "extra": self.extra}

    @staticmethod
    def from_json(d: dict) -> "Evaluation":
        return Evaluation(Verdict.from_json(d["verdict"]), Timing.from_json(d.get("timing")),
                          d.get("compile_s", 0.0), d.get("compile_log", ""), d.get("compile_cmd", ""),
                          d.get("eval_s", 0.0), d.get("speedup_vs_eager"), d.get("speedup_vs_compile"),
                          d.get("bandwidth_fraction"), d.get("extra", {}))
