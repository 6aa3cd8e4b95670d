"""The whole-model output check: element-wise against eager first, else against the model in a higher precision."""

import torch

from forge_pack.evaluate.model_accuracy import EAGER_ERROR_FACTOR, compare_outputs, describe, precise_reference


def _outputs(noise_eager: float, noise_patched: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    gold = torch.randn(4, 64, 512, generator=g) * 5  # LM-like logits on a scale of ~5-20
    eager = (gold + noise_eager * torch.randn(gold.shape, generator=g)).bfloat16()
    patched = (gold + noise_patched * torch.randn(gold.shape, generator=g)).bfloat16()
    return gold, eager, patched


def test_differently_rounded_output_as_accurate_as_eager_passes_against_float32():
    gold, eager, patched = _outputs(0.1, 0.1)
    without = compare_outputs(eager, patched)
    assert not without["within_tolerance"]  # the element-wise stage alone rejects it
    r = compare_outputs(eager, patched, [gold])
    assert r["within_tolerance"]
    acc = r["accuracy"]
    assert acc["basis"] == "against the model in float32"
    assert 0.2 < acc["eager_max_error"] < 1.0 and 0.2 < acc["patched_max_error"] < 1.0
    assert 0.05 < acc["eager_rms_error"] < 0.2
    assert "eager max" in describe(acc)


def test_less_accurate_output_fails_against_float32():
    gold, eager, patched = _outputs(0.1, 0.1 * EAGER_ERROR_FACTOR * 2.5)
    r = compare_outputs(eager, patched, [gold])
    assert not r["within_tolerance"]
    assert r["accuracy"]["patched_rms_error"] > EAGER_ERROR_FACTOR * r["accuracy"]["eager_rms_error"]


def test_one_wild_element_fails_on_the_max_error_even_with_a_good_rms():
    gold, eager, patched = _outputs(0.1, 0.1)
    patched = patched.clone()
    patched[1, 2, 3] += 20
    r = compare_outputs(eager, patched, [gold])
    assert not r["within_tolerance"]
    assert r["accuracy"]["patched_max_error"] > 19


def test_a_nan_where_eager_is_finite_fails_whatever_the_float32_errors():
    gold, eager, patched = _outputs(0.1, 0.1)
    patched = patched.clone()
    patched[0, 0, 0] = float("nan")
    r = compare_outputs(eager, patched, [gold])
    assert not r["within_tolerance"]
    assert r["accuracy"]["basis"] == "against the model in float32"


def test_element_wise_pass_keeps_its_basis_and_still_records_the_errors():
    gold, eager, _ = _outputs(0.1, 0.1)
    r = compare_outputs(eager, eager.clone(), [gold])
    assert r["within_tolerance"] and r["max_abs_diff"] == 0.0
    assert r["accuracy"]["basis"] == "element-wise against eager"
    assert r["accuracy"]["patched_max_error"] == r["accuracy"]["eager_max_error"] > 0


def test_without_a_reference_the_note_says_why_and_the_element_wise_verdict_stands():
    _, eager, patched = _outputs(0.1, 0.1)
    r = compare_outputs(eager, patched, None, "no float32 reference: out of memory")
    assert not r["within_tolerance"]
    assert r["accuracy"] == {"basis": "element-wise against eager", "note": "no float32 reference: out of memory"}


def _bf16_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 32)).bfloat16()


def test_precise_reference_runs_the_same_weights_in_float32_and_leaves_the_model_alone():
    m = _bf16_mlp()
    x = torch.randn(8, 64).bfloat16()
    out, note = precise_reference(m, (x,), {}, "cpu")
    assert note is None and len(out) == 1 and out[0].dtype == torch.float32
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    expected = torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(
        x.float(), m[0].weight.float(), m[0].bias.float())), m[2].weight.float(), m[2].bias.float())
    torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        bf16 = m(x).float()
    assert 0 < float((bf16 - out[0]).abs().max()) < 0.1  # bf16 eager differs from it by rounding only


def test_precise_reference_of_a_float32_model_is_its_float64_copy():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    out, note = precise_reference(m, (x,), {}, "cpu")
    assert note is None and out[0].dtype == torch.float64 and m.weight.dtype == torch.float32
    torch.testing.assert_close(out[0], x.double() @ m.weight.double().T + m.bias.double(), rtol=0, atol=1e-15)


def test_precise_reference_of_a_model_that_draws_random_numbers_is_no_yardstick():
    class Sample(torch.nn.Module):  # a VAE's latent_dist.sample()
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x) + torch.randn(4, 8)

    m, x = Sample(), torch.randn(4, 8)
    state = torch.get_rng_state()
    out, note = precise_reference(m, (x,), {}, "cpu")
    # torch.randn in float64 draws other numbers than in float32 from the same seed: nothing to compare with
    assert out is None and "draws random numbers" in note
    assert torch.equal(torch.get_rng_state(), state)  # the caller's generator is left alone


def test_precise_reference_runs_on_a_copy_of_inputs_the_forward_writes_into():
    class Bump(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, step):
            step += 1  # an integer counter: not widened, so the caller's own tensor unless copied
            return self.lin(x) * step

    x, step = torch.randn(2, 4), torch.tensor([1])
    out, note = precise_reference(Bump(), (x,), {"step": step}, "cpu")
    assert note is None and torch.equal(step, torch.tensor([1]))


def test_precise_reference_is_skipped_without_floating_state():
    class Count(torch.nn.Module):
        def forward(self, x):
            return x.sum(-1)

    assert precise_reference(Count(), (torch.arange(6).reshape(2, 3),), {}, "cpu") == (None, None)


def _tf32_like(scale_patched: float, seed: int = 1):
    """A float32 model's outputs where eager carries TF32-like rounding (~1e-3 relative): the gold
    float64 output, eager's and a patched one with its own rounding of `scale_patched` times eager's."""
    g = torch.Generator().manual_seed(seed)
    gold = torch.randn(2, 64, 24, 24, generator=g, dtype=torch.float64) * 0.05
    eager = (gold * (1 + 1e-3 * torch.randn(gold.shape, generator=g, dtype=torch.float64))).float()
    patched = (gold * (1 + scale_patched * 1e-3 * torch.randn(gold.shape, generator=g, dtype=torch.float64))).float()
    return gold, eager, patched


def test_float32_output_with_tf32_like_rounding_passes_against_float64():
    gold, eager, patched = _tf32_like(1.0)
    assert not compare_outputs(eager, patched)["within_tolerance"]  # element-wise: 10x fp32 tolerance is too tight
    r = compare_outputs(eager, patched, [gold])
    assert r["within_tolerance"]
    assert r["accuracy"]["basis"] == "against the model in float64"
    assert r["accuracy"]["reference_dtype"] == "float64"
    assert "in float64" in describe(r["accuracy"])


def test_reference_dtype_names_the_floating_yardstick_even_after_an_integer_output():
    gold, eager, patched = _tf32_like(1.0)
    ids = torch.arange(8)  # e.g. a model that also returns token ids, first
    r = compare_outputs((ids, eager), (ids, patched), [ids, gold])
    assert r["accuracy"]["reference_dtype"] == "float64"
    assert r["accuracy"]["basis"] == "against the model in float64"


def test_float32_output_less_accurate_than_eager_fails_against_float64():
    gold, eager, patched = _tf32_like(EAGER_ERROR_FACTOR * 2.5)
    r = compare_outputs(eager, patched, [gold])
    assert not r["within_tolerance"] and r["accuracy"]["basis"] == "against the model in float64"


class _OnlyBf16(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))

    def forward(self, x):
        if x.dtype != torch.bfloat16:
            raise TypeError("this model only runs in bf16")
        return x * self.w


def test_a_model_that_cannot_run_in_float32_gives_a_note_not_a_crash():
    out, note = precise_reference(_OnlyBf16(), (torch.ones(2, 4, dtype=torch.bfloat16),), {}, "cpu")
    assert out is None and note.startswith("no float32 reference: the float32 copy of the model failed (TypeError")


def test_fresh_inputs_keep_strides_views_and_expands_and_are_independent():
    import torch

    from forge_pack.evaluate.model_accuracy import fresh_inputs

    x = torch.randn(4, 8)
    mask = torch.ones(1, 1, 1, 1).expand(2, 4, 64, 64)
    a, sliced, transposed, m = fresh_inputs((x, x[:, ::2], x.t(), mask))
    assert sliced.stride() == (8, 2) and transposed.stride() == (1, 8) and m.stride() == (0, 0, 0, 0)
    assert m.untyped_storage().nbytes() == 4  # not materialised
    assert a.untyped_storage().data_ptr() == sliced.untyped_storage().data_ptr()  # still views of one tensor
    assert a.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    a += 1  # a forward writing into its copy leaves the caller's tensor alone
    assert torch.equal(sliced, x[:, ::2] + 1) and not torch.equal(a, x)
