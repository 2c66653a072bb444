"""Failures of a training process: which to retry, and a record of each for the job log.

A failure that would repeat (UserError: bad config, missing data, a damaged input file, a diverged
loss, a checkpoint that does not fit the model) is deterministic: retrying it only burns the
allocation. (A damaged checkpoint with an intact one before it is no failure: the resume goes on
from that one, training/checkpointing.py.) Every other
failure (a signal, a CUDA/NCCL error, out of memory, a lost peer, a hang) is transient: resuming
from the last checkpoint is the cure. A rank whose peer vanished records "lost-peer": the peer that
died (killed outright, or with its node) usually had no chance to record anything itself.

Records are JSON lines appended to RunLayout.failure_log, so that the batch script can end the job
log with one line per failure (training/recovery/policy.py):
  {"kind": "failure", "class": "deterministic"|"transient"|"lost-peer"|"hang", "rank", "host", "error", "step",
   "job", "attempt", "restart", "time"}     written by the rank that failed, when it still can
  {"kind": "resume", "checkpoint", "epoch", "step_in_epoch", "global_step", "job", "attempt",
   "restart", "time"}                        written by rank 0 when training starts again after one
A deterministic failure also leaves RunLayout.failure_marker (the same record): the batch script
does not retry, and a worker that torchrun restarts within the same job attempt stops at once.
`job` is SLURM_JOB_ID, `attempt` SLURM_RESTART_COUNT (requeues), `restart` torchrun's
TORCHELASTIC_RESTART_COUNT (in-job restarts).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from training.errors import UserError
from training.rundir import RunLayout
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)

_ERROR_CHARS = 400
"""An error's message is cut to this: one readable line, not a C++ stack trace."""


class NotRetriedError(UserError):
    """This job attempt already failed deterministically; a restarted worker stops at once."""


def where(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Job id, requeue count and torchrun restart count of this process (None outside Slurm)."""
    env = os.environ if environ is None else environ
    return {"job": env.get("SLURM_JOB_ID"), "attempt": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
            "restart": int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)}


LOST_PEER = ("connection closed by peer", "connection reset by peer", "broken pipe",
             "remote process exited", "socket closed")
"""How gloo and NCCL word a collective whose peer is gone: this rank only saw another one fail."""


def classify(exc: BaseException) -> str:
    """deterministic for what the user must fix (UserError); lost-peer for a collective whose peer
    vanished (the cause is elsewhere); transient for the rest."""
    if isinstance(exc, UserError):
        return "deterministic"
    text = str(exc).lower()
    return "lost-peer" if any(words in text for words in LOST_PEER) else "transient"


def one_line(exc: BaseException | str) -> str:
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 3] + "..."


def append_record(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, appended in a single write (ranks may append at the same moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps({**record, "time": round(time.time(), 3)}) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record, oldest first; a torn last line (a rank killed mid-write) is skipped."""
    if not path.exists():
        return []
    records = []
    with open(path) as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def record_failure(layout: RunLayout, rank: int, kind: str, error: str, step: int | None) -> None:
    """Append the failure; a deterministic one also leaves the marker that stops any retry."""
    record = {"kind": "failure", "class": kind, "rank": rank, "host": socket.gethostname(),
              "error": one_line(error), "step": step, **where()}
    append_record(layout.failure_log, record)
    if kind == "deterministic":
        write_json_atomic(layout.failure_marker, record, indent=None)


@contextmanager
def failure_guard(layout: RunLayout, rank: int, last_step: Callable[[], int | None]) -> Iterator[None]:
    """Record an exception that ends training (then let it go on: the CLI prints a UserError on one
    line and exits 2; anything else ends the process with a traceback and status 1)."""
    try:
        yield
    except NotRetriedError:
        raise
    except Exception as exc:
        kind = classify(exc)
        log.error("rank %d on %s: %s failure%s: %s", rank, socket.gethostname(), kind,
                  ", not retried" if kind == "deterministic" else "", one_line(exc))
        try:
            record_failure(layout, rank, kind, one_line(exc), last_step())
        except OSError as write_error:
            log.error("could not record the failure in %s: %s", layout.failure_log, write_error)
        raise


def read_marker(path: Path) -> dict[str, Any] | None:
    """The failure marker's record, None without a marker, {} for one that cannot be read."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def marks_attempt(marker: dict[str, Any] | None, job: str | None, attempt: int) -> bool:
    """Whether the marker was left by this job attempt (then it is not retried)."""
    return marker is not None and (marker.get("job"), marker.get("attempt")) == (job, attempt)


def refuse_if_failed(layout: RunLayout, *, is_main: bool) -> None:
    """Stop a worker that torchrun restarted after a deterministic failure in this job attempt;
    clear a marker left by an earlier attempt or job (the user fixed the cause and started again)."""
    marker = read_marker(layout.failure_marker)
    if marker is None:
        return
    now = where()
    if now["job"] is not None and marks_attempt(marker, now["job"], now["attempt"]):
        raise NotRetriedError(f"not retried: this job attempt already failed on rank {marker.get('rank')} "
                              f"({marker.get('host')}): {marker.get('error')}")
    if is_main:
        layout.failure_marker.unlink(missing_ok=True)
        log.info("cleared the failure marker of an earlier run (%s): %s", marker.get("job"), marker.get("error"))


def unresolved(records: list[dict[str, Any]]) -> bool:
    """Whether a failure was recorded after the last resume (a launch record in between, the batch
    script's requeue, leaves it unresolved: this start is its resume)."""
    for record in reversed(records):
        if record.get("kind") == "resume":
            return False
        if record.get("kind") == "failure":
            return True
    return False


def restart_number(records: list[dict[str, Any]], now: dict[str, Any]) -> int:
    """The in-job (torchrun) restart this start is, counted over the job attempt: this agent's
    TORCHELASTIC_RESTART_COUNT, unless it is lower than that. An agent whose own workers were still
    healthy when another node's agent restarted restarts them without counting, so rank 0's count
    can stay 0 after a restart the failed worker's agent counted. 0 when this start is no in-job
    restart (the first start of a requeued attempt)."""
    attempt = [r for r in records if r.get("job") == now["job"] and r.get("attempt") == now["attempt"]]
    if now["restart"] == 0 and not unresolved(attempt):
        return 0
    earlier = sum(1 for r in attempt if r.get("kind") == "resume" and r.get("restart", 0) > 0)
    return max(now["restart"], earlier + 1)


def record_resume(layout: RunLayout, checkpoint: str | None, epoch: int, step_in_epoch: int,
                  global_step: int, *, preempted: bool) -> None:
    """Rank 0, as training starts: note where it resumes if this start follows a failure: a recorded
    one, a torchrun restart (a worker that died without a record), or a requeue that no pre-emption
    asked for (Slurm's after a lost node, NODE_FAIL)."""
    now, records = where(), read_records(layout.failure_log)
    requeued_by_slurm = now["attempt"] > 0 and not preempted
    if now["restart"] == 0 and not requeued_by_slurm and not unresolved(records):
        return
    now["restart"] = restart_number(records, now)
    append_record(layout.failure_log, {"kind": "resume", "checkpoint": checkpoint, "epoch": epoch,
                           "step_in_epoch": step_in_epoch, "global_step": global_step, **now})
    log.warning("restarted after a failure (torchrun restart %d, job attempt %d): resuming from %s at "
                "epoch %d, step %d of the epoch", now["restart"], now["attempt"],
                checkpoint or "the start (no checkpoint yet)", epoch + 1, step_in_epoch)
