"""The live view of `make demo` (scripts/demo.sh) shows the last line of a job's log that has been
written whole: a progress bar's latest finished state, never a piece of one. Exercised by sourcing
the script's function in bash, without Slurm. Also, with an `scontrol` that answers as the controller does,
that the live view keeps following a job in a rare state of one still to end (the local cluster cannot be
made to hold one on demand)."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from tests.support.local_slurm import REPO

BAR = "epoch 1/10: {pct:>3}%|{bar:<10}| {n}/31 [00:0{n}<00:13,  1.52it/s]"


def bar(n: int) -> str:
    return BAR.format(pct=round(100 * n / 31), bar="█" * (n // 3), n=n)


def last_complete_line(path, window: int | None = None) -> str:
    call = f'last_complete_line "$1"{" " + str(window) if window else ""}'
    out = subprocess.run(["bash", "-c", f'source scripts/demo.sh && {call}', "_", str(path)], cwd=REPO,
                         capture_output=True, check=True)
    return out.stdout.decode()


@pytest.mark.parametrize(("written", "shown"), [
    # tqdm's redraws: "\r" then the new state; the last state is still being written
    ("INFO start\n" + "".join(f"\r{bar(n)}" for n in (1, 2, 3)) + f"\r{bar(4)[:27]}", bar(3)),
    # the same bar once its state is followed by the next redraw's "\r"
    ("INFO start\n" + "".join(f"\r{bar(n)}" for n in (1, 2, 3)) + "\r", bar(3)),
    # a closed bar, then a log line and blank lines (also "\r\n" line ends)
    (f"\r{bar(31)}\nINFO epoch 1 done\r\n\r\n\n", "INFO epoch 1 done"),
    # a log line half-written: the line before it is the latest whole one
    ("INFO first\nINFO second is long", "INFO first"),
    # nothing whole yet
    (f"\r{bar(1)[:12]}", ""),
    ("", ""),
])
def test_the_live_view_shows_the_latest_whole_state(tmp_path, written, shown):
    log = tmp_path / "job.out"
    log.write_bytes(written.encode())
    assert last_complete_line(log) == (shown + "\n" if shown else "")


def test_a_window_cut_from_a_long_log_never_shows_its_cut_first_piece(tmp_path):
    log = tmp_path / "job.out"
    whole = bar(5)
    log.write_bytes(("x" * 500 + "\n" + whole + "\n" + "y" * 30).encode())
    assert last_complete_line(log, window=len(whole.encode()) + 35) == whole + "\n"
    # the window starts inside the bar, inside a multi-byte character: nothing whole in it
    start = whole.encode().index("█".encode()) + 1
    assert last_complete_line(log, window=len(whole.encode()) - start + 31) == ""


def test_a_missing_log_shows_nothing(tmp_path):
    assert last_complete_line(tmp_path / "not-yet.out") == ""


FAKE_SCONTROL = """#!/bin/sh
# `scontrol show job -o ID`: job 5 completed; job 6 an array whose tasks are staging out and being
# signalled at the first poll, completed at the next. Each question is written to {calls}.
echo "$4" >> "{calls}"
if [ "$4" = 5 ] || grep -qx 6 "{polled}" 2>/dev/null; then echo "JobId=$4 JobState=COMPLETED"; exit 0; fi
echo 6 > "{polled}"
echo "JobId=6 ArrayTaskId=0 JobState=STAGE_OUT"
echo "JobId=7 ArrayTaskId=1 JobState=SIGNALING"
"""


def test_a_job_in_any_state_still_to_end_is_followed_to_its_end(tmp_path):
    """STAGE_OUT and SIGNALING are states of a job that has not ended: the view waits, it does not stop; a job
    once completed is not asked about again."""
    calls = tmp_path / "calls"
    (tmp_path / "scontrol").write_text(FAKE_SCONTROL.format(calls=calls, polled=tmp_path / "polled"))
    (tmp_path / "scontrol").chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "LOG_DIR": str(tmp_path)}
    result = subprocess.run(["bash", "-c", 'source scripts/demo.sh && follow "mean-std 5" "prepare 6"'], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "prepare:SIGNALING" in result.stdout and "prepare:done" in result.stdout
    assert calls.read_text().split() == ["5", "6", "6"]
