"""The whole pipeline as Slurm jobs on the local cluster, and pre-emption with requeue and resume.

A tiny run (ViT-tiny, 32 px crops, 160 synthetic images, 2 epochs) keeps this to a few minutes on 2
cores; what is under test is the Slurm side: the chain, its dependencies, pretraining across both
nodes, and that a pre-empted pretraining loses no finished epoch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml
from slurm_helpers import REPO, log_of

pytestmark = pytest.mark.slurm

STEPS = ["prepare", "mean-std", "pretrain", "features", "labels", "knn", "linear", "plots", "report"]
TINY = {
    "run": {"name": "slurm-test", "seed": 0},
    "data": {"num_workers": 0, "holdout_fraction": 0.3},
    "model": {"arch": "vit_tiny", "patch_size": 8, "out_dim": 256},
    "dino": {"global_crop_size": 32, "local_crop_size": 16, "local_crops_number": 2},
    "optim": {"epochs": 2, "batch_size_per_gpu": 16, "warmup_epochs": 0},
    "train": {"precision": "fp32", "saveckp_freq": 1, "log_every": 1, "tensorboard": False},
    "eval": {"batch_size": 64, "image_size": 32, "knn_k": [5, 10], "linear_epochs": 5, "umap_neighbors": 10},
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    from training.data.synthetic import write_dataset

    root = tmp_path_factory.mktemp("pipeline")
    write_dataset(root / "images", classes=4, per_class=40)
    config = {**TINY, "run": {**TINY["run"], "output_dir": str(root / "run")},
              "data": {**TINY["data"], "source": str(root / "images")}}
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="module")
def pipeline(cluster, workdir):
    """Submit the chain with slurm/submit_pipeline.sh and wait for its last job."""
    out = cluster.run(str(REPO / "slurm" / "submit_pipeline.sh"), "run.yaml", cwd=workdir)
    jobs = dict(line.split() for line in out.splitlines())
    infos = {}
    for step in STEPS:
        infos[step] = cluster.wait(jobs[step], timeout=600)
        assert infos[step]["JobState"] == "COMPLETED", f"{step}: {log_of(workdir, infos[step])}"
    return infos


def test_submitter_prints_one_job_per_step_in_order(pipeline):
    ids = [int(pipeline[step]["JobId"]) for step in STEPS]
    assert ids == sorted(ids)
    assert [pipeline[step]["JobName"] for step in STEPS] == [f"scdino-{step}" for step in STEPS]


def test_each_step_waited_for_the_previous_one(pipeline):
    for before, after in zip(STEPS, STEPS[1:]):
        assert pipeline[after]["StartTime"] >= pipeline[before]["EndTime"], (before, after)
        assert pipeline[after]["Dependency"] in ("(null)", ""), "afterok satisfied"


def test_pretraining_ran_across_both_nodes(pipeline, workdir):
    info = pipeline["pretrain"]
    assert info["NumNodes"] == "2" and info["NodeList"] in ("node[1-2]", "node1,node2")
    log = log_of(workdir, info)
    assert "2 node(s) x 1 process(es)" in log
    assert re.search(r"rank 1/2 joined \(gloo", log), log[-2000:]


def test_every_step_left_its_outputs(pipeline, workdir):
    run = workdir / "run"
    for relative in ("packed", "split.json", "mean_std.json", "checkpoints/checkpoint.pth", "metrics.jsonl",
                     "features/final", "features/raw_pixels", "features/random_init", "labels.json",
                     "knn/knn.json", "knn/knn.md", "linear/linear.json", "report.html"):
        assert (run / relative).exists(), relative
    assert list((run / "plots").glob("*.png"))
    timings = json.loads((run / "timings.json").read_text())
    assert set(STEPS) <= set(timings)
    epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "epoch"]
    assert epochs == [0, 1]


def test_knn_result_has_the_model_and_both_baselines(pipeline, workdir):
    knn = json.loads((workdir / "run" / "knn" / "knn.json").read_text())
    assert {"final", "raw_pixels", "random_init"} <= set(knn["tags"])
    for entry in knn["tags"].values():
        assert set(entry["top1"]) == {"5", "10"}
        assert all(0 <= value <= 100 for value in entry["top1"].values())


def copy_prepared(workdir: Path, name: str) -> Path:
    """A fresh run directory `name` holding the pipeline run's prepared inputs (packed images, split,
    mean/std), so that pretraining can start there at once."""
    run = workdir / name
    run.mkdir()
    for item in ("packed", "split.json", "mean_std.json"):
        source = workdir / "run" / item
        (shutil.copytree if source.is_dir() else shutil.copy)(source, run / item)
    return run


def epoch_records(run: Path) -> list[int]:
    if not (run / "metrics.jsonl").exists():
        return []
    records = (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip())
    return [r["epoch"] for r in records if r["kind"] == "epoch"]


def test_preempted_pretraining_requeues_and_loses_no_finished_epoch(cluster, pipeline, workdir):
    """USR1 to the batch shell (as Slurm sends before the time limit) mid-run: the workers save and
    stop, the job requeues itself, and the second attempt resumes where the first stopped."""
    run = copy_prepared(workdir, "preempt")
    epochs = 3
    job = cluster.sbatch("pretrain.slurm", "run.yaml", "--set", f"run.output_dir={run}", "--set",
                         f"optim.epochs={epochs}", cwd=workdir)
    deadline = time.monotonic() + 180
    while not epoch_records(run):
        assert time.monotonic() < deadline, log_of(workdir, cluster.job(job))
        assert cluster.job(job)["JobState"] in ("PENDING", "RUNNING"), log_of(workdir, cluster.job(job))
        time.sleep(0.3)
    cluster.run("scancel", "--batch", "--signal=USR1", job)
    info = cluster.wait(job, timeout=300)
    log = log_of(workdir, info)
    assert info["JobState"] == "COMPLETED", log
    assert info["Restarts"] == "1", f"expected one requeue: {log}"
    marker = re.search(r"pre-empted \((\{.*?\})\); requeueing", log)
    assert marker, log
    stopped_at = json.loads(marker.group(1))["epoch"]
    assert 1 <= stopped_at < epochs, "the signal should land after the first epoch and before the end"
    assert "attempt 2" in log
    assert epoch_records(run) == list(range(epochs)), "every epoch exactly once: none lost, none redone"
    assert not (run / "checkpoints" / "PREEMPTED").exists()


def worker_pids(run: Path) -> list[int]:
    """Training worker processes of the run in `run` (not the torchrun agents, srun or bash)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if (len(text) > 3 and "python" in Path(text[0]).name and "torch.distributed.run" not in text
                and "pretrain" in text and any(a == f"run.output_dir={run}" for a in text)):
            pids.append(int(proc.name))
    return sorted(pids)


def step_records(run: Path) -> list[dict]:
    if not (run / "metrics.jsonl").exists():
        return []
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip() and json.loads(line)["kind"] == "step"]


@pytest.mark.slow
def test_a_killed_worker_is_restarted_in_the_job_and_loses_no_epoch(cluster, pipeline, workdir):
    """kill -9 of one training worker mid-epoch: torchrun restarts the workers in the same job, they
    resume from the last (time-based, mid-epoch) checkpoint, and the job ends with one line per failure."""
    run = copy_prepared(workdir, "killed")
    epochs = 3
    job = cluster.sbatch("pretrain.slurm", "run.yaml", "--set", f"run.output_dir={run}", "--set",
                         f"optim.epochs={epochs}", "--set", "train.checkpoint_every_minutes=0.005", cwd=workdir)
    deadline = time.monotonic() + 180
    while not (step_records(run) and (run / "checkpoints" / "checkpoint.pth").exists() and worker_pids(run)):
        assert time.monotonic() < deadline, log_of(workdir, cluster.job(job))
        assert cluster.job(job)["JobState"] in ("PENDING", "RUNNING"), log_of(workdir, cluster.job(job))
        time.sleep(0.2)
    os.kill(worker_pids(run)[-1], signal.SIGKILL)
    info = cluster.wait(job, timeout=400)
    log = log_of(workdir, info)
    assert info["JobState"] == "COMPLETED", log
    assert info["Restarts"] == "0", f"an in-job restart, not a requeue: {log}"
    assert re.search(r"heal: failure 1: .* -> resumed from \S*checkpoint\.pth at epoch \d+, step \d+ of the epoch "
                     r"\(torchrun restart \d+, job attempt 0\)", log), log
    assert "restarted after a failure" in log, log
    assert epoch_records(run) == list(range(epochs)), "every epoch exactly once"
    # Rank 0's own note of where it started again: an in-job (torchrun) restart that loaded the
    # checkpoint, not a fresh start from step 0 (which would also end with every epoch once).
    records = [json.loads(line) for line in (run / "checkpoints" / "failures.jsonl").read_text().splitlines()]
    resumes = [r for r in records if r["kind"] == "resume"]
    assert resumes, records
    assert all(r["restart"] >= 1 and r["attempt"] == 0 for r in resumes), records
    assert resumes[0]["checkpoint"] == str(run / "checkpoints" / "checkpoint.pth"), records
    assert resumes[0]["global_step"] > 0, f"resumed from step 0, i.e. from scratch: {records}"


@pytest.mark.slow
def test_a_deterministic_failure_is_not_retried(cluster, pipeline, workdir):
    """A failure that would repeat (here: the mean/std file is gone) ends the job at once with one
    line saying it is not retried, instead of burning restarts and requeues."""
    run = copy_prepared(workdir, "broken")
    (run / "mean_std.json").unlink()
    job = cluster.sbatch("pretrain.slurm", "run.yaml", "--set", f"run.output_dir={run}", cwd=workdir)
    info = cluster.wait(job, timeout=300)
    log = log_of(workdir, info)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", log
    assert "not retried" in log and "python -m training mean-std" in log, log
    # Not retried because it was classed deterministic (exit 2), not because the restarts ran out
    # (whose line also says "not retried").
    assert info["ExitCode"] == "2:0", log
    assert "deterministic failure: not retried" in log and "after every restart allowed" not in log, log
    assert re.search(r"heal: failure 1: rank \d+ on \S+, deterministic: .* -> launch ended with .*: not retried "
                     r"\(a deterministic failure", log), log
