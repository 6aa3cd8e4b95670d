"""bench/kernelbench: every problem file loads as forge-pack loads a KernelBench file and runs at its
small size; the bench script turns a search's JSON into its table row."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import kernelbench as kb  # noqa: E402


def test_the_issue_problems_are_all_there():
    names = kb.problems()
    for want in ("l1_23_softmax", "l1_24_log_softmax", "l1_33_batch_norm", "l1_35_group_norm", "l1_36_rms_norm",
                 "l1_40_layer_norm", "l1_19_relu", "l1_26_gelu", "l1_42_max_pool_2d", "l1_45_avg_pool_2d"):
        assert want in names
    assert sum(n.startswith("l2_") for n in names) >= 2


@pytest.mark.parametrize("name", kb.problems())
def test_problem_file_loads_and_runs_small(name, monkeypatch):
    monkeypatch.setenv("FORGE_BENCH_SMALL", "1")
    from forge_pack.profile.load import load

    target = load(str(ROOT / "bench" / "kernelbench" / f"{name}.py"), device="cpu")
    assert target.form == "kernelbench"
    with torch.no_grad():
        out = target.module(*target.args)
    assert torch.isfinite(out).all()


def test_published_sizes_of_the_issue_problems():
    def sizes(name):
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "kernelbench" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    assert (sizes("l1_23_softmax").BATCH, sizes("l1_23_softmax").DIM) == (4096, 393216)
    gn = sizes("l1_35_group_norm")
    assert (gn.N, gn.C, gn.H, gn.W, gn.get_init_inputs()) == (112, 64, 512, 512, [64, 8])
    ln = sizes("l1_40_layer_norm")
    assert (ln.BATCH, ln.get_init_inputs()) == (16, [(64, 256, 256)])
    bn = sizes("l1_33_batch_norm")
    assert (bn.N, bn.C, bn.H, bn.W) == (64, 64, 512, 512)


def test_row_from_a_search_document():
    doc = {"hotspots": [{"signature": "layer_norm(x: f32[16,64,256,256], ...)", "skipped": None, "eager_us": 900.0,
                         "compile_us": 314.0, "verdict": "faster than torch.compile",
                         "best": {"median_us": 157.0, "speedup_vs_eager": 900 / 157, "speedup_vs_compile": 2.0,
                                  "bandwidth_fraction": 0.8, "family": "split_row"},
                         "search": {"evaluations": 50, "search_s": 100.0}}]}
    row = kb.row_of("l1_40_layer_norm", doc, 123.4, "ok", ["py", "-m", "forge_pack", "search"], "")
    assert (row["ours_us"], row["vs_compile"], row["family"], row["evaluations"], row["search_wall_s"]) == (
        157.0, 2.0, "split_row", 50, 123.4)
    assert row["command"] == "python -m forge_pack search"
    md = kb.markdown([row], {"gpu": "NVIDIA H200", "torch": "2.11"})
    assert ("| l1_40_layer_norm | layer_norm(x: f32[16,64,256,256], ...) | 900.0 | 314.0 | 157.0 | 5.73x | 2.00x | 80% "
            "| 50 (2.0 s) | 123 | ok |") in md
    row.update(evaluations=0, search_s=None)
    assert "| 80% | 0 | 123 |" in kb.markdown([row], {})
    row.update(evaluations=7, search_s=None)
    assert "| 80% | 7 | 123 |" in kb.markdown([row], {})


def test_row_when_nothing_is_targeted():
    doc = {"hotspots": [{"signature": "relu(...)", "skipped": "not a target op"}]}
    row = kb.row_of("l1_19_relu", doc, 5.0, "ok", ["py"], "")
    assert row["status"] == "not targeted" and row["note"] == "relu(...): not a target op"
    row = kb.row_of("l1_19_relu", {"hotspots": []}, 5.0, "ok", ["py"], "")
    assert row["note"] == "no targeted op in the forward"


def test_a_run_cut_off_before_its_json_notes_its_output_tail_on_one_line():
    row = kb.row_of("l2_gemm_layer_norm_gelu", None, 7.5, "stopped at the deadline (7 s)", ["py"],
                    "run directory: /tmp/r\n[profile] capture pass on cuda\n\n[profile] warm-up 1/2\n")
    md = kb.markdown([row], {})
    assert ("- `l2_gemm_layer_norm_gelu`: run directory: /tmp/r / [profile] capture pass on cuda / "
            "[profile] warm-up 1/2\n") in md


@pytest.mark.parametrize("mode, first, want", [("auto", "not targeted", ["ops", "regions"]), ("auto", "ok", ["ops"]),
                                               ("always", "ok", ["regions"]), ("never", "not targeted", ["ops"])])
def test_a_problem_no_op_target_covers_is_searched_as_regions(monkeypatch, mode, first, want):
    """auto: the op search first, the region search only where it found nothing to target (its wall time added);
    always / never: one search, as regions / as ops."""
    import argparse
    import time

    calls = []

    def fake(name, args, deadline_at, regions):
        calls.append("regions" if regions else "ops")
        return {"status": "ok" if regions else first, "search_wall_s": 2.0, "note": "relu(...): not a target op",
                "mode": calls[-1]}

    monkeypatch.setattr(kb, "_search", fake)
    row = kb.run_one("l1_19_relu", argparse.Namespace(regions=mode), time.monotonic() + 60)
    assert calls == want and row["mode"] == want[-1]
    assert row["search_wall_s"] == 2.0 * len(want)
    if len(want) == 2:
        assert row["ops_note"] == "relu(...): not a target op"


def test_a_search_stopped_before_its_summary_gives_its_row_from_the_run_store(tmp_path):
    """A search cut off at the deadline writes no search.json: the row still carries its baseline, its best
    verified kernel and why the rest failed, read from the run store (an H100 softmax search stopped so had
    only '10 evaluations, 10 failures' to show, all out_of_memory)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from pipeline_fakes import FakeEvaluator, fake_toolkit
    from search_fakes import fail_eval

    from forge_pack.search import pipeline

    class Failing(FakeEvaluator):
        calls = 0

        def evaluate(self, cand, hotspot, baseline):
            Failing.calls += 1
            if Failing.calls % 2:
                return fail_eval("out_of_memory")
            return super().evaluate(cand, hotspot, baseline)

    tk = fake_toolkit()
    tk.evaluator = lambda config, run_dir, backend: Failing(run_dir, 0.0)
    run_dir = tmp_path / "run"
    pipeline.run(pipeline.RunConfig(model="m.py", budget=6, top=1, run_dir=str(run_dir)), toolkit=tk,
                 say=lambda s: None)
    (run_dir / "search.json").unlink()
    doc = kb.store_doc(run_dir)
    row = kb.row_of("l1_23_softmax", doc, 260.0, "stopped at the deadline (260 s)", ["py"], "")
    assert row["signature"] == "softmax(x: f32[64,512], dim=1)"
    assert (row["eager_us"], row["compile_us"]) == (100.0, 90.0)
    assert row["evaluations"] == 6 and row["note"].startswith("stopped before its summary: 6 evaluations, failed: ")
    assert "out_of_memory 3" in row["note"]
    assert doc["hotspots"][0]["search"]["verdicts"] == {"out_of_memory": 3, "ok": 3}
    assert row["ours_us"] > 0 and abs(row["vs_eager"] - 100.0 / row["ours_us"]) < 1e-9  # the best of the 3 verified
    assert kb.store_doc(tmp_path / "nothing") is None
