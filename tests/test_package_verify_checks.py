"""The shipped ``python -m <package> verify`` (templates/package/_verify.py), in process: the module
is imported from the template inside a stand-in package (its patcher, manifest and rules), so each
of its checks is seen to decide a row with the exact reason and detail, and ``run`` to print and
return what it should.

Fast on purpose: these are the tests `make mutation` runs against templates/package/_verify.py
(the end-to-end package tests in test_pack_verify_rules.py run the same code in a subprocess)."""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
from pathlib import Path

import pytest
import torch

from forge_pack.evaluate import verdict_rules
from forge_pack.evaluate import verify as judge
from forge_pack.targets import dtypes, registry
from forge_pack.targets.sigparse import parse_signature

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "templates" / "package"


class FakeTarget:
    def __init__(self, tid, fn):
        self.id, self.fn = tid, fn


class FakePatcher:
    def __init__(self):
        self.ok, self.load_error, self.manifest, self.targets = True, "", {}, []

    def load(self):
        return self.ok


def _import_verify():
    """Import the template once per process, inside a stand-in package (templates.package) that
    holds what the real package gives it: the patcher, the copied rules, the originals. Once: the
    module is large under mutation testing, and every test of it reuses the same import."""
    mod = sys.modules.get("templates.package._verify")
    if mod is not None and getattr(mod, "_stand_in", False):
        return mod
    top = types.ModuleType("templates")
    top.__path__ = [str(ROOT / "templates")]
    pkg = types.ModuleType("templates.package")
    pkg.__path__ = [str(TEMPLATE)]
    pkg._PATCHER = FakePatcher()
    pkg._verdict_rules = verdict_rules
    patch = types.ModuleType("templates.package._patch")
    patch.ORIGINALS = {}
    # the package's copy of the target registry is forge_pack/targets itself (vendored verbatim)
    patch.TARGETS = registry
    patch.DTYPES = {name: dtypes.torch_dtype(name) for name in dtypes.CANONICAL}
    for name, m in (("templates", top), ("templates.package", pkg),
                    ("templates.package._verdict_rules", verdict_rules), ("templates.package._patch", patch)):
        sys.modules[name] = m
    mod = importlib.import_module("templates.package._verify")
    mod._stand_in = True
    return mod


@pytest.fixture
def pv(monkeypatch, tmp_path):
    """templates/package/_verify.py as templates.package._verify, with a fresh patcher and HERE at tmp_path."""
    mod = _import_verify()
    patcher = FakePatcher()
    monkeypatch.setattr(mod, "_PATCHER", patcher)
    monkeypatch.setattr(mod, "HERE", tmp_path)
    monkeypatch.setattr(mod, "ORIGINALS", {})
    mod._test_patcher = patcher
    return mod


SIG = parse_signature("softmax", "x: f32[4,16], dim=-1")
LN = parse_signature("layer_norm", "x: f32[4,16], weight: f32[16], normalized_shape=[16], eps=1e-5")


def ln_target():
    """layer_norm with an absent bias: the manifest lists it with no spec."""
    t = target(sig=LN)
    assert ["bias", None] in t["signature"]["inputs"]
    return t


def target(tid="t0", fixtures=(), sig=SIG):
    tol = verdict_rules.tolerance(registry.get(sig.op), sig.output.dtype)
    return {"id": tid, "op": sig.op, "signature": sig.to_json(), "fixtures": list(fixtures),
            "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "eager_slack": verdict_rules.EAGER_SLACK}}


def honest(x):
    return torch.softmax(x, -1)


def x_of(seed=0):
    return {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))}


# ---------------------------------------------------------------- helpers


def test_rules_hash_is_of_the_text_below_the_generated_header(pv, tmp_path):
    body = b"RULES = 1\n"
    (tmp_path / "_verdict_rules.py").write_bytes(b"# generated\n" + pv.HEADER_END + body)
    assert pv.rules_sha256() == hashlib.sha256(body).hexdigest()
    (tmp_path / "_verdict_rules.py").write_bytes(pv.HEADER_END + body)  # the header line first
    assert pv.rules_sha256() == hashlib.sha256(body).hexdigest()
    (tmp_path / "_verdict_rules.py").write_bytes(body)  # no header: the whole file
    assert pv.rules_sha256() == hashlib.sha256(body).hexdigest()


def test_lookup_prefers_the_original_recorded_before_patching(pv, monkeypatch):
    sentinel = object()
    monkeypatch.setattr(pv, "ORIGINALS", {("torch", "softmax"): sentinel})
    assert pv._lookup("torch", "softmax") is sentinel
    assert pv._lookup("torch", "log_softmax") is torch.log_softmax
    assert pv._lookup("torch.nn.functional", "layer_norm") is torch.nn.functional.layer_norm


def test_plain_inputs_and_params_come_from_the_manifest_signature(pv):
    t = ln_target()
    assert pv._plain_inputs(t) == [("x", ("float32", (4, 16), (16, 1))), ("weight", ("float32", (16,), (1,))),
                                   ("bias", None)]
    assert pv._params(t) == {"eps": 1e-5, "normalized_shape": [16]}


def test_seed_is_the_builds_seed_for(pv):
    assert pv._seed(5, "t0", "fresh", 1) == judge.seed_for(5, "t0", "fresh", 1)


def test_eager_is_the_original_op_of_the_target(pv):
    x = x_of()
    assert torch.equal(pv.eager(target())(x), torch.softmax(x["x"], -1))


def test_draw_uses_the_copied_generators_with_the_seed(pv):
    t = target()
    got = pv.draw(t, "large", 9, "cpu")["x"]
    want = registry.get("softmax").make_inputs(pv._plain_inputs(t), "large", torch.Generator().manual_seed(9), "cpu")["x"]
    assert torch.equal(got, want)


def test_fixture_loads_the_shipped_tensors_in_the_verified_layout(pv, tmp_path):
    from safetensors.torch import save_file

    x = torch.arange(64, dtype=torch.float32)
    save_file({"in.x": x, "in.weight": torch.ones(16)}, str(tmp_path / "f.safetensors"))
    got = pv._fixture(ln_target(), "f.safetensors", "cpu")
    assert got["bias"] is None and torch.equal(got["weight"], torch.ones(16))
    assert torch.equal(got["x"], x.view(4, 16)) and got["x"].stride() == (16, 1) and got["x"].dtype == torch.float32


def test_derive_picks_a_source_then_transforms_it_from_one_generator(pv):
    t = target()
    made = []
    sources = [lambda i=i: made.append(i) or x_of(i) for i in range(3)]
    got = pv.derive(t, "scale", sources, 21)["x"]
    gen = torch.Generator().manual_seed(21)
    pick = verdict_rules.derived_source(3, gen)
    want = verdict_rules.derive_inputs(registry.get("softmax"), pv._params(t), "scale", x_of(pick), gen)["x"]
    assert made == [pick] and torch.equal(got, want)


def test_input_sets_are_captured_fresh_derived_adversarial_with_their_seeds(pv, tmp_path, monkeypatch):
    t = target(fixtures=["a.safetensors"])
    loaded = []
    monkeypatch.setattr(pv, "_fixture", lambda t, rel, device: loaded.append((rel, device)) or x_of(77))
    sets = pv.input_sets(t, "cpu", 5, 2)
    assert [k for k, _ in sets] == (["captured[0]", "fresh[0]", "fresh[1]"]
                                    + [f"derived:{k}" for k in verdict_rules.DERIVED_KINDS]
                                    + [f"adversarial:{k}" for k in registry.get("softmax").adversarial])
    made = {k: m() for k, m in sets}
    assert torch.equal(made["captured[0]"]["x"], x_of(77)["x"])
    assert torch.equal(made["fresh[1]"]["x"], pv.draw(t, "fresh", pv._seed(5, "t0", "fresh", 1), "cpu")["x"])
    k = verdict_rules.DERIVED_KINDS[0]
    want = pv.derive(t, k, [lambda: x_of(77)], pv._seed(5, "t0", "derived", k))["x"]
    assert torch.equal(made[f"derived:{k}"]["x"], want)  # derived from the shipped fixture
    a = registry.get("softmax").adversarial[0]
    assert torch.equal(made[f"adversarial:{a}"]["x"], pv.draw(t, a, pv._seed(5, "t0", "adversarial", a), "cpu")["x"])
    assert loaded and all(x == ("a.safetensors", "cpu") for x in loaded)


def test_input_sets_without_fixtures_derive_from_the_fresh_draws(pv):
    t = target()
    sets = dict(pv.input_sets(t, "cpu", 5, 2))
    assert "captured[0]" not in sets
    k = verdict_rules.DERIVED_KINDS[1]
    fresh = [lambda i=i: pv.draw(t, "fresh", pv._seed(5, "t0", "fresh", i), "cpu") for i in range(2)]
    want = pv.derive(t, k, fresh, pv._seed(5, "t0", "derived", k))["x"]
    assert torch.equal(sets[f"derived:{k}"]()["x"], want)


def test_input_sets_with_no_fresh_draw_derive_from_fresh_zero(pv):
    t = target()
    sets = dict(pv.input_sets(t, "cpu", 5, 0))
    assert [k for k in sets if k.startswith("fresh")] == []
    k = verdict_rules.DERIVED_KINDS[0]
    src = [lambda: pv.draw(t, "fresh", pv._seed(5, "t0", "fresh", 0), "cpu")]
    assert torch.equal(sets[f"derived:{k}"]()["x"], pv.derive(t, k, src, pv._seed(5, "t0", "derived", k))["x"])


def test_sync_waits_only_on_cuda_devices(pv, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(a))
    pv._sync("cpu")
    assert calls == []
    pv._sync("cuda:1")
    assert calls == [()]


def test_junk_fill_is_off_where_the_flag_cannot_be_reached(pv, monkeypatch):
    import ctypes

    def missing(path):
        raise OSError("no such library")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert pv._cpu_junk_fill() is False


def test_junk_fill_is_off_where_this_torch_lacks_the_flag(pv, monkeypatch):
    import ctypes

    class Lib:
        pass

    monkeypatch.setattr(ctypes, "CDLL", lambda path: Lib())
    monkeypatch.setattr(ctypes.c_bool, "in_dll", classmethod(lambda cls, lib, name: (_ for _ in ()).throw(
        ValueError(name))))
    assert pv._cpu_junk_fill() is False


def test_junk_fill_reads_the_flag_from_torchs_own_c10(pv, monkeypatch):
    import ctypes

    opened = []
    real = ctypes.CDLL

    def spy(path):
        opened.append(path)
        return real(path)

    monkeypatch.setattr(ctypes, "CDLL", spy)
    on = pv._cpu_junk_fill()
    assert opened == [str(Path(torch.__file__).parent / "lib" / "libc10.so")]
    if on:  # a new block now holds the junk pattern
        assert int(torch.empty(3, dtype=torch.int32)[2]) == 0x7FEDBEEF


def test_junk_becomes_the_sentinel_in_four_byte_outputs(pv):
    out = torch.ones(2, 3)
    out.view(torch.int32)[0, 1] = 0x7FEDBEEF
    out.view(torch.int32)[1, 2] = 0x7FEDBEEF
    pv._junk_to_sentinel(out)
    assert verdict_rules.count_sentinel(out) == (2, "first at index (0, 1)")
    assert float(out[0, 0]) == 1.0 and float(out[1, 1]) == 1.0


def test_junk_in_two_byte_outputs_counts_only_its_nan_half(pv):
    out = torch.ones(4, dtype=torch.bfloat16)
    raw = out.view(torch.int16)
    raw[0] = torch.tensor(0xBEEF, dtype=torch.int32).to(torch.int16)  # the number half: a value a kernel may write
    raw[1] = 0x7FED
    raw[2] = 0x7FED  # the NaN half at a place where the pattern has the number half: written by the kernel
    pv._junk_to_sentinel(out)
    assert verdict_rules.count_sentinel(out) == (1, "first at index (1,)")
    assert int(raw[0]) == int(torch.tensor(0xBEEF, dtype=torch.int32).to(torch.int16))
    assert int(raw[2]) == 0x7FED


def test_call_on_cpu_runs_the_op_without_autograd_and_marks_junk(pv):
    seen = []

    def op(x):
        seen.append(torch.is_inference_mode_enabled())
        out = torch.softmax(x, -1)
        out.view(torch.int32)[0, 0] = 0x7FEDBEEF
        return out

    x = x_of()["x"]
    out, armed = pv._call(op, [x], {}, "cpu", True)
    assert seen == [True] and armed is True and verdict_rules.count_sentinel(out)[0] == 1
    out, armed = pv._call(op, [x], {}, "cpu", False)
    assert armed is False and verdict_rules.count_sentinel(out)[0] == 0


def test_overlaps_is_exact_at_the_boundary(pv):
    buf = bytearray(32)
    a = torch.frombuffer(memoryview(buf)[0:8], dtype=torch.uint8)
    b = torch.frombuffer(memoryview(buf)[8:16], dtype=torch.uint8)
    c = torch.frombuffer(memoryview(buf)[7:16], dtype=torch.uint8)
    one = torch.frombuffer(memoryview(buf)[3:4], dtype=torch.uint8)
    assert not pv._overlaps(a, b) and not pv._overlaps(b, a)
    assert pv._overlaps(a, c) and pv._overlaps(c, a) and pv._overlaps(one, a) and pv._overlaps(a, one)
    assert not pv._overlaps(torch.empty(0), a) and not pv._overlaps(a, torch.empty(0))


def test_fmt_right_aligns_numbers_and_dashes(pv):
    assert pv._fmt(None, 9) == "        -"
    assert pv._fmt(0.000123, 9) == " 1.23e-04"


# ---------------------------------------------------------------- check_set


def test_check_set_passes_the_original_op_with_its_errors(pv):
    r = pv.check_set(target(), honest, "fresh[0]", x_of(), "cpu")
    assert r["reason"] is None and r["detail"] == "" and r["kind"] == "fresh[0]"
    assert r["max_abs"] == 0.0 or r["max_abs"] < 1e-6
    assert (r["atol"], r["rtol"]) == (1e-8, 1e-4) and r["sentinel"] is False and r["allowance"] >= 0.0


def test_check_set_row_errors_and_allowance_are_the_rules(pv):
    x = x_of(3)

    def off(x):
        out = torch.softmax(x, -1)
        out[0, 0] += 1e-5
        return out

    r = pv.check_set(target(), off, "k", x, "cpu")
    ref = torch.softmax(x["x"].double(), -1)
    allow = verdict_rules.allowance(torch.softmax(x["x"], -1), ref, "float32", registry.get("softmax"))
    cmp = verdict_rules.compare(off(x["x"]), ref, "float32", registry.get("softmax"), atol_floor=allow, input_kind="k")
    assert r["allowance"] == float(allow.max())
    assert (r["max_abs"], r["max_rel"]) == (cmp.max_abs_err, cmp.max_rel_err)


def test_check_set_skips_a_set_where_eager_breaks_parity(pv, monkeypatch):
    monkeypatch.setattr(verdict_rules, "allowance", lambda *a: None)
    r = pv.check_set(target(), honest, "adversarial:large", x_of(), "cpu")
    assert (r["reason"], r["detail"]) == ("skipped", "eager PyTorch itself differs from float64 in NaN/Inf positions")
    assert r["allowance"] is None and r["kind"] == "adversarial:large"


def test_check_set_rejects_a_wrong_output_as_mismatch(pv):
    def wrong(x):
        out = torch.softmax(x, -1)
        out[1, 2] += 0.25
        return out

    r = pv.check_set(target(), wrong, "fresh[0]", x_of(), "cpu")
    assert r["reason"] == "mismatch" and r["detail"].startswith("fresh[0]: 1 of 64 elements out of tolerance")
    assert r["max_abs"] == pytest.approx(0.25, abs=1e-6)


def _second_key(pv, monkeypatch, key, eager_error: float):
    """Softmax given a second allowance key (a region rounded in 16-bit floats has one): eager is exact for the
    set's first allowance, then errs by ``eager_error`` at [0, 0] (what the allowance under the key is built
    from)."""
    import dataclasses

    spec = dataclasses.replace(registry.get("softmax"), sensitivity=key)
    monkeypatch.setattr(pv, "_spec", lambda t: spec)
    calls = []

    def eager(t):
        assert t["id"] == "t0"  # the target's own entry

        def run(x):
            out = torch.softmax(x["x"], -1)
            if calls:
                out[0, 0] += eager_error
            calls.append(1)
            return out
        return run

    monkeypatch.setattr(pv, "eager", eager)
    return calls


def _off_by_half(x):
    out = torch.softmax(x, -1)
    out[0, 0] += 0.5
    return out


def test_check_set_judges_a_mismatch_again_under_the_kinds_second_key_as_the_build_does(pv, monkeypatch):
    x = x_of()
    calls = _second_key(pv, monkeypatch, lambda got: torch.ones(4, 16, dtype=torch.float64) if got is x else None, 0.4)
    r = pv.check_set(target(), _off_by_half, "fresh[0]", x, "cpu")
    assert r["reason"] is None and len(calls) == 2
    assert r["allowance"] == pytest.approx(0.8, rel=1e-6)  # 2 x eager's error, bucketed by the second key
    assert r["binding"]["allowance"] == pytest.approx(0.8, rel=1e-6) and r["binding"]["ratio"] <= 1


@pytest.mark.parametrize("key,eager_error", [(None, 0.4), (1.0, 0.1)], ids=["no second key", "beyond eager"])
def test_check_set_keeps_a_mismatch_the_second_key_does_not_excuse(pv, monkeypatch, key, eager_error):
    _second_key(pv, monkeypatch, lambda x: None if key is None else torch.full((4, 16), key, dtype=torch.float64),
                eager_error)
    r = pv.check_set(target(), _off_by_half, "fresh[0]", x_of(), "cpu")
    assert r["reason"] == "mismatch" and r["detail"].startswith("fresh[0]: 1 of 64 elements out of tolerance")
    assert r["allowance"] < 0.01


def test_check_set_rejects_an_input_written_by_the_op(pv):
    x = x_of()
    original = x["x"].clone()

    def writes(x):
        out = torch.softmax(x, -1)
        x[0, 3] = 8.0
        return out

    r = pv.check_set(target(), writes, "fresh[0]", x, "cpu")
    assert r["reason"] == "input_mutated"
    assert r["detail"].startswith("fresh[0]: input `x` changed during the first call (1 elements, first at (0, 3)")
    assert not torch.equal(x["x"], original)


def test_check_set_rejects_an_input_written_on_the_second_call(pv):
    calls = []

    def writes(x):
        calls.append(1)
        out = torch.softmax(x, -1)
        if len(calls) == 2:
            x[2, 2] = 8.0
        return out

    r = pv.check_set(target(), writes, "fresh[0]", x_of(), "cpu")
    assert r["reason"] == "input_mutated" and "during the second call" in r["detail"]


def test_check_set_rejects_an_output_that_is_the_input(pv):
    r = pv.check_set(target(), lambda x: x, "fresh[0]", x_of(), "cpu")
    assert (r["reason"], r["detail"]) == ("aliasing", "fresh[0]: the output shares memory with input x")


def test_check_set_rejects_an_output_in_another_layout(pv):
    r = pv.check_set(target(), lambda x: torch.softmax(x, -1).t().contiguous().t(), "fresh[0]", x_of(), "cpu")
    assert (r["reason"], r["detail"]) == (
        "layout", "fresh[0]: output float32[4, 16] strides [1, 4], verified float32[4, 16] [16, 1]")


def test_check_set_rejects_an_output_in_another_dtype(pv):
    r = pv.check_set(target(), lambda x: torch.softmax(x, -1).double(), "fresh[0]", x_of(), "cpu")
    assert (r["reason"], r["detail"]) == (
        "layout", "fresh[0]: output float64[4, 16] strides [16, 1], verified float32[4, 16] [16, 1]")


def test_check_set_turns_a_refused_call_into_launch_error(pv):
    def refuses(x):
        raise RuntimeError("kernel launch failed: " + "z" * 400 + "\nsecond line")

    r = pv.check_set(target(), refuses, "fresh[0]", x_of(), "cpu")
    assert r["reason"] == "launch_error"
    assert r["detail"] == "fresh[0]: " + ("kernel launch failed: " + "z" * 400)[:300]


def test_check_set_rejects_a_second_call_that_differs_bitwise(pv):
    calls = []

    def racy(x):
        calls.append(1)
        out = torch.softmax(x, -1)
        if len(calls) == 2:
            out[3, 3] = torch.nextafter(out[3, 3], torch.tensor(2.0))
        return out

    r = pv.check_set(target(), racy, "fresh[0]", x_of(), "cpu")
    assert r["reason"] == "nondeterministic"
    assert r["detail"].startswith("fresh[0]: two runs on the same input differ bitwise (1 elements, first at (3, 3)")


def test_check_set_rejects_a_second_output_that_is_the_input(pv):
    calls = []

    def second_alias(x):
        calls.append(1)
        return torch.softmax(x, -1) if len(calls) == 1 else x

    r = pv.check_set(target(), second_alias, "fresh[0]", x_of(), "cpu")
    assert (r["reason"], r["detail"]) == ("aliasing", "fresh[0]: the output shares memory with input x")


def test_check_set_finds_unwritten_elements_through_the_allocator_junk(pv, monkeypatch):
    monkeypatch.setattr(pv, "_call", lambda fn, args, spec, device, junk: (_junky(), True))
    r = pv.check_set(target(), honest, "fresh[0]", x_of(), "cpu", junk=True)
    assert r["reason"] == "unwritten_output" and r["sentinel"] is True
    assert r["detail"] == "fresh[0]: 1 of 64 output elements never written (first at index (0, 0))"


def _junky():
    out = torch.softmax(x_of()["x"], -1)
    verdict_rules.fill_sentinel(out[0, :1])
    return out


def test_check_set_sentinel_is_armed_only_when_both_calls_were(pv, monkeypatch):
    armed = iter([True, False])
    monkeypatch.setattr(pv, "_call", lambda fn, args, spec, device, junk: (torch.softmax(args[0], -1), next(armed)))
    r = pv.check_set(target(), honest, "fresh[0]", x_of(), "cpu", junk=True)
    assert r["reason"] is None and r["sentinel"] is False
    armed = iter([True, True])
    r = pv.check_set(target(), honest, "fresh[0]", x_of(), "cpu", junk=True)
    assert r["sentinel"] is True


def test_check_set_passes_only_the_present_inputs_to_the_op(pv):
    got = []

    def op(*args):
        got.append(len(args))
        return torch.nn.functional.layer_norm(args[0], (16,), args[1], None, 1e-5)

    x = {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(1)), "weight": torch.ones(16), "bias": None}
    r = pv.check_set(ln_target(), op, "fresh[0]", x, "cpu")
    assert r["reason"] is None and got == [2, 2]


# ---------------------------------------------------------------- run


def _manifest(pv, tmp_path, targets, fn=honest, sha=None):
    body = b"# the rules\n"
    (tmp_path / "_verdict_rules.py").write_bytes(b"# header\n" + pv.HEADER_END + body)
    patcher = pv._test_patcher
    patcher.manifest = {"targets": targets,
                        "verify_rules": {"source_sha256": sha or hashlib.sha256(body).hexdigest()}}
    patcher.targets = [FakeTarget(t["id"], fn) for t in targets]
    return patcher


def test_run_passes_an_honest_package_and_prints_a_row_per_set(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    _manifest(pv, tmp_path, [target()])
    lines = []
    assert pv.run("cpu", fresh=1, seed=5, say=lines.append) == 0
    n = 1 + len(verdict_rules.DERIVED_KINDS) + len(registry.get("softmax").adversarial)
    assert lines[0].startswith("verification rules: forge_pack/evaluate/verdict_rules.py sha256 ")
    assert lines[0].endswith("(the build's final check); fresh and derived inputs seed 5; device cpu")
    assert lines[1] == ("an element passes when |out - ref| <= max(atol, eager allowance) + rtol * |ref| against "
                        "float64; allowance: 2x eager PyTorch's own error at that magnitude. 'max rel' is "
                        "|out - ref| / max(|ref|, atol): where |ref| is near zero the absolute term sets the bound, "
                        "so a relative error above rtol passes there while the absolute error stays within it. "
                        "Under each row: the element closest to its bound.")
    assert lines[2] == (f"{'target':<7} {'input':<24} {'max abs':>9} {'max rel':>9} {'atol':>9} {'allow<=':>9} "
                        f"{'rtol':>9} {'sentinel':>8}  result")
    rows, bounds = lines[3:-1:2], lines[4:-1:2]  # each row, then its element closest to the bound
    assert len(rows) == len(bounds) == n and all(r.startswith("t0      ") and r.endswith("      no  PASS") for r in rows)
    assert all(b.startswith(" " * 33 + "closest to its bound: |err| ") and " -> ok (" in b for b in bounds), bounds
    assert rows[0].startswith("t0      fresh[0]                 ")
    assert lines[-1] == f"PASS: 1 kernel, 0 failing checks on cpu ({n} input sets, seed 5)"


def test_run_counts_failing_sets_of_every_kernel(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)

    def wrong(x):
        out = torch.softmax(x, -1)
        out[0, 0] += 0.5
        return out

    _manifest(pv, tmp_path, [target("t0"), target("t1")], fn=wrong)
    lines = []
    assert pv.run("cpu", fresh=1, seed=3, say=lines.append) == 1
    n = 1 + len(verdict_rules.DERIVED_KINDS) + len(registry.get("softmax").adversarial)
    rows = [ln for ln in lines if ln.startswith(("t0 ", "t1 "))]
    fails = [r for r in rows if "  FAIL " in r]
    assert len(rows) == 2 * n and len(fails) >= 2 * (n - 2)
    assert "FAIL mismatch: fresh[0]: 1 of 64 elements out of tolerance" in rows[0]
    assert lines[-1] == f"FAIL: 2 kernels, {len(fails)} failing checks on cpu ({2 * n} input sets, seed 3)"


def test_run_prints_skipped_sets_and_leaves_them_out_of_the_count(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    monkeypatch.setattr(pv, "check_set", lambda t, fn, kind, x, device, junk: {
        "reason": "skipped", "detail": "eager differs"})
    _manifest(pv, tmp_path, [target()])
    lines = []
    assert pv.run("cpu", fresh=1, seed=3, say=lines.append) == 0
    assert lines[3] == "t0      fresh[0]                 skipped: eager differs"
    assert lines[-1] == "PASS: 1 kernel, 0 failing checks on cpu (0 input sets, seed 3)"


def test_run_row_shows_the_numbers_and_the_armed_sentinel(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: True)
    seen = []

    def row(t, fn, kind, x, device, junk):
        seen.append(junk)
        return {"reason": None, "detail": "", "max_abs": 1.5e-7, "max_rel": 2e-3, "atol": 1e-8, "allowance": 3e-7,
                "rtol": 1e-4, "sentinel": True}

    monkeypatch.setattr(pv, "check_set", row)
    _manifest(pv, tmp_path, [target()])
    lines = []
    assert pv.run("cpu", fresh=1, seed=3, say=lines.append) == 0
    assert lines[3] == "t0      fresh[0]                  1.50e-07  2.00e-03  1.00e-08  3.00e-07  1.00e-04    armed  PASS"
    assert set(seen) == {True}


def test_run_refuses_a_rules_file_that_is_not_the_builds(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    _manifest(pv, tmp_path, [target()], sha="ab" * 32)
    have = pv.rules_sha256()
    lines = []
    assert pv.run("cpu", fresh=0, seed=1, say=lines.append) == 1
    assert lines[0] == (f"FAIL rules: _verdict_rules.py (sha256 {have[:16]}) is not the file this package was built "
                        f"with ({'ab' * 8}): reinstall the package")
    assert lines[-1].startswith("FAIL: 1 kernel, 1 failing checks on cpu")


def test_run_refuses_a_manifest_without_a_rules_record(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    p = _manifest(pv, tmp_path, [target()])
    del p.manifest["verify_rules"]
    lines = []
    assert pv.run("cpu", fresh=0, seed=1, say=lines.append) == 1
    assert lines[0].endswith("is not the file this package was built with (none recorded): reinstall the package")


def test_run_refuses_a_manifest_tolerance_that_is_not_the_rules(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    t = target()
    t["tolerance"] = {**t["tolerance"], "rtol": 0.5}
    _manifest(pv, tmp_path, [t])
    lines = []
    assert pv.run("cpu", fresh=0, seed=1, say=lines.append) == 1
    tol = verdict_rules.tolerance(registry.get("softmax"), "float32")
    assert lines[3] == (f"t0      FAIL tolerance: the manifest records atol {tol.atol}, rtol 0.5, slack "
                        f"{verdict_rules.EAGER_SLACK}; the rules say {tol.atol}, {tol.rtol}, {verdict_rules.EAGER_SLACK}")
    assert lines[-1].startswith("FAIL: 1 kernel, 1 failing checks on cpu")


def test_run_refuses_a_manifest_whose_slack_is_not_the_rules(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    t = target()
    t["tolerance"] = {k: v for k, v in t["tolerance"].items() if k != "eager_slack"}
    _manifest(pv, tmp_path, [t])
    lines = []
    assert pv.run("cpu", fresh=0, seed=1, say=lines.append) == 1
    assert "FAIL tolerance: " in lines[3] and ", slack None; " in lines[3]


def test_run_cannot_verify_a_package_that_does_not_load(pv, tmp_path):
    p = _manifest(pv, tmp_path, [target()])
    p.ok, p.load_error = False, "no compatible GPU"
    lines = []
    assert pv.run("cpu", say=lines.append) == 1
    assert lines == ["FAIL: cannot verify on this machine: no compatible GPU"]


def test_run_draws_a_seed_when_none_is_given(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    monkeypatch.setattr(pv.os, "urandom", lambda n: bytes([7, 0, 0, 0]) if n == 4 else b"\xff" * n)
    _manifest(pv, tmp_path, [target()])
    lines = []
    pv.run("cpu", fresh=0, say=lines.append)
    assert "fresh and derived inputs seed 7;" in lines[0] and lines[-1].endswith(", seed 7)")


def test_run_uses_the_junk_fill_only_on_cpu(pv, tmp_path, monkeypatch):
    asked, seen = [], []
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: asked.append(1) or True)
    monkeypatch.setattr(pv, "check_set", lambda t, fn, kind, x, device, junk: seen.append((device, junk)) or {
        "reason": "skipped", "detail": ""})
    monkeypatch.setattr(pv, "input_sets", lambda t, device, seed, fresh: [("fresh[0]", lambda: {})])
    _manifest(pv, tmp_path, [target()])
    pv.run("cuda", fresh=1, seed=1, say=lambda s: None)
    assert asked == [] and seen == [("cuda", False)]
    pv.run("cpu", fresh=1, seed=1, say=lambda s: None)
    assert asked == [1] and seen[-1] == ("cpu", True)


def test_run_passes_fresh_count_and_seed_to_the_input_sets(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    got = []
    monkeypatch.setattr(pv, "input_sets", lambda t, device, seed, fresh: got.append((t["id"], device, seed, fresh))
                        or [])
    _manifest(pv, tmp_path, [target()])
    pv.run("cpu", fresh=4, seed=9, say=lambda s: None)
    assert got == [("t0", "cpu", 9, 4)]


# ---------------------------------------------------------------- exact inputs of each step


def test_seed_keeps_63_bits_of_the_hash(pv):
    seeds = [pv._seed(i, "t0") for i in range(16)]
    assert seeds == [judge.seed_for(i, "t0") for i in range(16)] and any(s & 1 for s in seeds)


def test_rules_hash_splits_at_the_first_header_end(pv, tmp_path):
    body = pv.HEADER_END + b"RULES = 2\n"  # the marker line again inside the body
    (tmp_path / "_verdict_rules.py").write_bytes(b"# generated\n" + pv.HEADER_END + body)
    assert pv.rules_sha256() == hashlib.sha256(body).hexdigest()


def test_the_reference_and_eager_use_the_originals_not_a_patched_op(pv, monkeypatch):
    real = torch.softmax
    monkeypatch.setattr(pv, "ORIGINALS", {("torch", "softmax"): real})
    monkeypatch.setattr(torch, "softmax", lambda x, dim, *a, **k: torch.zeros_like(x))
    x = x_of()
    assert torch.equal(pv.eager(target())(x), real(x["x"], -1))
    r = pv.check_set(target(), lambda x: real(x, -1), "fresh[0]", x, "cpu")
    assert r["reason"] is None


def test_eager_casts_to_the_manifests_output_dtype(pv):
    t = target(sig=parse_signature("softmax", "x: f32[4,16], dim=-1, dtype=float64"))
    assert t["signature"]["output"]["dtype"] == "float64"
    out = pv.eager(t)(x_of())
    assert out.dtype == torch.float64


def test_fixture_skips_an_absent_input_listed_first(pv, tmp_path):
    from safetensors.torch import save_file

    t = target()
    t["signature"]["inputs"] = [["bias", None], ["x", {"dtype": "bfloat16", "shape": [2, 3], "strides": [3, 1]}]]
    save_file({"in.x": torch.arange(6, dtype=torch.bfloat16)}, str(tmp_path / "g.safetensors"))
    got = pv._fixture(t, "g.safetensors", "cpu")
    assert got["bias"] is None and got["x"].dtype == torch.bfloat16
    assert torch.equal(got["x"], torch.arange(6, dtype=torch.bfloat16).view(2, 3))


def test_input_sets_load_fixtures_of_their_own_target(pv, monkeypatch):
    t = target(fixtures=["a.safetensors"])
    seen = []
    monkeypatch.setattr(pv, "_fixture", lambda tt, rel, device: seen.append(tt) or x_of(1))
    dict(pv.input_sets(t, "cpu", 5, 0))["captured[0]"]()
    assert seen == [t]


def test_derive_passes_the_targets_op_to_the_rules(pv):
    t = target(sig=LN)
    for kind in verdict_rules.DERIVED_KINDS:
        src = {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(2)), "weight": torch.ones(16),
               "bias": None}
        got = pv.derive(t, kind, [lambda: src], 5)
        gen = torch.Generator().manual_seed(5)
        verdict_rules.derived_source(1, gen)
        want = verdict_rules.derive_inputs(registry.get("layer_norm"), pv._params(t), kind, src, gen)
        assert all((got[k] is None and want[k] is None) or torch.equal(got[k], want[k]) for k in want), kind


def test_junk_to_sentinel_follows_the_storage_offset(pv):
    base = torch.ones(5, dtype=torch.bfloat16)
    out = base[1:]  # storage offset 1: element 0 sits where the pattern has its NaN half
    out.view(torch.int16)[0] = 0x7FED
    out.view(torch.int16)[1] = 0x7FED
    pv._junk_to_sentinel(out)
    assert verdict_rules.count_sentinel(out) == (1, "first at index (0,)")


def test_junk_fill_sets_c10s_flag_and_probes_a_new_block(pv, monkeypatch):
    import ctypes

    class Flag:
        value = False

    flags = {}

    def in_dll(cls, lib, name):
        flags[name] = Flag()
        return flags[name]

    monkeypatch.setattr(ctypes, "CDLL", lambda path: object())
    monkeypatch.setattr(ctypes.c_bool, "in_dll", classmethod(in_dll))
    probes = []

    def empty(n, dtype=None):
        probes.append((n, dtype))
        return torch.full((n,), 0x7FEDBEEF, dtype=torch.int32)

    monkeypatch.setattr(pv.torch, "empty", empty)
    assert pv._cpu_junk_fill() is True
    assert list(flags) == ["FLAGS_caffe2_cpu_allocator_do_junk_fill"] and flags[list(flags)[0]].value is True
    assert probes == [(2, torch.int32)]
    monkeypatch.setattr(pv.torch, "empty", lambda n, dtype=None: torch.tensor([0x7FEDBEEF, 0], dtype=torch.int32))
    assert pv._cpu_junk_fill() is False  # one element not junk: the fill is not on


def test_call_on_cuda_hands_the_op_the_sentinel_block(pv, monkeypatch):
    log, blocks = [], []
    monkeypatch.setattr(pv.torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    monkeypatch.setattr(pv, "_sync", lambda device: log.append(("sync", device)))

    real = torch.empty_strided

    def empty_strided(shape, strides, dtype=None, device=None):
        log.append(("block", tuple(shape), tuple(strides), dtype, device))
        blocks.append(real(shape, strides, dtype=dtype))
        return blocks[-1]

    monkeypatch.setattr(pv.torch, "empty_strided", empty_strided)
    spec = {"shape": [4, 16], "strides": [1, 4], "dtype": "bfloat16"}

    def takes_the_block(x):
        log.append(("sentinel", verdict_rules.count_sentinel(blocks[0])[0]))
        return blocks[0]

    out, armed = pv._call(takes_the_block, [x_of()["x"]], spec, "cuda:0", junk=True)
    assert armed is True and out is blocks[0]
    assert log == ["empty_cache", ("block", (4, 16), (1, 4), torch.bfloat16, "cuda:0"), ("sync", "cuda:0"),
                   ("sentinel", 64), ("sync", "cuda:0")]
    out, armed = pv._call(lambda x: torch.zeros(4, 16), [x_of()["x"]], spec, "cuda:0", junk=True)
    assert armed is False and verdict_rules.count_sentinel(out)[0] == 0  # no junk rewrite on CUDA


def test_check_set_rows_start_empty(pv, monkeypatch):
    monkeypatch.setattr(verdict_rules, "allowance", lambda *a: None)
    r = pv.check_set(target(), honest, "k", x_of(), "cpu")
    assert r == {"kind": "k", "max_abs": None, "max_rel": None, "atol": None, "rtol": None, "allowance": None,
                 "sentinel": False, "reason": "skipped",
                 "detail": "eager PyTorch itself differs from float64 in NaN/Inf positions", "binding": None}


def test_check_set_launch_error_row_keeps_the_empty_numbers(pv):
    r = pv.check_set(target(), lambda x: (_ for _ in ()).throw(RuntimeError("no")), "k", x_of(), "cpu")
    assert {k: r[k] for k in ("max_abs", "max_rel", "atol", "rtol", "sentinel")} == {
        "max_abs": None, "max_rel": None, "atol": None, "rtol": None, "sentinel": False}


def test_check_set_with_the_junk_fill_arms_the_sentinel_on_both_calls(pv):
    if not pv._cpu_junk_fill():
        pytest.skip("this torch build has no c10 junk-fill flag")
    r = pv.check_set(target(), honest, "fresh[0]", x_of(), "cpu", junk=True)
    assert r["reason"] is None and r["sentinel"] is True


def test_run_draws_three_fresh_sets_by_default(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    got = []
    monkeypatch.setattr(pv, "input_sets", lambda t, device, seed, fresh: got.append(fresh) or [])
    _manifest(pv, tmp_path, [target()])
    pv.run("cpu", seed=1, say=lambda s: None)
    assert got == [3]


def test_run_counts_every_failing_rules_and_tolerance_check(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    monkeypatch.setattr(pv, "input_sets", lambda t, device, seed, fresh: [])
    bad = [target("t0"), target("t1")]
    for t in bad:
        t["tolerance"] = {**t["tolerance"], "atol": 1.0}
    _manifest(pv, tmp_path, bad, sha="cd" * 32)
    lines = []
    assert pv.run("cpu", seed=1, say=lines.append) == 1
    assert lines[-1] == "FAIL: 2 kernels, 3 failing checks on cpu (0 input sets, seed 1)"


def test_run_goes_on_after_a_skipped_set(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    monkeypatch.setattr(pv, "input_sets", lambda t, device, seed, fresh: [("a", dict), ("b", dict)])
    rows = iter([{"reason": "skipped", "detail": "eager differs"},
                 {"reason": None, "detail": "", "max_abs": 0.0, "max_rel": 0.0, "atol": 1e-8, "allowance": 0.0,
                  "rtol": 1e-4, "sentinel": False}])
    monkeypatch.setattr(pv, "check_set", lambda *a: next(rows))
    _manifest(pv, tmp_path, [target()])
    lines = []
    assert pv.run("cpu", seed=1, say=lines.append) == 0
    assert lines[3].startswith("t0      a ") and lines[4].startswith("t0      b ") and lines[4].endswith("PASS")
    assert lines[-1] == "PASS: 1 kernel, 0 failing checks on cpu (1 input sets, seed 1)"


def test_run_prints_sixteen_hex_digits_of_the_rules_hash(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    _manifest(pv, tmp_path, [target()])
    lines = []
    pv.run("cpu", fresh=0, seed=1, say=lines.append)
    have = pv.rules_sha256()
    assert lines[0].startswith(f"verification rules: forge_pack/evaluate/verdict_rules.py sha256 {have[:16]} (the build's")


# ---------------------------------------------------------------- the shipped target registry's digest


def _ship_targets(tmp_path, files: dict) -> str:
    """Write _targets/ beside the stand-in module; returns the digest forge-pack would record."""
    d = tmp_path / "_targets"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_bytes(text)
    (d / "notes.txt").write_bytes(b"not a module: not in the digest")
    lines = "".join(f"{n} {hashlib.sha256(files[n]).hexdigest()}\n" for n in sorted(files) if n.endswith(".py"))
    return hashlib.sha256(lines.encode()).hexdigest()


def test_targets_sha256_is_the_digest_of_every_shipped_module_by_name(pv, tmp_path):
    want = _ship_targets(tmp_path, {"softmax.py": b"A = 1\n", "registry.py": b"B = 2\n"})
    assert pv.targets_sha256() == want
    (tmp_path / "_targets" / "softmax.py").write_bytes(b"A = 2\n")
    assert pv.targets_sha256() != want


def test_run_accepts_the_recorded_target_registry(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    patcher = _manifest(pv, tmp_path, [target()])
    patcher.manifest["targets_runtime"] = {"source_sha256": _ship_targets(tmp_path, {"softmax.py": b"A = 1\n"})}
    lines = []
    assert pv.run("cpu", fresh=0, seed=1, say=lines.append) == 0
    assert lines[0].startswith("verification rules: ") and lines[-1].startswith("PASS: 1 kernel, 0 failing checks")


def test_run_refuses_a_target_registry_that_is_not_the_builds(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    patcher = _manifest(pv, tmp_path, [target()])
    have = _ship_targets(tmp_path, {"softmax.py": b"A = 1\n"})
    patcher.manifest["targets_runtime"] = {"source_sha256": "ab" * 32}
    lines = []
    assert pv.run("cpu", fresh=0, seed=1, say=lines.append) == 1
    assert lines[0] == (f"FAIL targets: _targets/ (digest {have[:16]}) is not the target registry this package was "
                        f"built with ({'ab' * 8}): reinstall the package")
    assert lines[-1].startswith("FAIL: 1 kernel, 1 failing checks on cpu")


def test_run_counts_a_changed_registry_and_changed_rules_as_two_failures(pv, tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    patcher = _manifest(pv, tmp_path, [target()], sha="0" * 64)
    _ship_targets(tmp_path, {"softmax.py": b"A = 1\n"})
    patcher.manifest["targets_runtime"] = {}
    lines = []
    assert pv.run("cpu", fresh=0, seed=1, say=lines.append) == 1
    assert lines[0].startswith("FAIL rules: ")
    assert lines[1].startswith("FAIL targets: _targets/ (digest ") and lines[1].endswith(
        "built with (None): reinstall the package")
    assert lines[-1].startswith("FAIL: 1 kernel, 2 failing checks on cpu")


# ---------------------------------------------------------------- the allowance's magnitude


def test_check_set_of_a_pool_hands_the_kinds_magnitude_to_the_allowance_and_the_judgement(pv, monkeypatch):
    pool = parse_signature("adaptive_avg_pool2d", "x: f32[2,3,8,8], output_size=[1,1]")
    from forge_pack.targets.ops import with_output

    t = target(sig=with_output(pool))
    x = {"x": torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4)) * 100}
    spec = registry.get("adaptive_avg_pool2d")
    want = torch.nn.functional.adaptive_avg_pool2d(x["x"].double().abs(), 1)
    seen = []
    real_allowance, real_judge = verdict_rules.allowance, verdict_rules.judge_output

    def allowance(eager_out, ref, dtype, s, magnitude=None):
        seen.append(("allowance", s, magnitude))
        return real_allowance(eager_out, ref, dtype, s, magnitude)

    def judge_output(out, ref, dtype, s, allow, kind, magnitude=None):
        seen.append(("judge", s, magnitude))
        return real_judge(out, ref, dtype, s, allow, kind, magnitude)

    monkeypatch.setattr(pv.rules, "allowance", allowance)
    monkeypatch.setattr(pv.rules, "judge_output", judge_output)
    r = pv.check_set(t, lambda x: torch.nn.functional.adaptive_avg_pool2d(x, (1, 1)), "k", x, "cpu")
    assert r["reason"] is None
    assert [(w, s) for w, s, _ in seen] == [("allowance", spec), ("judge", spec)]
    assert all(m is not None and torch.equal(m, want) for _, _, m in seen)


# ---------------------------------------------------------------- region targets


def _region_target():
    """A region of a tiny graph (x * 2 + y, then ReLU) as a package's manifest lists it."""
    from forge_pack.graph.capture import capture
    from forge_pack.graph.regions import find_regions
    from forge_pack.targets import region_target

    class Tiny(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x * 2.0 + y)

    g = capture(Tiny(), (torch.randn(4, 16), torch.randn(4, 16)), profile=False)
    (region,) = find_regions(g)
    sig = region_target.signature(region)
    tol = verdict_rules.tolerance(registry.spec_for(sig), sig.output.dtype)
    return {"id": "t0", "op": "region", "signature": sig.to_json(), "fixtures": [],
            "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "eager_slack": verdict_rules.EAGER_SLACK}}


def test_run_verifies_a_region_target_against_its_rebuilt_subgraph(pv, tmp_path, monkeypatch):
    """The package's verify draws a region's inputs and references from the form in its manifest entry
    (the shipped _targets/region_target.py and _graph/): an honest kernel passes, a wrong one fails."""
    monkeypatch.setattr(pv, "_cpu_junk_fill", lambda: False)
    t = _region_target()
    spec = registry.spec_for_entry("region", dict((k, v) for k, v in t["signature"]["params"]))
    _manifest(pv, tmp_path, [t], fn=lambda a, b: torch.relu(a * 2.0 + b))
    lines = []
    assert pv.run("cpu", fresh=1, seed=5, say=lines.append) == 0, "\n".join(lines)
    n = 1 + len(verdict_rules.DERIVED_KINDS) + len(spec.adversarial)
    assert lines[-1] == f"PASS: 1 kernel, 0 failing checks on cpu ({n} input sets, seed 5)"
    _manifest(pv, tmp_path, [t], fn=lambda a, b: torch.relu(a * 2.0 - b))
    lines = []
    assert pv.run("cpu", fresh=1, seed=5, say=lines.append) == 1
    assert "FAIL mismatch: fresh[0]: " in next(ln for ln in lines if ln.startswith("t0      fresh[0]"))


# ---------------------------------------------------------------- explain: the binding element in one line


def _binding(**kw):
    b = {"err": 2e-5, "ref": 0.5, "atol": 1e-5, "absolute": 1e-5, "rtol": 1e-4, "bound": 6e-5, "ratio": 2e-5 / 6e-5,
         "max_rel": None}
    b.update(kw)
    return b


def test_explain_without_a_finite_element_says_so(pv):
    assert pv.explain(None) == "no finite element to compare"


def test_explain_an_element_within_its_bound_by_atol(pv):
    assert pv.explain(_binding()) == ("closest to its bound: |err| 2.0e-05 at ref 5.0e-01: bound atol 1.0e-05 + rtol "
                                      "1e-04 x |ref| = 6.0e-05 -> ok (33% of the bound)")
    # exactly at the bound is within it
    assert pv.explain(_binding(ratio=1.0)).endswith("-> ok (100% of the bound)")


def test_explain_an_element_out_of_tolerance_by_the_eager_allowance(pv):
    b = _binding(absolute=3e-5, ratio=10.0, err=9e-4, bound=9e-5)
    assert pv.explain(b) == ("closest to its bound: |err| 9.0e-04 at ref 5.0e-01: bound eager allowance 3.0e-05 "
                             "(above atol 1.0e-05) + rtol 1e-04 x |ref| = 9.0e-05 -> out of tolerance (10x the bound)")
    assert pv.explain(_binding(ratio=9.996)).endswith("-> out of tolerance (1000% of the bound)")
    assert pv.explain(_binding(ratio=1.5)).endswith("-> out of tolerance (150% of the bound)")


def test_explain_says_why_a_large_relative_error_near_zero_passes(pv):
    near_zero = {"rel": 0.5, "ref": -2e-6, "err": 1e-6, "bound": 1e-5, "absolute": 1e-5}
    assert pv.explain(_binding(max_rel=near_zero)).endswith(
        "-> ok (33% of the bound); max rel err 5.0e-01 > rtol is at ref -2.0e-06, where |err| 1.0e-06 is within the "
        "absolute term 1.0e-05 (near-zero |ref|: rtol x |ref| = 2.0e-10 allows almost nothing there)")
    at_bound = dict(near_zero, err=1e-5)
    assert "; max rel err" in pv.explain(_binding(max_rel=at_bound))
    base = pv.explain(_binding())
    assert pv.explain(_binding(max_rel=dict(near_zero, rel=1e-4))) == base  # not above rtol: nothing to explain
    assert pv.explain(_binding(max_rel=dict(near_zero, err=2e-5))) == base  # out of its bound: not a passing one


# ---------------------------------------------------------------- binding_element: the element closest to failing


ATOL, RTOL = 1e-5, 1e-4
# element 0: err 2e-5 at ref 0.25 (bound 3.5e-5, the closest to it); 1: err 4e-6 at ref 1e-6 (the largest
# relative error, 0.4 of atol); 2: a NaN output (never a candidate); 3: err 1e-4 at ref 2.0 (bound 2.1e-4)
REF = torch.tensor([0.25, 1e-6, 4.0, 2.0], dtype=torch.float64)
OUT = REF + torch.tensor([2e-5, 4e-6, float("nan"), 1e-4], dtype=torch.float64)


def _approx(got: dict, **want):
    assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-9, abs=0), got


def test_binding_element_is_the_element_nearest_its_bound_and_the_largest_relative_error(pv):
    table = torch.zeros(verdict_rules._BUCKETS, dtype=torch.float64)
    b = pv.binding_element(OUT, REF, table, ATOL, RTOL, None)
    _approx(b, err=2e-5, ref=0.25, absolute=1e-5, allowance=0.0, bound=3.5e-5, ratio=2e-5 / 3.5e-5, rel=8e-5)
    assert (b["atol"], b["rtol"]) == (ATOL, RTOL)
    _approx(b["max_rel"], err=4e-6, ref=1e-6, bound=1e-5 + 1e-10, rel=0.4, score=0.4)


def test_binding_element_skips_chunks_without_a_finite_element_and_keeps_the_best_across_chunks(pv, monkeypatch):
    monkeypatch.setattr(verdict_rules, "_CHUNK", 2)
    nan2 = torch.full((2,), float("nan"), dtype=torch.float64)
    b = pv.binding_element(torch.cat([nan2, OUT]), torch.cat([nan2, REF]),
                           torch.zeros(verdict_rules._BUCKETS, dtype=torch.float64), ATOL, RTOL, None)
    _approx(b, err=2e-5, ref=0.25, ratio=2e-5 / 3.5e-5)
    _approx(b["max_rel"], ref=1e-6, rel=0.4)
    assert pv.binding_element(nan2, nan2, torch.zeros(verdict_rules._BUCKETS, dtype=torch.float64),
                              ATOL, RTOL, None) is None


def test_binding_element_looks_the_allowance_up_by_the_kinds_magnitude(pv):
    table = torch.zeros(verdict_rules._BUCKETS, dtype=torch.float64)
    table[int(verdict_rules._bucket(torch.tensor([8.0], dtype=torch.float64)))] = 1e-3
    b = pv.binding_element(OUT, REF, table, ATOL, RTOL, torch.full((4,), 8.0))
    _approx(b, ref=2.0, absolute=1e-3, allowance=1e-3, bound=1.2e-3, ratio=1e-4 / 1.2e-3)


def test_check_set_names_the_binding_element_of_a_mismatch(pv):
    def wrong(x):
        out = torch.softmax(x, -1)
        out[1, 2] += 0.25
        return out

    r = pv.check_set(target(), wrong, "fresh[0]", x_of(), "cpu")
    b = r["binding"]
    assert r["reason"] == "mismatch" and b["err"] == pytest.approx(0.25, abs=1e-6) and b["ratio"] > 1
    assert b["ref"] == pytest.approx(float(torch.softmax(x_of()["x"].double(), -1)[1, 2]), rel=1e-6)


def test_check_set_binds_by_the_kinds_magnitude_where_it_has_one(pv):
    """A pool's allowance is looked up by the magnitude of the values averaged, not by |ref|."""
    sig = parse_signature("adaptive_avg_pool2d", "x: f32[2,3,8,8], output_size=[1,1]")
    spec = registry.get("adaptive_avg_pool2d")
    x = {"x": torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4))}
    fn = lambda x: torch.nn.functional.adaptive_avg_pool2d(x, [1, 1])  # noqa: E731
    r = pv.check_set(target(sig=sig), fn, "fresh[0]", x, "cpu")
    out, ref = fn(x["x"]), spec.reference64({"output_size": [1, 1]}, x)
    mag = verdict_rules.magnitude(spec, x)
    allow = verdict_rules.allowance(out, ref, "float32", spec, mag)
    want = pv.binding_element(out, ref, allow, r["atol"], r["rtol"], mag)
    assert r["reason"] is None and r["binding"] == want
    assert want != pv.binding_element(out, ref, allow, r["atol"], r["rtol"], None)  # |ref| would bind elsewhere


def test_check_set_holds_the_op_to_the_pytorch_op_from_before_the_package_patched_it(pv, monkeypatch):
    """While the package's patch is live, torch.nn.functional.layer_norm is the kernel: the reference
    and eager must come from the originals recorded before patching."""
    original = torch.nn.functional.layer_norm
    monkeypatch.setattr(pv, "ORIGINALS", {("torch.nn.functional", "layer_norm"): original})
    monkeypatch.setattr(torch.nn.functional, "layer_norm", lambda x, *a, **k: original(x, *a, **k) + 1.0)
    x = {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(1)), "weight": torch.ones(16), "bias": None}
    r = pv.check_set(ln_target(), lambda x, w: original(x, (16,), w, None, 1e-5), "fresh[0]", x, "cpu")
    # measured against the original (a reference from the patched op would be 1.0 off everywhere, and so
    # would eager: the allowance would absorb it and only these figures show it)
    assert (r["reason"], r["detail"]) == (None, "") and r["max_abs"] < 1e-5 and r["allowance"] < 1e-5


def test_eager_gives_the_manifests_output_dtype(pv):
    """A composite RMSNorm (Llama-style, fp32 weight on bf16 activations) returns what the profiled model
    returned: the manifest's output dtype, not x's."""
    t = target(sig=parse_signature("rms_norm", "x: bf16[4,16], weight: f32[16], normalized_shape=[16], eps=1e-6, "
                                               "composite=True"))
    t["signature"]["output"]["dtype"] = "float32"
    x = {"x": torch.randn(4, 16).bfloat16(), "weight": torch.ones(16)}
    assert pv.eager(t)(x).dtype == torch.float32


def test_binding_element_keeps_the_first_of_equal_elements_whatever_the_chunks(pv, monkeypatch):
    """Two elements exactly as close to their bounds (0.25 off 1.0 and 0.5 off 2.0 with rtol 0.5, atol 0)
    and as large in relative error: the first is named, in one chunk or one chunk per element."""
    ref = torch.tensor([1.0, 2.0], dtype=torch.float64)
    out = torch.tensor([1.25, 2.5], dtype=torch.float64)
    table = torch.zeros(verdict_rules._BUCKETS, dtype=torch.float64)
    whole = pv.binding_element(out, ref, table, 0.0, 0.5, None)
    monkeypatch.setattr(verdict_rules, "_CHUNK", 1)
    chunked = pv.binding_element(out, ref, table, 0.0, 0.5, None)
    assert (whole["ref"], whole["ratio"], whole["max_rel"]["ref"], whole["max_rel"]["rel"]) == (1.0, 0.5, 1.0, 0.25)
    assert chunked == whole
