"""The evaluator's workers as Ray actors: ``--ray ADDRESS`` spreads a search over a cluster.

Each actor (``EvalActor``: ``num_gpus=1`` for cuda, ``num_cpus=1`` running the cpu backend) holds
one ordinary ``WorkerProcess`` on its node, so a candidate is isolated, timed out and replaced
exactly as in a local run (Ray gives the actor its GPU through CUDA_VISIBLE_DEVICES, which the
worker inherits). The driver keeps everything else: the search, the compiler, the run store.
``RayPool`` has the surface of ``worker.WorkerPool`` (``acquire``, ``info``, ``close``) and hands
out ``RayWorker``s with the surface of ``WorkerProcess`` (``run``, ``memo``, ``device``), so the
evaluator does not know where its jobs run and its results are the same types.

Files: a job names files on the driver (the built artifact, the captured inputs under the run
directory). An actor whose node lacks one, or holds different bytes there (sha256), gets the
file's bytes with the job and keeps them under its own directory; on one host, or with a shared
file system, nothing is copied.

A lost actor (its node died, it was killed, it stopped answering) raises ``DeviceLost`` from
``RayWorker.run``: ``device_pool.run_on_a_device`` runs the job again on another actor, so a
lost node costs only its in-flight candidates' time, never their verdicts. The pool asks Ray
for a replacement actor in the background; it joins when Ray can place it.

Ray is an optional dependency (``pip install 'forge-pack[ray]'``), imported only here and only
when ``--ray`` is used.
"""

from __future__ import annotations

import hashlib
import os
import queue
import socket
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from forge_pack.core.errors import ForgeError
from forge_pack.evaluate.device_pool import NO_DEVICE_TIMEOUT_S, DeviceLost, check_one_model
from forge_pack.evaluate.worker import STARTUP_TIMEOUT_S, WorkerLost

# A result must come back within the job's own timeout plus this: the worker on the node enforces
# the timeout itself, so only a node that stopped answering (or a slow file transfer) runs past it.
TRANSFER_SLACK_S = 300.0
# Waiting for every actor of a new pool: Ray may have to start processes on remote nodes and the
# worker in each imports torch (STARTUP_TIMEOUT_S), so the same bound plus placement time.
ACTOR_START_TIMEOUT_S = STARTUP_TIMEOUT_S + 120.0


def import_ray():
    """The ``ray`` module, or a ForgeError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ForgeError("--ray needs Ray, which is not installed in this environment",
                         "pip install 'forge-pack[ray]' (on the driver and on every node of the cluster)") from None
    return ray


# ====================================================================== the actor (runs on a node)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Digests:
    """sha256 of files, cached by (path, size, mtime): captured inputs are hashed once per node."""

    def __init__(self):
        self.cache: dict[tuple, str] = {}

    def of(self, path: str) -> str | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (path, st.st_size, st.st_mtime_ns)
        if key not in self.cache:
            self.cache[key] = _sha256(path)
        return self.cache[key]


class EvalActor:
    """One evaluator worker on a Ray node. Plain class: ``RayPool`` wraps it with ``ray.remote``."""

    def __init__(self, backend: str, index: int, startup: Any):
        from forge_pack.evaluate.worker import WorkerProcess

        self.host = socket.gethostname()
        env: dict[str, str] = {}
        if backend == "cpu":  # the actor holds one CPU; passive OpenMP waiting as in worker.worker_envs
            env = {"OMP_NUM_THREADS": "1", "FORGE_PACK_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
        gpu = ""
        if backend == "cuda":
            import ray

            ids = ray.get_gpu_ids()
            gpu = str(ids[0]) if ids else os.environ.get("CUDA_VISIBLE_DEVICES", "?")
        self.label = f"{self.host}/cuda:{gpu}" if backend == "cuda" else f"{self.host}/cpu:{index}"
        self.mirror = Path(tempfile.mkdtemp(prefix="forge-ray-files-"))
        self.digests = _Digests()
        self.received: set[str] = set()  # driver paths whose bytes this actor received (kept under mirror)
        self.worker = WorkerProcess(backend, index, env, startup, tempfile.mkdtemp(prefix="forge-ray-workers-"))

    def ready(self) -> Any:
        """The worker's startup report with this actor's label and host, or WorkerLost."""
        info = self.worker.ready()
        if isinstance(info, WorkerLost):
            return info
        return {**dict(info), "label": self.label, "host": self.host, "actor_pid": os.getpid()}

    def missing(self, files: list[tuple[str, str]]) -> list[str]:
        """Of (driver path, sha256), the paths this node lacks or holds with other bytes."""
        return [p for p, digest in files if self.digests.of(p) != digest and self.digests.of(self._local(p)) != digest]

    def _local(self, path: str) -> str:
        return str(self.mirror / path.lstrip("/"))

    def run(self, job: Any, timeout: float, files: dict[str, bytes]) -> tuple[Any, int]:
        """Run one job in this node's worker: (its result, the worker's generation after it)."""
        for path, data in files.items():
            local = Path(self._local(path))
            local.parent.mkdir(parents=True, exist_ok=True)
            tmp = local.with_name(local.name + ".part")
            tmp.write_bytes(data)
            os.replace(tmp, local)
            self.received.add(path)
        result = self.worker.run(self._localised(job), timeout)
        if not self.worker.alive:
            self.worker.restart()  # as the local pool does: the next job finds a fresh worker
        return result, self.worker.generation

    def _localised(self, job: Any) -> Any:
        """The job with each driver path this node had to receive replaced by its copy here."""
        art = getattr(job, "artifact", None)
        if isinstance(art, str) and art in self.received:
            job = replace(job, artifact=self._local(art))
        inputs = getattr(job, "inputs", None)
        if inputs is not None:
            moved = self._localised_inputs(inputs)
            if moved is not inputs:
                job = replace(job, inputs=moved)
        elif getattr(job, "captures", None) is not None:
            job = self._localised_inputs(job)
        return job

    def _localised_inputs(self, inputs: Any) -> Any:
        """Captures arrive together (the driver sends all when one is missing): the run directory moves."""
        run_dir = getattr(inputs, "run_dir", None)
        if run_dir and inputs.captures and str(Path(run_dir) / inputs.captures[0]) in self.received:
            return replace(inputs, run_dir=self._local(str(run_dir)))
        return inputs

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.worker.close()


# ====================================================================== the driver side


def job_files(job: Any) -> list[str]:
    """The driver's files a job reads: the built artifact and the captured inputs it loads."""
    out = []
    art = getattr(job, "artifact", None)
    if isinstance(art, str) and art:
        out.append(art)
    inputs = getattr(job, "inputs", job)
    run_dir, captures = getattr(inputs, "run_dir", None), getattr(inputs, "captures", None) or ()
    if run_dir:
        out += [str(Path(run_dir) / c) for c in captures]
    return out


class RayWorker:
    """The driver's handle on one actor, with the surface of ``WorkerProcess`` the evaluator uses."""

    def __init__(self, ray, actor, backend: str, index: int, info: dict, digests: _Digests):
        self.ray, self.actor, self.backend, self.index = ray, actor, backend, index
        self.info, self.device = info, info["label"]
        self.generation = 1
        self.memo: dict[str, Any] = {}
        self.lost = False
        self.digests = digests

    def run(self, job: Any, timeout: float) -> Any:
        ray = self.ray
        try:
            files = self._files_to_send(job)
            result, generation = ray.get(self.actor.run.remote(job, timeout, files), timeout=timeout + TRANSFER_SLACK_S)
        except ray.exceptions.RayTaskError as e:  # our own code raised inside the actor: a fault, not a lost node
            raise RuntimeError(f"the Ray actor on {self.device} failed: {e}") from None
        except (ray.exceptions.RayError, ConnectionError) as e:
            self.lost = True
            if isinstance(e, ray.exceptions.GetTimeoutError):
                ray.kill(self.actor, no_restart=True)  # it stopped answering: it is gone for this pool
            raise DeviceLost(f"{self.device}: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}") from None
        if generation != self.generation:  # the node's worker was replaced: nothing it had loaded is there
            self.generation = generation
            self.memo = {}
        return result

    def _files_to_send(self, job: Any) -> dict[str, bytes]:
        paths = [p for p in job_files(job) if os.path.isfile(p)]
        if not paths:
            return {}
        known = self.memo.setdefault("files", {})  # path -> digest the node is known to hold
        digests = [(p, self.digests.of(p)) for p in paths]
        todo = [(p, d) for p, d in digests if known.get(p) != d]
        if not todo:
            return {}
        missing = set(self.ray.get(self.actor.missing.remote(todo), timeout=TRANSFER_SLACK_S))
        caps = set(paths[1:]) if getattr(job, "artifact", None) else set(paths)
        if missing & caps:  # the inputs move as one directory: every capture goes with the first missing one
            missing |= caps
        for p, d in digests:
            known[p] = d
        return {p: Path(p).read_bytes() for p in missing}

    @property
    def alive(self) -> bool:
        return not self.lost


class RayPool:
    """``workers`` actors on the cluster at ``address`` (cuda: default one per GPU of the cluster)."""

    def __init__(self, address: str, backend: str, workers: int | None, startup: Any, log_dir: str | None = None, *,
                 runtime_env: dict | None = None, start_timeout_s: float = ACTOR_START_TIMEOUT_S):
        ray = import_ray()
        self.ray, self.backend, self.startup = ray, backend, startup
        self.start_timeout_s = start_timeout_s
        if not ray.is_initialized():
            try:
                ray.init(address=None if address in ("", "local") else address, log_to_driver=False,
                         runtime_env=runtime_env, ignore_reinit_error=True)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ForgeError(f"cannot connect to the Ray cluster at {address}: {str(e).strip()[:300]}",
                                 "start one (`ray start --head` on this node) or pass its address, e.g. "
                                 "--ray auto or --ray ray://head:10001") from None
        resources = ray.cluster_resources()
        kind = "GPU" if backend == "cuda" else "CPU"
        have = int(resources.get(kind, 0))
        if have < 1:
            raise ForgeError(f"the Ray cluster has no {kind} for {backend} workers",
                             "add nodes with GPUs to the cluster, or search on the cpu" if kind == "GPU"
                             else "the cluster has no CPU resources to place an actor on")
        n = min(workers or have, have) if backend == "cuda" else max(1, workers or 1)
        opts = {"num_gpus": 1, "num_cpus": 1} if backend == "cuda" else {"num_cpus": 1}
        self.actor_class = ray.remote(**opts, max_restarts=0)(EvalActor)
        self.digests = _Digests()
        self.idle: queue.Queue[RayWorker] = queue.Queue()
        self.workers: list[RayWorker] = []
        self.lost: list[tuple[str, str]] = []  # (device, why) for every actor lost during the run
        self.replaced: list[str] = []  # labels of replacement actors that joined
        self._next_index = 0
        self._closed = False
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        actors = [self._new_actor() for _ in range(n)]
        reports = self._await_ready(actors)
        check = [(w.device, w.info) for w in reports]
        try:
            check_one_model(check)
        except ForgeError:
            self.close()
            raise
        self.reports = check

    def _new_actor(self):
        index = self._next_index
        self._next_index += 1
        return index, self.actor_class.remote(self.backend, index, self.startup)

    def _await_ready(self, actors: list) -> list[RayWorker]:
        ray = self.ray
        refs = [a.ready.remote() for _, a in actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout_s)
        if pending:
            for _, a in actors:
                ray.kill(a, no_restart=True)
            raise ForgeError(f"{len(pending)} of {len(actors)} Ray actors did not start within "
                             f"{self.start_timeout_s:.0f} s",
                             "the cluster may lack free GPUs/CPUs for them (`ray status`); pass --workers N "
                             "to use fewer")
        out = []
        for (index, actor), ref in zip(actors, refs):
            info = ray.get(ref)
            if isinstance(info, WorkerLost):
                for _, a in actors:
                    ray.kill(a, no_restart=True)
                raise ForgeError(f"a Ray actor's evaluator worker did not start: {info.detail.strip()[:500]}",
                                 "is forge-pack (with torch) installed on every node of the cluster?")
            w = RayWorker(ray, actor, self.backend, index, info, self.digests)
            out.append(w)
            self.workers.append(w)
            self.idle.put(w)
        return out

    @property
    def slots(self) -> int:
        return len(self.reports)

    def info(self) -> Any:
        first = dict(self.reports[0][1])
        first["devices"] = [label for label, _ in self.reports]
        return first

    @contextmanager
    def acquire(self):
        try:
            w = self.idle.get(timeout=NO_DEVICE_TIMEOUT_S)
        except queue.Empty:
            raise RuntimeError(f"no Ray actor became free within {NO_DEVICE_TIMEOUT_S:.0f} s "
                               f"(lost: {', '.join(d for d, _ in self.lost) or 'none'})") from None
        try:
            yield w
        finally:
            if w.lost:
                self._replace(w)
            else:
                self.idle.put(w)

    def note_lost(self, w: RayWorker, why: str) -> None:
        """Called by run_on_a_device when ``w`` lost its job: recorded; the job runs elsewhere."""
        with self._lock:
            self.lost.append((w.device, why))

    def _replace(self, w: RayWorker) -> None:
        """Ask Ray for another actor in the background: it joins the pool once placed (on a surviving
        node, or the lost one's when it comes back); the pool works on with the others meanwhile."""
        with self._lock:
            if w in self.workers:
                self.workers.remove(w)
            if self._closed:
                return

        def start() -> None:
            try:
                with self._lock:
                    if self._closed:
                        return
                    actor = self._new_actor()
                for new in self._await_ready([actor]):
                    with self._lock:
                        self.replaced.append(new.device)
            except Exception as e:  # noqa: BLE001 - the pool carries on with the actors it has
                with self._lock:
                    self.lost.append((w.device, f"no replacement: {type(e).__name__}: {e}"))

        t = threading.Thread(target=start, name="forge-ray-replace", daemon=True)
        self._threads.append(t)
        t.start()

    def close(self) -> None:
        ray = self.ray
        with self._lock:
            self._closed = True
            workers = list(self.workers)
        for w in workers:
            try:
                ray.get(w.actor.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a lost actor has nothing left to close
                pass
            try:
                ray.kill(w.actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
