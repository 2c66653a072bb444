"""Hang detection: the progress watchdog leaves a rank alone while steps complete, and ends a rank
whose step is stuck, within the timeout plus a little, with exit_codes.HANG and one line saying
which rank on which host stopped after which step."""

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from training.recovery.exit_codes import HANG
from training.recovery.failures import read_records
from training.recovery.watchdog import ProgressWatchdog
from training.rundir import RunLayout

REPO = Path(__file__).resolve().parents[3]


class Recording(ProgressWatchdog):
    """Records instead of ending the process, so the thread can be observed in-process."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fired = threading.Event()
        self.messages = []

    def fire(self, idle_s):
        self.messages.append(self.describe(idle_s))
        self.fired.set()
        self._stopped.set()


def test_steps_within_the_timeout_keep_it_quiet_and_silence_makes_it_fire():
    with Recording(0.5, rank=3, poll_s=0.02) as watchdog:
        for step in range(1, 16):
            time.sleep(0.1)
            watchdog.beat(step)
        assert not watchdog.fired.is_set()
        stalled = time.monotonic()
        assert watchdog.fired.wait(5)
        delay = time.monotonic() - stalled
    assert 0.45 <= delay < 1.5
    assert watchdog.messages[0].startswith(f"hang: rank 3 on {socket.gethostname()} completed no training "
                                           "step for ")
    assert watchdog.messages[0].endswith("last completed global step 15")


def test_a_zero_timeout_starts_no_thread():
    before = threading.active_count()
    with ProgressWatchdog(0, rank=0) as watchdog:
        assert threading.active_count() == before and watchdog._thread is None


STUCK_RUN = """
import json, time
from tests.support.heal_run import CPU, scripted, tiny_config
from training.trainer import train

def stuck():
    print(json.dumps({{"stuck_at": time.monotonic()}}), flush=True)
    time.sleep(600)

config = tiny_config({out!r}, **{{"train.hang_timeout_minutes": {minutes}}})
train(config, CPU, loader_factory=scripted(4, {{(0, 2): stuck}}))
"""


@pytest.mark.slow
def test_a_stuck_step_ends_the_process_with_the_hang_status(tmp_path):
    timeout_s = 3.0
    code = STUCK_RUN.format(out=str(tmp_path / "run"), minutes=timeout_s / 60)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    ended = time.monotonic()
    assert proc.returncode == HANG, stderr[-2000:]
    stuck_at = json.loads(stdout.strip().splitlines()[-1])["stuck_at"]
    delay = ended - stuck_at
    assert timeout_s <= delay < timeout_s + 3.0, delay
    hang_lines = [line for line in stderr.splitlines() if "hang: rank 0" in line]
    assert len(hang_lines) == 1
    assert f"on {socket.gethostname()} completed no training step" in hang_lines[0]
    assert "last completed global step 2" in hang_lines[0] and f"exiting {HANG}" in hang_lines[0]
    assert "File " in stderr and "in stuck" in stderr  # every thread's stack: where it hangs
    (record,) = read_records(RunLayout(tmp_path / "run").failure_log)
    assert (record["class"], record["rank"], record["step"]) == ("hang", 0, 2)
    assert record["error"].startswith("hang: rank 0 on ") and f"{record['error']}; exiting {HANG}" in stderr
