"""Isolated worker processes that run typed jobs: candidates never run in the caller's process.

An illegal memory access poisons the CUDA context of the whole process and a hung kernel can
only be stopped by killing its process, so each worker is a ``python -m forge_pack.evaluate.worker``
child in its own session (process group), talking over a socketpair. A worker kills its own
group when the process that started it dies (``watch_parent``); a CPU candidate's runner
(``forge_pack.evaluate.sandbox``) lives in that group and also dies with the worker.

The worker knows nothing about what it runs. A job is a frozen dataclass with a
``run(ctx: Context)`` method, pickled to the child (unpickling imports the job's module there);
what ``run`` returns is pickled back. ``Context.state`` keeps what a job loaded for the next
ones (the evaluator's input sets: ``forge_pack.evaluate.judge``). The pool's ``startup`` job runs first,
before the worker counts as ready; its result is ``WorkerProcess.ready()``.

Parent side: ``WorkerProcess.run(job, timeout)`` returns the job's result or, never raising for
them, ``JobError`` (the job raised: its traceback) or ``WorkerLost`` (the child crashed, did not
answer in time and was killed, or failed to start). A result whose ``retire`` is true, or a
``JobError`` from a job whose ``usable_after_error(ctx)`` says no, makes the child exit right
after sending it (a poisoned CUDA context cannot be recovered in-process); the pool replaces it.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 300.0  # importing torch and initialising CUDA on a busy machine


@dataclass(frozen=True)
class JobError:
    """The job raised in the child: its traceback (text for a verdict or an error, never parsed)."""

    traceback: str
    retire: bool = False  # the child exits after sending it (the job found the process unusable)


@dataclass(frozen=True)
class WorkerLost:
    """No result: the child died (``crash``), did not answer within the timeout and was killed
    (``timeout``), or failed to start (``start``)."""

    kind: str
    detail: str
    log_tail: str = ""


class Context:
    """What the child keeps between jobs: its backend and ``state``, a dict jobs use to hold what
    they loaded (the parent mirrors what it needs in ``WorkerProcess.memo``)."""

    def __init__(self, backend: str):
        self.backend = backend
        self.state: dict[str, Any] = {}


def _signal_name(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class WorkerProcess:
    """One child process; not thread-safe (the pool hands it to one thread at a time)."""

    def __init__(self, backend: str, index: int, env: dict[str, str], startup: Any, log_dir: str | None = None):
        self.backend, self.index, self.env, self.startup = backend, index, env, startup
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="forge-workers-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.generation = 0
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.generation += 1
        parent_sock, child_sock = socket.socketpair()
        self.log_path = self.log_dir / f"worker-{self.backend}-{self.index}-{self.generation}.log"
        env = dict(os.environ)
        env.update(self.env)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "forge_pack.evaluate.worker", str(child_sock.fileno()),
                                          self.backend, str(os.getpid())], pass_fds=[child_sock.fileno()], env=env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.info: Any = None
        self.memo: dict[str, Any] = {}  # the parent's notes about what this child holds; a new child starts empty
        self.dead = False
        try:
            self.conn.send(self.startup)  # runs while the caller goes on (the child imports torch meanwhile)
        except (OSError, ConnectionError):
            self.dead = True

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()[-chars:]
            return data.decode(errors="replace")
        except OSError:
            return ""

    def _recv(self, timeout: float) -> Any:
        """The child's next message, or WorkerLost."""
        try:
            ready = self.conn.poll(timeout)
        except (OSError, ValueError):  # the connection is gone (a failed restart)
            self.dead = True
            return WorkerLost("crash", "worker connection closed", self.log_tail())
        if not ready:
            self.kill()
            return WorkerLost("timeout", f"no answer within {timeout:.0f} s")
        try:
            return self.conn.recv()
        except (EOFError, OSError, ConnectionError):
            code = self.proc.wait(timeout=30) if self.proc else None
            self.dead = True
            return WorkerLost("crash", f"worker {_signal_name(code)}", self.log_tail())

    def ready(self) -> Any:
        """The startup job's result, or WorkerLost (kind ``start`` when the startup job raised)."""
        if self.info is None:
            got = self._recv(STARTUP_TIMEOUT_S)
            if isinstance(got, WorkerLost):
                return got
            if isinstance(got, JobError):
                self.kill()
                return WorkerLost("start", f"worker failed to start: {got.traceback}", self.log_tail())
            self.info = got
        return self.info

    def run(self, job: Any, timeout: float) -> Any:
        """Run one job in the child: its result, JobError or WorkerLost (never raises for them)."""
        ready = self.ready()
        if isinstance(ready, WorkerLost):
            return ready
        try:
            self.conn.send(job)
        except (OSError, ConnectionError):
            self.dead = True
            return WorkerLost("crash", "worker gone before the job", self.log_tail())
        result = self._recv(timeout)
        if getattr(result, "retire", False):  # the child exits right after sending it
            self.dead = True
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        return result

    def kill(self) -> None:
        self.dead = True
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # our own child's group: it may have compile workers
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()
        try:
            self.conn.close()
        except OSError:
            pass

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        if self.alive:
            try:
                self.conn.send(None)  # no job: exit
                self.proc.wait(timeout=10)
            except (OSError, ConnectionError, subprocess.TimeoutExpired):
                pass
        self.kill()


class WorkerPool:
    """``workers`` children (cuda: one per visible GPU), each started with ``startup``."""

    def __init__(self, backend: str, workers: int, startup: Any, log_dir: str | None = None):
        self.backend = backend
        self.workers: list[WorkerProcess] = []
        self.idle: queue.Queue[WorkerProcess] = queue.Queue()
        envs = worker_envs(backend, workers)
        for i, env in enumerate(envs):
            w = WorkerProcess(backend, i, env, startup, log_dir)
            self.workers.append(w)
            self.idle.put(w)

    @contextmanager
    def acquire(self):
        w = self.idle.get()
        try:
            yield w
        finally:
            try:
                if not w.alive:
                    w.restart()  # the replacement boots while the next candidate compiles
            finally:
                self.idle.put(w)  # never shrink the pool, even if a restart failed (the next job says why)

    def info(self) -> Any:
        """A worker's startup result, or WorkerLost."""
        with self.acquire() as w:
            return w.ready()

    def close(self) -> None:
        for w in self.workers:
            w.close()


def worker_envs(backend: str, workers: int) -> list[dict[str, str]]:
    """Per worker: the GPU it owns (cuda) or its share of the cores (cpu)."""
    if backend == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            devices = [d.strip() for d in visible.split(",") if d.strip()]
        else:
            import torch

            devices = [str(i) for i in range(torch.cuda.device_count())]
        if not devices:
            devices = ["0"]
        n = max(1, min(workers or len(devices), len(devices)))
        return [{"CUDA_VISIBLE_DEVICES": devices[i]} for i in range(n)]
    n = max(1, workers)
    threads = os.environ.get("FORGE_PACK_CPU_THREADS") or str(max(1, (os.cpu_count() or 1) // n))
    # Passive waiting: OpenMP threads that spin after a parallel region steal the cores the next
    # region (or another worker) needs. On 2 busy cores a spinning runtime turned a 0.2 ms kernel
    # into a 7 ms median with a 8 ms IQR; passive gave 0.23 ms with a 0.01 ms IQR (same machine).
    return [{"OMP_NUM_THREADS": threads, "FORGE_PACK_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE"}
            for _ in range(n)]


# ====================================================================== child side


def run_job(job: Any, ctx: Context) -> Any:
    """The job's result, or JobError when it raised (``retire`` when the job finds the process
    unusable afterwards, e.g. a CUDA context poisoned by a sticky error)."""
    try:
        return job.run(ctx)
    except Exception:
        text = traceback.format_exc()[-6000:]
        usable = getattr(job, "usable_after_error", None)
        try:
            retire = usable is not None and not usable(ctx)
        except Exception:
            retire = True
        return JobError(text, retire)


PARENT_POLL_S = 0.2  # how soon an orphaned worker notices; a getppid() every 0.2 s costs nothing


def watch_parent(parent: int) -> None:
    """End this worker's process group (the worker and its CPU runner) once the process that
    started it is gone. The worker runs in a session of its own, so nothing else reaches it when
    the tool is killed (SIGKILL runs no cleanup). PR_SET_PDEATHSIG alone would not do: it fires
    when the parent *thread* exits, and the pool restarts workers from short-lived search threads."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    conn = Connection(int(argv[0]))
    ctx = Context(argv[1])
    if len(argv) > 2:
        watch_parent(int(argv[2]))
    while True:  # the first job is the pool's startup job
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return 0
        except Exception:  # a job that cannot be unpickled here (its module failed to import)
            result: Any = JobError(traceback.format_exc()[-6000:])
        else:
            if job is None:
                return 0
            result = run_job(job, ctx)
        try:
            conn.send(result)
        except (OSError, ConnectionError):
            return 0
        except Exception:  # a result that cannot be pickled
            conn.send(JobError(traceback.format_exc()[-6000:], getattr(result, "retire", False)))
        sys.stdout.flush()
        if getattr(result, "retire", False):
            os._exit(3)  # a poisoned CUDA context cannot be recovered in-process


if __name__ == "__main__":
    # through the module's real name: a JobError pickled from here must be forge_pack.evaluate.worker's
    # class, which the parent can unpickle, not __main__'s
    from forge_pack.evaluate.worker import main as _main

    sys.exit(_main(sys.argv[1:]))
