"""pretrain's refusal of a worker that torchrun restarts after a deterministic failure of the same job
attempt: it stops before torch is imported and the ranks meet (a Python start, not a set-up), with the one
line train() would have printed; a marker an earlier attempt left lets it go on to the process group."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from tests.support.local_slurm import REPO
from tests.support.tiny import run_config
from training.config import dump_config
from training.recovery.failures import record_failure
from training.rundir import RunLayout
from training.steps import pretrain

MISSING = "MissingInputError: mean/std file not found at run/mean_std.json: run `python -m training mean-std` first"


def test_a_restarted_worker_of_the_failed_attempt_stops_before_torch_is_imported(tmp_path, slurm_job):
    config = run_config(tmp_path / "run")
    dump_config(config, tmp_path / "run.yaml")
    # Rank 0 of attempt 0 of job 4242 failed deterministically (as train() records it), then torchrun restarts.
    record_failure(RunLayout.from_config(config), 0, "deterministic", MISSING, None)
    env = {**os.environ, "TORCHELASTIC_RESTART_COUNT": "1"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "training", "pretrain", "--config",
                           str(tmp_path / "run.yaml")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: not retried: this job attempt already failed on rank 0 ({os.uname().nodename}): "
                      f"{MISSING}"]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "training.cli" in imported, "-X importtime lists the imports"
    assert "torch" not in imported, "torch imported before the refusal"


def test_a_marker_of_an_earlier_attempt_does_not_stop_the_start(tmp_path, slurm_job):
    """Attempt 1 after a requeue (the user fixed the cause): the early check lets it go on to the process group,
    where train() clears the marker on rank 0."""
    config = run_config(tmp_path / "run")
    layout = RunLayout.from_config(config)
    record_failure(layout, 0, "deterministic", MISSING, None)
    slurm_job.setenv("SLURM_RESTART_COUNT", "1")

    class Met(Exception):
        """The ranks would meet now: the start went past the refusal."""

    def process_group():
        raise Met

    slurm_job.setattr("training.distributed.groups.process_group", process_group)
    with pytest.raises(Met):
        pretrain.run(config, layout, argparse.Namespace())
    assert layout.failure_marker.exists(), "only rank 0, in train(), clears it"
