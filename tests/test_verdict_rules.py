"""Unit tests of forge_pack/verdict_rules.py's per-call checks, input makers and reference: each
asserts the exact verdict reason, detail text or value, so a changed rule shows up here (these
are also the tests `bench/mutation.sh verdict_rules` mutates the module against)."""

import torch

from forge_pack import verdict_rules as vr


def test_sentinel_fill_is_counted_exactly_and_the_first_unwritten_index_named():
    out = torch.zeros(2, 3)
    vr.fill_sentinel(out)
    out[0, 0] = 1.0
    out[1, 2] = 2.0
    assert vr.count_sentinel(out) == (4, "first at index (0, 1)")
    out.fill_(0.0)
    assert vr.count_sentinel(out) == (0, "")
