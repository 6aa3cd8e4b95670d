"""A hotspot: one target call signature and how much of the model's time it takes. No torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from forge_pack.core.signature import Signature


@dataclass(frozen=True)
class Hotspot:
    signature: Signature
    call_paths: tuple[str, ...]  # e.g. ("F.softmax", "nn.Softmax", "module:LlamaRMSNorm")
    calls_per_forward: float
    total_us: float  # per forward, device time (CPU time on the cpu backend)
    per_call_us: float
    time_share: float  # of the forward's total time, in [0, 1]
    captures: tuple[str, ...] = ()  # safetensors files relative to the run dir
    device: str = "cpu"
    module_class: str = ""  # for module composites: "pkg.module:ClassName"
    unsupported: str = ""  # why forge-pack's kernels cannot target it ("" when they can)
    extra: dict = field(default_factory=dict, compare=False)
    module_code: str = ""  # for module composites: profile.code_fingerprint of the class

    @property
    def op(self) -> str:
        return self.signature.op

    @property
    def id(self) -> str:
        return self.signature.slug()

    def to_json(self) -> dict:
        return {"id": self.id, "op": self.op, "signature": self.signature.to_json(),
                "call_paths": list(self.call_paths), "calls_per_forward": self.calls_per_forward,
                "total_us": self.total_us, "per_call_us": self.per_call_us, "time_share": self.time_share,
                "captures": list(self.captures), "device": self.device, "module_class": self.module_class,
                "module_code": self.module_code, "unsupported": self.unsupported, "extra": self.extra}

    @staticmethod
    def from_json(d: dict) -> "Hotspot":
        return Hotspot(Signature.from_json(d["signature"]), tuple(d["call_paths"]), d["calls_per_forward"],
                       d["total_us"], d["per_call_us"], d["time_share"], tuple(d.get("captures", ())),
                       d.get("device", "cpu"), d.get("module_class", ""), d.get("unsupported", ""),
                       d.get("extra", {}), d.get("module_code", ""))
