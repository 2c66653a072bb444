"""A planned chain's jobs run here, one after another, each as its batch script runs its step
(`python -m training STEP --config ARGS...`) in a process of its own: what `python -m training profile`
does without Slurm. The first failure stops it; an array of tasks is for Slurm only (plan one job a step)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterable

from training.chain.graph import JobSpec

log = logging.getLogger(__name__)


def command(job: JobSpec) -> list[str]:
    """The step's command line, as slurm/lib.sh's run_step builds it from the script's arguments."""
    return [sys.executable, "-m", "training", job.step, "--config", *job.args]


def run_here(jobs: Iterable[JobSpec]) -> int:
    """Each job in turn; the exit status of the first that fails (the jobs after it are not run), else 0."""
    for job in jobs:
        if "array" in job.sbatch:
            raise ValueError(f"{job.label} is an array of tasks, which run only under Slurm: plan one job per step")
        words = command(job)
        log.info("%s: %s", job.label, " ".join(words[1:]))
        code = subprocess.run(words, check=False).returncode
        if code:
            log.error("%s failed (exit %d); the jobs after it were not run", job.label, code)
            return code
    return 0
