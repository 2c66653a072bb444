"""The local Slurm cluster for the integration tests: started once per session, stopped at the end
only if this session started it. Needs root; without it every slurm test fails saying so.
Also the tiny pipeline run, submitted once per session and shared by test_pipeline.py (its chain)
and test_recovery.py (which starts pretraining again from its prepared inputs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.local_slurm import LOCAL_SLURM, PIPELINE_STEPS, REPO, TINY_PIPELINE, Cluster, log_of, start_cluster


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    try:
        local, was_up = start_cluster()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield local
    if not was_up:
        subprocess.run([str(LOCAL_SLURM), "stop"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def pipeline_workdir(tmp_path_factory) -> Path:
    """A synthetic dataset and run.yaml (the tiny run, output in run/) in a fresh folder."""
    from training.data.synthetic.folders import write_dataset

    root = tmp_path_factory.mktemp("pipeline")
    write_dataset(root / "images", classes=4, per_class=40)
    config = {**TINY_PIPELINE, "run": {**TINY_PIPELINE["run"], "output_dir": str(root / "run")},
              "data": {**TINY_PIPELINE["data"], "source": str(root / "images")}}
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="session")
def pipeline(cluster, pipeline_workdir) -> dict[str, dict[str, str]]:
    """Submit the chain with slurm/submit_pipeline.sh and wait for its last job: each step's
    `scontrol show job` fields. prepare runs as a 2-task array (one task per node) and its merge."""
    out = cluster.run(str(REPO / "slurm" / "submit_pipeline.sh"), "run.yaml", "--prepare-tasks", "2",
                      cwd=pipeline_workdir)
    jobs = dict(line.split() for line in out.splitlines())
    infos = {"prepare-parts": cluster.wait(jobs["prepare-parts"], timeout=600)}
    for step in PIPELINE_STEPS:
        infos[step] = cluster.wait(jobs[step], timeout=600)
        assert infos[step]["JobState"] == "COMPLETED", f"{step}: {log_of(pipeline_workdir, infos[step])}"
    return infos
