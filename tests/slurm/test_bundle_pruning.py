"""A code update while jobs hold the older bundle, on the real local Slurm cluster: a job submitted by hand
names its bundle in its comment when it starts (slurm/lib.sh), a job that submit_pipeline.sh submits names
it from submission on, and the node bootstrap (bootstrap/on-node-configured.sh), asking the cluster's own
squeue, keeps that bundle through two activations; once the jobs have ended, the next activation removes it.

The bootstrap downloads the bundles from S3, which this machine cannot reach: a fake `aws` copies them from
a folder (as tests/bootstrap/test_bootstrap.py does, which also covers the environments on FSx). Everything
else is real: squeue, sbatch, scontrol, the jobs, and the job submitted by hand runs as `nobody`, as a
user's would, so that its comment is one a user may set on their own job. How lib.sh writes the comment
(a user's own comment kept, another bundle's mark replaced, squeue failing) is checked first, without the
cluster, with squeue and scontrol replaced by functions that answer as they do."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.bootstrap_fakes import FAKE_AWS, REQUIREMENTS
from tests.support.local_slurm import REPO, TINY_PIPELINE, log_of

BOOTSTRAP = REPO / "bootstrap" / "on-node-configured.sh"
HOLDER = """#!/bin/bash
# A job submitted by hand: it sources env.sh and lib.sh as every slurm/*.slurm script does, then waits for
# the test to release it, and imports the training package of the bundle it started with.
#SBATCH --job-name=scdino-holds-a-bundle   # squeue name
#SBATCH --ntasks=1                         # one process
#SBATCH --cpus-per-task=1                  # leaves the rest of the node to the others
set -euo pipefail
source "$SCDINO_SLURM_DIR/env.sh"
source "$SCDINO_SLURM_DIR/lib.sh"
echo "home $SCDINO_HOME"
echo "venv $SCDINO_VENV"
while [ ! -e "$RELEASE" ]; do sleep 0.5; done
"$SCDINO_PYTHON" -c 'import training; print("code", training.__file__)'
"""


def _deploy(root: Path, bundle_id: str, *, mtime: int) -> None:
    """A deploy: bundle <id>.zip and the pointer to it, last modified at `mtime`, in the fake bucket."""
    s3 = root / "s3"
    (s3 / "bundles").mkdir(parents=True, exist_ok=True)
    (s3 / "bootstrap").mkdir(exist_ok=True)
    with zipfile.ZipFile(s3 / "bundles" / f"{bundle_id}.zip", "w") as bundle:
        bundle.writestr("requirements.txt", REQUIREMENTS)
        bundle.writestr("training/__init__.py", "")
    shutil.copy(REPO / "bootstrap" / "cluster-env.py", s3 / "bootstrap" / "cluster-env.py")
    pointer = s3 / "bootstrap" / "current.json"
    pointer.write_text(json.dumps({"bundle": f"s3://bucket/bundles/{bundle_id}.zip", "id": bundle_id}))
    os.utime(pointer, (mtime, mtime))


SYSTEM_PYTHON = Path("/usr/bin/python3.11")
"""The image's environment is built on the system's interpreter: the job that runs it as `nobody` cannot
run one under root's home folder (where a checkout's interpreter may live)."""


def _image_venv(path: Path) -> None:
    """The image's environment built from the bundles' requirements (no pip install, no shared environment)."""
    assert SYSTEM_PYTHON.exists(), f"{SYSTEM_PYTHON} is needed (Debian 12's python3.11 package)"
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(path)], check=True)
    (path / "scdino-requirements").mkdir()
    (path / "scdino-requirements" / "requirements.txt").write_text(REQUIREMENTS)


def _bootstrap(root: Path, cluster_env: dict[str, str]) -> str:
    """The node bootstrap as a node runs it after a deploy, with the cluster's real squeue on PATH."""
    env = {**cluster_env, "PATH": f"{root / 'bin'}:{cluster_env['PATH']}", "FAKE_S3_DIR": str(root / "s3"),
           "SCDINO_BOOTSTRAP_LOG": str(root / "bootstrap.log"), "SCDINO_IMAGE_VENV": str(root / "opt" / "scdino-venv"),
           "SCDINO_SHARED_VENVS": str(root / "fsx" / "venvs"), "SCDINO_CLUSTER_CONFIG": str(root / "cfnconfig"),
           "SCDINO_MONITORING_ENV": str(root / "monitoring.env"), "SCDINO_WORK_DIR": str(root / "fsx" / "work")}
    result = subprocess.run(["bash", str(BOOTSTRAP), "s3://bucket/bootstrap/current.json", str(root / "apps" / "scdino")],
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout


def _comment(cluster, job: str) -> str:
    return cluster.run("squeue", "--noheader", f"--jobs={job}", "--format=%k").strip()


def _until(condition, what: str, timeout: float = 300) -> None:
    """Poll `condition`; the wait is the scheduler's and the node's (a job to be started on a busy cluster), so
    it allows what Cluster.wait allows."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not after {timeout} s: {what}"
        time.sleep(0.5)


@pytest.fixture
def root():
    """A folder every user can read (the bundles) with a work folder `nobody` can write its log to."""
    path = Path(tempfile.mkdtemp(prefix="scdino-bundles-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _record(home: Path, comment: str, **env: str) -> list[str]:
    """What slurm/lib.sh does, sourced in job 42 whose SCDINO_HOME is `home` and whose comment squeue shows as
    `comment` ("FAIL": squeue fails): the scontrol calls it makes and the lines it logs."""
    script = """
        source slurm/env.sh
        squeue() { echo "squeue $*" >&2; [ "$COMMENT" != FAIL ] || return 1; echo "$COMMENT"; }
        scontrol() { echo "scontrol $*"; }
        source slurm/lib.sh
    """
    result = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
                            env={"PATH": "/usr/bin:/bin", "SCDINO_HOME": str(home), "SLURM_JOB_ID": "42",
                                 "COMMENT": comment, **env})
    return [*result.stdout.splitlines(), *(line.split("] ", 1)[-1] for line in result.stderr.splitlines())]


def test_a_job_names_its_bundle_in_its_comment_once_keeping_the_user_s_own(tmp_path):
    bundle = tmp_path / "scdino-abc123"
    bundle.mkdir()
    (tmp_path / "scdino").symlink_to(bundle)
    mark = f"scdino-bundle:{bundle}"
    update = f"scontrol update JobId=42 Comment={mark}"
    assert _record(tmp_path / "scdino", "(null)") == []  # not an installed bundle (a checkout): nothing to keep
    (bundle / ".ready").write_text("s3://bucket/bundles/abc123.zip\n")  # the bootstrap's marker: now it is one
    assert _record(tmp_path / "scdino", "(null)")[0] == update
    assert _record(tmp_path / "scdino", "my screen scdino-bundle:/apps/scdino-old")[0] == \
        f"scontrol update JobId=42 Comment=my screen {mark}"  # a requeued job that started on newer code
    assert not any(line.startswith("scontrol") for line in _record(tmp_path / "scdino", f"my screen {mark}"))
    assert _record(bundle, "(null)", SCDINO_JOB_COMMENT=mark) == []  # submit_pipeline.sh gave it: not even asked
    failed = _record(bundle, "FAIL")
    assert failed[-1] == "warning: squeue could not read this job's comment: its bundle is not named there"
    assert not any(line.startswith("scontrol") for line in failed)


@pytest.mark.slurm
@pytest.mark.slow
def test_two_activations_spare_the_bundle_of_pending_and_running_jobs_and_the_next_removes_it(cluster, root):
    (root / "bin").mkdir()
    (root / "bin" / "aws").write_text(FAKE_AWS)
    (root / "bin" / "aws").chmod(stat.S_IRWXU)
    (root / "opt").mkdir()
    _image_venv(root / "opt" / "scdino-venv")
    apps, work = root / "apps", root / "work"
    work.mkdir(mode=0o1777)
    work.chmod(0o1777)
    _deploy(root, "one111", mtime=1_000)
    _bootstrap(root, cluster.env)
    held = apps / "scdino-one111"
    assert (apps / "scdino").resolve() == held

    # The jobs see /apps/scdino, as on a cluster, and this checkout's scripts. The job by hand runs in the
    # environment env.sh picks for its bundle (the image's); the submitter plans with this checkout's venv.
    env = {**cluster.env, "SCDINO_HOME": str(apps / "scdino"), "SCDINO_SLURM_DIR": str(REPO / "slurm"),
           "RELEASE": str(work / "release")}
    user_env = {name: value for name, value in env.items() if name not in ("SCDINO_VENV", "SCDINO_PYTHON")}
    (work / "holder.sh").write_text(HOLDER)
    by_hand = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sbatch", "--parsable",
                              f"--output={work}/%x_%j.out", str(work / "holder.sh")], cwd=work, env=user_env,
                             capture_output=True, text=True, timeout=60)
    assert by_hand.returncode == 0, by_hand.stderr
    holder = by_hand.stdout.strip().split(";")[0]
    _until(lambda: _comment(cluster, holder) == f"scdino-bundle:{held}", f"job {holder} names {held}")
    (work / "run.yaml").write_text(yaml.safe_dump({**TINY_PIPELINE, "run": {"output_dir": str(work / "run")},
                                                   "data": {"source": str(work / "images")}}))
    submitted = subprocess.run([str(REPO / "slurm" / "submit_pipeline.sh"), "run.yaml", "--to", "prepare", "--after",
                                holder], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    (pending,) = [line.split()[1] for line in submitted.stdout.splitlines() if line.startswith("prepare ")]
    assert cluster.job(pending)["JobState"] == "PENDING"
    assert _comment(cluster, pending) == f"scdino-bundle:{held}"  # from submission on

    try:
        _deploy(root, "two222", mtime=2_000)
        _bootstrap(root, cluster.env)
        _deploy(root, "three333", mtime=3_000)
        out = _bootstrap(root, cluster.env)
        assert (apps / "scdino").resolve() == apps / "scdino-three333"
        (keeping,) = [line for line in out.splitlines() if f"keeping {held}: job(s)" in line]
        assert f" {holder} " in keeping and f" {pending} " in keeping
        assert sorted(path.name for path in apps.glob("scdino-*/")) == ["scdino-one111", "scdino-three333",
                                                                         "scdino-two222"]
    finally:
        cluster.run("scancel", pending)
        (work / "release").touch()
    info = cluster.wait(holder, timeout=120)
    log = log_of(work, info)
    assert info["JobState"] == "COMPLETED", log
    assert f"home {held}\nvenv {held}/.venv\n" in log and f"code {held}/training/__init__.py\n" in log

    _deploy(root, "four444", mtime=4_000)
    out = _bootstrap(root, cluster.env)
    assert f"removing old bundle {held}" in out
    assert sorted(path.name for path in apps.glob("scdino-*/")) == ["scdino-four444", "scdino-three333"]
