"""Recovery of pretraining on the real local Slurm cluster, by fault injection: pre-emption (USR1),
a worker killed outright, a node lost, a rank that hangs, a Spot interruption notice from a fake
metadata server, and a failure that would repeat. Each starts pretraining again from the prepared
inputs of the session's pipeline run (tests/slurm/conftest.py) in a run directory of its own.

Each test prints its recovery figures (`-s` shows them): seconds from the fault to the next
training step, and the steps that had to be done again."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.support.fake_imds import FakeMetadata
from tests.support.local_slurm import LOCAL_SLURM, Cluster, copy_prepared, log_of
from training.recovery.failures import read_records
from training.rundir import RunLayout
from training.rundir.artifacts import read_metrics

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def workdir(pipeline, pipeline_workdir: Path) -> Path:
    """The pipeline's folder, once its chain finished (its run/ holds the prepared inputs)."""
    return pipeline_workdir


def metric_records(run: Path, kind: str) -> list[dict]:
    """The run's metric lines of `kind` so far (a line rank 0 is still writing is skipped)."""
    layout = RunLayout(run)
    return [r for r in read_metrics(layout) if r["kind"] == kind] if layout.metrics.exists() else []


def epoch_records(run: Path) -> list[int]:
    return [r["epoch"] for r in metric_records(run, "epoch")]


def failure_records(run: Path, kind: str) -> list[dict]:
    return [r for r in read_records(RunLayout(run).failure_log) if r["kind"] == kind]


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


def submit(cluster: Cluster, workdir: Path, run: Path, *settings: str) -> str:
    args = [arg for setting in (f"run.output_dir={run}", *settings) for arg in ("--set", setting)]
    return cluster.sbatch("pretrain.slurm", "run.yaml", *args, cwd=workdir)


def wait_until_training(cluster: Cluster, workdir: Path, job: str, run: Path, *, checkpoint: bool = False,
                        workers: bool = False, timeout: float = 180) -> None:
    """Until the run logged a step (and has a checkpoint and live workers, when asked)."""
    deadline = time.monotonic() + timeout
    while not (metric_records(run, "step") and (not checkpoint or RunLayout(run).latest_checkpoint.exists())
               and (not workers or worker_pids(run))):
        assert time.monotonic() < deadline, log_of(workdir, cluster.job(job))
        assert cluster.job(job)["JobState"] in ("PENDING", "RUNNING"), log_of(workdir, cluster.job(job))
        time.sleep(0.2)


def recovery_figures(run: Path, case: str, fault_time: float, steps_at_fault: int,
                     resumed_at: int | None = None) -> dict:
    """Seconds from the fault to the next step logged, and the steps logged before the fault that
    were done again (those after the checkpoint training resumed from, by default the one rank 0
    noted after the failure; the step in flight comes on top)."""
    if resumed_at is None:
        resume = failure_records(run, "resume")
        resumed_at = resume[0]["global_step"] if resume else None
    # The first step after the resume (a step in flight at the fault may be logged after it).
    later = [r for r in metric_records(run, "step") if r["time"] > fault_time and r["step"] > (resumed_at or 0)]
    figures = {"case": case, "seconds_to_training_again": round(later[0]["time"] - fault_time, 1) if later else None,
               "steps_at_fault": steps_at_fault, "resumed_at_step": resumed_at,
               "steps_redone": None if resumed_at is None else max(steps_at_fault - resumed_at, 0)}
    print(f"\nrecovery: {json.dumps(figures)}")
    return figures


def steps_done(run: Path) -> int:
    steps = metric_records(run, "step")
    return steps[-1]["step"] if steps else 0


def assert_each_step_logged_once(run: Path, epochs: int, steps_per_epoch: int) -> None:
    """Every epoch and every step once, as in an uninterrupted run (a resume forgets the records of
    steps after its checkpoint, which are done again)."""
    assert epoch_records(run) == list(range(epochs)), "every epoch exactly once"
    steps = [r["step"] for r in metric_records(run, "step")]
    assert steps == list(range(1, epochs * steps_per_epoch + 1)), steps


def final_weights(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    saved = torch.load(RunLayout(run).latest_checkpoint, map_location="cpu", weights_only=False)
    return {name: saved[name] for name in ("student", "teacher")}


def test_preempted_pretraining_requeues_and_loses_no_finished_epoch(cluster, workdir):
    """USR1 to the batch shell (as Slurm sends before the time limit) mid-run: the workers save and
    stop, the job requeues itself, and the second attempt resumes where the first stopped."""
    run = copy_prepared(workdir, "preempt")
    epochs = 3
    job = submit(cluster, workdir, run, f"optim.epochs={epochs}")
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
    assert not RunLayout(run).preempted_marker.exists()


def test_a_killed_worker_is_restarted_in_the_job_and_ends_with_the_uninterrupted_weights(cluster, workdir):
    """kill -9 of one training worker mid-epoch: torchrun restarts the workers in the same job, they
    resume from the last (time-based, mid-epoch) checkpoint, the job ends with one line per failure,
    and the final weights are bit for bit those of the pipeline's uninterrupted run of the same
    config (CPU, gloo, per-batch seeds, RNG state in the checkpoint)."""
    run = copy_prepared(workdir, "killed")
    job = submit(cluster, workdir, run, "train.checkpoint_every_minutes=0.005")
    wait_until_training(cluster, workdir, job, run, checkpoint=True, workers=True)
    steps_at_fault, fault_time = steps_done(run), time.time()
    os.kill(worker_pids(run)[-1], signal.SIGKILL)
    info = cluster.wait(job, timeout=400)
    log = log_of(workdir, info)
    assert info["JobState"] == "COMPLETED", log
    assert info["Restarts"] == "0", f"an in-job restart, not a requeue: {log}"
    assert re.search(r"heal: failure 1: .* -> resumed from \S*checkpoint\.pth at epoch \d+, step \d+ of the epoch "
                     r"\(torchrun restart \d+, job attempt 0\)", log), log
    assert "restarted after a failure" in log, log
    assert_each_step_logged_once(run, epochs=2, steps_per_epoch=3)
    # Rank 0's own note of where it started again: an in-job (torchrun) restart that loaded the
    # checkpoint, not a fresh start from step 0 (which would also end with every epoch once).
    resumes = failure_records(run, "resume")
    assert resumes and all(r["restart"] >= 1 and r["attempt"] == 0 for r in resumes), resumes
    assert resumes[0]["checkpoint"] == str(RunLayout(run).latest_checkpoint), resumes
    assert resumes[0]["global_step"] > 0, f"resumed from step 0, i.e. from scratch: {resumes}"
    figures = recovery_figures(run, "kill -9 of a worker", fault_time, steps_at_fault)
    # A checkpoint after every step (0.3 s interval, ~1 s steps): at most the step in flight is redone.
    assert figures["steps_redone"] <= 1, figures
    killed, uninterrupted = final_weights(run), final_weights(workdir / "run")
    for model in ("student", "teacher"):
        assert killed[model].keys() == uninterrupted[model].keys()
        different = [k for k in killed[model] if not torch.equal(killed[model][k], uninterrupted[model][k])]
        assert not different, f"{model}: {len(different)} tensors differ from the uninterrupted run, e.g. {different[:3]}"


def test_a_lost_node_requeues_the_job_which_resumes_and_completes(cluster, workdir):
    """Every process of node2 ends at once and the node is marked down, as ParallelCluster does for an
    instance that failed or was reclaimed: Slurm requeues the job (NODE_FAIL), a replacement node
    comes up, and the second attempt resumes from the last checkpoint and finishes."""
    run = copy_prepared(workdir, "lost-node")
    epochs = 3
    job = submit(cluster, workdir, run, f"optim.epochs={epochs}", "train.checkpoint_every_minutes=0.005")
    wait_until_training(cluster, workdir, job, run, checkpoint=True)
    assert cluster.job(job)["NodeList"] in ("node[1-2]", "node1,node2")
    steps_at_fault, fault_time = steps_done(run), time.time()
    try:
        subprocess.run([str(LOCAL_SLURM), "kill-node", "node2"], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 60
        while cluster.job(job).get("Restarts") != "1":
            assert time.monotonic() < deadline, f"not requeued after the node loss: {cluster.job(job)}"
            time.sleep(0.5)
    finally:  # the replacement instance: node2's slurmd again, and the node back in service
        subprocess.run([str(LOCAL_SLURM), "start"], check=True, capture_output=True, timeout=300)
    info = cluster.wait(job, timeout=400)
    log = log_of(workdir, info)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    assert "attempt 2" in log, log
    assert_each_step_logged_once(run, epochs, steps_per_epoch=3)
    resumes = failure_records(run, "resume")
    assert resumes and resumes[0]["attempt"] == 1 and resumes[0]["global_step"] > 0, resumes
    figures = recovery_figures(run, "node lost (requeue)", fault_time, steps_at_fault)
    assert figures["steps_redone"] <= 1, figures


def test_a_hung_rank_is_detected_and_the_workers_restart(cluster, workdir):
    """SIGSTOP of one worker mid-epoch (it holds no lock, answers no collective, never exits): the
    other rank's progress watchdog ends it within the hang timeout, naming rank and host; torchrun
    then replaces both workers and training resumes in the same job."""
    run = copy_prepared(workdir, "hung")
    epochs, timeout_minutes = 3, 0.25
    job = submit(cluster, workdir, run, f"optim.epochs={epochs}", "train.checkpoint_every_minutes=0.005",
                 f"train.hang_timeout_minutes={timeout_minutes}")
    wait_until_training(cluster, workdir, job, run, checkpoint=True, workers=True)
    stopped = worker_pids(run)[-1]
    steps_at_fault, fault_time = steps_done(run), time.time()
    os.kill(stopped, signal.SIGSTOP)
    try:
        info = cluster.wait(job, timeout=400)
    finally:
        try:
            os.kill(stopped, signal.SIGKILL)  # if the test failed before torchrun ended it
        except ProcessLookupError:
            pass
    log = log_of(workdir, info)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", log
    hangs = failure_records(run, "failure")
    assert hangs and hangs[0]["class"] == "hang", hangs
    detected_after = hangs[0]["time"] - fault_time
    # The watchdog counts from the last step before the stop (about a step earlier) and polls every 0.75 s.
    assert timeout_minutes * 60 - 5 <= detected_after <= timeout_minutes * 60 + 5, f"watchdog fired {detected_after:.1f} s in"
    assert re.search(r"heal: failure 1: rank \d+ on node\d, hang", log), log
    assert_each_step_logged_once(run, epochs, steps_per_epoch=3)
    figures = recovery_figures(run, "hung rank (SIGSTOP)", fault_time, steps_at_fault)
    assert figures["steps_redone"] <= 1, figures


def controller_address(cluster: Cluster) -> str:
    """The address slurmctld listens on: the bridge in netns mode, loopback otherwise; every node reaches it."""
    config = cluster.run("scontrol", "show", "config")
    found = re.search(r"SlurmctldHost\[0\]\s*=\s*\S+\(([\d.]+)\)", config)
    return found.group(1) if found else "127.0.0.1"


def test_a_spot_interruption_notice_saves_requeues_and_resumes(cluster, workdir):
    """A fake IMDSv2 server the nodes reach answers 404, then the two-minute notice (once: the
    replacement instance sees none): the workers save and stop after the step in flight, the job
    requeues itself, and the second attempt resumes and finishes."""
    run = copy_prepared(workdir, "spot")
    epochs = 3
    with FakeMetadata(controller_address(cluster), once=True) as metadata:
        spot_cluster = dataclasses.replace(cluster, env={**cluster.env, "SCDINO_IMDS_ENDPOINT": metadata.endpoint,
                                                         "SCDINO_SPOT_POLL_SECONDS": "0.5"})
        job = submit(spot_cluster, workdir, run, f"optim.epochs={epochs}")
        wait_until_training(cluster, workdir, job, run)
        steps_at_fault, fault_time = steps_done(run), time.time()
        metadata.notice = {"action": "terminate", "time": "2026-11-23T16:00:00Z"}
        assert metadata.served_notice.wait(30), log_of(workdir, cluster.job(job))
        info = cluster.wait(job, timeout=400)
    log = log_of(workdir, info)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    assert re.search(r"Spot interruption notice on node\d \(terminate", log), log
    # The notice reaches one node; rank 0 saves whichever rank's SIGUSR1 it was.
    marker = re.search(r"pre-empted \((\{\"signal\": \"(?:SIGUSR1|a signal on another rank)\".*?\})\); requeueing", log)
    assert marker, log
    assert "attempt 2" in log, log
    assert_each_step_logged_once(run, epochs, steps_per_epoch=3)
    assert not RunLayout(run).preempted_marker.exists()
    tokens = [r for r in metadata.requests if r[0] == "PUT"]
    assert tokens and all(r[2] for r in tokens), "IMDSv2: a session token with a TTL first"
    saved_at = json.loads(marker.group(1))["step"]
    assert saved_at > steps_at_fault, "saved after the step in flight"
    figures = recovery_figures(run, "Spot notice (save, requeue)", fault_time, steps_at_fault, resumed_at=saved_at)
    assert figures["steps_redone"] == 0, figures


def test_a_deterministic_failure_is_not_retried(cluster, workdir):
    """A failure that would repeat (here: the mean/std file is gone) ends the job at once with one
    line saying it is not retried, instead of burning restarts and requeues."""
    run = copy_prepared(workdir, "broken")
    (run / "mean_std.json").unlink()
    job = submit(cluster, workdir, run)
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
    # torchrun restarted the workers, which stopped before torch and the rendezvous (training/steps/pretrain.py):
    # each rank joined once, in the launch that failed.
    assert "already failed on rank" in log and log.count(" joined (gloo") == 2, log
