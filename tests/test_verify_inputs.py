"""The fresh verification inputs: seeded by the candidate's own hash, the run's seed and the mode
(search or final), reproducible for the same key, different for any other; and the fingerprint that
notices a stray write into a cached input set.

A candidate that could predict its verification inputs could special-case them, so the seeding is
a guard in its own right (mutation testing found no test that missed it).
"""

import pytest
import torch

from forge_pack.evaluate import verify
from forge_pack.targets.sigparse import parse_signature

SIG = parse_signature("softmax", "x: f32[8,64], dim=-1")


def _x(s) -> torch.Tensor:
    return s.tensors["x"]


def test_the_same_key_draws_the_same_inputs():
    a = verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False)
    torch.rand(100)  # the global generator moving on must not change them
    b = verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False)
    assert len(a) == len(b) == 1
    assert a[0].kind == "fresh[0]" and torch.equal(_x(a[0]), _x(b[0])) and torch.equal(a[0].ref, b[0].ref)


def test_another_candidate_seed_or_mode_draws_other_inputs():
    base = _x(verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False)[0])
    for other in (verify.fresh_sets(SIG, "cpu", 7, "abc124", final=False),  # another candidate
                  verify.fresh_sets(SIG, "cpu", 8, "abc123", final=False),  # another run seed
                  verify.fresh_sets(SIG, "cpu", 7, "abc123", final=True)):  # the final check
        assert not torch.equal(base, _x(other[0]))


def test_the_draws_are_keyed_exactly_by_seed_mode_hash_and_index():
    from forge_pack.targets import ops

    for final, mode in ((True, "final"), (False, "search")):
        s = verify.fresh_sets(SIG, "cpu", 7, "abc123", final=final, count=2)[1]
        gen = torch.Generator().manual_seed(verify.seed_for(7, mode, "abc123", 1))
        assert torch.equal(_x(s), ops.make_inputs(SIG, "fresh", gen, "cpu")["x"]), mode


def test_several_sets_are_each_drawn_afresh():
    sets = verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False, count=3)
    assert [s.kind for s in sets] == ["fresh[0]", "fresh[1]", "fresh[2]"]
    assert not torch.equal(_x(sets[0]), _x(sets[1])) and not torch.equal(_x(sets[1]), _x(sets[2]))
    assert torch.equal(_x(sets[0]), _x(verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False)[0]))


def test_seed_for_is_a_stable_63_bit_hash_of_its_parts():
    assert verify.seed_for(7, "search", "abc123", 0) == verify.seed_for(7, "search", "abc123", 0)
    assert verify.seed_for(7, "search", "abc123", 0) != verify.seed_for(7, "search", "abc123", 1)
    assert 0 <= verify.seed_for("x") < 2 ** 63
    assert verify.seed_for(0) == int.from_bytes(__import__("hashlib").sha256(b"(0,)").digest()[:8], "little") & (
        (1 << 63) - 1)


def test_the_fingerprint_notices_one_changed_element_and_nothing_else():
    s = verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False)[0]
    before = verify.fingerprint(s)
    assert before == s.fingerprint and len(before) == 2  # x and the reference
    assert verify.fingerprint(s) == before
    x = _x(s)
    x.view(torch.int32)[3, 5] += 1  # one ulp of one element
    assert verify.fingerprint(s) != before
    x.view(torch.int32)[3, 5] -= 1
    assert verify.fingerprint(s) == before
    s.ref[0, 0] += 1.0
    assert verify.fingerprint(s)[1] != before[1] and verify.fingerprint(s)[0] == before[0]


def test_an_absent_optional_tensor_does_not_stop_the_fingerprint():
    x = torch.arange(6, dtype=torch.float32)
    s = verify.InputSet("captured[0]", SIG, {"weight": None, "x": x}, x.double())
    before = verify.fingerprint(s)
    assert len(before) == 3 and before[0] is None
    x[2] = 7.0  # a write into the tensor after the absent one is still noticed
    assert verify.fingerprint(s)[1] != before[1]


def test_a_fresh_draw_whose_eager_breaks_nan_parity_is_kept_without_eager_slack(monkeypatch):
    monkeypatch.setattr(verify, "make_set", lambda *a, **k: None)
    (s,) = verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False)
    assert (s.kind, s.atol_floor) == ("fresh[0]", 0.0)
    assert s.ref.dtype == torch.float64 and torch.equal(s.ref, torch.softmax(_x(s).double(), -1))


# ---------------------------------------------------------------- streamed sets (hotspots too large to cache)


def _saved_captures(tmp_path, sig, n=2):
    from forge_pack.profile.capture import save_capture
    from forge_pack.targets import ops

    names = []
    for i in range(n):
        x = torch.randn(*sig.x.shape, generator=torch.Generator().manual_seed(100 + i))
        save_capture(tmp_path / f"c{i}.safetensors", sig, {"x": x}, ops.eager(sig)({"x": x}))
        names.append(f"c{i}.safetensors")
    return names


def _same(a, b):
    assert a.kind == b.kind
    assert a.tensors.keys() == b.tensors.keys()
    for k in a.tensors:  # bit for bit, NaN where NaN (the -inf rows' references)
        torch.testing.assert_close(a.tensors[k], b.tensors[k], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(a.ref, b.ref, rtol=0, atol=0, equal_nan=True)


def test_a_static_stream_yields_odd_then_adversarial_then_captured_sets_like_the_cached_ones(tmp_path, monkeypatch):
    """Remade one at a time, the stream's adversarial and captured sets are the cached sets bit for bit;
    its odd sets are no larger than the signature, odd-sized; a second pass (from host memory) is equal."""
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig)
    cached, _ = verify.static_sets(sig, caps, str(tmp_path), "cpu", 7, False)
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 1 << 30)  # as on a GPU host
    stream = verify.StaticStream(sig, caps, str(tmp_path), "cpu", 7, False)
    got = list(stream)
    odd = [s for s in got if s.kind.startswith("odd:")]
    rest = [s for s in got if not s.kind.startswith("odd:")]
    assert got == odd + rest and odd  # odd sets first
    by_kind = {s.kind: s for s in cached}
    adv = [s.kind for s in rest if s.kind.startswith("adversarial:")]
    assert [s.kind for s in rest] == adv + ["captured[0]", "captured[1]"]
    assert adv == [f"adversarial:{k}" for k in ops.get_op(sig.op).adversarial_kinds(sig)]
    for s in rest:
        _same(s, by_kind[s.kind])
    for s in odd:
        x = s.tensors["x"]
        assert x.numel() <= sig.x.numel and x.shape[0] % 2 == 1 and x.dim() == 2
        assert s.kind == "odd:" + "x".join(str(d) for d in x.shape)
        torch.testing.assert_close(s.ref, ops.reference64(s.sig, s.tensors).double(), rtol=0, atol=0, equal_nan=True)
    assert all(s.streamed for s in got)
    assert set(stream.host) == {s.kind for s in got}  # every set kept in host memory (there is room)
    again = list(stream)
    for a, b in zip(got, again, strict=True):
        _same(a, b)
        assert a.tensors["x"].data_ptr() != b.tensors["x"].data_ptr()  # a copy, never the kept tensor
    # another seed draws other adversarial sets; the captured ones stay the captures
    other = {s.kind: s for s in verify.StaticStream(sig, caps, str(tmp_path), "cpu", 8, False)}
    assert not all(torch.equal(other[k].tensors["x"].nan_to_num(), by_kind[k].tensors["x"].nan_to_num()) for k in adv)
    _same(other["captured[1]"], by_kind["captured[1]"])


def test_a_static_stream_without_room_in_host_memory_remakes_every_set(tmp_path, monkeypatch):
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig, n=1)
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 0)
    stream = verify.StaticStream(sig, caps, str(tmp_path), "cpu", 7, True)
    first = list(stream)
    assert stream.host == {} and stream.skipped == []
    for a, b in zip(first, list(stream), strict=True):
        _same(a, b)


def test_derived_sets_streamed_one_at_a_time_equal_the_held_ones(tmp_path):
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig, n=3)
    cached, _ = verify.static_sets(sig, caps, str(tmp_path), "cpu", 7, True)
    sources = [s for s in cached if s.kind.startswith("captured")]
    held = verify.derived_sets(sig, "cpu", 7, "abc", True, sources)
    asked = []

    def source(i):
        asked.append(i)
        return sources[i].tensors

    streamed = list(verify.iter_derived_sets(sig, "cpu", 7, "abc", True, len(sources), source))
    assert [s.kind for s in streamed] == [f"derived:{k}" for k in ops.DERIVED_KINDS] == [s.kind for s in held]
    for a, b in zip(streamed, held, strict=True):
        _same(a, b)
        assert a.streamed
    assert len(asked) == len(ops.DERIVED_KINDS) and set(asked) <= {0, 1, 2}
    other = list(verify.iter_derived_sets(sig, "cpu", 7, "abd", True, len(sources), source))
    assert any(not torch.equal(a.tensors["x"], b.tensors["x"]) for a, b in zip(other, streamed))
    # the search's sets, seeded by the search mode, equal the held ones too (and differ from the final's)
    search = list(verify.iter_derived_sets(sig, "cpu", 7, "abc", False, len(sources), source))
    for a, b in zip(search, verify.derived_sets(sig, "cpu", 7, "abc", False, sources), strict=True):
        _same(a, b)
    assert any(not torch.equal(a.tensors["x"], b.tensors["x"]) for a, b in zip(search, streamed))


def test_odd_sets_of_a_few_huge_rows_shrink_to_an_odd_row_count_within_the_signature():
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[4,100], dim=-1"))
    big = parse_signature("softmax", "x: f32[37,99], dim=-1")
    got = verify._no_larger(big, sig)
    assert got.x.shape == (3, 99) and got.x.strides == (99, 1) and got.params == big.params
    assert got.output is None and got.op == "softmax"
    assert verify._no_larger(big, ops.with_output(parse_signature("softmax", "x: f32[10,100], dim=-1"))).x.shape == (9, 99)
    assert verify._no_larger(big, ops.with_output(parse_signature("softmax", "x: f32[8,100], dim=-1"))).x.shape == (7, 99)
    assert verify._no_larger(big, ops.with_output(parse_signature("softmax", "x: f32[1,50], dim=-1"))).x.shape == (1, 99)
    small = parse_signature("softmax", "x: f32[3,99], dim=-1")
    assert verify._no_larger(small, sig) is small  # no larger already: unchanged
    flat = parse_signature("softmax", "x: f32[999], dim=-1")
    assert verify._no_larger(flat, sig) is flat  # one dim: no rows to drop
    few = parse_signature("softmax", "x: f32[5,99], dim=-1")
    assert verify._no_larger(few, ops.with_output(parse_signature("softmax", "x: f32[4,120], dim=-1"))).x.shape == (3, 99)
    # an odd quotient is itself the row count: 500 // 99 = 5 rows of 99 fit in 5x100
    assert verify._no_larger(big, ops.with_output(parse_signature("softmax", "x: f32[5,100], dim=-1"))).x.shape == (5, 99)
    same = parse_signature("softmax", "x: f32[5,80], dim=-1")
    assert verify._no_larger(same, sig) is same  # exactly as large (400 elements): unchanged
    # rows of one element: 20 of them fit in 4x5, the largest odd count is 19 (more than one row's width)
    column = parse_signature("softmax", "x: f32[37,1], dim=-1")
    assert verify._no_larger(column, ops.with_output(parse_signature("softmax", "x: f32[4,5], dim=-1"))).x.shape == (19, 1)


def test_a_static_stream_keeps_sets_in_host_memory_only_while_they_fit(tmp_path, monkeypatch):
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig, n=2)
    one = 8 * 64 * 4  # bytes of one set's x
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: one)
    stream = verify.StaticStream(sig, [caps[0]], str(tmp_path), "cpu", 7, False)
    stream.captures = caps
    kinds = [s.kind for s in stream]
    kept = [k for k in kinds if k in stream.host]
    assert stream.host_room >= 0 and len(kept) >= 1
    first_full = next(k for k in kinds if not k.startswith("odd:"))  # the odd sets are smaller than one
    assert sum(verify.memory_plan.tensors_bytes(stream.host[k]) for k in kept) <= one
    assert stream.host_room == one - sum(verify.memory_plan.tensors_bytes(stream.host[k]) for k in kept)
    assert "captured[1]" not in stream.host and first_full in kinds


def test_fresh_inputs_default_to_the_first_draw():
    assert torch.equal(verify.fresh_inputs(SIG, "cpu", 7, "abc123", False)["x"],
                       _x(verify.fresh_sets(SIG, "cpu", 7, "abc123", final=False)[0]))


def _on_device(monkeypatch, tmp_path):
    """Every draw and capture load asks for a device ("meta": not the CPU, yet usable without a GPU);
    the asked device is recorded and the tensors are made on the CPU, as a GPU worker's would be
    before they are moved. The sets are recorded with the devices of the tensors they get."""
    from forge_pack.profile import capture
    from forge_pack.targets import ops

    asked, sets = [], []
    real_make, real_load = ops.make_inputs, capture.load_capture
    monkeypatch.setattr(ops, "make_inputs", lambda sig, kind, gen, device: asked.append(("draw", device)) or
                        real_make(sig, kind, gen, "cpu"))
    monkeypatch.setattr(capture, "load_capture", lambda path, sig, *device: asked.append(("load", *device)) or
                        real_load(path, sig, "cpu"))

    def make_set(kind, sig, tensors, device, known=None):
        sets.append((kind, {n: (t.device.type if t is not None else None) for n, t in tensors.items()}))
        return verify.InputSet(kind, sig, tensors, torch.zeros(0, dtype=torch.float64))

    return asked, sets, make_set


def test_every_input_is_drawn_or_loaded_on_the_evaluations_device(tmp_path, monkeypatch):
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig, n=1)
    asked, _, make_set = _on_device(monkeypatch, tmp_path)
    verify.fresh_inputs(sig, "meta", 7, "abc", False, 1)
    assert asked == [("draw", "meta")]
    asked.clear()
    verify.fresh_sets(sig, "meta", 7, "abc", False, count=2)
    assert asked == [("draw", "meta")] * 2
    asked.clear()
    n_static = len(ops.odd_signatures(sig)) + len(ops.adversarial_kinds(sig))
    verify.static_sets(sig, caps, str(tmp_path), "meta", 7, False)
    assert sorted(asked) == [("draw", "meta")] * n_static + [("load", "meta")]
    asked.clear()
    monkeypatch.setattr(verify, "make_set", make_set)
    # the room for host copies is the evaluation's device's (none for a CPU evaluation: its sets are there)
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: asked.append(("room", device)) or 0)
    assert len(list(verify.StaticStream(sig, caps, str(tmp_path), "meta", 7, False))) == n_static + 1
    assert asked == [("room", "meta")] + [("draw", "meta")] * n_static + [("load", "meta")]


def test_a_static_stream_copies_its_host_sets_to_the_device_and_hands_out_copies_only(tmp_path, monkeypatch):
    """The host copy is the stream's own (never the tensors a kernel was given) and every later pass
    gets a new copy of it on the evaluation's device: a kernel writing into its input cannot reach it."""
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig, n=1)
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 1 << 30)
    stream = verify.StaticStream(sig, caps, str(tmp_path), "cpu", 7, False)
    first = list(stream)
    second = list(stream)
    for a, b in zip(first, second, strict=True):
        kept = stream.host[a.kind]["x"]
        assert torch.equal(kept, a.tensors["x"]) and torch.equal(b.tensors["x"], kept)
        assert len({kept.data_ptr(), a.tensors["x"].data_ptr(), b.tensors["x"].data_ptr()}) == 3
    _, sets, make_set = _on_device(monkeypatch, tmp_path)
    monkeypatch.setattr(verify, "make_set", make_set)
    stream = verify.StaticStream(sig, caps, str(tmp_path), "meta", 7, False)
    n = len(list(stream))
    list(stream)
    assert [d for _, d in sets] == [{"x": "cpu"}] * n + [{"x": "meta"}] * n  # drawn (here: CPU), then copied over


def test_a_static_stream_measures_eagers_allowance_once_per_kept_set(tmp_path, monkeypatch):
    """A set kept in host memory is the same tensors every evaluation: its eager allowance is measured
    on the first pass only, and later passes carry the same table (and the same skipped sets); a set
    not kept is measured every time (its allowance must never outlive the tensors it was measured on)."""
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig, n=1)
    calls = []
    real = verify.rules.allowance
    monkeypatch.setattr(verify.rules, "allowance", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 1 << 30)
    stream = verify.StaticStream(sig, caps, str(tmp_path), "cpu", 7, False)
    first = list(stream)
    assert len(calls) == len(first) + len(stream.skipped) and set(stream.known) == set(stream.host)
    calls.clear()
    second = list(stream)
    assert calls == []
    for a, b in zip(first, second, strict=True):
        assert a.kind == b.kind and torch.equal(a.atol_floor, b.atol_floor)
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 0)
    stream = verify.StaticStream(sig, caps, str(tmp_path), "cpu", 7, False)
    calls.clear()
    n = len(list(stream)) + len(list(stream))
    assert len(calls) == n and stream.known == {}


def test_a_host_copy_keeps_the_exact_strides_of_a_non_dense_view_both_ways():
    """A region's input can be a slice of a fused buffer: the host copy and the copy back must keep its
    strides (``.to`` makes a non-dense view dense, and a kernel specialised to them reads elsewhere)."""
    base = torch.arange(4 * 10, dtype=torch.float32).reshape(4, 10)
    view = base[:, 2:7]
    host = verify.memory_plan.to_host(view)
    back = verify.memory_plan.from_host(host, "cpu")
    for t in (host, back):
        assert t.stride() == view.stride() and torch.equal(t, view)
    assert back.data_ptr() != host.data_ptr() and host.data_ptr() != view.data_ptr()


def test_a_static_stream_keeps_an_absent_optional_input_absent_in_host_memory(tmp_path, monkeypatch):
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("layer_norm", "x: f32[4,16], weight: f32[16], normalized_shape=[16], eps=1e-5"))
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 1 << 30)
    stream = verify.StaticStream(sig, [], None, "cpu", 7, False)
    first, second = list(stream), list(stream)
    assert first and len(second) == len(first) and set(stream.host) == {s.kind for s in first}
    assert all(s.tensors["bias"] is None and stream.host[s.kind]["bias"] is None for s in first + second)


def test_a_static_stream_keeps_a_set_that_fills_the_host_room_exactly(tmp_path, monkeypatch):
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 7 * 64 * 4)  # the first odd set
    stream = verify.StaticStream(sig, [], None, "cpu", 7, False)
    kinds = [s.kind for s in stream]
    assert kinds[0] == "odd:7x64" and set(stream.host) == {"odd:7x64"} and stream.host_room == 0


def test_a_static_stream_says_which_sets_it_skipped_and_why(monkeypatch):
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    real = verify.make_set
    monkeypatch.setattr(verify, "make_set", lambda kind, *a: None if kind == "adversarial:large" else real(kind, *a))
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 0)
    stream = verify.StaticStream(sig, [], None, "cpu", 7, False)
    kinds = [s.kind for s in stream]
    assert "adversarial:large" not in kinds and "large" in ops.adversarial_kinds(sig)
    assert stream.skipped == ["adversarial:large: eager PyTorch itself differs from float64 in NaN/Inf positions"]


def test_a_static_stream_reads_captures_relative_to_the_working_folder_without_a_run_dir(tmp_path, monkeypatch):
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig, n=1)
    monkeypatch.chdir(tmp_path)
    stream = verify.StaticStream(sig, caps, None, "cpu", 7, False)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(100))  # _saved_captures' first
    assert torch.equal(stream.capture(0)["x"], x)


def test_a_static_streams_odd_sets_are_drawn_from_the_seed_mode_and_their_own_size():
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    for final, mode in ((False, "search"), (True, "final")):
        odd = [s for s in verify.StaticStream(sig, [], None, "cpu", 7, final) if s.kind.startswith("odd:")]
        assert [s.kind for s in odd] == ["odd:7x64", "odd:3x63"]  # 37x64 shrunk to fit 8x64; 3x63 fits
        for s in odd:
            gen = torch.Generator().manual_seed(verify.seed_for(7, mode, "odd", s.sig.key()))
            assert torch.equal(s.tensors["x"], ops.make_inputs(s.sig, "fresh", gen, "cpu")["x"]), (mode, s.kind)


def _large_draws(monkeypatch, threads: int, seed: int = 5):
    """A draw over the parallel threshold, scaled down (threshold 10 000 elements, chunks of 3 000)."""
    from forge_pack.targets import inputs

    monkeypatch.setattr(inputs, "PARALLEL_DRAW", 10_000)
    monkeypatch.setattr(inputs, "CHUNK", 3_000)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return inputs.standard_normal((5, 4_001), torch.Generator().manual_seed(seed))
    finally:
        torch.set_num_threads(before)


def test_a_large_draw_depends_on_the_seed_alone_not_on_the_threads(monkeypatch):
    """Large draws are made in chunks on all the CPU threads (one generator draws ~0.6 GB/s: seconds per
    evaluation of a GB input); the values must still be the seed's, the same on any machine."""
    one, two = _large_draws(monkeypatch, 1), _large_draws(monkeypatch, 2)
    assert one.shape == (5, 4_001) and one.dtype == torch.float32 and torch.equal(one, two)
    assert not torch.equal(one, _large_draws(monkeypatch, 2, seed=6))
    flat = one.reshape(-1)
    chunks = [flat[a:a + 3_000] for a in range(0, flat.numel() - 3_000, 3_000)]
    assert not any(torch.equal(chunks[0], c) for c in chunks[1:])  # each chunk its own stream
    assert abs(flat.mean().item()) < 0.05 and abs(flat.std().item() - 1.0) < 0.05


def test_a_small_draw_is_the_generators_own_randn():
    from forge_pack.targets import inputs

    got = inputs.standard_normal((8, 64), torch.Generator().manual_seed(3))
    assert torch.equal(got, torch.randn((8, 64), generator=torch.Generator().manual_seed(3)))


def test_a_capture_is_read_from_disk_once_for_its_derived_and_captured_sets(tmp_path, monkeypatch):
    """A streamed hotspot's derived sets come from its captures: where the host has room they are copies of the
    captured set's host copy, bit for bit the file's, not a new read of a GB file per evaluation."""
    from forge_pack.profile import capture as capture_mod
    from forge_pack.targets import ops

    sig = ops.with_output(parse_signature("softmax", "x: f32[8,64], dim=-1"))
    caps = _saved_captures(tmp_path, sig, n=1)
    reads = []
    load = capture_mod.load_capture
    monkeypatch.setattr(capture_mod, "load_capture", lambda *a, **k: (reads.append(a[0]), load(*a, **k))[1])
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 1 << 30)
    stream = verify.StaticStream(sig, caps, str(tmp_path), "cpu", 7, False)
    want, _ = load(tmp_path / caps[0], sig, "cpu")
    sources = [stream.source(0) for _ in range(3)]
    captured = [s for s in list(stream) + list(stream) if s.kind == "captured[0]"]
    assert len(reads) == 1 and len(captured) == 2
    for t in sources + [s.tensors for s in captured]:
        assert torch.equal(t["x"], want["x"])
    assert len({t["x"].data_ptr() for t in sources}) == 3  # each a copy: a derived transform cannot reach the cache
    monkeypatch.setattr(verify.memory_plan, "host_cache_bytes", lambda device: 0)
    reads.clear()
    stream = verify.StaticStream(sig, caps, str(tmp_path), "cpu", 7, False)
    stream.source(0), stream.source(0)
    assert len(reads) == 2  # no room: read each time


def _permuted(monkeypatch, n: int, seed: int = 1, full: int = 1_000, block: int = 64, chunk: int = 200):
    """inputs.flat_permuted of 0..n-1 (float64: every value distinct), scaled down (whole randperm up to ``full``
    elements, blocks of ``block``, gathers of ``chunk``), and the sizes randperm was asked for."""
    from forge_pack.targets import inputs

    monkeypatch.setattr(inputs, "FULL_PERM", full)
    monkeypatch.setattr(inputs, "PERM_BLOCK", block)
    monkeypatch.setattr(inputs, "CHUNK", chunk)
    sizes: list[int] = []
    real = torch.randperm

    def spy(k, *a, **kw):
        sizes.append(k)
        return real(k, *a, **kw)

    monkeypatch.setattr(torch, "randperm", spy)
    got = inputs.flat_permuted(torch.arange(n, dtype=torch.float64), torch.Generator().manual_seed(seed))
    monkeypatch.setattr(torch, "randperm", real)
    return got, sizes


@pytest.mark.parametrize("n", [1_000 * 64 + 37, 64 * 64], ids=["tail", "whole_blocks"])
def test_a_large_permutation_is_a_permutation_drawn_from_small_ones(monkeypatch, n):
    """A region's derived 'permute' set of a GB input drew randperm over every element (minutes on the CPU, an
    int64 index twice the input's size): above FULL_PERM the order comes from permutations of n / block and block
    elements, and is still a permutation of every element that moves elements across blocks, the seed's alone."""
    got, sizes = _permuted(monkeypatch, n)
    assert got.shape == (n,) and torch.equal(got.sort().values, torch.arange(n, dtype=torch.float64))
    assert max(sizes) <= max(n // 64, 64) and n not in sizes
    moved = got != torch.arange(n, dtype=torch.float64)
    assert moved.float().mean() > 0.9
    whole = (n // 64) * 64
    assert (got[:whole].view(-1, 64).div(64).floor() != torch.arange(n // 64)[:, None]).any()  # across blocks
    assert torch.equal(got, _permuted(monkeypatch, n)[0])
    assert not torch.equal(got, _permuted(monkeypatch, n, seed=2)[0])


def test_a_small_permutation_is_any_order_of_the_elements(monkeypatch):
    got, sizes = _permuted(monkeypatch, 1_000)
    assert sizes == [1_000] and torch.equal(got.sort().values, torch.arange(1_000, dtype=torch.float64))
