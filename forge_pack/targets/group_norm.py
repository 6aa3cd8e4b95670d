"""group_norm over [N, C, *spatial] in G groups of C/G channels, and instance_norm, the group_norm of one channel
per group (its statistics from the input: no running statistics), both on contiguous tensors."""

from __future__ import annotations

from . import norm_common
from .call_args import bind, is_number
from .inputs import block_rows, permute_channels
from .spec import Draw, TargetSpec, Tolerance, function_paths


def _binder(style: str, args: tuple, kwargs: dict):
    names = ("input", "num_groups", "weight", "bias", "eps")
    if style == "torch":
        names = names + ("cudnn_enabled",)  # torch.group_norm's extra flag: no effect on the result
    b = bind(names, {"weight": None, "bias": None, "eps": 1e-5, "cudnn_enabled": True}, args, kwargs)
    if b is None or not isinstance(b["num_groups"], int) or not is_number(b["eps"]):
        return None
    return ({"x": b["input"], "weight": b["weight"], "bias": b["bias"]},
            {"num_groups": int(b["num_groups"]), "eps": float(b["eps"])})


def _supports(sig) -> str | None:
    why = norm_common.contiguous_inputs(sig)
    if why is None and len(sig.x.shape) < 2:
        return "group_norm needs [N, C, ...]"
    return why


def _size_vars(sig) -> dict:
    shape = sig.x.shape
    n, c = shape[0], shape[1]
    hw = sig.x.numel // max(n * c, 1)
    g = int(sig.param("num_groups"))
    return {"N": n, "C": c, "G": g, "HW": hw, "CPG": c // g, "GROUP_SIZE": (c // g) * hw}


def _reference(params, t, lookup):
    x, g = t["x"], params["num_groups"]
    if x.numel() // max(x.shape[0] * g, 1) < norm_common.LONG_ROW:
        return lookup("torch.nn.functional", "group_norm")(x, g, t.get("weight"), t.get("bias"), params["eps"])
    n, c = x.shape[0], x.shape[1]
    y = norm_common.normalize_rows64(x.reshape(n, g, -1), (-1,), params["eps"]).view(x.shape)
    per_channel = (1, c) + (1,) * (x.dim() - 2)  # weight and bias: one value per channel
    return norm_common.affine_(y, t.get("weight"), t.get("bias"), per_channel)


def _eager(params, out_dtype, lookup):
    fn = lookup("torch.nn.functional", "group_norm")
    groups, eps = params["num_groups"], params["eps"]
    return lambda t: fn(t["x"], groups, t.get("weight"), t.get("bias"), eps)


def _rows(params: dict, xf):
    return block_rows(xf, xf.shape[0] * params["num_groups"])  # one row per (sample, group)


def _permute(params: dict, xf, others: dict, gen):
    return permute_channels(xf, others, gen, groups=params["num_groups"])


def _odd_shapes(sig) -> list:
    n, c = sig.x.shape[:2]
    return [((min(n, 2) + 1, c) + (5, 7)[: max(len(sig.x.shape) - 2, 0)], False)]


def _complete(kwargs: dict):
    if kwargs.get("num_groups") is None:
        return "group_norm needs num_groups=G", "e.g. 'x: f32[1,512,128,128], num_groups=32'"
    return None


GROUP_NORM = TargetSpec(
    name="group_norm", tensors=("x", "weight", "bias"), scalars=("eps",), params=("num_groups", "eps"), own_params=(),
    doc="x contiguous [N, C, *spatial] (HW = spatial size); G groups of CPG = C/G channels; per "
        "(n, g) mean and biased variance over CPG*HW elements; out = (x - mean) * rsqrt(var + eps) "
        "* weight[c] + bias[c]; weight/bias may be absent.",
    size_vars=_size_vars, supports=_supports, float64_reference=_reference, eager_call=_eager,
    tolerances={
        # outputs are ~N(0,1)*weight+bias: values near zero are common, so atol matters.
        "float32": Tolerance(1e-4, 1e-4, "mean/var over up to millions of elements in fp32: "
                                         "~1e-5 absolute on unit-scale outputs"),
        "bfloat16": Tolerance(1.6e-2, 1.6e-2, "unit-scale outputs rounded to bf16: half an ulp "
                                              "of 1.0 is 4e-3, plus statistics error"),
        "float16": Tolerance(2e-3, 2e-3, "unit-scale outputs rounded to fp16: two ulps of 1.0"),
    },
    draws={"weight": Draw(0.2, 1.0), "bias": Draw(0.2)}, adversarial=("large", "offset", "constant"),
    rows=_rows, permute=_permute, odd_shapes=_odd_shapes,
    call_paths=function_paths("group_norm", "group_norm", False, ("GroupNorm",)), bind=_binder,
    complete=_complete)



def _instance_binder(style: str, args: tuple, kwargs: dict):
    """F.instance_norm with the statistics of the input itself (nn.InstanceNorm*d without running statistics,
    the default): running_mean and running_var absent and use_input_stats True. With running statistics it
    either updates them (training: a side effect) or is a per-channel affine map (eval): neither is targeted."""
    names = ("input", "running_mean", "running_var", "weight", "bias", "use_input_stats", "momentum", "eps")
    b = bind(names, {"running_mean": None, "running_var": None, "weight": None, "bias": None, "use_input_stats": True,
                     "momentum": 0.1, "eps": 1e-5}, args, kwargs)
    if b is None or b["running_mean"] is not None or b["running_var"] is not None or b["use_input_stats"] is not True:
        return None
    if not is_number(b["eps"]) or not (b["momentum"] is None or is_number(b["momentum"])):
        return None
    return {"x": b["input"], "weight": b["weight"], "bias": b["bias"]}, {"eps": float(b["eps"])}


def _instance_supports(sig) -> str | None:
    why = norm_common.contiguous_inputs(sig)
    if why is None and len(sig.x.shape) < 3:
        return "instance_norm needs [N, C, *spatial] with at least one spatial dim"
    return why


def _instance_size_vars(sig) -> dict:
    n, c = sig.x.shape[0], sig.x.shape[1]
    hw = sig.x.numel // max(n * c, 1)
    return {"N": n, "C": c, "G": c, "HW": hw, "CPG": 1, "GROUP_SIZE": hw}  # group_norm's, one channel per group


def _instance_reference(params, t, lookup):
    return _reference({"num_groups": t["x"].shape[1], "eps": params["eps"]}, t, lookup)


def _instance_eager(params, out_dtype, lookup):
    fn = lookup("torch.nn.functional", "instance_norm")
    eps = params["eps"]
    return lambda t: fn(t["x"], None, None, t.get("weight"), t.get("bias"), True, 0.1, eps)


def _instance_rows(params: dict, xf):
    return block_rows(xf, xf.shape[0] * xf.shape[1])  # one row per (sample, channel)


def _instance_permute(params: dict, xf, others: dict, gen):
    return permute_channels(xf, others, gen)  # every channel its own group: channels in any order


INSTANCE_NORM = TargetSpec(
    name="instance_norm", tensors=("x", "weight", "bias"), scalars=("eps",), params=("eps",), own_params=(),
    doc="x contiguous [N, C, *spatial] (HW = spatial size); per (n, c) mean and biased variance over the HW "
        "elements of the plane; out = (x - mean) * rsqrt(var + eps) * weight[c] + bias[c]; weight/bias may be "
        "absent. The group_norm kernels serve it with G = C groups of CPG = 1 channel (GROUP_SIZE = HW).",
    size_vars=_instance_size_vars, supports=_instance_supports, float64_reference=_instance_reference,
    eager_call=_instance_eager, tolerances=GROUP_NORM.tolerances, draws=GROUP_NORM.draws,
    adversarial=GROUP_NORM.adversarial, rows=_instance_rows, permute=_instance_permute, odd_shapes=_odd_shapes,
    call_paths=function_paths("instance_norm", None, False, ("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d")),
    bind=_instance_binder)

SPECS = (GROUP_NORM, INSTANCE_NORM)
