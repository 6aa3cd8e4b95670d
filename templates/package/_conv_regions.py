"""Conv epilogue regions in compile mode: one op per chain signature (conv -> inference batch_norm (->
add) (-> activation)), computed with the batch_norm folded into the convolution at build time.

Compile mode's region pass (``_compile.py``) finds the chain's canonical form in Inductor's graph and
puts one call of this op there, with the chain's inputs (activation, conv weight, the batch_norm's
weight, bias, running mean and variance, the residual) in the form's order. The op then:

1. takes the sha256 of the parameters it was handed (``_graph/conv_fold.param_digest``; cached per
   tensor identity and version counter, so an in-place change such as ``load_state_dict`` or
   ``bn.running_var.fill_()`` is seen, and an unchanged model pays for the hash once) and looks for
   the build's instance with that digest: each layer of a model has its own folded tensors, stored
   in ``conv/<id>_<i>.safetensors`` beside this file;
2. no instance matches (the model's weights changed after the build): runs the chain's original ops
   (the subgraph rebuilt from its form) and warns once;
3. else runs the chosen candidate: cuDNN's fused convolution + bias (+ add) + ReLU (a library
   candidate, ``library:...``) or the folded convolution followed by the package's epilogue kernel
   (``<ns>::t<N>``, the generated pointwise kernel verified by the build), run over the convolution's
   output in memory order (channels_last as [N, H, W, C]) and viewed back.

Under CUDA graphs (``mode="reduce-overhead"``) the op's Python body runs when the graph is captured:
the digest is checked then (from the warm-up run's cache: hashing copies to the host, which a capture
forbids; parameters never seen before the capture run the original ops), not on every replay. Eager
``apply()`` does not use these regions.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import torch

LIBS: dict[str, Any] = {}  # namespace -> torch.library.Library (kept alive: dropping it unregisters the ops)
IMPLS: dict[str, "ConvRegionOp"] = {}  # op qualname -> its implementation


_UNKNOWN = "unknown"  # ConvRegionOp.match: the parameters could not be hashed now


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


class ConvRegionOp:
    """The op of one manifest region with a ``conv`` record."""

    def __init__(self, entry: dict, namespace: str, package: str, here: Path, graph_rt: Any):
        self.entry, self.conv = entry, entry["conv"]
        self.namespace, self.package, self.here = namespace, package, here
        self.fold = graph_rt["conv_fold"]
        self.canonical = graph_rt["canonical"]
        self.roles = list(self.conv["roles"])
        self.digests = {inst["digest"]: inst["file"] for inst in self.conv["instances"]}
        self._tensors: dict[tuple[str, str], tuple] = {}  # (digest, device) -> folded (weight, bias)
        self._seen: dict[tuple, str | None] = {}  # parameter identities and versions -> matching digest
        self._reference: dict[str, Any] = {}
        self._warned = False
        self._lock = threading.Lock()
        self.calls = {"folded": 0, "original": 0}

    # ---- parameters
    def _identity(self, params: dict) -> tuple | None:
        try:
            return tuple((role, t.data_ptr(), t._version, str(t.device)) if t is not None else (role,)
                         for role, t in sorted(params.items()))
        except RuntimeError:  # an inference tensor has no version counter: hash every call
            return None

    def match(self, inputs: tuple) -> str | None:
        """The digest of the build instance these parameters are (None: none is)."""
        params = self.fold.params_of(inputs, self.roles)
        ident = self._identity(params)
        if ident is not None and ident in self._seen:
            return self._seen[ident]
        if _capturing(inputs[0]):
            return _UNKNOWN  # hashing copies to the host, which a CUDA graph capture forbids
        digest = self.fold.param_digest(params)
        found = digest if digest in self.digests else None
        if ident is not None:
            with self._lock:
                self._seen[ident] = found
        return found

    def folded(self, digest: str, device: torch.device) -> tuple:
        key = (digest, str(device))
        if key not in self._tensors:
            w, b = self.fold.load(self.here / self.digests[digest], device)
            with self._lock:
                self._tensors[key] = (w, b, b.to(w.dtype))
        return self._tensors[key]

    # ---- the op
    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        digest = self.match(inputs)
        if digest is _UNKNOWN:  # parameters first seen inside a CUDA graph capture: the original ops, unchecked
            self.calls["original"] += 1
            return self.original(inputs)
        if digest is None:
            self.calls["original"] += 1
            if not self._warned:
                self._warned = True
                warnings.warn(f"{self.package}: region {self.entry['id']} ({self.entry.get('name', '')}): the model's "
                              "convolution / batch_norm parameters are not the ones the package folded at build time; "
                              "it runs the original ops", RuntimeWarning, stacklevel=2)
            return self.original(inputs)
        self.calls["folded"] += 1
        x = inputs[self.roles.index("x")]
        r = inputs[self.roles.index("residual")] if "residual" in self.roles else None
        w, b, b_cast = self.folded(digest, x.device)
        c = self.conv
        cand = c.get("candidate", "folded")
        if cand.startswith("library:") and x.device.type == "cuda":
            if r is None:
                out = torch.cudnn_convolution_relu(x, w, b_cast, c["stride"], c["padding"], c["dilation"], c["groups"])
            else:
                out = torch.cudnn_convolution_add_relu(x, w, r, 1.0, b_cast, c["stride"], c["padding"],
                                                       c["dilation"], c["groups"])
        else:
            y = self.fold.conv(x, w, None, c)
            epi = c["epilogue"]
            ns, _, name = epi["op"].partition("::")
            args = self.fold.epilogue_args(epi["inputs"], epi["perm"], y, b, r)
            out = self.fold.from_memory_order(getattr(getattr(torch.ops, ns), name).default(*args), epi["perm"])
        return self._layout(out)

    def original(self, inputs: tuple) -> torch.Tensor:
        device = inputs[0].device
        key = str(device)
        if key not in self._reference:
            self._reference[key] = self.canonical.rebuild(self.entry["form"], device)
        return self._layout(self._reference[key](*inputs))

    def _layout(self, out: torch.Tensor) -> torch.Tensor:
        o = self.entry["output"]
        if tuple(out.stride()) == tuple(o["strides"]):
            return out
        fixed = torch.empty_strided(tuple(o["shape"]), tuple(o["strides"]), dtype=out.dtype, device=out.device)
        return fixed.copy_(out)

    def fake(self, *inputs: torch.Tensor) -> torch.Tensor:
        o = self.entry["output"]
        return torch.empty_strided(tuple(o["shape"]), tuple(o["strides"]), dtype=getattr(torch, o["dtype"]),
                                   device=inputs[0].device)


def register(entry: dict, namespace: str, package: str, here: Path, graph_rt: dict) -> ConvRegionOp:
    """Define ``entry['op']`` (``<ns>::<name>``, taking the form's inputs) with this implementation and a fake
    kernel; an op already defined in this process (another CompileMode of the package) is reused."""
    qual = entry["op"]
    ns, _, name = qual.partition("::")
    impl = ConvRegionOp(entry, namespace, package, here, graph_rt)
    lib = LIBS.get(ns)
    if lib is None:
        lib = LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    if qual in IMPLS:
        return IMPLS[qual]
    args = ", ".join(f"Tensor in{k}" for k in range(len(entry["form"]["inputs"])))
    # Inductor then hands the op its inputs in the traced strides: the convolution's output, hence the
    # epilogue kernel's input, keeps the layout the kernel was verified on
    tag = getattr(torch._C.Tag, "needs_exact_strides", None)
    lib.define(f"{name}({args}) -> Tensor", tags=(tag,) if tag is not None else ())
    lib.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(qual, lib=lib)(impl.fake)
    IMPLS[qual] = impl
    return impl
