"""slurm/lib.sh's share_cores in plain bash (no Slurm cluster; the SLURM_* variables a job would
have are set by hand): on the local cluster a job's processes divide the machine's cores, a step that
fixes its threads keeps them, and on any other cluster OMP_NUM_THREADS is left alone."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = ("SCDINO_SHARED_CORES", "SCDINO_STEP_THREADS", "SLURM_JOB_NUM_NODES", "SLURM_ARRAY_TASK_COUNT",
        "OMP_NUM_THREADS")


def threads(procs: int = 1, **env: str) -> str:
    """OMP_NUM_THREADS after `share_cores PROCS` in a shell with exactly `env` of OURS set."""
    base = {k: v for k, v in os.environ.items() if k not in OURS}
    script = f'source "{REPO}/slurm/lib.sh"; share_cores {procs}; echo "${{OMP_NUM_THREADS:-unset}}"'
    done = subprocess.run(["bash", "-c", script], env={**base, **env}, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.parametrize(("procs", "env", "expected"), [
    (1, {"SLURM_JOB_NUM_NODES": "1"}, "8"),          # features, knn, plots: the whole machine
    (1, {"SLURM_JOB_NUM_NODES": "2"}, "4"),          # pretraining: two nodes on one machine
    (2, {"SLURM_JOB_NUM_NODES": "2"}, "2"),          # two processes on each
    (1, {"SLURM_JOB_NUM_NODES": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, "2"),  # an array's tasks side by side
    (4, {"SLURM_JOB_NUM_NODES": "4"}, "1"),          # never fewer than one
    (1, {"SLURM_JOB_NUM_NODES": "1", "SCDINO_STEP_THREADS": "1"}, "1"),     # ingest keeps its one
])
def test_the_local_clusters_jobs_divide_its_cores(procs, env, expected):
    assert threads(procs, SCDINO_SHARED_CORES="8", OMP_NUM_THREADS="1", **env) == expected


def test_a_real_cluster_keeps_its_own_setting():
    assert threads(1, SLURM_JOB_NUM_NODES="1") == "unset"
    assert threads(1, SLURM_JOB_NUM_NODES="1", OMP_NUM_THREADS="6") == "6"
