"""One search per run directory: an exclusive flock on RUN_DIR/lock for the whole run. No torch import.

flock, not a pid file: the kernel releases it when the process ends however it ends (kill -9
too), so a crashed run never leaves a stale lock behind. A second ``--resume`` of a run still
going is refused instead of searching the same database twice.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from forge_pack.core.errors import ForgeError

try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "lock"


class RunLock:
    """An exclusive, non-blocking flock on RUN_DIR/lock. The holder's pid is written into the file
    only to name it in the refusal."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None or self.fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if not isinstance(e, BlockingIOError):  # a filesystem without flock (ENOLCK, EOPNOTSUPP)
                os.close(fd)
                warnings.warn(f"cannot lock {self.path} ({e.strerror}): two searches of this run directory "
                              "would not be kept apart", RuntimeWarning, stacklevel=2)
                return
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise ForgeError(f"another forge-pack process{who} is searching {self.path.parent} right now",
                             "wait for it to finish, or stop it (Ctrl-C, or the dashboard's stop) and then "
                             f"continue with --resume {self.path.parent}") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None
