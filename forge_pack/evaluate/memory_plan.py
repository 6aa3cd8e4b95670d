"""What an evaluation may hold in device memory, and the float64 references computed in slices.

The goal is an evaluation whose peak stays within a few times B, the bytes of the signature's
inputs + outputs, whatever B is (the judge's tensors: input sets, references, outputs, saved
copies, timing copies; not the flush buffer or the copy-bandwidth probe, which have fixed sizes):

- input sets are verified one at a time: a hotspot's static sets (captured, adversarial, odd)
  stay cached in the worker only while all of them together are small (``CACHE_BYTES``); beyond
  that they are made again per evaluation (their cost is proportional to the data), each set's
  tensors and reference dropped when verification moves on, an odd-size set never larger than
  the signature (``verify._no_larger``), the timed input drawn again for timing rather than held
  (on a GPU it waits in host memory while the derived sets are made from it, and comes back from
  there for timing); on a GPU the static sets' tensors stay in host memory between evaluations
  (``host_cache_bytes``) and only their references are computed again;
- the float64 reference of a large set is computed in slices along a batch dimension
  (``reference64``), so its float64 temporaries (inputs converted to float64, the op's
  intermediates) are bounded by ``SLICE_BYTES``, not by the tensor; a streamed set drops its
  reference once the first run is judged;
- derived sets are transformed in place, their float64 arithmetic a chunk at a time
  (``verdict_rules.derive_inputs``): whole-tensor float64 copies there were the largest part of an
  H100 evaluation's peak (5.13x B against this module's estimate of 3.5x, for a 3.2 GB softmax);
- timing keeps one copy of the timed input when it is far larger than the cache
  (``timing.rotation_count``), and times the verified set's own tensors.

Measured on the CPU for a scaled-down large hotspot (tests/test_eval_memory.py): 4.4x B at the
peak for a 36 MB layer_norm; the live tensors there, verifying a derived set, are its inputs and
float64 reference (2x an fp32 output), the saved inputs, out, the CPU's second fresh output and the
timed input kept as the derived sets' source (about 3.9x B); the rest is the process's own growth.

``fits`` tells the judge before it allocates anything whether the evaluation's estimated peak fits
the device's free memory; when it does not (or an allocation fails anyway), the verdict is
``out_of_memory``: a fact about the signature on this device, never a crash of the worker.
"""

from __future__ import annotations

from typing import Any

from forge_pack.core.signature import Signature
from forge_pack.targets import abi

CACHE_BYTES = 256 << 20  # static sets kept between evaluations up to this much (captures of real models fit)
SLICE_BYTES = 64 << 20  # float64 bytes of one reference slice's output: temporaries stay near this size
OOM_MARGIN = 1.1  # estimate x this must fit the free memory: the allocator rounds and fragments

# Ops whose dim 0 indexes independent problems (samples, or rows of a row-wise op): the reference on
# x[a:b] with every other tensor whole is rows a..b of the reference. Any other op is never sliced.
_BATCH_DIM0 = ("group_norm", "instance_norm", "batch_norm", "adaptive_avg_pool2d")


def _dim0_independent(sig: Signature) -> bool:
    # Only the ops below are known to compute each dim-0 slice alone; anything else (a region, whose
    # reductions may span dim 0; attention) keeps the whole-tensor reference.
    if sig.op not in ("softmax", "log_softmax", "layer_norm", "rms_norm") and sig.op not in _BATCH_DIM0:
        return False
    x = sig.x
    if len(x.shape) < 2 or x.shape[0] < 2:
        return False
    if sig.op in ("softmax", "log_softmax"):
        return (sig.param("dim") or 0) % len(x.shape) != 0
    if sig.op in ("layer_norm", "rms_norm"):
        return len(sig.param("normalized_shape") or [0]) < len(x.shape)
    return sig.op in _BATCH_DIM0


def reference64(sig: Signature, tensors: dict[str, Any], slice_bytes: int = SLICE_BYTES):
    """``ops.reference64`` with bounded temporaries: the float64 output preallocated, filled slice
    by slice along dim 0 where the op allows it (each slice about ``slice_bytes`` of output)."""
    import torch

    from forge_pack.targets import ops

    out_spec = sig.output
    if out_spec is None or not _dim0_independent(sig) or out_spec.numel * 8 <= slice_bytes:
        return ops.reference64(sig, tensors)
    x = tensors["x"]
    n = x.shape[0]
    per_row = max(out_spec.numel // max(out_spec.shape[0], 1), 1)
    step = max(1, slice_bytes // (per_row * 8))
    ref = torch.empty(tuple(out_spec.shape), dtype=torch.float64, device=x.device)
    for a in range(0, n, step):
        part = {k: (v[a:a + step] if k == "x" else v) for k, v in tensors.items()}
        ref[a:a + step] = ops.reference64(sig, part)
        del part
    return ref


def running_reference(sig: Signature) -> bool:
    """Whether the timing loop keeps its one copy's float64 reference and recomputes only the dim-0
    slices the judge changed before each call (``reference64_rows``) instead of the whole reference per
    call: a row-wise or per-sample op whose reference is larger than one slice. The reference is held
    where the whole one was made per call, so the peak is the same."""
    return sig.output is not None and _dim0_independent(sig) and sig.output.numel * 8 > SLICE_BYTES


def reference64_rows(sig: Signature, tensors: dict[str, Any], ref, rows) -> None:
    """Recompute ``ref`` (``reference64`` of ``tensors`` before x changed in ``rows``) at those dim-0
    indices, from x's rows and the other tensors whole, as ``reference64``'s slices are made."""
    from forge_pack.targets import ops

    for r in sorted(set(rows)):
        part = {k: (v[r:r + 1] if k == "x" else v) for k, v in tensors.items()}
        ref[r:r + 1] = ops.reference64(sig, part)
        del part


PARK_ON_HOST = ("cuda",)  # devices whose streamed timed input waits in host memory during the derived sets


def park_on_host(device: str) -> bool:
    """Whether a large hotspot's fresh set leaves the device while the derived sets are verified
    (on the CPU the host is the device: nothing to gain)."""
    return device in PARK_ON_HOST


HOST_CACHE_DEVICES = ("cuda",)  # devices whose streamed static sets keep their tensors in host memory
HOST_CACHE_CAP = 32 << 30  # and at most this much of it (or a quarter of the machine's memory, if less)


def host_cache_bytes(device: str) -> int:
    """Host memory a streamed hotspot may keep its static sets' tensors in (0: none): drawing a GB
    tensor on the CPU takes seconds, copying it back to the GPU a fraction of one."""
    if device not in HOST_CACHE_DEVICES:
        return 0
    import os

    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 0
    return min(HOST_CACHE_CAP, physical // 4)


def to_host(t):
    """A host copy of a device tensor with its exact strides, in page-locked memory where the tensor is
    on a GPU (torch's caching host allocator: the copy back runs at the link's speed, several times
    a pageable copy's, and a block freed by one evaluation serves the next); pageable if pinning fails."""
    import torch

    if t.device.type == "cuda":
        try:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, pin_memory=True).copy_(t)
        except RuntimeError:  # no page-locked memory left: an ordinary copy does the same job, slower
            pass
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu").copy_(t)


def from_host(t, device: str):
    """A device copy of a host copy (``to_host``) with the same strides; from page-locked memory the
    copy does not wait for the host (the host copy is never written again, and every use of the
    device copy is queued after it on the same stream)."""
    import torch

    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    return out.copy_(t, non_blocking=t.is_pinned())


def tensors_bytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values() if t is not None)


def data_bytes(sig: Signature) -> int:
    """Inputs + outputs: the bytes the bound is stated in."""
    return abi.bytes_moved(sig)


def set_bytes(sig: Signature) -> int:
    """One input set held for verification: its inputs and its float64 reference."""
    inputs = sum(s.nbytes for _, s in sig.inputs if s is not None)
    return inputs + (sig.output.numel * 8 if sig.output is not None else 0)


def cache_static(sig: Signature, static_sets: int) -> bool:
    """Whether a hotspot's static sets stay cached in the worker between evaluations."""
    return static_sets * set_bytes(sig) <= CACHE_BYTES


def estimate_peak(sig: Signature, workspace_bytes: int = 0) -> int:
    """Device bytes the judge holds at its peak (verification of one set while the timed input is
    kept): the timed input, one set (inputs + float64 reference), the set's saved inputs, the output
    and its first-run copy, the workspaces, and the larger of one reference slice's temporaries and
    one comparison chunk's."""
    from forge_pack.evaluate import verdict_rules  # torch: only the judge (a worker) asks

    inputs = sum(s.nbytes for _, s in sig.inputs if s is not None)
    out = sig.output.nbytes if sig.output is not None else 0
    ref = sig.output.numel * 8 if sig.output is not None else 0
    numel = sig.output.numel if sig.output is not None else 0
    slice_temporaries = min(ref, SLICE_BYTES) * 4  # float64 inputs and intermediates of one slice
    compare_temporaries = min(numel, verdict_rules._CHUNK) * verdict_rules.CHUNK_BYTES_PER_ELEMENT
    temporaries = max(slice_temporaries, compare_temporaries)
    return inputs + (inputs + ref) + inputs + 2 * out + workspace_bytes + temporaries


# Said in an out_of_memory verdict when the signature's own sets, without any candidate's workspace,
# exceed the free memory: every candidate of the hotspot would be refused the same way (the search stops).
SETS_DO_NOT_FIT = "the signature's own sets do not fit, whatever the kernel"


def fits(sig: Signature, free_bytes: int | None, workspace_bytes: int = 0) -> str | None:
    """Why the evaluation cannot fit ``free_bytes`` of device memory (None: it fits, or unknown). The
    reason says whether the signature's own sets are the cause (SETS_DO_NOT_FIT) or this
    candidate's workspace (without it, the evaluation would fit)."""
    if free_bytes is None:
        return None
    need = estimate_peak(sig, workspace_bytes)
    if need * OOM_MARGIN <= free_bytes:
        return None
    why = (f"evaluating {sig.pretty()} needs about {need / 2**30:.2f} GiB of device memory "
           f"({need / max(data_bytes(sig), 1):.1f}x its {data_bytes(sig) / 2**30:.2f} GiB of inputs and "
           f"outputs), {free_bytes / 2**30:.2f} GiB are free")
    if estimate_peak(sig) * OOM_MARGIN > free_bytes:
        return f"{why}: {SETS_DO_NOT_FIT}"
    return f"{why}: this candidate's {workspace_bytes / 2**30:.2f} GiB of workspace is what does not fit"


NO_DEVICE_ALLOCATION = ("cuda",)  # backends whose kernels allocate no device memory of their own (only workspaces)


def allocation_failed(sig: Signature, err: BaseException, backend: str, workspace_bytes: int) -> str:
    """The out_of_memory detail of an allocation that failed despite the estimate. Where the candidate cannot
    have caused it (a GPU kernel without workspace: every tensor of the evaluation is the judge's, the same for
    each candidate of the hotspot), it says so with SETS_DO_NOT_FIT, and the search stops there instead of
    failing every candidate the same way (an H100 search of a 6 GiB softmax failed 10 of 10, 20 s each). A CPU
    candidate's code may allocate host memory itself: its failure is its own."""
    why = f"an allocation failed while evaluating {sig.pretty()}: {str(err)[:500]}"
    where = failed_at(err)
    if where:
        why += f" [in {where}]"
    if backend in NO_DEVICE_ALLOCATION and workspace_bytes == 0:
        why += f" (the candidate allocates nothing: {SETS_DO_NOT_FIT})"
    return why


WHERE_FRAMES = 4  # the innermost frames of forge_pack's own code an out_of_memory detail names


def failed_at(err: BaseException, frames: int = WHERE_FRAMES) -> str:
    """Where in forge_pack's code ``err`` was raised, innermost first ("verify.py:79 make_set <-
    judge.py:214 judge"): which of the judge's steps (a reference, a derived set, timing's copies)
    asked for the memory that was missing, so the peak's excess over the estimate can be located
    from a verdict alone. Frames outside forge_pack (torch's) are skipped."""
    import os
    import traceback

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the forge_pack package
    ours = [f for f in traceback.extract_tb(err.__traceback__)
            if os.path.abspath(f.filename).startswith(root + os.sep)]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(ours[-frames:]))


def sets_do_not_fit(verdict) -> bool:
    """Whether an evaluation's verdict says no candidate of its hotspot can fit this device's memory
    (an allocation that failed despite the estimate may be the candidate's own doing: not this, unless
    ``allocation_failed`` found that it cannot be)."""
    return verdict.reason == "out_of_memory" and SETS_DO_NOT_FIT in (verdict.detail or "")


def free_bytes(device: str) -> int | None:
    """Free device memory now (CUDA: the driver's count plus what torch's cache holds); None on CPU."""
    if device != "cuda":
        return None
    import torch

    free, _ = torch.cuda.mem_get_info()
    return int(free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())


def is_out_of_memory(err: BaseException) -> bool:
    """An allocation failure (CUDA's OutOfMemoryError, the CPU allocator's refusal)."""
    import torch

    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, (RuntimeError, MemoryError)) and (
        "out of memory" in text or "DefaultCPUAllocator: can't allocate memory" in text or isinstance(err, MemoryError))


def release(device: str) -> None:
    """Give what a failed evaluation allocated back, so the worker stays usable."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()

