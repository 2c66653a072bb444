"""Submit the real slurm/*.slurm scripts to the local cluster and wait for them (tests/slurm)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCAL_SLURM = REPO / "scripts" / "local-slurm.sh"
SLURM_DIR = REPO / "slurm"
PIPELINE_STEPS = ["prepare", "mean-std", "pretrain", "features", "labels", "knn", "linear", "export", "plots",
                  "report"]
TINY_PIPELINE = {
    "run": {"name": "slurm-test", "seed": 0},
    "data": {"num_workers": 0, "holdout_fraction": 0.3},
    "model": {"arch": "vit_tiny", "patch_size": 8, "out_dim": 256},
    "dino": {"global_crop_size": 32, "local_crop_size": 16, "local_crops_number": 2},
    "optim": {"epochs": 2, "batch_size_per_gpu": 16, "warmup_epochs": 0},
    "train": {"precision": "fp32", "saveckp_freq": 1, "log_every": 1, "tensorboard": False},
    "eval": {"batch_size": 64, "image_size": 32, "knn_k": [5, 10], "linear_epochs": 5, "umap_neighbors": 10},
}
"""A tiny run (ViT-tiny, 32 px crops, 160 synthetic images, 2 epochs): the whole chain in a few
minutes on 2 cores. What the Slurm tests check is the Slurm side, not the model's quality."""
COMPLETION_FIELDS = {"JobID": "JobId", "JobName": "JobName", "Partition": "Partition", "NNodes": "NumNodes",
                     "AllocCPUS": "NumCPUs", "State": "JobState", "ExitCode": "ExitCode", "Start": "StartTime",
                     "End": "EndTime", "NodeList": "NodeList"}
"""What the job completion log (jobcomp/filetxt) keeps of a job, by sacct's name: scontrol's name."""
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED"}


@dataclass(frozen=True)
class Cluster:
    """The local cluster and the environment jobs are submitted with (slurm/env.sh overrides)."""

    env: dict[str, str]
    base: Path

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 60) -> str:
        result = subprocess.run(args, env=self.env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def sbatch(self, script: str, *args: str, cwd: Path, options: tuple[str, ...] = ()) -> str:
        out = self.run("sbatch", "--parsable", *options, str(SLURM_DIR / script), *args, cwd=cwd)
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict; once the controller has forgotten the job (MinJobAge after its end),
        the fields the job completion log keeps (`sacct --completion`), under scontrol's names."""
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=self.env, capture_output=True,
                               text=True, timeout=60)
        if shown.returncode == 0:
            return dict(re.findall(r"(\w[\w/:]*)=(\S*)", shown.stdout))
        text = self.run("sacct", "--completion", "-n", "-P", "-j", job_id, f"--format={','.join(COMPLETION_FIELDS)}")
        rows = [line.split("|") for line in text.splitlines() if line.split("|")[0] == job_id]
        if not rows:
            raise AssertionError(f"job {job_id}: unknown to scontrol ({shown.stderr.strip()}) and to the job "
                                 "completion log")
        info = dict(zip(COMPLETION_FIELDS.values(), rows[-1], strict=True))
        return {**info, "JobState": info["JobState"].split(" ")[0], "Source": "sacct --completion"}  # "CANCELLED by 0"

    def wait(self, job_id: str, timeout: float = 300, poll: float = 1.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in FINAL_STATES:
                return info
            time.sleep(poll)
        raise AssertionError(f"job {job_id} not finished after {timeout} s: {self.job(job_id)}")


def job_env(base: Path) -> dict[str, str]:
    """This process's environment plus .local-slurm/scdino-env.sh, as sbatch should see it."""
    env_file = base / "scdino-env.sh"
    out = subprocess.run(["bash", "-c", f'source "{env_file}" && env -0'], capture_output=True, check=True).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    env["OMP_NUM_THREADS"] = "1"
    return env


def log_of(cwd: Path, info: dict[str, str]) -> str:
    path = Path(info["StdOut"]) if info.get("StdOut") else cwd / "logs" / f"{info['JobName']}_{info['JobId']}.out"
    return path.read_text() if path.exists() else f"(no log at {path})"


def start_cluster() -> tuple[Cluster, bool]:
    """Start (or reuse) the local cluster; returns it and whether it was already running."""
    if os.geteuid() != 0:
        raise RuntimeError(
            "the Slurm integration tests need root (slurmd, munged and network namespaces): "
            "run them as root, e.g. `sudo make test`, or in the CI container"
        )
    was_up = subprocess.run([str(LOCAL_SLURM), "status"], capture_output=True).returncode == 0
    result = subprocess.run([str(LOCAL_SLURM), "start"], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"scripts/local-slurm.sh start failed: {result.stderr.strip()}")
    base = Path(os.environ.get("SLURM_LOCAL_BASE", REPO / ".local-slurm"))
    return Cluster(env=job_env(base), base=base), was_up


def copy_prepared(workdir: Path, name: str) -> Path:
    """A fresh run directory `name` in `workdir` holding the finished pipeline run's prepared inputs
    (packed images, split, mean/std: workdir/run), so that pretraining can start there at once."""
    run = workdir / name
    run.mkdir()
    for item in ("packed", "split.json", "split.npy", "mean_std.json"):
        source = workdir / "run" / item
        (shutil.copytree if source.is_dir() else shutil.copy)(source, run / item)
    return run
