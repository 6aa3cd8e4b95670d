"""Elapsed-time progress for a long step (timing eager, confirming, the whole-model check, a pip
build): ``with step("confirming", say) as s: work(say=s.say)``.

Nothing extra for a step that ends within ``SHOW_AFTER_S``. Past that, on a terminal a line that
redraws itself every second (a spinner and the seconds so far); in a log (not a terminal) a line
every ``LOG_EVERY_S``. A step that took longer than ``SHOW_AFTER_S`` ends with one line saying how
long it took (or that it failed after so long). Lines said inside the step go through ``s.say``,
which first clears the redrawn line so the two never share a row.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO

SHOW_AFTER_S = 2.0  # shorter steps stay silent: a line per sub-second step would bury the output
LOG_EVERY_S = 10.0  # in a log file, often enough to show it is alive, rare enough to stay readable
TICK_S = 0.5  # terminal redraw period
_SPINNER = "|/-\\"


class Step:
    def __init__(self, label: str, say: Callable[[str], None] | None = None, stream: TextIO | None = None,
                 show_after_s: float = SHOW_AFTER_S, log_every_s: float = LOG_EVERY_S, tick_s: float = TICK_S):
        self.label = label
        self.stream = stream or sys.stderr  # as it is now: tests and wrappers swap sys.stderr
        self._say = say or (lambda text: print(text, file=self.stream, flush=True))
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.show_after_s, self.log_every_s, self.tick_s = show_after_s, log_every_s, tick_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._open = False  # a redrawn line is on the terminal now
        self._t0 = 0.0
        self._thread: threading.Thread | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def say(self, text: str) -> None:
        with self._lock:
            self._clear()
            self._say(text)

    def __enter__(self) -> "Step":
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._tick, name="forge-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        took = self.elapsed_s
        with self._lock:
            self._clear()
            if took >= self.show_after_s:
                self._say(f"  {self.label}: {'failed after' if exc_type else 'done in'} {took:.1f} s")

    def _clear(self) -> None:
        if self._open:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._open = False

    def _tick(self) -> None:
        logged = 0.0
        i = 0
        while not self._stop.wait(self.tick_s):
            took = self.elapsed_s
            if took < self.show_after_s:
                continue
            with self._lock:
                if self._stop.is_set():
                    return
                if self.tty:
                    self.stream.write(f"\r  {self.label} {_SPINNER[i % len(_SPINNER)]} {took:.0f} s\x1b[K")
                    self.stream.flush()
                    self._open = True
                    i += 1
                elif took - logged >= self.log_every_s:
                    self._say(f"  {self.label}: {took:.0f} s so far")
                    logged = took


def step(label: str, say: Callable[[str], None] | None = None, **kw) -> Step:
    return Step(label, say, **kw)
