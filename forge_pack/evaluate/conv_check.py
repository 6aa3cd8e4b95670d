"""The conv epilogue region's whole-chain candidates, checked and timed against the chain itself.

A chain (``graph/conv_chain``) has two kinds of candidate beside the generated epilogue kernel, which
the search verifies as a pointwise region of its own:

- ``folded``: the folded convolution (``conv_fold``) followed by the epilogue ``act(y + b [+ r])``;
  with the epilogue run eagerly it checks the folding, with the package's kernel it is what ships;
- ``library`` (CUDA, ReLU chains only): cuDNN's fused convolution + bias (+ add) + ReLU,
  ``torch.cudnn_convolution_relu`` / ``torch.cudnn_convolution_add_relu``, on the folded weight and
  bias. It is labelled as a library candidate wherever it appears.

Both are held to the whole-model rule (``model_accuracy.EAGER_ERROR_FACTOR``): folding rounds
differently from the original chain, so the candidate's largest error against the chain computed in
float64 may be at most twice the original chain's own (eager) error plus one atol of the output dtype;
NaN/Inf must sit where the float64 chain has them; the inputs (the folded tensors included) must be
unchanged and the output must have the chain's dtype, shape and strides. Input sets: the captured
ones, fresh draws of the activations (the parameters are the model's and stay), and adversarial ones
(activations scaled by 1e2; shifted by 4 spreads).
"""

from __future__ import annotations

from typing import Callable

import torch

from forge_pack.evaluate.model_accuracy import EAGER_ERROR_FACTOR
from forge_pack.evaluate.verdict_rules import TABLE
from forge_pack.graph import canonical, conv_fold
from forge_pack.graph.conv_chain import ConvChain, epilogue_perm, epilogue_region

LIBRARY = "library:cudnn_convolution_relu"
LIBRARY_ADD = "library:cudnn_convolution_add_relu"
FRESH_SETS = 2  # fresh activation draws per check (the parameters are the model's own and do not vary)


def folded_params(chain: ConvChain, inputs: list) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(folded weight, folded float32 bias, digest of the parameters folded) from the chain's inputs."""
    params = conv_fold.params_of(inputs, chain.roles)
    w, b = conv_fold.fold(params["weight"], params["conv_bias"], params["bn_weight"], params["bn_bias"],
                          params["running_mean"], params["running_var"], chain.eps)
    return w, b, conv_fold.param_digest(params)


def folded_candidate(chain: ConvChain, w: torch.Tensor, b: torch.Tensor,
                     epilogue: Callable | None = None) -> Callable:
    """conv(x, w) then the epilogue (``epilogue(*its inputs in form order)``; None: the eager epilogue)."""
    epi = epilogue_region(chain)
    run = epilogue if epilogue is not None else canonical.rebuild(epi.form, chain.region.device)
    ix, ir = chain.index("x"), chain.index("residual")
    args, perm = chain.conv_args(), epilogue_perm(chain)

    def call(*inputs):
        y = conv_fold.conv(inputs[ix], w, None, args)
        ins = conv_fold.epilogue_args(epi.inputs, perm, y, b.to(y.device), inputs[ir] if ir is not None else None)
        return conv_fold.from_memory_order(run(*ins), perm)

    return call


def library_candidate(chain: ConvChain, w: torch.Tensor, b: torch.Tensor) -> tuple[str, Callable] | None:
    """(label, call) of cuDNN's fused conv + bias (+ add) + ReLU, where the chain is one it computes."""
    if chain.activation != "relu" or not hasattr(torch, "cudnn_convolution_relu"):
        return None
    ix, ir = chain.index("x"), chain.index("residual")
    a = chain.conv_args()
    bias = b.to(w.dtype)
    if ir is None:
        def call(*inputs):
            return torch.cudnn_convolution_relu(inputs[ix], w, bias, a["stride"], a["padding"], a["dilation"],
                                                a["groups"])
        return LIBRARY, call

    def call_add(*inputs):
        return torch.cudnn_convolution_add_relu(inputs[ix], w, inputs[ir], 1.0, bias, a["stride"], a["padding"],
                                                a["dilation"], a["groups"])
    return LIBRARY_ADD, call_add


def input_sets(chain: ConvChain, captured: list, seed: int = 0) -> list[tuple[str, list]]:
    """(kind, inputs) per set: the captured one, fresh activations, adversarial activations."""
    varying = [i for i, r in enumerate(chain.roles) if r in ("x", "residual")]
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def with_(make) -> list:
        out = list(captured)
        for i in varying:
            t = captured[i]
            new = make(t).to(t.dtype)
            out[i] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(new)
        return out

    sets = [("captured", list(captured))]
    for k in range(FRESH_SETS):
        sets.append((f"fresh[{k}]", with_(lambda t: torch.randn(t.shape, generator=gen).to(t.device))))
    sets.append(("adversarial:large", with_(lambda t: t.double() * 1e2)))
    sets.append(("adversarial:shift", with_(lambda t: t.double() + 4 * t.double().std().clamp_min(1.0))))
    return sets


def check(chain: ConvChain, candidate: Callable, sets: list[tuple[str, list]]) -> dict:
    """{ok, reason, checks: [{kind, max_abs, eager_max_abs, bound, ok}]} of a candidate on these sets."""
    ref64 = chain.region.reference_f64()
    eager = chain.region.reference()
    out_spec = chain.region.output_spec
    atol = TABLE[out_spec.dtype].atol
    checks, reason = [], ""
    for kind, inputs in sets:
        saved = [t.clone() for t in inputs]
        with torch.no_grad():
            want = ref64(*inputs)
            own = eager(*inputs)
            got = candidate(*inputs)
        row = {"kind": kind, "ok": False}
        checks.append(row)
        if any(not torch.equal(a, b) for a, b in zip(inputs, saved)):
            reason = f"input_mutated on {kind}"
            break
        if got.dtype != own.dtype or tuple(got.shape) != tuple(out_spec.shape) or \
                tuple(got.stride()) != tuple(out_spec.strides):
            reason = (f"layout on {kind}: {got.dtype} {tuple(got.shape)} strides {tuple(got.stride())}, "
                      f"the chain's {out_spec.dtype} {tuple(out_spec.shape)} strides {tuple(out_spec.strides)}")
            break
        g64, o64 = got.double(), own.double()
        finite = torch.isfinite(want)
        if not torch.equal(finite, torch.isfinite(g64)) or not torch.equal(
                torch.nan_to_num(want, nan=0.0, posinf=1.0, neginf=-1.0)[~finite],
                torch.nan_to_num(g64, nan=0.0, posinf=1.0, neginf=-1.0)[~finite]):
            reason = f"nan on {kind}: NaN/Inf where the float64 chain has none, or the other way round"
            break
        own_finite = finite & torch.isfinite(o64)
        err = (g64 - want)[finite].abs().max().item() if finite.any() else 0.0
        own_err = (o64 - want)[own_finite].abs().max().item() if own_finite.any() else 0.0
        bound = EAGER_ERROR_FACTOR * own_err + atol
        row.update(max_abs=err, eager_max_abs=own_err, bound=bound, ok=err <= bound)
        if err > bound:
            reason = (f"mismatch on {kind}: max abs error {err:.3g} against the float64 chain, above "
                      f"{EAGER_ERROR_FACTOR:g} x eager's {own_err:.3g} + atol {atol:g}")
            break
    return {"ok": not reason, "reason": reason, "checks": checks}


def time_us(call: Callable, inputs: list, device: str) -> dict:
    """The timing protocol of the evaluator (``timing.time_calls``: flushed caches, warm-up, >= 30 calls)."""
    from forge_pack.evaluate.timing import TimingConfig, time_calls

    with torch.no_grad():
        t = time_calls([lambda: call(*inputs)], device, TimingConfig(reps=30, warmup=5))
    return t.to_json() if t is not None else {}
