"""slurm/heal.sh's run_healing in plain bash, with scontrol and sleep stubbed (no Slurm cluster):
a transient failure requeues the job once, then stops; a deterministic one is not retried and exits
2; torchrun gets its restart budget; the job log ends with one line per failure."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = ("SCDINO_MAX_RESTARTS", "SCDINO_MAX_REQUEUES", "PET_MAX_RESTARTS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
"""Settings the script reads or sets: the test's own values only, whatever the calling shell has."""

HARNESS = r"""
set -euo pipefail
source "$REPO/slurm/lib.sh"
source "$REPO/slurm/heal.sh"
scontrol() { echo "scontrol $*" >>"$CALLS"; }
sleep() { echo "sleep $*" >>"$CALLS"; }
# A training launch: records what a failing rank would, then ends with the given status.
launch() {
  echo "PET_MAX_RESTARTS=${PET_MAX_RESTARTS:-unset} share=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-unset}" >>"$CALLS"
  if [ "$1" != none ]; then
    "$SCDINO_PYTHON" -c 'import sys
from training.rundir import RunLayout
from training.recovery.failures import record_failure
record_failure(RunLayout(sys.argv[1]), 1, sys.argv[2], sys.argv[3], 12)' "$RUN" "$1" "$3"
  fi
  return "$2"
}
rc=0
run_healing "$CONFIG" -- launch "$@" || rc=$?
echo "rc=$rc" >>"$CALLS"
"""


@pytest.fixture
def heal(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"run:\n  output_dir: {tmp_path / 'run'}\n")

    def run(*launch_args, restart_count=0, **env):
        calls = tmp_path / "calls"
        calls.unlink(missing_ok=True)
        inherited = {k: v for k, v in os.environ.items() if k not in OURS}
        environ = {**inherited, "REPO": str(REPO), "CALLS": str(calls), "CONFIG": str(config),
                   "RUN": str(tmp_path / "run"), "SCDINO_PYTHON": sys.executable, "PYTHONPATH": str(REPO),
                   "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "pretrain", "SLURM_RESTART_COUNT": str(restart_count),
                   **env}
        done = subprocess.run(["bash", "-c", HARNESS, "harness", *launch_args], cwd=REPO, env=environ,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        heal_lines = [line for line in done.stderr.splitlines() if line.startswith("heal: ")]
        return calls.read_text().splitlines(), heal_lines, done.stderr
    return run


def test_transient_failure_requeues_once_then_stops(heal):
    calls, lines, _ = heal("transient", "1", "RuntimeError: NCCL error")
    assert calls == ["PET_MAX_RESTARTS=3 share=1", "scontrol requeue 4242", "sleep 300", "rc=1"]
    assert lines == [f"heal: failure 1: rank 1 on {os.uname().nodename}, transient: RuntimeError: NCCL error "
                     "(after global step 12) -> launch ended with status 1: requeueing the job "
                     "(failure requeue 1 of 1)"]

    calls, lines, stderr = heal("none", "137", "", restart_count=1)
    assert calls == ["PET_MAX_RESTARTS=3 share=1", "rc=137"]
    assert len(lines) == 2 and lines[1].startswith("heal: failure 2: a worker ended without a record")
    assert lines[1].endswith("launch ended with status 137 (signal SIGKILL): stopped: no restart left "
                             "(SCDINO_MAX_RESTARTS, SCDINO_MAX_REQUEUES)")
    assert "after every restart allowed; not retried" in stderr


def test_deterministic_failure_is_not_retried_and_exits_2(heal):
    calls, lines, stderr = heal("deterministic", "1", "MissingInputError: mean_std not found", SCDINO_MAX_RESTARTS="1")
    assert calls == ["PET_MAX_RESTARTS=1 share=1", "rc=2"]
    assert len(lines) == 1 and "deterministic: MissingInputError: mean_std not found" in lines[0]
    assert lines[0].endswith("not retried (a deterministic failure: fix the cause, then resubmit)")


def test_success_is_quiet(heal):
    calls, lines, _ = heal("none", "0", "")
    assert calls == ["PET_MAX_RESTARTS=3 share=1", "rc=0"] and lines == []


@pytest.mark.parametrize("name", ["SCDINO_MAX_RESTARTS", "SCDINO_MAX_REQUEUES"])
def test_a_bad_budget_is_refused_naming_the_setting(heal, name):
    calls, _, stderr = heal("none", "0", "", **{name: "three"})
    assert calls == ["rc=2"]
    assert f"error: {name} must be a whole number >= 0 (0 turns it off), got 'three'" in stderr
