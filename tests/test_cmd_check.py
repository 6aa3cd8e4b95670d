"""`forge-pack check`: a user's own kernel verified and timed; malformed input gives clear errors."""

import json

import pytest
from typer.testing import CliRunner

from forge_pack.cli.main import app
from forge_pack.core.errors import ForgeError
from forge_pack.targets.sigparse import parse_signature

from eval_helpers import KERNELS

runner = CliRunner()
REF = KERNELS.parent.parent / "templates" / "kernels" / "cpu"
FAST = ["--reps", "3", "--no-compile-baseline", "--timeout", "20"]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("FORGE_PACK_CPU_THREADS", "1")


def invoke(args):
    result = runner.invoke(app, args)
    if isinstance(result.exception, ForgeError):  # cli.main prints these; the bare app raises them
        return 1, f"error: {result.exception.message}\nhint: {result.exception.hint}"
    return result.exit_code, result.output


@pytest.mark.slow  # > 10 s on 2 cores
def test_check_passes_a_good_kernel_and_prints_timings():
    code, out = invoke(["check", str(REF / "reference_softmax.cpp"), "--spec", str(REF / "reference_softmax.json"),
                        "--op", "softmax", "--signature", "x: f32[32,300], dim=-1", *FAST])
    assert code == 0, out
    assert "verdict   PASS" in out and "eager" in out and "kernel" in out and "fresh[0]" in out


@pytest.mark.slow  # > 10 s on 2 cores
def test_check_reports_a_rejected_kernel_with_its_reason_as_json():
    code, out = invoke(["check", str(KERNELS / "cpu_nan_wildcard.cpp"), "--op", "softmax",
                        "--signature", "x: f32[32,300], dim=-1", "--json", *FAST])
    assert code == 1
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["ok"] is False and doc["evaluation"]["verdict"]["reason"] == "nan"
    assert doc["baseline"]["eager"]["median_us"] > 0


def test_check_runs_the_guard_page_pass_and_rejects_an_out_of_bounds_read():
    code, out = invoke(["check", str(KERNELS / "cpu_oob_read_past_end.cpp"), "--op", "softmax",
                        "--signature", "x: f32[32,300], dim=-1", *FAST])
    assert code == 1
    assert "REJECTED: out_of_bounds" in out and "guard page" in out


@pytest.mark.parametrize("args,needle", [
    (["check", "missing.cpp", "--op", "softmax", "--signature", "x: f32[4,4]"], "kernel file not found"),
    (["check", "{k}", "--op", "softmax"], "no target"),
    (["check", "{k}", "--op", "softmax", "--signature", "x: f32[4,4]", "--spec", "{bad}"], "not valid JSON"),
    (["check", "{k}", "--op", "softmax", "--signature", "x: q9[4,4]"], "unknown dtype"),
    (["check", "{k}", "--op", "softmax", "--signature", "x: f32[4,4]", "--device", "cuda"], "looks like a cpu kernel"),
    (["check", "{nospec}", "--op", "softmax", "--signature", "x: f32[4,4]"], "has no launch spec"),
])
def test_check_gives_clear_errors_for_malformed_input(tmp_path, args, needle):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    nospec = tmp_path / "k.cpp"
    nospec.write_text('extern "C" void k(const float* x, float* out) {}\n')
    subst = {"{k}": str(KERNELS / "cpu_nan_wildcard.cpp"), "{bad}": str(bad), "{nospec}": str(nospec)}
    code, out = invoke([subst.get(a, a) for a in args])
    assert code == 1 and needle in out, out


def test_parse_signature_round_trips_pretty_text():
    sig = parse_signature("softmax", "x: bf16[1,8,2048,2048], dim=-1, dtype=float32")
    assert sig.param("dim") == 3 and sig.output.dtype == "float32" and sig.x.dtype == "bfloat16"
    again = parse_signature(None, sig.pretty())
    assert again.key() == sig.key()
    pool = parse_signature("adaptive_avg_pool2d", "x: bf16[256,2048,7,7]{channels_last}")
    assert pool.x.is_channels_last and pool.output.shape == (256, 2048, 1, 1)
    gn = parse_signature("group_norm", "x: f32[1,512,128,128], num_groups=32, weight: f32[512], bias: f32[512]")
    assert gn.param("num_groups") == 32 and gn.param("eps") == 1e-5 and gn.input("weight").shape == (512,)


@pytest.mark.parametrize("op,text,needle", [
    ("softmax", "x: f32[3,4], dim=5", "out of range"),
    ("group_norm", "x: f32[2,6,4,4]", "num_groups"),
    ("group_norm", "x: f32[2,6,4,4], num_groups=4", "PyTorch rejects"),
    ("softmax", "x: f32[3,4], colour=red", "no parameter"),
    ("nonsense", "x: f32[3]", "unknown op"),
    ("softmax", "x f32[3]", "cannot read"),
])
def test_parse_signature_errors(op, text, needle):
    with pytest.raises(ForgeError, match=needle):
        parse_signature(op, text)
