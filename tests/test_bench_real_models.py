"""bench/models/*.py (issue 8's real architectures) load in forge-pack's model-file form at their
FORGE_BENCH_SMALL sizes, and bench/real_models.py turns a run's state into issue 8's rows.

The model tests need optional packages (torchvision, diffusers, transformers with Gemma 4 and
Qwen3.5-MoE) and skip cleanly without them; the results test needs nothing beyond forge-pack.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

# model file -> (the optional package it needs, the output shape at FORGE_BENCH_SMALL sizes)
MODELS = {
    "resnet50": ("torchvision", (2, 1000)),
    "sd35_vae_decode": ("diffusers", (1, 3, 128, 128)),
    "gemma4_prefill": ("transformers", (1, 1, 4096)),
    "qwen35_moe_prefill": ("transformers", (1, 1, 4096)),
}


def _has(module: str, attr: str | None = None) -> bool:
    if importlib.util.find_spec(module) is None:
        return False
    if attr is None:
        return True
    try:
        return hasattr(importlib.import_module(module), attr)
    except Exception:
        return False


@pytest.mark.parametrize("name", list(MODELS))
def test_bench_model_small_forward(name, monkeypatch):
    need, shape = MODELS[name]
    if not _has(need):
        pytest.skip(f"{need} is not installed")
    if name == "gemma4_prefill" and not _has("transformers", "Gemma4ForCausalLM"):
        pytest.skip("this transformers has no Gemma 4")
    if name == "qwen35_moe_prefill" and not _has("transformers", "Qwen3_5MoeForCausalLM"):
        pytest.skip("this transformers has no Qwen3.5-MoE")
    monkeypatch.setenv("FORGE_BENCH_SMALL", "1")
    monkeypatch.setenv("FORGE_BENCH_DEVICE", "cpu")
    from forge_pack.profile.load import load, run_forward

    target = load(BENCH / "models" / f"{name}.py", "cpu", None)
    assert target.form == "get_model"
    assert all(p.dtype == torch.bfloat16 for p in target.module.parameters())  # bf16 by default
    out = run_forward(target)
    assert tuple(out.shape) == shape and out.dtype == torch.bfloat16
    assert bool(out.float().isfinite().all())


def _real_models():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_real_models", BENCH / "real_models.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_real_models_rows_and_report(tmp_path):
    rm = _real_models()
    sig = "softmax(x: bf16[1,8,2048,2048], dim=3, dtype=float32) -> f32"
    st = {
        "status": "done",
        "search": {"hotspots": [
            {"id": "a", "op": "softmax", "signature": sig, "time_share": 0.06, "skipped": None, "eager_us": 180.0,
             "compile_us": 110.0, "floor_us": 47.4, "verdict": "winner"},
            {"id": "b", "op": "rms_norm", "signature": "rms_norm(x: bf16[1,2048,1536])", "time_share": 0.02,
             "skipped": None, "eager_us": 30.0, "compile_us": 12.0, "floor_us": 3.0, "verdict": "no winner"},
            {"id": "c", "op": "softmax", "signature": "softmax(x: bf16[4,4])", "time_share": 0.0,
             "skipped": "beyond --top 2", "eager_us": None, "compile_us": None, "floor_us": None}]},
        "targets": [{"id": "t0", "op": "softmax", "signature": sig, "eager_us": 180.0, "compile_us": 110.0,
                     "kernel_us": 60.0, "speedup_vs_eager": 3.0, "speedup_vs_compile": 110.0 / 60.0,
                     "time_share": 0.06, "calls_per_forward": 6}],
        "measure": {"eager": {"median_us": 17300.0, "iqr_us": 100.0, "min_us": 17000.0},
                    "patched": {"median_us": 16500.0, "iqr_us": 120.0, "min_us": 16300.0},
                    "compiled": {"median_us": 12000.0}, "compiled_patched": {"median_us": 10500.0},
                    "compile_s": 20.0, "compile_diff": {"max_abs_diff": 2.0},
                    "compile_patched_s": 22.0, "compile_patched_diff": {"max_abs_diff": 1.5},
                    "iters": 30, "inputs": [{"shape": [1, 2048], "dtype": "int64"}]},
    }
    doc = {"models": {"gemma4_prefill": st}, "env": {"gpu": "NVIDIA H200", "torch": "2.11.0"},
           "config": {"budget": 12, "iters": 30, "warmup": 5, "compile_mode": "default"}, "commands": ["x"]}
    rm.write_results(tmp_path, doc)
    rows = json.loads((tmp_path / "seed_table.json").read_text())
    assert all(tuple(r) == rm.ROW_KEYS for r in rows)
    packed, unpacked, e2e = rows
    assert packed["kernel_us"] == 60.0 and packed["bandwidth_fraction"] == pytest.approx(47.4 / 60.0)
    assert unpacked["op"] == "rms_norm" and unpacked["kernel_us"] is None
    assert e2e["op"] == "end_to_end" and e2e["speedup_vs_eager"] == pytest.approx(17300 / 16500)
    assert e2e["speedup_vs_compile"] == pytest.approx(12000 / 16500)
    md = (tmp_path / "real_models.md").read_text()
    assert "| Gemma 4 E2B | softmax | 2.83x |" in md and "3.00x" in md and "| yes |" in md
    assert "| 17.300 | 16.500 | 12.000 | 10.500 | 1.05x |" in md  # eager, patched, compile, patched + compile
    assert "patched + torch.compile: compiled in 22 s, max |out - eager| 1.5 (torch.compile alone: 2.000)" in md
    assert "median of 30 timed forwards" in md and "within noise" not in md  # a 0.8 ms gap, IQRs ~0.1 ms
    readme = tmp_path / "README.md"
    readme.write_text("# Results\n\nbefore\n")
    rm.update_readme(readme, md)
    rm.update_readme(readme, md)  # replaced in place, not appended twice
    text = readme.read_text()
    assert text.count(rm.BEGIN) == 1 and text.startswith("# Results") and "before" in text


def test_real_models_report_says_when_a_gap_is_within_noise():
    rm = _real_models()
    m = {"eager": {"median_us": 30000.0, "iqr_us": 3000.0, "min_us": 26700.0},
         "patched": {"median_us": 29400.0, "iqr_us": 4800.0, "min_us": 26700.0}, "iters": 150}
    doc = {"models": {"qwen35_moe_prefill": {"status": "done", "measure": m},
                      "resnet50": {"status": "done", "measure": {**m, "iters": 30}}},
           "env": {}, "config": {"iters": 30, "warmup": 5}, "commands": []}
    md = rm.markdown(doc)
    assert "qwen35_moe_prefill: eager and patched medians differ by 0.6 ms, less than the spread" in md
    assert "median of (qwen35_moe_prefill 150, resnet50 30) timed forwards" in md
