"""Is the patched model's output as good as the original's? Whole-model output comparison.

Per-op verification (``tolerance.compare``) holds each kernel to a float64 reference. A whole model
is different: a bf16 or fp16 model is not exact either, and each patched op that rounds once
where eager rounded twice (or the other way round) moves every later layer a little. Holding the
patched output element by element to the eager output then rejects packages that are as accurate
as eager, only differently rounded; a Gemma-like LM's logits move by 0.3 on a scale of 5 that way,
while torch.compile of the same model moves them by 2.0. A float32 model on a GPU is not exact
either: cuDNN convolutions run in TF32 by default (10-bit mantissas), so an fp32 group_norm kernel
that differs from eager by 7e-7 moved a small VAE's output by 4.7e-4 on the H200, TF32 rounding
flips that eager's own output carries too.

So the check has two stages:

1. element by element against the eager output, within ``MODEL_SLACK`` times the output dtype's
   per-op tolerance (what a faithfully rounded model meets);
2. where that fails, both outputs are compared to the same model computed in a higher precision
   (float32 for a bf16/fp16 model, float64 for a float32 one; its own weights and inputs, converted
   exactly): the patched output passes when its error against that yardstick, in max and in RMS,
   is at most ``EAGER_ERROR_FACTOR`` times eager's own error plus one output-dtype ``atol``.

The second stage needs a higher-precision copy of the model; where it does not fit or does not
run, the first stage's verdict stands and the result says why.
"""

from __future__ import annotations

import copy
import math
from typing import Any

# Whole-model outputs pass through every patched op: per-op errors compound through the layers,
# so the element-wise model-level check allows this multiple of the output dtype's per-op tolerance.
MODEL_SLACK = 10.0
# Against the float32 yardstick: the patched model may be at most this much less accurate than eager.
EAGER_ERROR_FACTOR = 2.0
LOW_PRECISION = ("bfloat16", "float16")


def tensors(obj: Any) -> list:
    """Every tensor in a model output (tensors, lists, tuples, dicts, HF ModelOutput), in order."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict) or hasattr(obj, "to_tuple"):
        items = obj.to_tuple() if hasattr(obj, "to_tuple") else list(obj.values())
        return [t for v in items for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


# Every forward of a whole-model comparison (eager, higher-precision reference, patched, reverted)
# draws its random numbers from this seed: dropout left on, a VAE's latent sample, noise in a
# diffusion step are then the same draws in each, and only the patched ops differ.
CHECK_SEED = 0


def clone_outputs(obj: Any) -> Any:
    """A copy of a model output that the next forward cannot change: a model that returns a buffer
    it reuses (a preallocated output, a static cache) would overwrite an output kept by reference."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        items = {k: clone_outputs(v) for k, v in obj.items()}
        try:  # HF ModelOutput is a dataclass taking keywords; OrderedDict & co. take the pairs
            return type(obj)(**items) if hasattr(obj, "to_tuple") else type(obj)(items)
        except Exception:  # noqa: BLE001 - a mapping type we cannot rebuild: its items still compare
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple takes its fields positionally
        return type(obj)(*(clone_outputs(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_outputs(v) for v in obj)
    return obj


def fresh_inputs(obj: Any, memo: dict | None = None) -> Any:
    """A copy of forward arguments for one run: tensors copied storage by storage (strides, views of
    one another and stride-0 expands stay what they were: the package's guard checks strides, and an
    expanded mask must not become a full allocation), containers rebuilt, anything else deep-copied
    where it can be; a forward that writes into its inputs (x += pos, a cache it fills) then leaves
    the next run's inputs as the user's get_inputs() made them. The memo keeps one tensor passed
    twice one tensor in the copy."""
    import torch

    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        out: Any = _same_layout_copy(obj, memo)
    elif isinstance(obj, dict):
        try:  # keep a dict subclass's type (attribute access to a batch's fields)
            out = copy.copy(obj)
        except Exception:  # noqa: BLE001
            out = {}
        for k, v in obj.items():
            out[k] = fresh_inputs(v, memo)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        out = type(obj)(*(fresh_inputs(v, memo) for v in obj))
    elif isinstance(obj, (list, tuple)):
        out = type(obj)(fresh_inputs(v, memo) for v in obj)
    elif isinstance(obj, (int, float, complex, bool, str, bytes, type(None))):
        out = obj
    else:
        try:
            out = copy.deepcopy(obj)
        except Exception:  # noqa: BLE001 - not copyable: the run gets the object itself
            out = obj
    memo[id(obj)] = out
    return out


def _same_layout_copy(t, memo: dict):
    """t on a copy of its storage (one copy per storage, shared by every view of it): same size,
    strides and offset. Tensors without a plain storage (subclasses, sparse) are cloned."""
    import torch

    try:
        storage = t.untyped_storage()
        key = ("storage", t.device, storage.data_ptr(), storage.nbytes())
        if key not in memo:
            memo[key] = storage.clone()
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(memo[key], t.storage_offset(), t.size(),
                                                                   t.stride())
    except (RuntimeError, TypeError, NotImplementedError):
        return t.detach().clone()


def _rng_devices(device: str) -> list[int]:
    """The CUDA devices whose generators a forward may draw from: all of them once CUDA is in use."""
    import torch

    if device == "cuda" or (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return list(range(torch.cuda.device_count()))
    return []


def _rng_state(devices: list[int]) -> list:
    import torch

    return [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]


def seeded_run(fn, args: tuple, kwargs: dict, device: str, seed: int = CHECK_SEED) -> tuple[Any, bool]:
    """fn(*args, **kwargs) on a fresh copy of the arguments, its random numbers drawn from `seed` in a
    forked RNG (the caller's generators are left as they were): (cloned output, whether it drew any)."""
    import torch

    a, k = fresh_inputs((tuple(args), dict(kwargs)))
    devices = _rng_devices(device)
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        before = _rng_state(devices)
        out = clone_outputs(fn(*a, **k))
        drew = any(not torch.equal(x, y) for x, y in zip(before, _rng_state(devices)))
    return out, drew


def seeded_forward(module, args: tuple, kwargs: dict, device: str, seed: int = CHECK_SEED) -> Any:
    """One forward of a whole-model comparison (see seeded_run): its cloned output."""
    return seeded_run(module, args, kwargs, device, seed)[0]


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _errors(x64, g64) -> tuple[float, float]:
    """(max abs, RMS) of x - g over the positions where both are finite."""
    import torch

    both = torch.isfinite(x64) & torch.isfinite(g64)
    d = (x64 - g64)[both]
    if not d.numel():
        return 0.0, 0.0
    return float(d.abs().max()), float(d.square().mean().sqrt())


def precise_reference(module, args: tuple, kwargs: dict, device: str) -> tuple[Any, str | None]:
    """The model's output computed in a higher precision from its own weights and inputs (float32
    when it holds bf16/fp16 state or inputs, else float64 when it holds float32 ones): (output
    tensors, None), or (None, why not); (None, None) when it has no floating state to widen."""
    import torch

    state = [*module.parameters(), *module.buffers()]
    floats = [t for t in [*state, *tensors(list(args)), *tensors(dict(kwargs))] if t.is_floating_point()]
    names = {_dtype_name(t) for t in floats}
    if names & set(LOW_PRECISION):
        wide, size = torch.float32, 4
    elif "float32" in names:
        wide, size = torch.float64, 8
    else:
        return None, None
    label = str(wide).replace("torch.", "")
    need = sum(t.numel() * size for t in state if t.is_floating_point())
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        if need * 1.5 > free:
            return None, (f"no {label} reference: a {label} copy of the weights needs {need / 2**30:.1f} GiB "
                          f"and {free / 2**30:.1f} GiB are free")

    def cast(v):
        if isinstance(v, torch.Tensor):
            return v.to(wide) if v.is_floating_point() else v
        if isinstance(v, (list, tuple)):
            return type(v)(cast(x) for x in v)
        if isinstance(v, dict):
            return {k: cast(x) for k, x in v.items()}
        return v

    gold_module = None
    try:
        gold_module = copy.deepcopy(module).to(wide)
        with torch.inference_mode():
            # Same seed, fresh inputs, as the eager and patched forwards (seeded_forward).
            out, drew = seeded_run(gold_module, cast(tuple(args)), cast(dict(kwargs)), device)
        if drew:
            # A float64 copy draws other numbers from the same seed (torch.randn in float32 and in
            # float64 take different paths): its output is no yardstick for the float32 model's.
            return None, (f"no {label} reference: the forward draws random numbers, and a {label} copy "
                          "draws different ones from the same seed")
        return [t.detach().clone() for t in tensors(out)], None
    except Exception as e:  # noqa: BLE001 - the yardstick is optional; the element-wise verdict stands
        return None, (f"no {label} reference: the {label} copy of the model failed "
                      f"({type(e).__name__}: {str(e)[:200]})")
    finally:
        del gold_module
        if device == "cuda":
            torch.cuda.empty_cache()


def compare_outputs(ref: Any, got: Any, gold: list | None = None, gold_note: str | None = None) -> dict:
    """Max abs/rel difference over every output tensor, the tolerance verdict (see the module
    docstring), argmax agreement; ``gold`` is ``precise_reference``'s output when there is one."""
    import torch

    from forge_pack.evaluate import tolerance

    a, b = tensors(ref), tensors(got)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return {"max_abs_diff": None, "max_rel_diff": None, "within_tolerance": False, "output_kind": "structure",
                "argmax_agreement": None, "note": "the patched model's outputs have another structure or shape"}
    max_abs, max_rel, ok = 0.0, 0.0, True
    hard = True  # integer outputs equal and NaN/Inf where eager has them: no yardstick excuses these
    floors: list[float] = []
    for x, y in zip(a, b):
        if not x.is_floating_point():
            hard = hard and bool(torch.equal(x, y))
            ok = ok and hard
            floors.append(0.0)
            continue
        x64, y64 = x.double(), y.double()
        both = torch.isfinite(x64) & torch.isfinite(y64)
        same_special = bool(((~torch.isfinite(x64)) == (~torch.isfinite(y64))).all())
        hard = hard and same_special
        diff = (x64 - y64).abs()[both]
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            scale = float(x64[both].abs().max().clamp_min(1e-30))
            max_rel = max(max_rel, float(diff.max()) / scale)
        try:
            tol = tolerance.tolerance(None, _dtype_name(x))
            floors.append(tol.atol)
            close = torch.isclose(y64, x64, rtol=MODEL_SLACK * tol.rtol, atol=MODEL_SLACK * tol.atol, equal_nan=True)
            ok = ok and bool(close.all()) and same_special
        except KeyError:
            floors.append(0.0)
            ok = ok and same_special
    at = next((i for i, x in enumerate(a) if x.is_floating_point() and x.dim() >= 2 and x.shape[-1] >= 2), None)
    kind, agree = ("structure" if len(a) > 1 else "tensor"), None
    if at is not None:  # (list.index would compare tensors element-wise)
        first, second = a[at], b[at]
        agree = float((first.argmax(-1) == second.argmax(-1)).double().mean())
        if len(a) == 1:
            kind = "lm" if first.dim() == 3 else "classifier" if first.dim() == 2 else "tensor"
    result = {"max_abs_diff": max_abs, "max_rel_diff": max_rel, "within_tolerance": ok, "output_kind": kind,
              "argmax_agreement": agree}
    accuracy = {"basis": "element-wise against eager"}
    if gold is not None and len(gold) == len(a) and all(g.shape == x.shape for g, x in zip(gold, a)):
        worst = None
        passed = True
        for x, y, g, floor in zip(a, b, gold, floors):
            if not x.is_floating_point():
                continue
            wide = _dtype_name(g)  # the yardstick's precision (gold may also hold integer outputs)
            g64 = g.double().to(x.device)
            e_max, e_rms = _errors(x.double(), g64)
            p_max, p_rms = _errors(y.double(), g64)
            fine = (p_max <= EAGER_ERROR_FACTOR * e_max + floor and p_rms <= EAGER_ERROR_FACTOR * e_rms + floor)
            passed = passed and fine
            ratio = p_max / e_max if e_max > 0 else (math.inf if p_max > 0 else 1.0)
            if worst is None or ratio > worst[0]:
                worst = (ratio, e_max, p_max, e_rms, p_rms)
        if worst is not None:
            ratio, e_max, p_max, e_rms, p_rms = worst
            accuracy.update(eager_max_error=e_max, patched_max_error=p_max, eager_rms_error=e_rms,
                            patched_rms_error=p_rms, reference_dtype=wide)
            if not ok:
                accuracy["basis"] = f"against the model in {wide}"
                ok = passed and hard
                result["within_tolerance"] = ok
    elif gold_note:
        accuracy["note"] = gold_note
    result["accuracy"] = accuracy
    return result


def describe(accuracy: dict | None) -> str:
    """One clause for reports: how far eager and patched are from the higher-precision model, when known."""
    if not accuracy or accuracy.get("eager_max_error") is None:
        return ""
    wide = accuracy.get("reference_dtype", "float32")
    return (f"error against the model in {wide}: eager max {accuracy['eager_max_error']:.3g} "
            f"(RMS {accuracy['eager_rms_error']:.3g}), patched max {accuracy['patched_max_error']:.3g} "
            f"(RMS {accuracy['patched_rms_error']:.3g})")
