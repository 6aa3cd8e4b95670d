"""The fresh verification inputs: seeded by the candidate's own hash, the run's seed and the mode
(search or final), reproducible for the same key, different for any other; and the fingerprint that
notices a stray write into a cached input set.

A candidate that could predict its verification inputs could special-case them, so the seeding is
a guard in its own right (mutation testing found no test that missed it).
"""

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
