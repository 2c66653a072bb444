"""After a training launch ends: retry or not, and one line per failure for the end of the job log.

    python -m training.recovery.policy --failure-log FILE --failure-marker FILE --exit-code RC \
        [--max-requeues N]

slurm/heal.sh runs this in the batch shell once the launch (srun + torchrun) has returned and the
pre-emption path has had its turn. It appends a "launch" record to the failure log, prints the job's
failure lines on stderr and one word on stdout:
  done         the launch succeeded
  requeue      a transient failure outlived torchrun's in-job restarts: requeue the job
  not-retried  a deterministic failure (this job attempt's marker, or status 2): the job exits 2
  stop         a transient failure, but the failure requeues (SCDINO_MAX_REQUEUES) are used up
The records are those of training/recovery/failures.py; only this Slurm job's are summarised.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from training.recovery.exit_codes import DETERMINISTIC, HANG, OK
from training.recovery.failures import append_record, marks_attempt, read_marker, read_records, where

_PRIORITY = {"hang": 0, "deterministic": 1, "transient": 2, "lost-peer": 3}
"""Which of several ranks' records of one incident names its cause: a hang or a deterministic error
first; a lost peer is only a survivor's view of a failure elsewhere."""

UNRECORDED = ("a worker ended without a record (killed by a signal such as SIGKILL or the OOM killer, "
              "or its node was lost; torchrun's 'failed (exitcode: ...) local_rank: ...' line names it)")


SLURM_REQUEUE = ("the job was requeued by Slurm with no record from training (a lost node: NODE_FAIL, "
                 "or scontrol requeue)")


def is_deterministic(exit_code: int, marker: dict[str, Any] | None, job: str | None, attempt: int) -> bool:
    """Status 2 (a UserError where the launcher passes statuses through), or this attempt's marker."""
    return exit_code == DETERMINISTIC or marks_attempt(marker, job, attempt)


def requeues_so_far(records: list[dict[str, Any]], job: str | None) -> int:
    return sum(1 for r in records if r.get("kind") == "launch" and r.get("decision") == "requeue"
               and r.get("job") == job)


def decide(exit_code: int, deterministic: bool, requeues: int, max_requeues: int) -> str:
    """done, requeue, not-retried or stop (see the module docstring)."""
    if exit_code == OK:
        return "done"
    if deterministic:
        return "not-retried"
    return "requeue" if requeues < max_requeues else "stop"


def status_text(code: int) -> str:
    """Exit status in words: srun reports death by signal N as 128 + N."""
    if code == HANG:
        return f"status {code} (hang detected by the progress watchdog)"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"status {code} (signal {signal.Signals(code - 128).name})"
    return f"status {code}"


def cause(failures: list[dict[str, Any]]) -> str:
    """The incident's cause in words, from the record that names it best."""
    if not failures:
        return UNRECORDED
    first = min(failures, key=lambda r: (_PRIORITY.get(r.get("class"), 9), r.get("time", 0)))
    others = len({r.get("rank") for r in failures} - {first.get("rank")})
    step = "no step yet" if first.get("step") is None else f"after global step {first['step']}"
    more = f"; {others} other rank(s) failed with it" if others else ""
    seen = f"rank {first.get('rank')} on {first.get('host')}"
    if first.get("class") == "lost-peer":
        return f"{UNRECORDED}; {seen} lost its peer: {first.get('error')} ({step}{more})"
    return f"{seen}, {first.get('class')}: {first.get('error')} ({step}{more})"


def outcome(record: dict[str, Any], max_requeues: int) -> str:
    if record["kind"] == "resume":
        at = (f"{record['checkpoint']} at epoch {record['epoch'] + 1}, step {record['step_in_epoch']} of the "
              "epoch" if record.get("checkpoint") else "the start (no checkpoint yet)")
        return f"resumed from {at} (torchrun restart {record['restart']}, job attempt {record['attempt']})"
    if record["decision"] == "requeue":
        ending = f"requeueing the job (failure requeue {record['requeue_number']} of {max_requeues})"
    elif record["decision"] == "not-retried":
        ending = "not retried (a deterministic failure: fix the cause, then resubmit)"
    else:
        ending = "stopped: no restart left (SCDINO_MAX_RESTARTS, SCDINO_MAX_REQUEUES)"
    return f"launch ended with {status_text(record['exit_code'])}: {ending}"


def summary(records: list[dict[str, Any]], job: str | None, max_requeues: int) -> list[str]:
    """One line per failure of this job: who, what, and how training went on (or why not)."""
    lines: list[str] = []
    pending: list[dict[str, Any]] = []
    requeued = False  # the last line ended in our requeue: the next resume completes that line
    for record in (r for r in records if r.get("job") == job):
        kind = record.get("kind")
        if kind == "failure":
            pending.append(record)
        elif kind == "resume" and requeued and not pending:
            lines[-1] += f" -> {outcome(record, max_requeues)}"
            requeued = False
        elif kind == "resume" or (kind == "launch" and record["exit_code"] != OK):
            slurm_requeue = kind == "resume" and not pending and record["attempt"] > 0 and record["restart"] == 0
            what = SLURM_REQUEUE if slurm_requeue else cause(pending)
            lines.append(f"failure {len(lines) + 1}: {what} -> {outcome(record, max_requeues)}")
            pending, requeued = [], kind == "launch" and record["decision"] == "requeue"
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.recovery.policy", description=__doc__.splitlines()[0])
    parser.add_argument("--failure-log", type=Path, required=True)
    parser.add_argument("--failure-marker", type=Path, required=True)
    parser.add_argument("--exit-code", type=int, required=True)
    parser.add_argument("--max-requeues", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    now = where()
    records = read_records(args.failure_log)
    deterministic = is_deterministic(args.exit_code, read_marker(args.failure_marker), now["job"], now["attempt"])
    requeues = requeues_so_far(records, now["job"])
    decision = decide(args.exit_code, deterministic, requeues, args.max_requeues)
    launch = {"kind": "launch", "exit_code": args.exit_code, "decision": decision,
              "deterministic": deterministic, "requeue_number": requeues + (decision == "requeue"), **now}
    append_record(args.failure_log, launch)
    for line in summary([*records, launch], now["job"], args.max_requeues):
        print(f"heal: {line}", file=sys.stderr)
    print(decision)
    return 0


if __name__ == "__main__":
    sys.exit(main())
