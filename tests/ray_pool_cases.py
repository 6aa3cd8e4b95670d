"""--ray: the evaluator's workers as Ray actors on a local cluster (ray.init with CPUs only): jobs
spread over the actors, a killed actor loses only its in-flight job, which runs again on another,
files a node lacks travel with the job, and a search run through Ray has the form of a local one.

Run by tests/test_ray_pool.py in a pytest process of its own (a fault in Ray's native driver must not
take a pytest-xdist worker down with it), or directly: `make test-ray`. Skipped where Ray is not
installed (`pip install 'forge-pack[ray]'`)."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent))
from device_jobs import FakeJudge, FakeStartup, ReadArtifact  # noqa: E402

from forge_pack.evaluate.device_pool import run_on_a_device  # noqa: E402
from forge_pack.evaluate.ray_pool import RayPool, job_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PYPATH = os.pathsep.join(p for p in (str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="module")
def cluster():
    # two CPUs: two actors at once; a killed actor's CPU is free again for its replacement
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": PYPATH, "FORGE_PACK_CPU_THREADS": "1"}})
    yield
    ray.shutdown()


@pytest.fixture
def pool(cluster, tmp_path):
    p = RayPool("local", "cpu", 2, FakeStartup(), str(tmp_path))
    yield p
    p.close()


def test_jobs_spread_over_the_actors_one_at_a_time_each_with_its_label(pool):
    labels = pool.info()["devices"]
    assert len(labels) == 2 and all("/cpu:" in lab for lab in labels) and len(set(labels)) == 2
    runs, lock = [], threading.Lock()

    def one(i):
        label, r = run_on_a_device(pool, lambda w: (w.device, w.run(FakeJudge(f"c{i}", 0.3), 30)))
        with lock:
            runs.append((label, r))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(runs) == 6
    per = {lab: [r for lb, r in runs if lb == lab] for lab in labels}
    assert all(len(v) >= 2 for v in per.values()), {k: len(v) for k, v in per.items()}
    for v in per.values():  # one actor, one worker process, one job at a time
        spans = sorted((r["t0"], r["t1"]) for r in v)
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))
        assert len({r["pid"] for r in v}) == 1


def test_a_killed_actor_loses_only_its_in_flight_job_which_runs_again_on_another(pool):
    first = pool.idle.queue[0]  # the next acquire takes it
    got = {}

    lost_with = []

    def job():
        got["r"] = run_on_a_device(pool, lambda w: (w.device, w.run(FakeJudge("victim", 2.0), 30)),
                                   on_lost=lost_with.append)

    t = threading.Thread(target=job)
    t.start()
    time.sleep(0.8)  # the job is in flight on `first`
    ray.kill(first.actor, no_restart=True)
    t.join(60)
    label, result = got["r"]
    assert label != first.device and result["hash"] == "victim"  # re-queued, and run to its end elsewhere
    assert [d for d, _ in pool.lost] == lost_with == [first.device]
    assert "ActorDied" in pool.lost[0][1] or "RayActorError" in pool.lost[0][1]
    deadline = time.monotonic() + 60
    while not pool.replaced and time.monotonic() < deadline:  # Ray places a replacement on the freed CPU
        time.sleep(0.2)
    assert len(pool.replaced) == 1 and pool.replaced[0] != first.device
    assert sorted(w.device for w in pool.workers) == sorted([label, pool.replaced[0]])
    r = run_on_a_device(pool, lambda w: w.run(FakeJudge("after", 0.0), 30))
    assert r["hash"] == "after"


def test_a_file_the_node_lacks_travels_with_the_job(pool, tmp_path):
    w = pool.idle.get()
    try:
        driver_only = "/forge-pack-driver-only/build/k.so"  # a path no node has
        data, gen = ray.get(w.actor.run.remote(ReadArtifact(driver_only), 30, {driver_only: b"\x7fELF kernel"}))
        assert data == b"\x7fELF kernel"
        here = tmp_path / "k.so"
        here.write_bytes(b"same host")
        assert ray.get(w.actor.missing.remote([(str(here), "0" * 64)])) == [str(here)]  # other bytes: missing
        assert w.run(ReadArtifact(str(here)), 30) == b"same host"  # one host: the node's own file, nothing sent
    finally:
        pool.idle.put(w)


def test_job_files_names_the_artifact_and_the_captures():
    from forge_pack.evaluate.judge import JudgeCandidate, LoadInputs

    inputs = LoadInputs("k", None, ("inputs/a.pt", "inputs/b.pt"), "/runs/r", 0, False)  # type: ignore[arg-type]
    job = JudgeCandidate(inputs, None, "/cache/k.so", None)  # type: ignore[arg-type]
    assert job_files(job) == ["/cache/k.so", "/runs/r/inputs/a.pt", "/runs/r/inputs/b.pt"]
    assert job_files(inputs) == ["/runs/r/inputs/a.pt", "/runs/r/inputs/b.pt"]


def test_missing_ray_is_an_error_with_the_install_hint(monkeypatch):
    from forge_pack.core.errors import ForgeError
    from forge_pack.evaluate import ray_pool

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ForgeError) as e:
        ray_pool.import_ray()
    assert e.value.message == "--ray needs Ray, which is not installed in this environment"
    assert e.value.hint.startswith("pip install 'forge-pack[ray]'")


def _evaluating(run_dir: Path) -> bool:
    try:
        conn = sqlite3.connect(f"file:{run_dir / 'run.db'}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT COUNT(*) FROM nodes WHERE status='evaluating'").fetchone()[0] > 0
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def _shape(v):
    """The form of a JSON document: keys and types, not values."""
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_shape(v[0])] if v else []
    return type(v).__name__ if v is not None else None


@pytest.mark.slow
def test_a_cpu_search_through_ray_has_the_form_of_a_local_one_and_survives_a_killed_actor(cluster, tmp_path):
    from forge_pack.search import pipeline
    from forge_pack.search.devices import make_evaluator

    model = str(ROOT / "tests" / "models" / "norm_head.py")
    made = []

    def evaluator(config, run_dir, backend):
        made.append(make_evaluator(config, run_dir, backend))
        return made[-1]

    killed = []

    def kill_one_when_busy(run_dir: Path):
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            pool = getattr(made[0], "pool", None) if made else None
            busy = [w for w in getattr(pool, "workers", []) if w not in list(pool.idle.queue)] if pool else []
            if busy and _evaluating(run_dir):  # a candidate (not the baseline) is on that actor
                ray.kill(busy[0].actor, no_restart=True)
                killed.append(busy[0].device)
            time.sleep(0.05)

    summaries = {}
    for name, extra in (("local", {}), ("ray", {"ray": "local", "workers": 2, "parallel_auto": True})):
        run_dir = tmp_path / name
        config = pipeline.RunConfig(model=model, device="cpu", budget=3, top=1, seed=1, run_dir=str(run_dir),
                                    timeout_s=120, **extra)
        tk = pipeline.Toolkit(evaluator=evaluator)
        watcher = None
        if name == "ray":
            watcher = threading.Thread(target=kill_one_when_busy, args=(run_dir,), daemon=True)
            watcher.start()
        summaries[name] = pipeline.run(config, toolkit=tk, say=lambda s: None, quiet=True)
        if watcher:
            watcher.join(1)
        made.clear()
    local, remote = summaries["local"], summaries["ray"]
    assert killed, "no actor was busy to kill"
    assert remote.outcomes[0].result.evaluations == local.outcomes[0].result.evaluations == 3
    docs = {n: json.loads((tmp_path / n / "search.json").read_text()) for n in summaries}
    assert _shape(docs["ray"]["hotspots"][0]["search"]) == _shape(docs["local"]["hotspots"][0]["search"])
    assert sorted(docs["ray"]) == sorted(docs["local"])
    for n in summaries:
        conn = sqlite3.connect(tmp_path / n / "run.db")
        rows = conn.execute("SELECT reason, device, evaluation_json FROM evaluations").fetchall()
        conn.close()
        assert len(rows) == 3
        if n == "ray":
            # the killed actor's candidate ran again elsewhere: no evaluation is a crash of the candidate,
            # and the one that was in flight names the actor it was lost with
            assert all(dev and "/cpu:" in dev for _, dev, _ in rows) and "crash" not in {r for r, _, _ in rows}
            requeued = [json.loads(j)["extra"].get("requeued_from") for _, _, j in rows]
            assert [q for q in requeued if q] == [killed]
        else:
            assert all(dev is None for _, dev, _ in rows)
