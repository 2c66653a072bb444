"""Progress watchdog: a rank that completes no training step for too long ends its own process.

A stuck collective (a peer that died, was stopped or lost its network) blocks the main thread in
C++, where no Python signal handler or exception reaches it; the collective's own timeout may be
far longer or, for a stopped peer on gloo, wait on an open socket. A daemon thread notices instead:
when no step (or save) was reported for `timeout_s`, it logs one line with the rank, host and last
step, dumps every thread's stack to stderr (which collective it hangs in), and ends the process
with exit_codes.HANG through os._exit, since the main thread cannot be unwound. torchrun then
restarts the worker group, or the batch script requeues the job (slurm/heal.sh).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import sys
import threading
import time
from typing import Callable

from training.recovery.exit_codes import HANG

log = logging.getLogger(__name__)

ON_FIRE_LIMIT_S = 10.0
"""How long the watchdog waits for its `on_fire` (recording the failure) before exiting anyway."""


class ProgressWatchdog:
    """Use as a context manager around the training loop; call `beat(step)` after every step."""

    def __init__(self, timeout_s: float, *, rank: int, poll_s: float | None = None,
                 on_fire: Callable[[str, int | None], None] | None = None) -> None:
        self.timeout_s = timeout_s
        self.rank, self.host = rank, socket.gethostname()
        self.poll_s = poll_s if poll_s is not None else min(max(timeout_s / 20, 0.05), 10.0)
        self.on_fire = on_fire
        self.last_step: int | None = None
        self._last_beat = time.monotonic()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ProgressWatchdog":
        if self.timeout_s > 0:
            self._last_beat = time.monotonic()
            self._thread = threading.Thread(target=self._watch, name="progress-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def beat(self, step: int) -> None:
        """A step (or a save) completed: the clock starts again."""
        self.last_step = step
        self._last_beat = time.monotonic()

    def _watch(self) -> None:
        while not self._stopped.wait(self.poll_s):
            idle = time.monotonic() - self._last_beat
            if idle >= self.timeout_s:
                self.fire(idle)

    def describe(self, idle_s: float) -> str:
        last = "no step yet" if self.last_step is None else f"last completed global step {self.last_step}"
        return (f"hang: rank {self.rank} on {self.host} completed no training step for {idle_s:.0f} s "
                f"(train.hang_timeout_minutes={self.timeout_s / 60:g}); {last}")

    def fire(self, idle_s: float) -> None:
        """Log, record, dump stacks, and end the process with exit_codes.HANG."""
        message = self.describe(idle_s)
        log.critical("%s; exiting %d so the launcher restarts training", message, HANG)
        try:
            if self.on_fire is not None:  # bounded: a hung shared file system must not keep the rank alive
                recorder = threading.Thread(target=self.on_fire, args=(message, self.last_step), daemon=True)
                recorder.start()
                recorder.join(ON_FIRE_LIMIT_S)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        finally:
            for handler in logging.getLogger().handlers:
                handler.flush()
            sys.stderr.flush()
            os._exit(HANG)
