"""--gpus: one worker per device, candidates spread by the MCTS, never two timed runs on one device,
the device recorded per evaluation, the same winners as on one device, mixed GPU models refused.

The "devices" here are CPU worker processes with labels (device_pool.Device) running light jobs
(tests/device_jobs.py): the dispatch is the same code a GPU pool runs."""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from device_jobs import FakeJudge, FakeStartup  # noqa: E402
from pipeline_fakes import fake_toolkit  # noqa: E402
from search_fakes import GridProposer, Landscape, ListProposer, all_points  # noqa: E402

from forge_pack.core.errors import ForgeError  # noqa: E402
from forge_pack.core.verdict import Baseline, Timing  # noqa: E402
from forge_pack.evaluate.device_pool import Device, DevicePool, check_one_model, confirm_pool, \
    run_on_a_device  # noqa: E402
from forge_pack.search import pipeline  # noqa: E402
from forge_pack.search.devices import check_flags, parse_gpus, slots_of  # noqa: E402
from forge_pack.search.mcts import SearchConfig, search  # noqa: E402
from forge_pack.store.run_store import Store, open_readonly  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PYPATH = os.pathsep.join(p for p in (str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH")) if p)


def fake_devices(n: int, models: list[str] | None = None) -> list[Device]:
    out = []
    for i in range(n):
        env = {"PYTHONPATH": PYPATH, "FAKE_DEVICE": f"fake:{i}"}
        if models:
            env.update(FAKE_BACKEND="cuda", FAKE_GPU=models[i], FAKE_CAPABILITY="9.0")
        out.append(Device(f"fake:{i}", "cpu", env))
    return out


class DeviceEvaluator:
    """The evaluator's dispatch (device_pool.run_on_a_device) with deterministic fake timings: each
    candidate holds a device for ``sleep_s`` and gets the landscape's evaluation, tagged with the
    device that ran it, as the real evaluator tags extra["device"]."""

    def __init__(self, pool, land: Landscape, sleep_s: float):
        self.pool, self.land, self.sleep_s = pool, land, sleep_s
        self.runs: list[dict] = []
        self.lock = threading.Lock()

    def evaluate(self, cand, hotspot=None, baseline=None):
        ran = run_on_a_device(self.pool, lambda w: (w.device, w.run(FakeJudge(cand.content_hash, self.sleep_s), 30)))
        label, job = ran
        with self.lock:
            self.runs.append({**job, "label": label})
        ev = self.land.evaluate(cand)
        return replace(ev, extra={**ev.extra, "device": label})

    def baseline(self, hotspot):
        return Baseline(Timing(100.0, 2.0, 30, 98.0, "monotonic"), None)

    @property
    def slots(self):
        return self.pool.slots

    def close(self):
        self.pool.close()


@pytest.fixture
def pool3(tmp_path):
    pool = DevicePool(fake_devices(3), FakeStartup(), str(tmp_path / "logs"))
    yield pool
    pool.close()


def _overlaps(runs: list[dict]) -> list[tuple]:
    by_device: dict[str, list] = {}
    for r in runs:
        by_device.setdefault(r["label"], []).append((r["t0"], r["t1"]))
    bad = []
    for label, spans in by_device.items():
        spans.sort()
        bad += [(label, a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
    return bad


def test_dispatch_spreads_candidates_over_every_device_one_timed_run_per_device_at_a_time(pool3):
    land = Landscape(3)
    ev = DeviceEvaluator(pool3, land, sleep_s=0.12)
    result = search(GridProposer(), ev.evaluate, SearchConfig(budget=15, parallel=3, seed=0))
    assert result.evaluations == 15
    per_device = {label: sum(1 for r in ev.runs if r["label"] == label) for label in ("fake:0", "fake:1", "fake:2")}
    assert sum(per_device.values()) == 15
    assert min(per_device.values()) >= 3, per_device  # spread, not all on the first free one
    assert _overlaps(ev.runs) == []  # never two timed runs on one device at once
    # each job ran in the worker of the device it was dispatched to (its own environment)
    assert all(r["device"] == r["label"] for r in ev.runs)
    # and the devices did run at once: some runs on different devices overlap in time
    spans = sorted((r["t0"], r["t1"]) for r in ev.runs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    # every evaluation names the device that measured it
    by_hash = {r["hash"]: r["label"] for r in ev.runs}
    assert all(n.evaluation.extra["device"] == by_hash[n.candidate.content_hash] for n in result.nodes)


def test_parallel_1_over_three_devices_is_the_one_device_search_exactly(pool3, tmp_path):
    """Same evaluations -> same search: with one evaluation in flight the device cannot change it."""
    one = DevicePool(fake_devices(1), FakeStartup(), str(tmp_path / "one"))
    try:
        r1 = search(GridProposer(), DeviceEvaluator(one, Landscape(5), 0.0).evaluate,
                    SearchConfig(budget=12, parallel=1, seed=4))
    finally:
        one.close()
    r3 = search(GridProposer(), DeviceEvaluator(pool3, Landscape(5), 0.0).evaluate,
                SearchConfig(budget=12, parallel=1, seed=4))
    assert [n.candidate.content_hash for n in r3.nodes] == [n.candidate.content_hash for n in r1.nodes]
    assert r3.best.candidate.content_hash == r1.best.candidate.content_hash
    assert r3.best_speedup == r1.best_speedup
    assert {n.evaluation.extra["device"] for n in r3.nodes} == {"fake:0", "fake:1", "fake:2"}


def test_three_devices_find_the_same_winner_as_one_given_the_same_evaluations(pool3):
    """Every candidate of a small space evaluated either way (deterministic timings): the winner and
    every verdict are the same, whichever device measured what."""
    points = [p for p in all_points() if p["f"] == 0 and p["c"] == 1][:12]
    land = Landscape(9)
    one = search(ListProposer(points), land.evaluate, SearchConfig(budget=12, parallel=1, seed=0))
    many = search(ListProposer(points), DeviceEvaluator(pool3, Landscape(9), 0.05).evaluate,
                  SearchConfig(budget=12, parallel=3, seed=0))
    assert many.evaluations == one.evaluations == 12
    assert many.best.candidate.content_hash == one.best.candidate.content_hash
    verdicts = lambda r: {n.candidate.content_hash: (n.reason, n.speedup) for n in r.nodes}  # noqa: E731
    assert verdicts(many) == verdicts(one)


def test_gpus_of_two_models_are_refused_naming_each_group(tmp_path):
    with pytest.raises(ForgeError) as e:
        DevicePool(fake_devices(3, ["NVIDIA H200", "NVIDIA H200", "NVIDIA H100"]), FakeStartup(), str(tmp_path))
    assert e.value.message == ("the GPUs of one search must be one model, these are 2: NVIDIA H200 (sm_90): "
                               "fake:0, fake:1; NVIDIA H100 (sm_90): fake:2")
    assert e.value.hint.startswith("search on one model's GPUs, e.g. --gpus 0,1 ")


def test_one_model_passes_and_capability_alone_splits_models():
    check_one_model([("cuda:0", {"name": "H200", "capability": "9.0"}), ("cuda:1", {"name": "H200", "capability": "9.0"})])
    with pytest.raises(ForgeError):
        check_one_model([("cuda:0", {"name": "X", "capability": "8.0"}), ("cuda:1", {"name": "X", "capability": "9.0"})])


def test_a_worker_that_dies_is_restarted_on_its_own_device(pool3):
    from device_jobs import FakeJudge  # noqa: F401
    from worker_jobs import Crash

    with pool3.acquire() as w:
        label, pid = w.device, w.ready()["pid"]
        w.run(Crash(), 30)
    seen = {}
    for _ in range(3):
        with pool3.acquire() as w:
            seen[w.device] = w.run(FakeJudge("h", 0.0), 30)
    assert seen[label]["device"] == label and seen[label]["pid"] != pid
    assert pool3.slots == 3


@pytest.mark.parametrize("spec,visible,want", [
    ("all", ["0", "1", "2"], ["0", "1", "2"]),
    ("2,0", ["0", "1", "2"], ["2", "0"]),
    (" 1 ", ["0", "1"], ["1"]),
    ("5", ["4", "5"], ["5"]),  # CUDA_VISIBLE_DEVICES=4,5: the host's own indices
])
def test_parse_gpus_resolves_the_host_indices(spec, visible, want):
    assert parse_gpus(spec, visible) == want


@pytest.mark.parametrize("spec,visible,message", [
    ("0,0", ["0", "1"], "--gpus names GPU 0 more than once"),
    ("0,3", ["0", "1"], "--gpus names GPU 3, which is not visible here (visible: 0, 1)"),
    ("0,,1", ["0", "1"], "--gpus takes 'all' or a comma-separated list of GPU indices, got '0,,1'"),
    ("all", [], "--gpus needs CUDA GPUs, and none is visible here"),
])
def test_parse_gpus_refuses_what_cannot_work(spec, visible, message):
    with pytest.raises(ForgeError) as e:
        parse_gpus(spec, visible)
    assert e.value.message == message
    assert e.value.hint


def test_flag_combinations_that_cannot_work_are_refused():
    for args, start in [(("0", None, "cpu", None), "--gpus spreads a CUDA search"),
                        (("0,1", None, None, 2), "--gpus and --workers both choose"),
                        (("0,1", "auto", None, None), "--gpus with a list of indices"),
                        ((None, " ", None, None), "--ray needs the cluster's address")]:
        with pytest.raises(ForgeError) as e:
            check_flags(*args)
        assert e.value.message.startswith(start), e.value.message
    check_flags("all", "auto", None, None)
    check_flags(None, "auto", "cpu", 2)


def test_a_store_without_the_device_column_gets_it_and_records_the_device(tmp_path):
    db = tmp_path / "run.db"
    conn = sqlite3.connect(db)  # an evaluations table as written before the column existed
    conn.executescript("CREATE TABLE evaluations (node_id INTEGER PRIMARY KEY, hotspot_id TEXT NOT NULL, ok INTEGER"
                       " NOT NULL, reason TEXT NOT NULL, detail TEXT, max_abs_err REAL, max_rel_err REAL, median_us"
                       " REAL, iqr_us REAL, n INTEGER, speedup_vs_eager REAL, speedup_vs_compile REAL,"
                       " bandwidth_fraction REAL, reward REAL NOT NULL, compile_s REAL, eval_s REAL,"
                       " evaluation_json TEXT NOT NULL, finished_at REAL NOT NULL);"
                       "INSERT INTO evaluations VALUES (1,'h',1,'ok','',0,0,1,0,1,1,1,1,0,0,0,'{}',0);")
    conn.close()
    with Store(tmp_path) as store:
        ev = {"verdict": {"ok": True, "reason": "ok"}, "extra": {"device": "cuda:3"}}
        store.record_evaluation(2, "h", ev, 0.1)
        store.record_evaluation(3, "h", {"verdict": {"ok": True, "reason": "ok"}}, 0.1)
        rows = dict(store.query("SELECT node_id, device FROM evaluations ORDER BY node_id"))
    assert rows == {1: None, 2: "cuda:3", 3: None}


def test_pipeline_with_device_pool_uses_one_slot_per_device_and_stores_the_device(tmp_path):
    pools = []

    def make(config, run_dir, backend):
        pool = DevicePool(fake_devices(3), FakeStartup(), str(run_dir / "workers"))
        ev = DeviceEvaluator(pool, Landscape(2), 0.1)
        pools.append(ev)
        return ev

    tk = replace(fake_toolkit(), evaluator=make)
    config = pipeline.RunConfig(model="model.py", run_dir=str(tmp_path / "run"), budget=9, top=1,
                                gpus="0,1,2", parallel_auto=True)
    summary = pipeline.run(config, toolkit=tk, say=lambda s: None, quiet=True)
    assert summary.outcomes[0].result.evaluations == 9
    ev = pools[0]
    assert slots_of(ev) == 3
    spans = sorted((r["t0"], r["t1"]) for r in ev.runs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # parallel_auto: several in flight
    assert _overlaps(ev.runs) == []
    conn = open_readonly(tmp_path / "run")
    devices = [r[0] for r in conn.execute("SELECT device FROM evaluations")]
    conn.close()
    assert len(devices) == 9 and set(devices) <= {"fake:0", "fake:1", "fake:2"} and len(set(devices)) >= 2


def test_the_confirmation_of_a_gpus_run_uses_its_first_gpu_only(monkeypatch):
    import forge_pack.evaluate.device_pool as dp

    monkeypatch.setattr(dp, "DevicePool", lambda devices, startup, log_dir: devices)
    assert confirm_pool({"gpus": "3,1"}, "cuda") == [Device("cuda:3", "cuda", {"CUDA_VISIBLE_DEVICES": "3"})]
    assert confirm_pool({"gpus": "3,1"}, "cpu") is None
    assert confirm_pool({}, "cuda") is None
    assert confirm_pool({"gpus": "all", "ray": "auto"}, "cuda") is None


def test_the_flags_resolve_to_gpu_ids_kept_in_the_config_and_one_evaluation_per_device(monkeypatch):
    import forge_pack.search.devices as devices
    from forge_pack.cli.search import device_overrides
    from forge_pack.search.config import RunConfig

    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0", "1", "2", "3"])
    assert device_overrides("all", None, None, None, None) == {"parallel_auto": True, "gpus": "0,1,2,3"}
    assert device_overrides("3,1", None, "cuda", None, 6) == {"parallel_auto": False, "gpus": "3,1"}
    assert device_overrides(None, None, None, 2, None) == {}  # neither flag: the plain path, untouched
    config = RunConfig(model="m.py", gpus="3,1", parallel_auto=True)
    back = RunConfig.from_json(config.to_json())
    assert (back.gpus, back.ray, back.parallel_auto) == ("3,1", None, True)
    assert RunConfig.from_json({"model": "m.py"}).gpus is None  # a config.json written before the flags


class _LosingPool:
    """Devices in turn; those named in ``lose`` lose every job they are given (a node that died)."""

    def __init__(self, labels, lose):
        from types import SimpleNamespace

        self.workers = [SimpleNamespace(device=label) for label in labels]
        self.lose, self.turn, self.noted = set(lose), 0, []

    def acquire(self):
        from contextlib import contextmanager

        @contextmanager
        def cm():
            w = self.workers[self.turn % len(self.workers)]
            self.turn += 1
            yield w

        return cm()

    def note_lost(self, w, why):
        self.noted.append((w.device, why))


def test_a_job_lost_with_its_device_runs_again_on_another_which_the_result_names():
    from forge_pack.evaluate.device_pool import DeviceLost

    pool = _LosingPool(["a", "b", "c"], lose={"a", "b"})

    def job(w):
        if w.device in pool.lose:
            raise DeviceLost(f"{w.device}: node died")
        return w.device

    lost = []
    assert run_on_a_device(pool, job, on_lost=lost.append) == "c"
    assert lost == ["a", "b"] and pool.noted == [("a", "a: node died"), ("b", "b: node died")]
    everywhere = _LosingPool(["a", "b"], lose={"a", "b"})
    with pytest.raises(RuntimeError, match="lost with its device 8 times in a row"):
        run_on_a_device(everywhere, lambda w: (_ for _ in ()).throw(DeviceLost(w.device)))
    assert len(everywhere.noted) == 8


@pytest.mark.slow  # two torch workers: 15 s alone on 2 cores, more under load; the fake-device tests are the fast path
def test_the_real_evaluator_on_two_cpu_devices_names_the_device_of_each_evaluation(tmp_path):
    from eval_helpers import hotspot

    from forge_pack.evaluate.device_pool import cpu_devices
    from forge_pack.evaluate.evaluator import Evaluator
    from forge_pack.evaluate.judge import Startup
    from forge_pack.evaluate.timing import TimingConfig
    from forge_pack.search.families import reference_candidate

    h = hotspot("softmax", "x: f32[32,256], dim=-1")
    ref = reference_candidate(h.signature, "cpu")
    variants = [replace(ref, source=ref.source + f"\n// variant {i}\n") for i in range(4)]
    pool = DevicePool(cpu_devices(2), Startup(), str(tmp_path))
    with Evaluator("cpu", timeout_s=60, timing=TimingConfig(warmup=1, reps=5, flush=False, compile_baseline=False),
                   pool=pool) as ev:
        assert ev.device_info()["devices"] == ["cpu:0", "cpu:1"]
        results = {}

        def run(i):
            results[i] = ev.evaluate(variants[i], h)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert [results[i].verdict.reason for i in range(4)] == ["ok"] * 4
    assert {results[i].extra["device"] for i in range(4)} == {"cpu:0", "cpu:1"}
