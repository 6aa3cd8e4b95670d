"""One worker per device: the evaluator's pool when a search is spread over several GPUs.

A ``Device`` is a label (what the run store records: ``cuda:3``) and the environment its worker
starts with (``CUDA_VISIBLE_DEVICES=3``, so the worker's ``cuda:0`` is that GPU and nothing it
times runs anywhere else). ``DevicePool`` starts one ``WorkerProcess`` per device and hands each
to one evaluation at a time, so no two timed runs ever share a GPU. Tests build the same pool
from CPU "devices" (``cpu_devices``): the dispatch logic is the same.

All workers report their device at start (the ``Startup`` job); a pool whose GPUs are not one
model is refused (``check_one_model``): a kernel's speedup is measured against a baseline timed
on one device, and a package is confirmed for one GPU model, so mixing an H100 with an H200 in
one search would compare timings of different machines.

``DeviceLost`` is raised by a worker whose device went away with the job (a Ray actor on a lost
node): the evaluator runs the job again on another device, the candidate is never blamed.
"""

from __future__ import annotations

import os
import queue
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from forge_pack.core.errors import ForgeError
from forge_pack.evaluate.worker import WorkerLost, WorkerPool, WorkerProcess

# How long an evaluation waits for a device when every one was lost and none came back: long
# enough for Ray to place a replacement actor, short enough that a dead cluster is an error.
NO_DEVICE_TIMEOUT_S = 600.0


class DeviceLost(Exception):
    """The device (not the candidate) is gone with the job in flight: run the job elsewhere."""


@dataclass(frozen=True)
class Device:
    label: str  # recorded per evaluation, e.g. "cuda:3" (the host's own index) or "cpu:1"
    backend: str  # cuda | cpu
    env: dict = field(default_factory=dict)  # the worker's environment on top of the parent's


def cuda_devices(indices: list[str]) -> list[Device]:
    """One device per physical GPU index (as CUDA_VISIBLE_DEVICES names them: numbers or UUIDs)."""
    return [Device(f"cuda:{i}", "cuda", {"CUDA_VISIBLE_DEVICES": str(i)}) for i in indices]


def cpu_devices(n: int, prefix: str = "cpu") -> list[Device]:
    """``n`` CPU workers as devices, each with its share of the cores (the pool's CPU form)."""
    threads = os.environ.get("FORGE_PACK_CPU_THREADS") or str(max(1, (os.cpu_count() or 1) // max(n, 1)))
    # passive OpenMP waiting for the reason given in worker.worker_envs
    env = {"OMP_NUM_THREADS": threads, "FORGE_PACK_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE"}
    return [Device(f"{prefix}:{i}", "cpu", dict(env)) for i in range(n)]


def first_gpu(config: dict) -> str | None:
    """The first GPU a ``--gpus`` run searched on (config.json keeps the ids the flag resolved to);
    None for any other run, whose later steps use the default device."""
    gpus = str((config or {}).get("gpus") or "")
    first = gpus.split(",")[0].strip()
    if not first or first == "all" or (config or {}).get("ray"):
        return None
    return first


def confirm_pool(config: dict, backend: str, log_dir: str | None = None) -> "DevicePool | None":
    """The pool of the confirmation before packing for a ``--gpus`` run: one worker on the run's first
    GPU (config.json holds the ids the flag resolved to), so the package is confirmed on the GPU model
    the search timed on; the default pool would take the first visible GPU, which --gpus may have
    left out. None for any other run (the default pool)."""
    first = first_gpu(config)
    if backend != "cuda" or first is None:
        return None
    from forge_pack.evaluate.judge import Startup

    return DevicePool(cuda_devices([first]), Startup(), log_dir)


def model_of(info: dict) -> str:
    """What makes two devices interchangeable for timing: the GPU's name and compute capability."""
    if info.get("backend") == "cpu":
        return "cpu"
    return f"{info.get('name', '?')} (sm_{str(info.get('capability', '?')).replace('.', '')})"


def check_one_model(reports: list[tuple[str, dict]]) -> None:
    """ForgeError when the devices (label, startup report) are not all one model."""
    groups: dict[str, list[str]] = {}
    for label, info in reports:
        groups.setdefault(model_of(info), []).append(label)
    if len(groups) <= 1:
        return
    listing = "; ".join(f"{m}: {', '.join(labels)}" for m, labels in groups.items())
    largest = max(groups.values(), key=len)
    ids = ",".join(label.split(":", 1)[-1] for label in largest)
    raise ForgeError(f"the GPUs of one search must be one model, these are {len(groups)}: {listing}",
                     f"search on one model's GPUs, e.g. --gpus {ids} (timings of different GPU models "
                     f"are not comparable, and a package is confirmed on one model)")


class DevicePool(WorkerPool):
    """A ``WorkerPool`` with one worker per ``Device``; the worker handed out carries ``.device``.

    Every worker starts at once and the pool waits until all have reported (or failed): the
    model check needs every report, and a GPU that cannot start a worker is an error now, not a
    failed verdict per candidate later."""

    def __init__(self, devices: list[Device], startup: Any, log_dir: str | None = None):
        if not devices:
            raise ValueError("a device pool needs at least one device")
        backends = {d.backend for d in devices}
        if len(backends) != 1:
            raise ValueError(f"one backend per pool, got {sorted(backends)}")
        self.backend = devices[0].backend
        self.devices = list(devices)
        self.workers: list[WorkerProcess] = []
        self.idle: queue.Queue[WorkerProcess] = queue.Queue()
        for i, d in enumerate(devices):
            w = WorkerProcess(d.backend, i, dict(d.env), startup, log_dir)
            w.device = d.label  # type: ignore[attr-defined]
            self.workers.append(w)
        self._check_started()
        for w in self.workers:
            self.idle.put(w)

    @property
    def slots(self) -> int:
        """Evaluations the pool runs at once: one per device."""
        return len(self.workers)

    def _check_started(self) -> None:
        reports = []
        for w in self.workers:
            info = w.ready()
            if isinstance(info, WorkerLost):
                self.close()
                raise ForgeError(f"the worker for {w.device} did not start: {info.detail.strip()[:500]}",  # type: ignore[attr-defined]
                                 f"its log is {w.log_path}; check that the device is visible and free "
                                 f"(nvidia-smi), or leave it out of --gpus")
            reports.append((w.device, info))  # type: ignore[attr-defined]
        try:
            check_one_model(reports)
        except ForgeError:
            self.close()
            raise
        self.reports = reports

    def info(self) -> Any:
        """The first device's report, with every device's label (they are one model)."""
        first = dict(self.reports[0][1])
        first["devices"] = [label for label, _ in self.reports]
        return first

    @contextmanager
    def acquire(self):
        try:
            w = self.idle.get(timeout=NO_DEVICE_TIMEOUT_S)
        except queue.Empty:
            raise RuntimeError(f"no device became free within {NO_DEVICE_TIMEOUT_S:.0f} s") from None
        try:
            yield w
        finally:
            try:
                if not w.alive:
                    w.restart()  # on the same device: the replacement boots while the next candidate compiles
            finally:
                self.idle.put(w)


def run_on_a_device(pool: Any, fn: Callable[[Any], Any], attempts: int = 8,
                    on_lost: Callable[[str], None] | None = None) -> Any:
    """``fn(worker)`` on a device of ``pool``; a ``DeviceLost`` runs it again on another (and tells
    ``on_lost`` the lost device's label).

    ``attempts`` bounds the re-queues of one job: a job that every device loses in turn is the
    job's doing (it takes its node down), not bad luck, and must end."""
    for attempt in range(attempts):
        with pool.acquire() as w:
            try:
                return fn(w)
            except DeviceLost as e:
                last = e
                note = getattr(pool, "note_lost", None)
                if callable(note):
                    note(w, str(e))
                if on_lost is not None:
                    on_lost(str(getattr(w, "device", "")))
    raise RuntimeError(f"the job was lost with its device {attempts} times in a row: {last}")
