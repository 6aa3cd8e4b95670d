"""Conv epilogue regions in compile mode: one op per chain signature (conv -> inference batch_norm (->
add) (-> activation)), computed with the batch_norm folded into the convolution at build time.

Compile mode's region pass (``_compile.py``) finds the chain's canonical form in Inductor's graph and
puts one call of this op there, with the chain's inputs (activation, conv weight, the batch_norm's
weight, bias, running mean and variance, the residual) in the form's order. The op then:

1. takes the sha256 of the parameters it was handed (``_graph/conv_fold.param_digest``; cached per
   tensor identity and version counter, so an in-place change such as ``load_state_dict`` or
   ``bn.running_var.fill_()`` is seen, and an unchanged model pays for the hash once) and looks for
   the build's instance with that digest: each layer of a model has its own folded tensors, stored
   in ``conv/<id>_<i>.safetensors`` beside this file, whose sha256 the manifest records (a file that
   differs runs the original ops, with a warning; ``verify`` fails it);
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

import hashlib
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

LIBS: dict[str, Any] = {}  # namespace -> torch.library.Library (kept alive: dropping it unregisters the ops)
IMPLS: dict[str, "ConvRegionOp"] = {}  # op qualname -> its implementation


_UNKNOWN = "unknown"  # ConvRegionOp.match: the parameters could not be hashed now


class CorruptFolded(RuntimeError):
    """A folded-tensor file whose sha256 is not the one the manifest records."""


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
        self.file_sha256 = {inst["digest"]: inst.get("sha256") for inst in self.conv["instances"]}
        self._corrupt: set[str] = set()  # digests whose file failed its sha256
        # per call, everything below is a lookup: the op sits on every convolution of the compiled model
        c = self.conv
        self.param_at = [self.roles.index(r) for r in self.fold.PARAM_ROLES if r in self.roles]
        self.ix = self.roles.index("x")
        self.ir = self.roles.index("residual") if "residual" in self.roles else None
        self.args = (list(c["stride"]), list(c["padding"]), list(c["dilation"]), False, [0, 0], int(c["groups"]))
        self.library = c.get("candidate", "folded") if c.get("candidate", "folded").startswith("library:") else ""
        epi = c.get("epilogue") or {}
        self.perm = tuple(epi.get("perm", (0, 1, 2, 3)))
        self.inverse = tuple(self.perm.index(d) for d in range(len(self.perm)))
        self.epi_names = list(epi.get("inputs", ()))
        self.epi_qualname = epi.get("op", "")
        self.epi_op: Any = None
        self.out_strides = tuple(entry["output"]["strides"])
        self._tensors: dict[tuple[str, str], tuple] = {}  # (digest, device) -> folded weight, biases
        self._seen: dict[tuple, str | None] = {}  # parameter identities and versions -> matching digest
        self._reference: dict[str, Any] = {}
        self._warned = False
        self._lock = threading.Lock()
        self.calls = {"folded": 0, "original": 0}

    # ---- parameters
    def _identity(self, inputs: tuple) -> tuple | None:
        try:
            return (inputs[self.ix].device,) + tuple((inputs[i].data_ptr(), inputs[i]._version) for i in self.param_at)
        except RuntimeError:  # an inference tensor has no version counter: hash every call
            return None

    def match(self, inputs: tuple) -> str | None:
        """The digest of the build instance these parameters are (None: none is)."""
        ident = self._identity(inputs)
        if ident is not None:
            found = self._seen.get(ident, _UNKNOWN)
            if found is not _UNKNOWN:
                return found
        if _capturing(inputs[0]):
            return _UNKNOWN  # hashing copies to the host, which a CUDA graph capture forbids
        digest = self.fold.param_digest(self.fold.params_of(inputs, self.roles))
        found = digest if digest in self.digests else None
        if ident is not None:
            with self._lock:
                self._seen[ident] = found
        return found

    def folded(self, digest: str, device: torch.device) -> tuple:
        """(weight, bias shaped for the epilogue, bias in the weight's dtype for a library call) on `device`."""
        key = (digest, str(device))
        got = self._tensors.get(key)
        if got is None:
            path = self.here / self.digests[digest]
            want = self.file_sha256.get(digest)
            if digest in self._corrupt or (want and hashlib.sha256(path.read_bytes()).hexdigest() != want):
                self._corrupt.add(digest)  # hashed once: later calls fail at once
                raise CorruptFolded(f"{path.name} is not the file of folded tensors the build wrote (its sha256 differs "
                                    "from the manifest's): reinstall the package")
            w, b = self.fold.load(path, device)
            pos = self.perm.index(1)
            got = (w, b.view([-1] + [1] * (w.dim() - 1 - pos)), b.to(w.dtype))
            with self._lock:
                self._tensors[key] = got
        return got

    def preload(self, device: torch.device) -> None:
        """Load every build instance's folded tensors and build the original ops' reference on `device` now,
        at compile time: tensors first made inside the op's first call would be made inside
        mode="reduce-overhead"'s CUDA graph warm-up, in the graph's private memory pool, and kept there by
        this object's caches, which CUDA graph trees refuse ("tensors in the cudagraph pool not tracked as
        outputs"). A corrupt file is left for the call to report."""
        for digest in self.digests:
            try:
                self.folded(digest, device)
            except (CorruptFolded, OSError):
                pass
        self._reference_on(device)

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
        try:
            out = self.run_folded(digest, inputs[self.ix], inputs[self.ir] if self.ir is not None else None)
        except CorruptFolded as e:
            self.calls["original"] += 1
            if not self._warned:
                self._warned = True
                warnings.warn(f"{self.package}: region {self.entry['id']}: {e}; it runs the original ops",
                              RuntimeWarning, stacklevel=2)
            return self.original(inputs)
        self.calls["folded"] += 1
        return out

    def run_folded(self, digest: str, x: torch.Tensor, r: torch.Tensor | None) -> torch.Tensor:
        """The chosen candidate on the folded tensors of build instance ``digest`` (what a matched call runs;
        ``python -m <pkg> verify`` checks it against the float64 chain of the same tensors)."""
        w, b, b_cast = self.folded(digest, x.device)
        a = self.args
        if self.library and x.is_cuda:
            if r is None:
                out = torch.cudnn_convolution_relu(x, w, b_cast, a[0], a[1], a[2], a[5])
            else:
                out = torch.cudnn_convolution_add_relu(x, w, r, 1.0, b_cast, a[0], a[1], a[2], a[5])
        else:
            y = torch.ops.aten.convolution.default(x, w, None, *a)
            if self.epi_op is None:
                ns, _, name = self.epi_qualname.partition("::")
                self.epi_op = getattr(getattr(torch.ops, ns), name).default
            by_name = {"y": y.permute(self.perm), "b": b, "r": r.permute(self.perm) if r is not None else None}
            out = self.epi_op(*[by_name[n] for n in self.epi_names]).permute(self.inverse)
        return out if out.stride() == self.out_strides else self._layout(out)

    def original(self, inputs: tuple) -> torch.Tensor:
        return self._layout(self._reference_on(inputs[0].device)(*inputs))

    def _reference_on(self, device: torch.device) -> Any:
        """The chain's original ops (its form rebuilt) on `device`, built once."""
        key = str(device)
        if key not in self._reference:
            self._reference[key] = self.canonical.rebuild(self.entry["form"], device)
        return self._reference[key]

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
