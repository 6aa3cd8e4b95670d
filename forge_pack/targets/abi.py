"""The kernel ABI of each target op: tensor argument names, size variables, scalars, byte counts.

Pure Python (no torch), shared by the launcher, the template proposer, the LLM prompt, the
package generator and the search. A candidate's launch spec may name, as arguments and in
expressions, exactly what ``env(sig)`` and ``tensor_names(sig)`` return for its signature.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge_pack.core.signature import ELEMENT_BYTES, Signature

TARGET_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm",
              "adaptive_avg_pool2d")


@dataclass(frozen=True)
class OpABI:
    op: str
    tensor_inputs: tuple[str, ...]  # in order; optional ones may be absent (None) in a signature
    scalars: tuple[str, ...]  # float scalars passed as f32 by default
    doc: str  # one paragraph for docs and LLM prompts


ABIS: dict[str, OpABI] = {
    "softmax": OpABI("softmax", ("x",), (),
                     "out[r, c] = exp(x[r, c] - max_c x[r, :]) / sum_c exp(x[r, :] - max), over the last dim; "
                     "x is contiguous [rows, cols]; out has the output dtype (it may differ from x's, e.g. bf16 in, "
                     "fp32 out); the math is done in fp32."),
    "log_softmax": OpABI("log_softmax", ("x",), (),
                         "out[r, c] = x[r, c] - max - log(sum_c exp(x[r, :] - max)) over the last dim; x contiguous "
                         "[rows, cols]; fp32 math."),
    "layer_norm": OpABI("layer_norm", ("x", "weight", "bias"), ("eps",),
                        "out[r, c] = (x[r, c] - mean_r) * rsqrt(var_r + eps) * weight[c] + bias[c]; biased variance "
                        "over the last `cols` elements; x contiguous [rows, cols]; weight/bias may be absent."),
    "rms_norm": OpABI("rms_norm", ("x", "weight"), ("eps", "weight_offset"),
                      "out[r, c] = x[r, c] * rsqrt(mean_c x[r, :]^2 + eps) * (weight[c] + weight_offset); x "
                      "contiguous [rows, cols]; fp32 math; weight may be absent (then the factor is 1)."),
    "group_norm": OpABI("group_norm", ("x", "weight", "bias"), ("eps",),
                        "x contiguous [N, C, *spatial] (HW = spatial size); G groups of CPG = C/G channels; per "
                        "(n, g) mean and biased variance over CPG*HW elements; out = (x - mean) * rsqrt(var + eps) "
                        "* weight[c] + bias[c]; weight/bias may be absent."),
    "batch_norm": OpABI("batch_norm", ("x", "running_mean", "running_var", "weight", "bias"), ("eps",),
                        "inference: out[n, c, hw] = (x - running_mean[c]) * rsqrt(running_var[c] + eps) * weight[c] "
                        "+ bias[c]; x is [N, C, H, W] either contiguous (NCHW) or channels_last (NHWC in memory, "
                        "the size variable `channels_last` is 1); out has x's layout."),
    "adaptive_avg_pool2d": OpABI("adaptive_avg_pool2d", ("x",), (),
                                 "output size (1, 1): out[n, c] = mean over H*W of x[n, c]; x [N, C, H, W] contiguous "
                                 "or channels_last (`channels_last` = 1); out is [N, C, 1, 1] (contiguous memory "
                                 "order n*C + c in both cases)."),
}


def abi(op: str) -> OpABI:
    return ABIS[op]


def supports(sig: Signature) -> str | None:
    """None if forge-pack's kernels can target this exact signature, else why not."""
    x = sig.x
    if x.dtype not in ("float32", "float16", "bfloat16"):
        return f"dtype {x.dtype} is not targeted"
    if x.numel == 0:
        return "empty tensor"
    if sig.op in ("softmax", "log_softmax"):
        if sig.param("dim") != len(x.shape) - 1:
            return "softmax over a dimension other than the last"
        if not x.is_contiguous:
            return "non-contiguous input"
    elif sig.op in ("layer_norm", "rms_norm", "group_norm"):
        if not x.is_contiguous:
            return "non-contiguous input"
        for name, spec in sig.inputs[1:]:
            if spec is not None and not spec.is_contiguous:
                return f"non-contiguous {name}"
        if sig.op == "group_norm" and len(x.shape) < 2:
            return "group_norm needs [N, C, ...]"
    elif sig.op in ("batch_norm", "adaptive_avg_pool2d"):
        if len(x.shape) != 4:
            return f"{sig.op} is targeted on 4-d inputs only"
        if x.layout not in ("contiguous", "channels_last"):
            return "input is neither contiguous nor channels_last"
        if sig.op == "adaptive_avg_pool2d" and tuple(sig.param("output_size") or ()) != (1, 1):
            return "only output size (1, 1) is targeted"
        if sig.op == "batch_norm" and sig.param("training"):
            return "batch_norm in training mode is not targeted"
    return None


def env(sig: Signature) -> dict[str, int]:
    """Integer size variables usable in launch expressions and as kernel arguments."""
    x = sig.x
    shape = x.shape
    numel = x.numel
    e: dict[str, int] = {"numel": numel}
    if sig.op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
        if sig.op in ("layer_norm", "rms_norm"):
            cols = 1
            for s in sig.param("normalized_shape") or shape[-1:]:
                cols *= int(s)
        else:
            cols = shape[-1] if shape else 1
        e.update(rows=numel // max(cols, 1), cols=cols)
    elif sig.op == "group_norm":
        n, c = shape[0], shape[1]
        hw = numel // max(n * c, 1)
        g = int(sig.param("num_groups"))
        e.update(N=n, C=c, G=g, HW=hw, CPG=c // g, GROUP_SIZE=(c // g) * hw)
    elif sig.op in ("batch_norm", "adaptive_avg_pool2d"):
        n, c, h, w = shape
        e.update(N=n, C=c, H=h, W=w, HW=h * w, channels_last=int(x.layout == "channels_last" and not x.is_contiguous))
    for name, spec in sig.inputs:
        e[f"has_{name}"] = int(spec is not None)
    return e


def scalars(sig: Signature) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in ABIS[sig.op].scalars:
        value = sig.param(name)
        out[name] = float(value if value is not None else 0.0)
    return out


def tensor_names(sig: Signature) -> list[str]:
    """Tensor argument names a launch may use: present inputs, then `out`."""
    return [n for n, s in sig.inputs if s is not None] + ["out"]


def bytes_moved(sig: Signature) -> int:
    """The fewest bytes the op must move: every input read once, the output written once."""
    total = sum(s.nbytes for _, s in sig.inputs if s is not None)
    if sig.output is not None:
        total += sig.output.nbytes
    return total


def floor_us(sig: Signature, copy_bandwidth_gbs: float) -> float:
    """Bandwidth floor in microseconds at the measured copy bandwidth (GB/s = bytes/ns)."""
    return bytes_moved(sig) / (copy_bandwidth_gbs * 1e3)


def element_bytes(dtype: str) -> int:
    return ELEMENT_BYTES[dtype]
