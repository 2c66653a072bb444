"""Failure classification: a deterministic failure leaves the marker and is not retried within the
job attempt (a later attempt or job starts afresh); a transient one is recorded without a marker,
and the restart that follows notes where it resumed; the policy turns the records into a decision
and one line per failure."""

import json
import socket

import pytest
import torch

from tests.support.heal_run import CPU, scripted, tiny_config
from training.recovery import failures, policy
from training.recovery.failures import NotRetriedError, read_records, record_failure, record_resume
from training.rundir import RunLayout
from training.trainer import TrainingDivergedError, train

torch.set_num_threads(1)

HOST = socket.gethostname()


class PoisonedCrops:
    """Batches whose second batch of epoch 2 is NaN: the loss diverges there, every time."""

    def __init__(self, config):
        self.inner = scripted(2)(config, CPU)[0]

    def set_epoch(self, epoch):
        self.inner.set_epoch(epoch)

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        for index, (crops, labels) in enumerate(self.inner):
            if (self.inner.epoch, index) == (1, 1):
                crops = [c * float("nan") for c in crops]
            yield crops, labels


def poisoned(config, ctx):
    loader = PoisonedCrops(config)
    return loader, loader


def test_deterministic_failure_is_marked_and_not_retried_in_the_same_attempt(tmp_path, slurm_job):
    config = tiny_config(tmp_path)
    layout = RunLayout.from_config(config)
    with pytest.raises(TrainingDivergedError):
        train(config, CPU, loader_factory=poisoned)
    marker = json.loads(layout.failure_marker.read_text())
    assert (marker["class"], marker["rank"], marker["host"], marker["job"], marker["attempt"], marker["step"]) == (
        "deterministic", 0, HOST, "4242", 0, 3)
    assert marker["error"].startswith("TrainingDivergedError: non-finite loss (nan) at epoch 2, step 2")

    slurm_job.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun restarts the worker group
    with pytest.raises(NotRetriedError, match=r"not retried: this job attempt already failed on rank 0"):
        train(config, CPU, loader_factory=scripted(2))
    assert [r["kind"] for r in read_records(layout.failure_log)] == ["failure"]
    assert torch.load(layout.latest_checkpoint, weights_only=False)["global_step"] == 2  # untouched

    slurm_job.setenv("SLURM_RESTART_COUNT", "1")  # a later attempt (the user fixed the data): it runs
    result = train(config, CPU, loader_factory=scripted(2))
    assert result.global_step == 4 and not layout.failure_marker.exists()


def test_transient_failure_is_recorded_and_the_restart_notes_where_it_resumed(tmp_path, slurm_job):
    config = tiny_config(tmp_path, **{"train.checkpoint_every_minutes": 0})
    layout = RunLayout.from_config(config)

    def nccl_error():
        raise RuntimeError("NCCL communicator was aborted on rank 0\n  (a C++ trace follows)")

    with pytest.raises(RuntimeError):
        train(config, CPU, loader_factory=scripted(3, {(1, 2): nccl_error}))
    assert not layout.failure_marker.exists()
    slurm_job.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert train(config, CPU, loader_factory=scripted(3)).global_step == 6

    failure, resume = read_records(layout.failure_log)
    assert (failure["kind"], failure["class"], failure["step"], failure["restart"]) == ("failure", "transient", 5, 0)
    assert failure["error"] == "RuntimeError: NCCL communicator was aborted on rank 0 (a C++ trace follows)"
    assert (resume["kind"], resume["checkpoint"], resume["epoch"], resume["step_in_epoch"], resume["restart"]) == (
        "resume", str(layout.latest_checkpoint), 1, 0, 1)
    assert policy.summary(read_records(layout.failure_log), "4242", 1) == [
        f"failure 1: rank 0 on {HOST}, transient: {failure['error']} (after global step 5) -> resumed from "
        f"{layout.latest_checkpoint} at epoch 2, step 0 of the epoch (torchrun restart 1, job attempt 0)"]


def test_restarts_are_counted_over_the_job_attempt_when_rank_zeros_agent_did_not_count(tmp_path, slurm_job):
    """Rank 0's agent restarts its still-healthy workers when another node's agent restarts first,
    without counting: TORCHELASTIC_RESTART_COUNT stays 0 there. The resume record still says which
    in-job restart it is; the first start of a requeued attempt is no in-job restart."""
    layout = RunLayout.from_config(tiny_config(tmp_path))

    def fail_then_resume(step: int) -> dict:
        record_failure(layout, 0, "lost-peer", "RuntimeError: Connection reset by peer", step)
        record_resume(layout, str(layout.latest_checkpoint), 0, step, step, preempted=False)
        return read_records(layout.failure_log)[-1]

    assert [fail_then_resume(1)["restart"], fail_then_resume(2)["restart"]] == [1, 2]  # env count: 0
    slurm_job.setenv("TORCHELASTIC_RESTART_COUNT", "3")  # the agent's own count wins when it is higher
    assert fail_then_resume(3)["restart"] == 3
    slurm_job.setenv("SLURM_RESTART_COUNT", "1")  # Slurm requeued the job after a lost node: a new attempt
    slurm_job.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    record_resume(layout, str(layout.latest_checkpoint), 0, 3, 3, preempted=False)
    assert (read_records(layout.failure_log)[-1]["attempt"], read_records(layout.failure_log)[-1]["restart"]) == (1, 0)
    assert fail_then_resume(4)["restart"] == 1  # the count starts again in the new attempt


def test_a_clean_start_writes_no_records(tmp_path, slurm_job):
    config = tiny_config(tmp_path, **{"optim.epochs": 1})
    train(config, CPU, loader_factory=scripted(2))
    assert not RunLayout.from_config(config).failure_log.exists()


def rec(kind, **fields):
    base = {"job": "7", "attempt": 0, "restart": 0, "time": 0.0}
    return {"kind": kind, **base, **fields}


def test_policy_decisions():
    assert policy.decide(0, False, 0, 1) == "done"
    assert policy.decide(1, True, 0, 1) == "not-retried"
    assert policy.decide(137, False, 0, 1) == "requeue"
    assert policy.decide(137, False, 1, 1) == "stop"
    marker = {"job": "7", "attempt": 1}
    assert policy.is_deterministic(1, marker, "7", 1) and not policy.is_deterministic(1, marker, "7", 2)
    assert policy.is_deterministic(2, None, "7", 0) and not policy.is_deterministic(76, None, "7", 0)


def test_summary_one_line_per_failure_across_restarts_and_requeues():
    records = [
        rec("failure", **{"class": "transient", "rank": 0, "host": "node1", "error": "RuntimeError: peer closed",
                          "step": 57, "time": 2.0}),
        rec("failure", **{"class": "hang", "rank": 3, "host": "node2", "error": "hang: rank 3 ...", "step": 57,
                          "time": 3.0}),
        rec("resume", checkpoint="/r/checkpoint.pth", epoch=2, step_in_epoch=9, global_step=50, restart=1),
        rec("resume", checkpoint="/r/checkpoint.pth", epoch=2, step_in_epoch=9, global_step=50, restart=2),
        rec("launch", exit_code=137, decision="requeue", requeue_number=1, restart=0),
        rec("resume", checkpoint="/r/checkpoint.pth", epoch=3, step_in_epoch=0, global_step=60, attempt=1),
        rec("resume", checkpoint="/r/checkpoint.pth", epoch=4, step_in_epoch=0, global_step=80, attempt=2),
        rec("launch", exit_code=0, decision="done", attempt=2),
        rec("launch", exit_code=1, decision="stop", job="8"),
    ]
    lines = policy.summary(records, "7", 1)
    assert lines == [
        "failure 1: rank 3 on node2, hang: hang: rank 3 ... (after global step 57; 1 other rank(s) failed with "
        "it) -> resumed from /r/checkpoint.pth at epoch 3, step 9 of the epoch (torchrun restart 1, job attempt 0)",
        f"failure 2: {policy.UNRECORDED} -> resumed from /r/checkpoint.pth at epoch 3, step 9 of the epoch "
        "(torchrun restart 2, job attempt 0)",
        f"failure 3: {policy.UNRECORDED} -> launch ended with status 137 (signal SIGKILL): requeueing the job "
        "(failure requeue 1 of 1) -> resumed from /r/checkpoint.pth at epoch 4, step 0 of the epoch "
        "(torchrun restart 0, job attempt 1)",
        f"failure 4: {policy.SLURM_REQUEUE} -> resumed from /r/checkpoint.pth at epoch 5, step 0 of the epoch "
        "(torchrun restart 0, job attempt 2)",
    ]


def test_policy_command_appends_the_launch_and_prints_the_decision(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    log, marker = tmp_path / "failures.log", tmp_path / "marker"
    args = ["--failure-log", str(log), "--failure-marker", str(marker), "--exit-code", "1", "--max-requeues", "1"]
    assert policy.main(args) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "requeue"
    assert out.err.strip().startswith("heal: failure 1: a worker ended without a record")
    policy.main(args)
    assert capsys.readouterr().out.strip() == "stop"
    marker.write_text(json.dumps({"job": "7", "attempt": 0}))
    policy.main(args)
    assert capsys.readouterr().out.strip() == "not-retried"
    assert [r["decision"] for r in read_records(log)] == ["requeue", "stop", "not-retried"]


def test_a_survivors_view_of_a_lost_peer_does_not_pass_for_the_cause():
    gloo = RuntimeError("[pair.cc:561] Connection closed by peer [10.99.0.12]:52907. This is typically ...")
    assert failures.classify(gloo) == "lost-peer"
    assert failures.classify(RuntimeError("CUDA error: an illegal memory access")) == "transient"
    assert failures.classify(TrainingDivergedError("non-finite loss")) == "deterministic"
    survivor = rec("failure", **{"class": "lost-peer", "rank": 0, "host": "node1", "step": 9,
                                 "error": f"RuntimeError: {gloo}"})
    resume = rec("resume", checkpoint=None, epoch=0, step_in_epoch=0, global_step=0, restart=1)
    (line,) = policy.summary([survivor, resume], "7", 1)
    assert line.startswith(f"failure 1: {policy.UNRECORDED}; rank 0 on node1 lost its peer: RuntimeError: "
                           "[pair.cc:561] Connection closed by peer [10.99.0.12]:52907")
    assert line.endswith("-> resumed from the start (no checkpoint yet) (torchrun restart 1, job attempt 0)")
