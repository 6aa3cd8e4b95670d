"""Isolated worker processes: candidates never run in the caller's process.

An illegal memory access poisons the CUDA context of the whole process and a hung kernel can
only be stopped by killing its process, so each worker is a ``python -m forge_pack.evaluate.worker``
child in its own session (process group), talking over a socketpair with pickled messages. A
worker kills its own group when the process that started it dies (``watch_parent``); a CPU
candidate's runner (``forge_pack.evaluate.sandbox``) lives in that group and also dies with the worker.

Parent side: ``WorkerProcess`` (start, request with a timeout, kill) and ``WorkerPool`` (one
worker per GPU on cuda, ``--workers`` on cpu; a dead worker is replaced). Child side:
``Session`` keeps the hotspot's input sets loaded between candidates (loading captured tensors
per candidate would kill throughput), verifies and times candidates, and measures baselines.

Messages: {"cmd": "load" | "evaluate" | "baseline" | "exit", ...} -> dict reply. A reply with
``poisoned: True`` means the CUDA context is unusable; the child exits right after sending it.
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
from collections import OrderedDict
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path

STARTUP_TIMEOUT_S = 300.0  # importing torch and initialising CUDA on a busy machine


class WorkerDied(Exception):
    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail


class WorkerTimeout(Exception):
    pass


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

    def __init__(self, backend: str, index: int, env: dict[str, str], log_dir: str | None = None):
        self.backend, self.index, self.env = backend, index, env
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
        self.info: dict | None = None
        self.loaded: OrderedDict = OrderedDict()  # hotspot keys whose input sets the child holds (its LRU)
        self.dead = False

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()[-chars:]
            return data.decode(errors="replace")
        except OSError:
            return ""

    def _recv(self, timeout: float):
        try:
            ready = self.conn.poll(timeout)
        except (OSError, ValueError):  # the connection is gone (a failed restart)
            self.dead = True
            raise WorkerDied("worker connection closed", self.log_tail())
        if not ready:
            self.kill()
            raise WorkerTimeout(f"no answer within {timeout:.0f} s")
        try:
            return self.conn.recv()
        except (EOFError, OSError, ConnectionError):
            code = self.proc.wait(timeout=30) if self.proc else None
            self.dead = True
            raise WorkerDied(f"worker {_signal_name(code)}", self.log_tail())

    def ready(self) -> dict:
        if self.info is None:
            msg = self._recv(STARTUP_TIMEOUT_S)
            if "hello" not in msg:
                self.kill()
                raise WorkerDied(f"worker failed to start: {msg.get('error', msg)}", self.log_tail())
            self.info = msg["hello"]
        return self.info

    def request(self, msg: dict, timeout: float) -> dict:
        self.ready()
        try:
            self.conn.send(msg)
        except (OSError, ConnectionError):
            self.dead = True
            raise WorkerDied("worker gone before the request", self.log_tail())
        reply = self._recv(timeout)
        if reply.get("poisoned"):
            self.dead = True
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        return reply

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

    def mark_loaded(self, key: str) -> None:
        """Mirror the child's LRU of loaded hotspots (Session.MAX_CACHED)."""
        self.loaded[key] = True
        self.loaded.move_to_end(key)
        while len(self.loaded) > Session.MAX_CACHED:
            self.loaded.popitem(last=False)

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        if self.alive:
            try:
                self.conn.send({"cmd": "exit"})
                self.proc.wait(timeout=10)
            except (OSError, ConnectionError, subprocess.TimeoutExpired):
                pass
        self.kill()


class WorkerPool:
    def __init__(self, backend: str, workers: int, log_dir: str | None = None):
        self.backend = backend
        self.workers: list[WorkerProcess] = []
        self.idle: queue.Queue[WorkerProcess] = queue.Queue()
        envs = worker_envs(backend, workers)
        for i, env in enumerate(envs):
            w = WorkerProcess(backend, i, env, log_dir)
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
                self.idle.put(w)  # never shrink the pool, even if a restart failed (the next request says why)

    def info(self) -> dict:
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


class Session:
    """Worker-side state: device, copy bandwidth, cached input sets per hotspot."""

    MAX_CACHED = 2  # hotspots whose sets stay loaded (captured tensors can be hundreds of MB)

    def __init__(self, backend: str):
        import torch

        self.torch = torch
        self.backend = backend
        self.device = "cuda" if backend == "cuda" else "cpu"
        if backend == "cpu" and os.environ.get("FORGE_PACK_THREADS"):
            torch.set_num_threads(int(os.environ["FORGE_PACK_THREADS"]))
        self.copy_bw: float | None = None
        self.sets: OrderedDict = OrderedDict()

    def hello(self) -> dict:
        torch = self.torch
        info = {"backend": self.backend, "pid": os.getpid(), "torch": torch.__version__}
        if self.backend == "cuda":
            from forge_pack.evaluate.launch import DEV_SMEM_OPTIN, Driver

            props = torch.cuda.get_device_properties(0)
            Driver.get().ensure_context()
            info.update(name=props.name, capability=f"{props.major}.{props.minor}", arch=f"sm_{props.major}{props.minor}",
                        sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
                        l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
                        smem_optin_bytes=Driver.get().device_attribute(DEV_SMEM_OPTIN),
                        cuda=torch.version.cuda)
        else:
            info.update(name="cpu", threads=torch.get_num_threads())
        return info

    def bandwidth(self, cfg) -> float:
        if self.copy_bw is None:
            from forge_pack.evaluate.timing import copy_bandwidth_gbs

            self.copy_bw = copy_bandwidth_gbs(self.device, cfg)
        return self.copy_bw

    def load(self, req: dict) -> dict:
        from forge_pack.core.signature import Signature
        from forge_pack.evaluate.verify import static_sets

        key = req["key"]
        if key not in self.sets:
            sig = Signature.from_json(req["signature"])
            sets, skipped = static_sets(sig, req.get("captures", []), req.get("run_dir"), self.device,
                                        req.get("seed", 0), req.get("final", False))
            self.sets[key] = (sets, skipped)
            while len(self.sets) > self.MAX_CACHED:
                self.sets.popitem(last=False)
        self.sets.move_to_end(key)
        return {"ok": True, "sets": [s.kind for s in self.sets[key][0]], "skipped": self.sets[key][1]}

    def evaluate(self, req: dict) -> dict:
        from forge_pack.evaluate.evaluator import worker_evaluate

        return worker_evaluate(self, req)

    def baseline(self, req: dict) -> dict:
        from forge_pack.evaluate.evaluator import worker_baseline

        return worker_baseline(self, req)

    def healthy(self) -> bool:
        """After a CUDA error: is the context still usable? (sticky errors poison it for good)"""
        if self.backend != "cuda":
            return True
        try:
            self.torch.cuda.synchronize()
            return float(self.torch.ones(1, device="cuda").add_(1).item()) == 2.0
        except Exception:
            return False


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
    backend = argv[1]
    if len(argv) > 2:
        watch_parent(int(argv[2]))
    try:
        session = Session(backend)
        conn.send({"hello": session.hello()})
    except Exception:
        conn.send({"error": traceback.format_exc()})
        return 2
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        cmd = msg.get("cmd")
        if cmd == "exit":
            return 0
        t0 = time.perf_counter()
        try:
            reply = getattr(session, cmd)(msg)
        except Exception:
            reply = {"error": traceback.format_exc()[-6000:]}
            if not session.healthy():
                reply["poisoned"] = True
        reply["worker_s"] = time.perf_counter() - t0
        conn.send(reply)
        sys.stdout.flush()
        if reply.get("poisoned"):
            os._exit(3)  # a poisoned CUDA context cannot be recovered in-process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
