"""attention: the SDPA binder and the eager composite's, package parity, the float64 reference
(exact on small inputs, fully masked rows as PyTorch gives them, GQA head mapping), tolerance,
ABI, the CPU family through the evaluator, a kernel without its causal mask rejected, and the
package's patch of a composite function."""

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kind_checks as kc
from forge_pack.targets import abi, ops, registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import attention_block  # noqa: E402  (HF-style eager_attention_forward, repeat_kv)

SPEC = registry.get("attention")
g = torch.Generator().manual_seed(0)
q = torch.randn(2, 4, 6, 8, generator=g)
k = torch.randn(2, 2, 7, 8, generator=g)
v = torch.randn(2, 2, 7, 8, generator=g)
mask = torch.randn(2, 1, 6, 7, generator=g)
mask2 = torch.randn(6, 7, generator=g)
kf, vf = torch.randn(2, 4, 7, 8, generator=g), torch.randn(2, 4, 7, 8, generator=g)


def _p(scale=1 / math.sqrt(8), causal=False, gqa=False, softcap=None, composite=False) -> dict:
    return {"scale": scale, "causal": causal, "softcap": softcap, "enable_gqa": gqa, "composite": composite}


CALLS = [  # (call, style, tensors, params)
    (lambda: F.scaled_dot_product_attention(q, kf, vf), "F", {"x": q, "k": kf, "v": vf, "mask": None}, _p()),
    (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), "F",
     {"x": q, "k": k, "v": v, "mask": None}, _p(causal=True, gqa=True)),
    (lambda: F.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale=0.5, enable_gqa=True), "F",
     {"x": q, "k": k, "v": v, "mask": mask}, _p(scale=0.5, gqa=True)),
    (lambda: F.scaled_dot_product_attention(query=q, key=kf, value=vf, attn_mask=mask2, scale=0.1), "F",
     {"x": q, "k": kf, "v": vf, "mask": mask2}, _p(scale=0.1)),
]


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_binder_reads_every_call_path(call, style, tensors, params):
    kc.check_binds("attention", call, style, tensors, params)


@pytest.mark.parametrize("call, style, tensors, params", CALLS)
def test_the_package_binds_each_call_as_the_profiler_does(tmp_path_factory, call, style, tensors, params):
    kc.check_same_in_package(kc.package_runtime(tmp_path_factory.getbasetemp()), "attention", call)


@pytest.mark.parametrize("style, args, kwargs", [
    ("F", (q, kf, vf), {"dropout_p": 0.1}),  # dropout: random, no kernel reproduces it
    ("F", (q, kf, vf, mask2), {"is_causal": True}),  # PyTorch refuses the pair; its error stays its own
    ("F", (q[0], kf[0], vf[0]), {}),  # 3-d
    ("F", (q, kf, vf), {"scale": "big"}),
    ("F", (q, kf, vf), {"unknown": 1}),
    ("F", (q, kf, vf, None, 0.0, False, 0.5), {}),  # scale is keyword-only
])
def test_calls_it_cannot_read_exactly_are_left_to_pytorch(tmp_path_factory, style, args, kwargs):
    kc.check_refused(kc.package_runtime(tmp_path_factory.getbasetemp()), "attention", style, args, kwargs)


# ---------------------------------------------------------------- the eager composite


class _HFAttention(torch.nn.Module):
    num_key_value_groups = 2
    head_dim = 8


def test_the_eager_composite_binds_by_the_functions_own_parameters():
    m = _HFAttention().eval()
    hf_mask = torch.randn(2, 1, 6, 9)  # longer than the keys: the function slices it
    tensors, params = SPEC.bind_module(attention_block.eager_attention_forward, (m, q, k, v, hf_mask),
                                       {"scaling": 0.3})
    assert tensors["x"] is q and tensors["k"] is k and tensors["v"] is v
    assert torch.equal(tensors["mask"], hf_mask[:, :, :, :7])
    assert params == _p(scale=0.3, gqa=True, composite=True)
    m.train()  # dropout applies in training: not the kernel's math
    assert SPEC.bind_module(attention_block.eager_attention_forward, (m, q, k, v, None, 0.3, 0.1), {}) is None
    m.eval()
    m.num_key_value_groups = 3  # heads do not map
    assert SPEC.bind_module(attention_block.eager_attention_forward, (m, q, k, v, None, 0.3), {}) is None


def test_the_eager_composite_reference_is_the_model_codes_output_layout_and_values():
    m = _HFAttention().eval()
    hf_mask = torch.full((6, 7), torch.finfo(torch.float32).min).triu(1)[None, None]
    tensors, params = SPEC.bind_module(attention_block.eager_attention_forward, (m, q, k, v, hf_mask, 0.3), {})
    got = attention_block.eager_attention_forward(m, q, k, v, hf_mask, 0.3)[0]
    ref = SPEC.reference64(params, tensors)
    assert ref.shape == got.shape == (2, 6, 4, 8)  # [B, L, H, D], as the function returns it
    assert torch.allclose(ref, got.double(), atol=1e-5)
    assert torch.equal(SPEC.eager(params, "float32")(tensors), got)


# ---------------------------------------------------------------- the reference


def _naive(qd, kd, vd, scale, mask=None, causal=False, zero_empty=True, window=0, softcap=None):
    """Element by element in float64: the definition the reference must match exactly. A mask of fewer than 4 dims
    broadcasts from the right (a [L, S] mask over every batch and head); a soft cap bounds the scaled logit to
    cap * tanh(logit / cap) before the mask is added, as Gemma 2 does."""
    b_, h_, l_, d_ = qd.shape
    s_ = kd.shape[2]
    gq = h_ // kd.shape[1]
    m4 = None if mask is None else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))

    def logit(b, h, i, j):
        x = float(qd[b, h, i] @ kd[b, h // gq, j]) * scale
        if softcap:
            x = softcap * math.tanh(x / softcap)
        if m4 is not None:
            x += float(m4[b if m4.shape[0] > 1 else 0, h if m4.shape[1] > 1 else 0, i, j])
        return x

    out = torch.zeros(b_, h_, l_, d_, dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            for i in range(l_):
                logits = [logit(b, h, i, j) for j in range(s_)]
                if causal:
                    logits = [x if j <= i and (not window or i - j < window) else -math.inf
                              for j, x in enumerate(logits)]
                top = max(logits)
                if top == -math.inf:
                    out[b, h, i] = 0.0 if zero_empty else math.nan
                    continue
                w = [math.exp(x - top) for x in logits]
                total = sum(w)
                out[b, h, i] = sum(w[j] / total * vd[b, h // gq, j] for j in range(s_))
    return out


@pytest.mark.parametrize("causal, with_mask, window, softcap", [
    (False, None, 0, None), (True, None, 0, None), (False, "4d", 0, None), (True, None, 1, None), (True, None, 3, None),
    (False, "2d", 0, None), (False, "heads", 0, None), (False, None, 0, 0.5), (True, "4d", 0, 0.5)])
def test_the_reference_is_exact_on_small_inputs(causal, with_mask, window, softcap):
    """Against the element-by-element definition: causal, sliding windows, a [B, 1, L, S] mask, a [L, S] mask
    broadcast over batch and heads, a mask per head, and a soft cap (scores of about +-2 here: a cap of 0.5 bends
    them all)."""
    heads = torch.randn(2, 4, 6, 7, generator=torch.Generator().manual_seed(3))
    m = {None: None, "4d": mask, "2d": mask2, "heads": heads}[with_mask]
    params = {**_p(scale=0.4, causal=causal, gqa=True, softcap=softcap), "window": window}
    ref = SPEC.reference64(params, {"x": q, "k": k, "v": v, "mask": m})
    qd, kd, vd = q.double(), k.double(), v.double()
    want = _naive(qd, kd, vd, 0.4, None if m is None else m.double(), causal, window=window, softcap=softcap)
    assert torch.allclose(ref, want, rtol=1e-12, atol=1e-12)
    if window:
        assert not torch.allclose(ref, _naive(qd, kd, vd, 0.4, None, causal), rtol=1e-6, atol=1e-6)
    if softcap:
        uncapped = _naive(qd, kd, vd, 0.4, None if m is None else m.double(), causal)
        assert not torch.allclose(ref, uncapped, rtol=1e-3, atol=1e-3)


def test_the_reference_computed_in_row_chunks_is_the_whole_one(monkeypatch):
    """Long sequences are referenced REF_ROWS query rows at a time: 3 rows per chunk over 10 rows (a short last
    chunk), head dim 4 (fewer than the rows), causal with a mask, equals the element-by-element definition."""
    from forge_pack.targets import attention

    gen = torch.Generator().manual_seed(5)
    qq, kk, vv = (torch.randn(1, 2, 10, 4, generator=gen) for _ in range(3))
    mm = torch.randn(1, 1, 10, 10, generator=gen)
    monkeypatch.setattr(attention, "REF_ROWS", 3)
    ref = SPEC.reference64(_p(scale=0.3, causal=True), {"x": qq, "k": kk, "v": vv, "mask": mm})
    want = _naive(qq.double(), kk.double(), vv.double(), 0.3, mm.double(), causal=True)
    assert ref.shape == want.shape and torch.allclose(ref, want, rtol=1e-12, atol=1e-12)


def test_the_composite_eager_call_masks_a_sliding_window_as_the_reference_does():
    """The eager baseline of a windowed chain adds transformers' sliding-window mask: it agrees with the
    float64 reference to the eager rounding, and differs from plain causal attention."""
    params = {**_p(scale=0.4, causal=True, gqa=True, composite=True), "window": 2}
    t = {"x": q, "k": k, "v": v, "mask": None}
    got = SPEC.eager(params, "float32")(t).double()
    ref = SPEC.reference64(params, t)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    plain = SPEC.reference64({**params, "window": 0}, t)
    assert (plain - ref).abs().max() > 1e-3


@pytest.mark.parametrize("params, why", [({"causal": False, "window": 4, "composite": True}, "sliding window"),
                                         ({"causal": True, "window": 4, "composite": False}, "sliding window")])
def test_a_window_needs_the_causal_mask_of_an_eager_composite(params, why):
    from forge_pack.core.signature import Signature, TensorSpec

    spec = TensorSpec("float32", (1, 2, 8, 16), (256, 128, 16, 1))
    sig = Signature("attention", (("x", spec), ("k", spec), ("v", spec), ("mask", None)),
                    tuple(sorted({**_p(), **params}.items())), None)
    assert why in (SPEC.supports(sig) or "")


def test_gqa_maps_query_head_h_to_key_head_h_over_groups():
    params = _p(gqa=True)
    ref = SPEC.reference64(params, {"x": q, "k": k, "v": v, "mask": None})
    for h in range(4):  # heads 0, 1 read key/value head 0; heads 2, 3 read head 1
        alone = SPEC.reference64(_p(), {"x": q[:, h:h + 1], "k": k[:, h // 2:h // 2 + 1],
                                        "v": v[:, h // 2:h // 2 + 1], "mask": None})
        assert torch.equal(ref[:, h:h + 1], alone)


@pytest.mark.parametrize("composite", [False, True])
def test_fully_masked_rows_are_what_pytorch_gives(composite):
    """An all -inf row: 0 from SDPA (its safe softmax), NaN from the eager softmax; a row of
    finfo.min (HF's masks): uniform weights, the mean of v, on both."""
    m = torch.zeros(2, 1, 6, 7)
    m[:, :, 0] = float("-inf")
    m[:, :, 1] = torch.finfo(torch.float32).min
    t = {"x": q, "k": kf, "v": vf, "mask": m}
    params = _p(composite=composite)
    ref = SPEC.reference64(params, t)
    eager = SPEC.eager(params, "float32")(t)
    row = (lambda r: r[:, 0, :]) if composite else (lambda r: r[:, :, 0])  # [B, L, H, D] or [B, H, L, D]
    row1 = (lambda r: r[:, 1, :]) if composite else (lambda r: r[:, :, 1])
    if composite:
        assert torch.isnan(row(ref)).all() and torch.isnan(row(eager)).all()
    else:
        assert torch.equal(row(ref), torch.zeros_like(row(ref))) and torch.equal(row(eager), torch.zeros_like(row(eager)))
    mean_v = vf.double().mean(dim=2)  # [B, H, D]
    assert torch.allclose(row1(ref), mean_v, atol=1e-12) and torch.allclose(row1(eager).double(), mean_v, atol=1e-5)


def test_a_row_masked_fully_in_one_head_only_is_zero_there_and_live_elsewhere():
    """SDPA's safe softmax is per (head, query row): row 0 of head 1 all -inf gives 0 there, while row 0 of the
    other heads attends as usual (the reference must not ask whether the whole column of heads is masked)."""
    m = torch.zeros(2, 4, 6, 7)
    m[:, 1, 0] = float("-inf")
    ref = SPEC.reference64(_p(), {"x": q, "k": kf, "v": vf, "mask": m})
    assert torch.equal(ref[:, 1, 0], torch.zeros_like(ref[:, 1, 0]))
    assert not torch.isnan(ref).any() and (ref[:, 0, 0].abs() > 0).all()


@pytest.mark.parametrize("kind", ["fresh", "large", "masked_rows"])
def test_the_float64_reference_agrees_with_eager(kind):
    sig = kc.signature("attention", {"x": q, "k": k, "v": v, "mask": mask}, _p(gqa=True))
    t = ops.make_inputs(sig, kind, torch.Generator().manual_seed(1), "cpu")
    ref, out = ops.reference64(sig, t), ops.eager(sig)(t)
    assert torch.equal(torch.isnan(ref), torch.isnan(out))
    fin = ~torch.isnan(ref)
    assert torch.allclose(out.double()[fin], ref[fin], rtol=1e-4, atol=1e-5)


def test_masked_rows_mask_some_rows_fully_and_leave_the_rest_live():
    sig = kc.signature("attention", {"x": q, "k": k, "v": v, "mask": mask}, _p(gqa=True))
    t = ops.make_inputs(sig, "masked_rows", torch.Generator().manual_seed(1), "cpu")
    rows = t["mask"].reshape(-1, 7)
    assert torch.isneginf(rows[0]).all() and (rows[2] == torch.finfo(torch.float32).min).all()
    assert torch.isfinite(rows[3, 1]) and torch.isneginf(rows[3, 2:]).all()
    unmasked = ops.make_inputs(kc.signature("attention", {"x": q, "k": k, "v": v, "mask": None}, _p(gqa=True)),
                               "masked_rows", torch.Generator().manual_seed(1), "cpu")
    assert torch.equal(unmasked["x"], torch.zeros_like(q))  # no mask: all-equal logits instead


def test_tolerance_rows():
    kc.check_tolerances("attention", {"bfloat16": (4e-3, 1.6e-2), "float16": (1e-3, 2e-3)})


def test_abi_size_variables_carry_every_stride_and_the_mask_broadcast():
    vs = torch.empty(2, 7, 2, 8).transpose(1, 2)  # a strided value, as HF's transpose(1, 2) view
    sig = kc.signature("attention", {"x": q, "k": k, "v": vs, "mask": mask}, _p(gqa=True))
    kc.check_abi(sig, {"B": 2, "H": 4, "HKV": 2, "L": 6, "S": 7, "D": 8, "G": 2, "v_sb": 112, "v_sh": 8, "v_sl": 16,
                       "m_sb": 42, "m_sh": 0, "m_sl": 7, "o_sb": 192, "o_sh": 48, "o_sl": 8, "has_mask": 1})
    assert abi.scalars(sig) == {"scale": 1 / math.sqrt(8), "softcap": 0.0}
    assert abi.supports(sig) is None
    composite = kc.signature("attention", {"x": q, "k": k, "v": v, "mask": None}, _p(gqa=True, composite=True))
    kc.check_abi(composite, {"o_sb": 192, "o_sh": 8, "o_sl": 32})  # out is [B, L, H, D]


def test_signatures_it_does_not_target_say_why():
    boolean = ops.make_signature("attention", {"x": q, "k": kf, "v": vf, "mask": torch.ones(6, 7, dtype=torch.bool)},
                                 _p())
    assert "boolean masks are not targeted" in abi.supports(boolean)
    odd = ops.make_signature("attention", {"x": q, "k": k[:, :, :, :4], "v": v, "mask": None}, _p())
    assert "head_dim" in abi.supports(odd)
    no_gqa = ops.make_signature("attention", {"x": q, "k": k, "v": v, "mask": None}, _p())
    assert "without enable_gqa" in abi.supports(no_gqa)


def _attn_sig(qs=(1, 4, 6, 8), ks=(1, 2, 7, 8), vs=None, dtypes=("float32",) * 3, mask=None, last=1, mask_last=1,
              out_last=None, **params):
    """An attention signature from shapes alone, params over _p()'s: dense strides with ``last`` (the query's),
    ``mask_last`` (the mask's) and ``out_last`` (an output like the query, or none) as the innermost stride."""
    from forge_pack.core.signature import Signature, TensorSpec

    def spec(shape, dtype, inner=1):
        strides = [inner] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * max(shape[i + 1], 1)
        return TensorSpec(dtype, tuple(shape), tuple(strides))

    vs = ks if vs is None else vs
    ins = (("x", spec(qs, dtypes[0], last)), ("k", spec(ks, dtypes[1])), ("v", spec(vs, dtypes[2])),
           ("mask", None if mask is None else spec(mask, dtypes[0], mask_last)))
    out = None if out_last is None else spec(qs, dtypes[0], out_last)
    return Signature("attention", ins, tuple(sorted({**_p(gqa=True), **params}.items())), out)


@pytest.mark.parametrize("sig, why", [
    (_attn_sig(qs=(4, 6, 8)), "attention on tensors that are not 4-d [batch, heads, length, head_dim]"),
    (_attn_sig(ks=(2, 7, 8), vs=(1, 2, 7, 8)), "attention on tensors that are not 4-d [batch, heads, length, head_dim]"),
    (_attn_sig(vs=(2, 7, 8)), "attention on tensors that are not 4-d [batch, heads, length, head_dim]"),
    (_attn_sig(dtypes=("float32", "float32", "bfloat16")), "query, key and value of different dtypes"),
    (_attn_sig(vs=(1, 2, 7, 4)), "a value head_dim other than the query's, or keys and values of different shapes"),
    (_attn_sig(ks=(2, 2, 7, 8)), "query heads not a multiple of key/value heads"),  # another batch
    (_attn_sig(ks=(1, 3, 7, 8)), "query heads not a multiple of key/value heads"),
    (_attn_sig(enable_gqa=False), "fewer key/value heads than query heads without enable_gqa (SDPA refuses the call)"),
    (_attn_sig(ks=(1, 2, 0, 8)), "empty attention"),
    (_attn_sig(qs=(1, 4, 0, 8)), "empty attention"),
    (_attn_sig(window=3, composite=True), "a sliding window without the causal mask, or on an SDPA call (which has none)"),
    # one head and one query row whose last dim is strided: refused by the head dim alone
    (_attn_sig(qs=(1, 1, 1, 8), ks=(1, 1, 7, 8), last=2), "query, key or value with a non-contiguous last dim"),
    (_attn_sig(qs=(1, 4, 6, 2), ks=(1, 2, 7, 2), last=2), "query, key or value with a non-contiguous last dim"),
    (_attn_sig(mask=(3, 1, 6, 7)), "a mask of shape [3, 1, 6, 7] that is not [B|1, H|1, L, S]"),
    (_attn_sig(mask=(1, 1, 5, 7)), "a mask of shape [1, 1, 5, 7] that is not [B|1, H|1, L, S]"),
    (_attn_sig(qs=(1, 4, 1, 8), mask=(1, 1, 1, 7), mask_last=2), "a mask with a non-contiguous last dim"),
    (_attn_sig(ks=(1, 2, 2, 8), mask=(1, 1, 6, 2), mask_last=2), "a mask with a non-contiguous last dim"),
    (_attn_sig(out_last=2), "an output with a non-contiguous last dim"),
    # what it does take: an eager composite repeats the key/value heads itself; one key (a decode step's first
    # token), one query row (decoding)
    (_attn_sig(enable_gqa=False, composite=True), None),
    (_attn_sig(ks=(1, 2, 1, 8)), None),
    (_attn_sig(qs=(1, 4, 1, 8)), None),
    (_attn_sig(window=3, composite=True, causal=True), None),
    (_attn_sig(qs=(1, 4, 6, 1), ks=(1, 2, 7, 1), last=2), None),  # a head dim of 1: its stride means nothing
    (_attn_sig(mask=(1, 4, 6, 7)), None),  # a mask per head
    (_attn_sig(ks=(1, 2, 1, 8), mask=(1, 1, 6, 1), mask_last=2), None),
    (_attn_sig(out_last=1), None),
], ids=["q-3d", "k-3d", "v-3d", "dtypes", "head-dim", "batch", "heads", "no-gqa", "no-keys", "no-queries",
        "window-not-causal", "strided-q", "strided-q-d2", "mask-batch", "mask-rows", "strided-mask",
        "strided-mask-s2", "strided-out", "composite-gqa", "one-key", "one-query", "window", "d1-strided",
        "mask-per-head", "s1-strided-mask", "dense-out"])
def test_what_the_target_takes_and_why_not(sig, why):
    assert SPEC.supports(sig) == why


# ---------------------------------------------------------------- the CPU family, judged


from eval_helpers import hotspot  # noqa: E402

def _timing():
    from forge_pack.evaluate.timing import TimingConfig

    return TimingConfig(warmup=1, reps=3, flush=False, compile_baseline=False)


SIGS = [
    "x: f32[2,4,33,16], k: f32[2,2,40,16], v: f32[2,2,40,16], causal=True, enable_gqa=True, scale=0.25",
    "x: bf16[1,2,20,32], k: bf16[1,2,20,32], v: bf16[1,2,20,32], mask: bf16[1,1,20,20], scale=0.2",
    "x: f32[1,4,12,16], k: f32[1,2,12,16], v: f32[1,2,12,16], mask: f32[1,1,12,12], enable_gqa=True, scale=0.25, "
    "softcap=50.0, composite=True",
    "x: bf16[1,4,100,16], k: bf16[1,2,100,16], v: bf16[1,2,100,16], causal=True, window=7, enable_gqa=True, "
    "scale=0.25, composite=True",
]
WINDOWED = SIGS[3]


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    from forge_pack.evaluate.evaluator import Evaluator

    with Evaluator("cpu", workers=1, timeout_s=60, timing=_timing(), log_dir=tmp_path_factory.mktemp("ev")) as ev:
        yield ev


@pytest.mark.parametrize("text", SIGS)
def test_the_cpu_family_is_verified_by_the_evaluator(evaluator, text):
    from forge_pack.search.templates_proposer import instantiate

    h = hotspot("attention", text)
    r = evaluator.evaluate(instantiate("attention", "cpu", "online", {}, h.signature), h)
    assert r.verdict.ok, r.verdict.detail
    assert r.verdict.reason == "ok"


@pytest.mark.parametrize("blocks", [{"block_m": 4, "block_n": 32}, {"block_m": 16, "block_n": 32}])
def test_a_sliding_window_skips_whole_tiles_and_still_verifies(evaluator, blocks):
    """Query blocks past the window start at their first row's first key (tiles before it never read) and a
    tile straddling the window's edge is cut per row: both verified against the float64 reference."""
    from forge_pack.search.templates_proposer import instantiate

    h = hotspot("attention", WINDOWED)
    r = evaluator.evaluate(instantiate("attention", "cpu", "online", blocks, h.signature), h)
    assert r.verdict.ok and r.verdict.reason == "ok", r.verdict.detail


@pytest.mark.parametrize("cut", [("const long long lo = (windowed &&", "const long long lo = (0 &&"),
                                 ("const long long kv_begin = (windowed &&", "const long long kv_begin = (0 &&")])
def test_a_kernel_that_ignores_the_window_is_rejected_as_a_mismatch(evaluator, cut):
    """Dropping the window's cut per row is wrong everywhere past the window; dropping only the skipped
    leading tiles keeps the per-row cut, so that one is the same computation (and must verify)."""
    from forge_pack.core.candidate import Candidate
    from forge_pack.search.templates_proposer import instantiate

    h = hotspot("attention", WINDOWED)
    good = instantiate("attention", "cpu", "online", {"block_m": 8, "block_n": 32}, h.signature)
    source = good.source.replace(*cut)
    assert source != good.source
    bad = Candidate(good.op, good.backend, source, good.spec, good.family, dict(good.params), "user")
    r = evaluator.evaluate(bad, h)
    if "lo =" in cut[0]:
        assert not r.verdict.ok and r.verdict.reason == "mismatch", r.verdict
    else:
        assert r.verdict.ok, r.verdict.detail


def test_a_kernel_without_the_causal_mask_is_rejected_as_a_mismatch(evaluator):
    from forge_pack.core.candidate import Candidate
    from forge_pack.search.templates_proposer import instantiate

    h = hotspot("attention", SIGS[0])
    good = instantiate("attention", "cpu", "online", {}, h.signature)
    source = good.source.replace("const long long kv_end = causal ?", "const long long kv_end = 0 ?")
    source = source.replace("if (causal) live =", "if (0) live =")
    assert source != good.source
    bad = Candidate(good.op, good.backend, source, good.spec, good.family, dict(good.params), "user")
    r = evaluator.evaluate(bad, h)
    assert not r.verdict.ok and r.verdict.reason == "mismatch", r.verdict
    assert "out of tolerance" in r.verdict.detail


# ---------------------------------------------------------------- the package's patch of the function


def _manifest_target(patch_mod, sig, fn) -> dict:
    return {"id": "attention_0", "op": "attention", "torch_op": "attention_0", "signature": sig.to_json(),
            "module_class": f"{fn.__module__}:{fn.__name__}", "module_code": patch_mod.code_fingerprint(fn),
            "kernel": {"min_sm_count": 0}}


@torch.no_grad()  # the kernels have no backward: a call that needs a graph goes to the original
def test_the_package_replaces_the_eager_function_at_its_module_name_and_reverts_it(tmp_path_factory, monkeypatch):
    patch_mod = kc.package_runtime(tmp_path_factory.getbasetemp())
    model = attention_block.get_model()
    x = attention_block.get_inputs()[0]
    seen = []
    original = attention_block.eager_attention_forward
    monkeypatch.setattr(attention_block, "eager_attention_forward",
                        lambda *a, **kw: seen.append((a, kw)) or original(*a, **kw))
    model(x)
    attention_block.eager_attention_forward = original
    args, kwargs = seen[0]
    tensors, params = SPEC.bind_module(original, args, kwargs)
    sig = ops.make_signature("attention", tensors, params, original(*args, **kwargs)[0])
    manifest = {"package": {"namespace": "attn_test"}, "backend": "cpu", "build": {"cuda_arch_list": ""},
                "targets": [_manifest_target(patch_mod, sig, original)]}
    monkeypatch.setattr(patch_mod, "integrity_status", lambda doc: ("ok", "test manifest"))
    p = patch_mod.Patcher(manifest, "attn_test", lambda: None)
    marker = torch.full(tuple(sig.output.shape), 7.0)
    monkeypatch.setattr(p, "_bind_ops", lambda: [setattr(t, "fn", lambda *ts: marker) for t in p.targets])
    assert p.apply(model)
    try:
        assert attention_block.eager_attention_forward is not original
        out, weights = attention_block.eager_attention_forward(*args, **kwargs)
        assert out is marker and weights is None  # HF's own SDPA path returns no weights either
        model(x)
        assert p.kernel_calls == {"attention_0": 2}
        attention_block.eager_attention_forward(*args[:4], None, **kwargs)  # no mask: not the verified call
        assert p.fallback_calls == {"function": 1}
    finally:
        p.revert()
    assert attention_block.eager_attention_forward is original


@pytest.mark.slow  # ~30-70 s on 2 cores; the evaluator tests above are its fast path
def test_a_search_on_the_attention_model_finds_a_verified_kernel(tmp_path, cli_env, forge_cmd):
    import json
    import subprocess

    model = Path(__file__).resolve().parents[1] / "models" / "attention_block.py"
    r = subprocess.run([*forge_cmd, "search", str(model), "--device", "cpu", "--budget", "2", "--top", "1",
                        "--run-dir", str(tmp_path / "run"), "--seed", "1"],
                       capture_output=True, text=True, env=cli_env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "run" / "search.json").read_text())
    searched = [h for h in doc["hotspots"] if not h["skipped"]]
    assert searched
    assert all(h.get("best") for h in searched), [h["verdict"] for h in searched]  # a verified kernel each


# ---------------------------------------------------------------- the CUDA family compiles here


def _cuda_compiler() -> bool:
    import shutil

    from forge_pack.evaluate import compile as fcompile

    return fcompile.nvrtc() is not None or shutil.which("nvcc") is not None


@pytest.mark.skipif(not _cuda_compiler(), reason="neither NVRTC nor nvcc available")
@pytest.mark.parametrize("text, knobs", [
    ("x: bf16[2,16,256,128], k: bf16[2,16,256,128], v: bf16[2,16,256,128], causal=True, scale=0.088", {}),
    ("x: f16[2,8,77,64], k: f16[2,2,77,64], v: f16[2,2,77,64], mask: f16[2,1,77,77], enable_gqa=True, scale=0.125",
     {"stages": 1, "ldmatrix": 0}),
    ("x: bf16[1,8,128,256], k: bf16[1,4,128,256], v: bf16[1,4,128,256], mask: bf16[1,1,128,128], enable_gqa=True, "
     "scale=0.0625, softcap=50.0, composite=True", {}),
    ("x: bf16[1,1,1030,512], k: bf16[1,1,1030,512], v: bf16[1,1,1030,512], scale=0.044", {}),
    ("x: bf16[1,16,300,128], k: bf16[1,8,300,128], v: bf16[1,8,300,128], causal=True, window=96, enable_gqa=True, "
     "scale=0.088, composite=True", {}),
    ("x: bf16[1,16,300,256], k: bf16[1,8,300,256], v: bf16[1,8,300,256], causal=True, window=96, enable_gqa=True, "
     "scale=0.0625, softcap=30.0, composite=True", {}),
])
def test_the_cuda_family_compiles_for_sm90_without_spills(tmp_path, text, knobs):
    from forge_pack.evaluate.compile import compile_candidate
    from forge_pack.search.templates_proposer import instantiate

    h = hotspot("attention", text)
    build = compile_candidate(instantiate("attention", "cuda", "flash", knobs, h.signature), arch="sm_90",
                              cache_dir=tmp_path)
    assert build.ok, build.log[-2000:]
    res = build.resources["attention_flash"]
    assert res["spill_stores"] == 0 and res["registers"] <= 255, res
    assert "warning" not in build.log.lower(), build.log


def test_a_function_of_the_eager_name_that_computes_something_else_is_not_targeted():
    from forge_pack.profile.composite_functions import composite_mismatch

    m = _HFAttention().eval()
    tensors, params = SPEC.bind_module(attention_block.eager_attention_forward, (m, q, k, v, None, 0.3), {})
    right = attention_block.eager_attention_forward(m, q, k, v, None, 0.3)[0]
    assert composite_mismatch(SPEC, "eager_attention_forward", tensors, params, right) == ""
    unscaled = attention_block.eager_attention_forward(m, q, k, v, None, 1.0)[0]  # scaling ignored
    why = composite_mismatch(SPEC, "eager_attention_forward", tensors, params, unscaled)
    assert why.startswith("eager_attention_forward does not compute softmax(q k^T * scale + mask) v here")
    heads_first = right.transpose(1, 2)  # [B, H, L, D]: not the layout the function returns
    assert "returns shape" in composite_mismatch(SPEC, "eager_attention_forward", tensors, params, heads_first)


# ---------------------------------------------------------------- the eager binder's every reading and refusal


def _gemma_eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    """Gemma's eager attention's parameters (its body is not run: the binder reads the parameters)."""
    raise AssertionError("the binder does not call the function")


def _no_dropout_eager(module, query, key, value, attention_mask, scaling):
    raise AssertionError("the binder does not call the function")


def test_the_eager_binder_reads_softcap_a_default_scale_and_the_groups():
    from types import SimpleNamespace

    m = _HFAttention().eval()
    tensors, params = SPEC.bind_module(_gemma_eager, (m, q, k, v, None), {"softcap": 30, "scaling": 0.25})
    assert params == _p(scale=0.25, gqa=True, softcap=30.0, composite=True)
    assert isinstance(params["softcap"], float)
    # no scaling: the module's head_dim ** -0.5, as Gemma's eager attention computes it
    _, params = SPEC.bind_module(_gemma_eager, (m, q, k, v, None), {})
    assert params == _p(scale=8 ** -0.5, gqa=True, composite=True)
    # one group: no key/value repetition to do
    ungrouped = SimpleNamespace(num_key_value_groups=1, head_dim=8, training=False)
    _, params = SPEC.bind_module(_gemma_eager, (ungrouped, q, kf, vf, None, 0.0, 0.5), {})
    assert params["enable_gqa"] is False
    # a module object without `training` (not an nn.Module) and a dropout: nothing says it applies
    bare = SimpleNamespace(num_key_value_groups=2, head_dim=8)
    assert SPEC.bind_module(_gemma_eager, (bare, q, k, v, None, 0.1, 0.5), {}) is not None
    # a function without a dropout parameter, on a module in training: there is no dropout to apply
    assert SPEC.bind_module(_no_dropout_eager, (m.train(), q, k, v, None, 0.5), {}) is not None


@pytest.mark.parametrize("fn, module, args, kwargs", [
    (max, None, (q, k), {}),  # no readable signature
    (lambda module, x, y, z: None, "m", (q, k, v), {}),  # no `query` parameter
    (_gemma_eager, "m", (q, k), {}),  # missing arguments: the call does not bind
    (_gemma_eager, "m", (q, k, v, None), {"softcap": "big"}),  # a softcap that is not a number
    (_gemma_eager, "m", (q, k, v, None), {"scaling": "big"}),  # a scale that is not a number
    (_gemma_eager, "no-head-dim", (q, k, v, None), {}),  # no scaling and no head_dim to default it from
    (_gemma_eager, "no-groups", (q, k, v, None, 0.0, 0.5), {}),  # no num_key_value_groups
    (_gemma_eager, "m", (q, k, v, 0.5, 0.0, 0.5), {}),  # a mask that is not a tensor
    (_gemma_eager, "m", (q, k, v, mask[0], 0.0, 0.5), {}),  # a 3-d mask
    (_gemma_eager, "m", (q, k, v, mask[None], 0.0, 0.5), {}),  # a 5-d mask
], ids=["no-signature", "no-query", "unbound", "softcap-str", "scale-str", "no-head-dim", "no-groups",
        "mask-number", "mask-3d", "mask-5d"])
def test_the_eager_binder_leaves_calls_it_cannot_read_exactly(fn, module, args, kwargs):
    from types import SimpleNamespace

    modules = {"m": _HFAttention().eval(), None: None,
               "no-head-dim": SimpleNamespace(num_key_value_groups=2, training=False),
               "no-groups": SimpleNamespace(head_dim=8, training=False)}
    assert SPEC.bind_module(fn, (modules[module], *args), kwargs) is None


def test_a_hand_written_signature_is_completed_or_refused_word_for_word():
    from forge_pack.core.errors import ForgeError
    from forge_pack.targets.sigparse import parse_signature

    sig = parse_signature("attention", "attention(x: f32[1,4,6,8], k: f32[1,2,7,8], v: f32[1,2,7,8], "
                                       "causal=True, enable_gqa=True)")
    assert sig.param("causal") is True and sig.param("enable_gqa") is True
    with pytest.raises(ForgeError) as e:
        parse_signature("attention", "attention(x: f32[4,6,8], k: f32[1,2,7,8], v: f32[1,2,7,8])")
    assert (e.value.message, e.value.hint) == (
        "attention takes 4-d x (the query) and k", "e.g. x: bf16[1,8,2048,128], k: bf16[1,8,2048,128], ...")
    with pytest.raises(ForgeError) as e:
        parse_signature("attention", "attention(x: f32[1,4,6,8], k: f32[2,7,8], v: f32[1,2,7,8])")
    assert e.value.message == "attention takes 4-d x (the query) and k"
    with pytest.raises(ForgeError) as e:
        parse_signature("attention", "attention(x: f32[1,4,6,8], k: f32[1,3,7,8], v: f32[1,3,7,8], "
                                     "enable_gqa=True)")
    assert (e.value.message, e.value.hint) == ("4 query heads are not a multiple of 3 key heads",
                                               "give k and v a head count dividing the query's, and enable_gqa=True")


def test_a_two_dim_mask_broadcasts_over_batch_and_heads():
    sig = kc.signature("attention", {"x": q, "k": kf, "v": vf, "mask": mask2}, _p())
    kc.check_abi(sig, {"m_sb": 0, "m_sh": 0, "m_sl": 7, "has_mask": 1})
    assert abi.supports(sig) is None


def test_the_composite_returns_the_kernels_output_without_weights():
    out, weights = torch.ones(2), torch.zeros(2)
    assert SPEC.composite_output((out, weights)) is out
    assert SPEC.composite_output(out) is out
    assert SPEC.composite_return(out) == (out, None)


def _hf_softcapped(q_, k_, v_, cap, causal, window=0):
    """Gemma's eager attention written out independently: repeat_kv, scaled logits soft-capped, HF's causal
    (and sliding-window) finfo.min mask, fp32 softmax cast back, P V, [B, L, H, D]."""
    g_ = q_.shape[1] // k_.shape[1]
    k_, v_ = k_.repeat_interleave(g_, dim=1), v_.repeat_interleave(g_, dim=1)
    w = torch.matmul(q_, k_.transpose(2, 3)) * 0.5
    w = torch.tanh(w / cap) * cap
    if causal:
        i, j = torch.arange(w.shape[-2])[:, None], torch.arange(w.shape[-1])[None, :]
        hidden = (j > i) | ((j <= i - window) if window > 0 else torch.zeros_like(j > i))
        w = w + torch.zeros(w.shape[-2:], dtype=w.dtype).masked_fill(hidden, torch.finfo(w.dtype).min)
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q_.dtype)
    return torch.matmul(w, v_).transpose(1, 2).contiguous()


@pytest.mark.parametrize("causal, window", [(False, 0), (True, 0), (True, 3)])
def test_the_eager_composite_call_is_gemmas_eager_attention_op_for_op_in_bf16(causal, window):
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    params = {**_p(scale=0.5, gqa=True, softcap=2.0, composite=True, causal=causal), "window": window}
    tensors = {"x": qb, "k": kb, "v": vb, "mask": None}
    got = SPEC.eager(params, "bfloat16")(tensors)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, _hf_softcapped(qb, kb, vb, 2.0, causal, window))
    wide = SPEC.eager(params, "float32")(tensors)  # the signature's output dtype is what it returns
    assert wide.dtype == torch.float32 and torch.equal(wide, got.float())
    from forge_pack.targets.attention import eager_attention

    if causal and not window:  # the function's own default: no window
        assert torch.equal(eager_attention(qb, kb, vb, None, 0.5, 2.0, causal=True), got)
    if not causal:  # ... and no causal mask
        assert torch.equal(eager_attention(qb, kb, vb, None, 0.5, 2.0), got)


def test_the_magnitude_is_the_values_peak_per_batch_and_channel():
    vv = torch.zeros(2, 2, 7, 8)
    vv[0, 1, 3, 2], vv[1, 0, 6, 5], vv[1, 1, 0, 2] = -4.0, 3.0, 0.5
    mag = SPEC.magnitude({"x": q, "k": k, "v": vv, "mask": None})
    assert mag.shape == (2, 4, 6, 8) and mag.dtype == torch.float64
    want = torch.zeros(2, 8, dtype=torch.float64)
    want[0, 2], want[1, 5], want[1, 2] = 4.0, 3.0, 0.5
    assert torch.equal(mag, want[:, None, None, :].expand(2, 4, 6, 8))


def test_odd_shapes_change_the_query_length_only_and_none_with_a_mask():
    sig = kc.signature("attention", {"x": q, "k": k, "v": v, "mask": None}, _p(gqa=True))
    assert SPEC.odd_shapes(sig) == [((2, 4, 37, 8), False), ((2, 4, 5, 8), False)]
    one_row = kc.signature("attention", {"x": q[:, :, :1], "k": k, "v": v, "mask": None}, _p(gqa=True))
    assert SPEC.odd_shapes(one_row) == [((2, 4, 37, 8), False)]  # no shorter query than one row
    masked = kc.signature("attention", {"x": q, "k": k, "v": v, "mask": mask}, _p(gqa=True))
    assert SPEC.odd_shapes(masked) == []


def test_the_output_strides_follow_the_output_or_the_layout_the_call_writes():
    from forge_pack.core.signature import Signature, TensorSpec

    ins = {"x": q, "k": k, "v": v, "mask": None}
    kc.check_abi(ops.make_signature("attention", ins, _p(gqa=True)), {"o_sb": 192, "o_sh": 48, "o_sl": 8})
    kc.check_abi(ops.make_signature("attention", ins, _p(gqa=True, composite=True)),
                 {"o_sb": 192, "o_sh": 8, "o_sl": 32})  # no output recorded: the [B, L, H, D] it returns
    base = kc.signature("attention", ins, _p(gqa=True))
    # an SDPA call whose output is a [B, H, L, D] view of [B, L, H, D] storage: its own strides
    out = TensorSpec(base.output.dtype, (2, 4, 6, 8), (192, 8, 32, 1))
    kc.check_abi(Signature("attention", base.inputs, base.params, out), {"o_sb": 192, "o_sh": 8, "o_sl": 32})


def test_a_permutation_moves_whole_query_vectors_reproducibly():
    rows, back = SPEC.rows(_p(), q)
    assert rows.shape == (48, 8) and torch.equal(back(rows), q)
    p1 = SPEC.permute(_p(), q, {}, torch.Generator().manual_seed(3))
    p2 = SPEC.permute(_p(), q, {}, torch.Generator().manual_seed(3))
    assert torch.equal(p1, p2) and not torch.equal(p1, q)
    got = sorted(map(tuple, p1.reshape(-1, 8).tolist()))
    assert got == sorted(map(tuple, q.reshape(-1, 8).tolist()))


@pytest.mark.parametrize("args, kwargs", [
    ((q, kf, vf[0]), {}),  # only the value 3-d
    ((q, kf[0], vf), {}),  # only the key 3-d
    ((q[0], kf, vf), {}),  # only the query 3-d
    ((q, kf, vf.long()), {}),  # an integer value
    ((q, kf.long(), vf), {}),  # an integer key
    ((q.long(), kf, vf), {}),  # an integer query
    (([1.0], kf, vf), {}),  # a query that is not a tensor
    ((q, kf, vf, mask[None]), {}),  # a 5-d mask
    ((q, kf, vf, 0.5), {}),  # a mask that is not a tensor
], ids=["v-3d", "k-3d", "q-3d", "v-int", "k-int", "q-int", "q-list", "mask-5d", "mask-number"])
def test_the_sdpa_binder_refuses_each_tensor_it_cannot_take(args, kwargs):
    assert SPEC.bind("F", args, kwargs) is None
    assert SPEC.bind("F", (q, kf, vf), {}) is not None  # the same call with the three right tensors binds


def test_size_variables_of_one_key_head_no_mask_and_a_window_without_causal():
    mqa = kc.signature("attention", {"x": q, "k": k[:, :1], "v": v[:, :1], "mask": None}, _p(gqa=True))
    kc.check_abi(mqa, {"HKV": 1, "G": 4, "m_sb": 0, "m_sh": 0, "m_sl": 0, "has_mask": 0, "window": 0})
    windowed = kc.signature("attention", {"x": q, "k": k, "v": v, "mask": None},
                            {**_p(gqa=True, composite=True), "window": 3})
    kc.check_abi(windowed, {"window": 0, "causal": 0})  # a window counts only under the causal mask
    causal = kc.signature("attention", {"x": q, "k": k, "v": v, "mask": None},
                          {**_p(gqa=True, composite=True, causal=True), "window": 3})
    kc.check_abi(causal, {"window": 3, "causal": 1})


@pytest.mark.parametrize("gqa", [False, True])
def test_the_sdpa_eager_call_passes_the_scale_and_the_causal_flag(gqa):
    kk, vv = (k, v) if gqa else (kf, vf)
    params = _p(scale=0.5, causal=True, gqa=gqa)
    got = SPEC.eager(params, "float32")({"x": q, "k": kk, "v": vv, "mask": None})
    extra = {"enable_gqa": True} if gqa else {}
    assert torch.equal(got, F.scaled_dot_product_attention(q, kk, vv, is_causal=True, scale=0.5, **extra))


def test_a_hand_written_signature_without_a_query_is_refused():
    assert SPEC.complete({"k": k}) == ("attention takes 4-d x (the query) and k",
                                       "e.g. x: bf16[1,8,2048,128], k: bf16[1,8,2048,128], ...")
