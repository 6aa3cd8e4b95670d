"""group_norm: binder on every call path (torch.group_norm's cudnn_enabled included), package
parity, reference, tolerance, ABI."""

import pytest
import torch
import torch.nn.functional as F

import kind_checks as kc
from forge_pack.targets import abi

x = torch.randn(2, 4, 3, 3)
w, b = torch.randn(4), torch.randn(4)
gn = torch.nn.GroupNorm(2, 4, eps=1e-3)

CALLS = [  # (call, style, tensors, params)
    (lambda: F.group_norm(x, 2, w, b), "F", {"x": x, "weight": w, "bias": b}, {"num_groups": 2, "eps": 1e-5}),
    (lambda: F.group_norm(x, num_groups=4, eps=1e-6), "F", {"x": x, "weight": None, "bias": None},
     {"num_groups": 4, "eps": 1e-6}),
    # torch.group_norm takes cudnn_enabled: the profiler once refused what the package took
    (lambda: torch.group_norm(x, 2, w, b, 1e-6, True), "torch", {"x": x, "weight": w, "bias": b},
     {"num_groups": 2, "eps": 1e-6}),
    (lambda: torch.group_norm(x, 2, w, b, 1e-6, cudnn_enabled=False), "torch", {"x": x, "weight": w, "bias": b},
     {"num_groups": 2, "eps": 1e-6}),
    (lambda: gn(x), "F", {"x": x, "weight": gn.weight, "bias": gn.bias}, {"num_groups": 2, "eps": 1e-3}),
]


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_binder_reads_every_call_path(call, style, tensors, params):
    kc.check_binds("group_norm", call, style, tensors, params)


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_package_binds_each_call_as_the_profiler_does(tmp_path_factory, call, style, tensors, params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), "group_norm", call)


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (x, 2.0), {}),  # num_groups not an int
    ("F", (x, 2, w, b, 1e-5), {"cudnn_enabled": True}),  # F.group_norm has no cudnn_enabled
    ("torch", (x, 2, w, b, 1e-5, True, 0), {}),  # too many positionals
])
def test_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "group_norm", style, args, kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_float64_reference_agrees_with_eager(dtype):
    t = torch.empty(2, 8, 5, 7, dtype=dtype)
    sig = kc.signature("group_norm", {"x": t, "weight": torch.empty(8, dtype=dtype), "bias": None},
                       {"num_groups": 4, "eps": 1e-5})
    kc.check_reference_matches_eager(sig)


def test_tolerance_rows():
    kc.check_tolerances("group_norm", {"float32": (1e-4, 1e-4), "bfloat16": (1.6e-2, 1.6e-2),
                                       "float16": (2e-3, 2e-3)})


def test_abi_and_applicability():
    sig = kc.signature("group_norm", {"x": torch.empty(2, 8, 5, 7), "weight": None, "bias": None},
                       {"num_groups": 4, "eps": 1e-5})
    kc.check_abi(sig, {"N": 2, "C": 8, "G": 4, "HW": 35, "CPG": 2, "GROUP_SIZE": 70, "has_weight": 0})
    assert abi.supports(sig) is None
    cl = kc.signature("group_norm", {"x": torch.empty(2, 8, 5, 7).to(memory_format=torch.channels_last),
                                     "weight": None, "bias": None}, {"num_groups": 4, "eps": 1e-5})
    assert abi.supports(cl) == "non-contiguous input"


def test_the_binders_defaults_are_pytorchs_on_both_paths():
    from forge_pack.targets import registry

    spec = registry.get("group_norm")
    for style in ("F", "torch"):
        tensors, params = spec.bind(style, (x, 2), {})
        assert params == {"num_groups": 2, "eps": 1e-5} and tensors == {"x": x, "weight": None, "bias": None}
    assert spec.bind("torch", (x, 2), {"cudnn_enabled": False})[1] == {"num_groups": 2, "eps": 1e-5}


def _sig(shape, groups):
    return kc.signature("group_norm", {"x": torch.empty(shape), "weight": None, "bias": None},
                        {"num_groups": groups, "eps": 1e-5})


def test_size_vars_are_integers_even_for_one_channel_of_one_sample():
    from forge_pack.targets import registry

    got = registry.get("group_norm").size_vars(_sig((2, 8, 5, 7), 4))
    assert got == {"N": 2, "C": 8, "G": 4, "HW": 35, "CPG": 2, "GROUP_SIZE": 70}
    assert all(type(v) is int for v in got.values())
    assert registry.get("group_norm").size_vars(_sig((1, 1, 3, 3), 1)) == {
        "N": 1, "C": 1, "G": 1, "HW": 9, "CPG": 1, "GROUP_SIZE": 9}


def test_applicability_needs_samples_and_channels():
    from forge_pack.targets import registry

    from forge_pack.targets import ops

    flat = ops.make_signature("group_norm", {"x": torch.empty(8), "weight": None, "bias": None},
                              {"num_groups": 1, "eps": 1e-5})
    assert registry.get("group_norm").supports(flat) == "group_norm needs [N, C, ...]"
    assert abi.supports(_sig((2, 8), 4)) is None  # [N, C] with no spatial dims is still a group norm


def test_odd_shapes_take_at_most_three_samples_and_keep_the_channels():
    from forge_pack.targets import registry

    odd = registry.get("group_norm").odd_shapes
    assert odd(_sig((4, 8, 5, 7), 4)) == [((3, 8, 5, 7), False)]
    assert odd(_sig((1, 8, 10), 2)) == [((2, 8, 5), False)]
    assert odd(_sig((2, 8), 4)) == [((3, 8), False)]


def test_a_parsed_signature_needs_num_groups():
    from forge_pack.targets import registry

    spec = registry.get("group_norm")
    t = torch.empty(1, 8, 4, device="meta")
    assert spec.complete({"input": t}) == ("group_norm needs num_groups=G", "e.g. 'x: f32[1,512,128,128], num_groups=32'")
    assert spec.complete({"input": t, "num_groups": 2}) is None


def test_the_float64_reference_and_eager_call_normalize_each_group():
    from forge_pack.targets import registry

    spec = registry.get("group_norm")
    t = {"x": torch.tensor([[[1.0, 3.0], [5.0, 7.0]]]), "weight": torch.tensor([2.0, 1.0]), "bias": torch.tensor([0.0, 1.0])}
    ref = spec.reference64({"num_groups": 2, "eps": 0.0}, t)
    assert ref.dtype == torch.float64 and ref.tolist() == [[[-2.0, 2.0], [0.0, 2.0]]]
    assert spec.eager({"num_groups": 2, "eps": 0.0}, "float32")(t).tolist() == [[[-2.0, 2.0], [0.0, 2.0]]]
    one = spec.reference64({"num_groups": 1, "eps": 0.0}, {**t, "weight": None, "bias": None})
    assert torch.allclose(one, torch.tensor([[[-3.0, -1.0], [1.0, 3.0]]], dtype=torch.float64) / 5 ** 0.5, rtol=1e-15)


# ---------------------------------------------------------------- instance_norm: group_norm of one channel per group

inn = torch.nn.InstanceNorm2d(4, affine=True, eps=1e-3)
IN_CALLS = [  # (call, style, tensors, params)
    (lambda: F.instance_norm(x), "F", {"x": x, "weight": None, "bias": None}, {"eps": 1e-5}),
    (lambda: F.instance_norm(x, None, None, w, b, True, 0.1, 1e-6), "F", {"x": x, "weight": w, "bias": b},
     {"eps": 1e-6}),
    (lambda: F.instance_norm(x, weight=w, eps=1e-4), "F", {"x": x, "weight": w, "bias": None}, {"eps": 1e-4}),
    (lambda: torch.nn.InstanceNorm2d(4)(x), "F", {"x": x, "weight": None, "bias": None}, {"eps": 1e-5}),
    (lambda: inn(x), "F", {"x": x, "weight": inn.weight, "bias": inn.bias}, {"eps": 1e-3}),
    (lambda: torch.nn.InstanceNorm1d(4)(x.flatten(2)), "F", {"x": None, "weight": None, "bias": None}, {"eps": 1e-5}),
]


@pytest.mark.parametrize("call, style, tensors, params", IN_CALLS[:-1])
def test_instance_norm_binder_reads_every_call_path(call, style, tensors, params):
    kc.check_binds("instance_norm", call, style, tensors, params)


@pytest.mark.parametrize("call, style, tensors, params", IN_CALLS)
def test_the_package_binds_each_instance_norm_call_as_the_profiler_does(tmp_path_factory, call, style, tensors,
                                                                         params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), "instance_norm", call)


rm, rv = torch.zeros(4), torch.ones(4)


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (x, rm, rv), {}),  # running statistics: training updates them, eval is an affine map
    ("F", (x, rm, rv, None, None, False), {}),
    ("F", (x, None, None, None, None, False), {}),  # use_input_stats False without statistics: PyTorch's error
    ("F", (x,), {"eps": "1e-5"}),
    ("F", (x,), {"cudnn_enabled": True}),  # F.instance_norm has no such argument
])
def test_instance_norm_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "instance_norm", style, args, kwargs)


def test_instance_norm_with_running_statistics_is_not_a_target():
    """nn.InstanceNorm2d(track_running_stats=True) passes its buffers: never taken, in training or in eval."""
    m = torch.nn.InstanceNorm2d(4, track_running_stats=True)
    for mode in (m.train(), m.eval()):
        hits = [h for h in kc.recorded(lambda: mode(x)) if h[0] == "instance_norm"]
        assert hits and all(kc.registry.get("instance_norm").bind(h[1], h[2], h[3]) is None for h in hits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_instance_norm_float64_reference_agrees_with_eager(dtype):
    t = torch.empty(2, 8, 5, 7, dtype=dtype)
    sig = kc.signature("instance_norm", {"x": t, "weight": torch.empty(8, dtype=dtype), "bias": None}, {"eps": 1e-5})
    kc.check_reference_matches_eager(sig)


def test_instance_norm_is_group_norm_with_one_channel_per_group():
    """Its size variables are group_norm's with G = C (what lets the group_norm kernels serve it), its reference
    is exactly F.instance_norm in float64 (long planes too: the var_mean path), and it needs a spatial dim."""
    from forge_pack.targets import registry

    spec = registry.get("instance_norm")
    sig = kc.signature("instance_norm", {"x": torch.empty(2, 8, 5, 7), "weight": None, "bias": None}, {"eps": 1e-5})
    kc.check_abi(sig, {"N": 2, "C": 8, "G": 8, "HW": 35, "CPG": 1, "GROUP_SIZE": 35, "has_weight": 0})
    assert abi.supports(sig) is None
    from forge_pack.targets import ops

    flat = ops.make_signature("instance_norm", {"x": torch.empty(2, 8), "weight": None, "bias": None}, {"eps": 1e-5})
    assert spec.supports(flat) == "instance_norm needs [N, C, *spatial] with at least one spatial dim"
    g = torch.Generator().manual_seed(0)
    for shape in ((2, 3, 5, 7), (2, 3, 40000)):  # 40000 >= LONG_ROW: the reference's var_mean path
        t = {"x": torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 2,
             "weight": torch.randn(3, generator=g, dtype=torch.float64), "bias": torch.randn(3, generator=g,
                                                                                          dtype=torch.float64)}
        want = F.instance_norm(t["x"], weight=t["weight"], bias=t["bias"], eps=1e-5)
        assert torch.allclose(spec.reference64({"eps": 1e-5}, t), want, rtol=1e-12, atol=1e-12), shape
    assert spec.tolerances == registry.get("group_norm").tolerances


def test_instance_norm_binder_defaults_are_pytorchs():
    """The package's patched F.instance_norm receives the call as written: the binder's defaults are F's."""
    from forge_pack.targets import registry

    spec = registry.get("instance_norm")
    assert spec.bind("F", (x,), {}) == ({"x": x, "weight": None, "bias": None}, {"eps": 1e-5})
    assert spec.bind("F", (x, None, None, w), {"momentum": None}) == ({"x": x, "weight": w, "bias": None},
                                                                      {"eps": 1e-5})
    assert spec.bind("F", (x,), {"bias": b, "use_input_stats": True, "eps": 1e-2}) == (
        {"x": x, "weight": None, "bias": b}, {"eps": 1e-2})
    assert spec.bind("F", (x, rm), {}) is None and spec.bind("F", (x, None, rv), {}) is None  # either statistic
    assert spec.bind("F", (x,), {"momentum": "0.1"}) is None


def test_instance_norm_eager_is_the_functional_call_with_every_argument():
    from forge_pack.targets import registry

    g = torch.Generator().manual_seed(3)
    t = {"x": torch.randn(2, 3, 4, 5, generator=g) * 2 + 1, "weight": torch.randn(3, generator=g),
         "bias": torch.randn(3, generator=g)}
    got = registry.get("instance_norm").eager({"eps": 0.5}, "float32")(t)
    assert torch.equal(got, F.instance_norm(t["x"], weight=t["weight"], bias=t["bias"], eps=0.5))


def _in_sig(shape, channels_last=False):
    t = torch.empty(shape)
    if channels_last:
        t = t.to(memory_format=torch.channels_last)
    return kc.signature("instance_norm", {"x": t, "weight": None, "bias": None}, {"eps": 1e-5})


def test_instance_norm_size_vars_and_applicability_at_the_edges():
    from forge_pack.targets import registry

    spec = registry.get("instance_norm")
    got = spec.size_vars(_in_sig((1, 1, 3, 3)))
    assert got == {"N": 1, "C": 1, "G": 1, "HW": 9, "CPG": 1, "GROUP_SIZE": 9}
    assert all(type(v) is int for v in got.values())
    assert spec.supports(_in_sig((2, 4, 10))) is None  # InstanceNorm1d's [N, C, L]
    assert spec.supports(_in_sig((2, 4, 3, 5, 6))) is None
    assert spec.supports(_in_sig((2, 4, 3, 5), channels_last=True)) == "non-contiguous input"


def test_instance_norm_rows_are_planes_and_its_permutation_moves_whole_planes_with_their_channel():
    """The derived sets: rows are the (sample, channel) planes; a permutation reorders samples, channels (with
    weight and bias) and positions, so every plane of the result is an original plane, with its channel's affine."""
    from forge_pack.targets import registry

    spec = registry.get("instance_norm")
    n, c, hw = 3, 5, 6
    xf = (torch.arange(n, dtype=torch.float64)[:, None, None] * 1000 + torch.arange(c)[None, :, None] * 10
          + torch.arange(hw)[None, None, :] / 10).reshape(n, c, 2, 3)
    rows, back = spec.rows({"eps": 1e-5}, xf)
    assert rows.shape == (n * c, hw) and torch.equal(rows[c + 2], xf[1, 2].reshape(-1)) and torch.equal(back(rows), xf)
    others = {"weight": torch.arange(c, dtype=torch.float64), "bias": -torch.arange(c, dtype=torch.float64)}
    again = spec.permute({"eps": 1e-5}, xf, dict(others), torch.Generator().manual_seed(4))
    moved = spec.permute({"eps": 1e-5}, xf, others, torch.Generator().manual_seed(4))
    assert moved.shape == xf.shape and not torch.equal(moved, xf) and torch.equal(moved, again)  # the seed's
    for i in range(n):
        for j in range(c):
            plane = moved[i, j].reshape(-1)
            si, sj = int(plane[0] // 1000), int(plane[0] % 1000 // 10)  # the original plane it came from
            assert torch.equal(plane.sort().values, xf[si, sj].reshape(-1)), (i, j)
            assert others["weight"][j] == sj and others["bias"][j] == -sj
