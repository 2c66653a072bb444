"""The live view of `make demo` and `make screen` (scripts/demo.sh) on the real local cluster: it reads a
job's end after the controller has forgotten it, and every stop names the step, the job, why and the
log to read. Nothing here depends on how fast the machine is: the controller is made to forget jobs
(MinJobAge=2) and the tests wait for it to have done so.

`test_the_demo_chain_finishes_when_slurm_forgets_its_jobs` runs scripts/demo.sh itself, as `make demo`
does, on a tiny config with MinJobAge far below the chain's time: the end of `make demo` and `make
screen` on a machine half as fast as ours was exactly this (scontrol exited 1 for the first forgotten
job and `set -e` ended the script without a word)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support.local_slurm import LOCAL_SLURM, REPO, TINY_PIPELINE, Cluster

pytestmark = pytest.mark.slurm

SHORT_AGE = "2"


@pytest.fixture(scope="module")
def forgetful(cluster: Cluster):
    """The local cluster with MinJobAge=2 s (applied by `scontrol reconfigure`, no restart); the usual 600 s
    again afterwards."""
    def start(age: str | None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "SLURM_LOCAL_MIN_JOB_AGE"}
        if age:
            env["SLURM_LOCAL_MIN_JOB_AGE"] = age
        subprocess.run([str(LOCAL_SLURM), "start"], env=env, check=True, capture_output=True, timeout=300)

    start(SHORT_AGE)
    assert "MinJobAge               = 2 sec" in cluster.run("scontrol", "show", "config")
    yield cluster
    start(None)


def known_to_controller(cluster: Cluster, job: str) -> bool:
    return subprocess.run(["scontrol", "show", "job", job], env=cluster.env, capture_output=True).returncode == 0


def wait_forgotten(cluster: Cluster, job: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while known_to_controller(cluster, job):
        assert time.monotonic() < deadline, f"the controller still holds job {job} after {timeout} s"
        time.sleep(1)


def follow(cluster: Cluster, log_dir: Path, *entries: str, unknown_seconds: int = 120):
    """scripts/demo.sh's follow() on "STEP JOBID" entries, in a bash that sourced the script."""
    env = {**cluster.env, "LOG_DIR": str(log_dir), "DEMO_UNKNOWN_SECONDS": str(unknown_seconds)}
    return subprocess.run(["bash", "-c", 'source scripts/demo.sh && follow "$@"', "_", *entries], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)


def test_a_job_the_controller_forgot_is_read_from_the_completion_log(forgetful, tmp_path):
    job = forgetful.run("sbatch", "--parsable", "--wrap", "true", cwd=tmp_path).strip()
    wait_forgotten(forgetful, job)
    result = follow(forgetful, tmp_path, f"prepare {job}")
    assert result.returncode == 0, result.stderr
    assert "prepare:done" in result.stdout


def test_a_failed_step_is_named_with_its_state_and_its_log(forgetful, tmp_path):
    log = tmp_path / "scdino-knn_%j.out"
    job = forgetful.run("sbatch", "--parsable", f"--output={log}", "--wrap",
                        "echo 'ValueError: eval.knn_k must be positive'; exit 3", cwd=tmp_path).strip()
    wait_forgotten(forgetful, job)  # the worst case: only the completion log still knows it
    result = follow(forgetful, tmp_path, f"knn {job}")
    assert result.returncode == 1
    assert f"step knn (job {job}) ended FAILED" in result.stderr
    assert str(tmp_path / f"scdino-knn_{job}.out") in result.stderr
    assert "ValueError: eval.knn_k must be positive" in result.stderr


def test_a_job_no_source_knows_stops_the_view_with_the_reason(forgetful, tmp_path):
    unknown = str(int(forgetful.run("sbatch", "--parsable", "--wrap", "true", cwd=tmp_path).strip()) + 10_000)
    result = follow(forgetful, tmp_path, f"pretrain {unknown}", unknown_seconds=2)
    assert result.returncode == 1
    assert f"no Slurm source has known step pretrain (job {unknown}) for 2 s" in result.stderr
    assert "scripts/local-slurm.sh status" in result.stderr


@pytest.mark.slow
def test_the_demo_chain_finishes_when_slurm_forgets_its_jobs(forgetful, tmp_path):
    config = {**TINY_PIPELINE, "run": {**TINY_PIPELINE["run"], "output_dir": str(tmp_path / "run")},
              "data": {**TINY_PIPELINE["data"], "source": str(tmp_path / "images")}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "DEMO_CONFIG": str(tmp_path / "run.yaml"), "DEMO_PER_CLASS": "40",
           "SLURM_LOCAL_MIN_JOB_AGE": SHORT_AGE}
    result = subprocess.run([str(REPO / "scripts" / "demo.sh")], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "== done in" in result.stdout
    jobs = [line.split() for line in (tmp_path / "run" / "logs" / "jobs.txt").read_text().splitlines()]
    assert [step for step, _ in jobs][:3] == ["prepare", "mean-std", "pretrain"]
    # The situation rehearsed did happen: the first jobs were forgotten while the chain still ran.
    assert not known_to_controller(forgetful, jobs[0][1])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["knn"]["final"]["top1"] > 0
    # Each step's time, the forgotten ones too, from the job completion log.
    assert set(results["job_seconds"]) == {step for step, _ in jobs}
    assert results["bill"]["source"] == "sacct --completion (job completion log)"
