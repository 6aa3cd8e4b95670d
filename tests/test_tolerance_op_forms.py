"""tolerance.py's op-name forms of the rules (what judge.py's timed-call checks call with an op name):
each is the rule of verdict_rules applied to that kind's TargetSpec, and no op means the generic rules."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from forge_pack.evaluate import tolerance, verdict_rules
from forge_pack.targets import registry


def test_magnitude_of_a_pool_is_the_mean_of_abs_x_per_plane():
    x = torch.tensor([[[[1.0, -3.0], [5.0, -7.0]]]])
    got = tolerance.magnitude("adaptive_avg_pool2d", {"x": x})
    assert got.dtype == torch.float64 and torch.equal(got, torch.tensor([[[[4.0]]]], dtype=torch.float64))
    assert torch.equal(got, F.adaptive_avg_pool2d(x.double().abs(), 1))


def test_magnitude_is_none_for_a_kind_bucketed_by_its_reference_and_without_an_op():
    x = {"x": torch.ones(2, 4)}
    assert tolerance.magnitude("softmax", x) is None
    assert tolerance.magnitude(None, x) is None


def test_tolerance_by_op_name_is_the_kinds_row_and_the_table_without_an_op():
    assert tolerance.spec_for("softmax") is registry.get("softmax") and tolerance.spec_for(None) is None
    assert tolerance.tolerance(None, "float16") == verdict_rules.TABLE["float16"]
    assert tolerance.tolerance("softmax", "float32") == verdict_rules.tolerance(registry.get("softmax"), "float32")


def test_compare_looks_the_allowance_up_by_the_magnitude_it_is_given():
    ref = torch.full((4,), 0.25, dtype=torch.float64)
    out = torch.tensor([0.75, 0.25, 0.25, 0.25])  # one element off by 0.5
    table = torch.zeros(2048, dtype=torch.float64)
    table[(torch.tensor(1024.0, dtype=torch.float64).view(torch.int64) >> 52).item():] = 1.0  # 1.0 from 2^10 up
    mag = torch.full((4,), 1024.0, dtype=torch.float64)
    by_mag = tolerance.compare(out, ref, "float32", "softmax", atol_floor=table, input_kind="k", magnitude=mag)
    assert (by_mag.passed, by_mag.mismatches, by_mag.input_kind) == (True, 0, "k")
    by_ref = tolerance.compare(out, ref, "float32", "softmax", atol_floor=table, input_kind="k")
    assert (by_ref.passed, by_ref.mismatches) == (False, 1)
