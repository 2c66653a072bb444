"""The pretraining loop on in-memory crops: resume after a pre-emption signal gives the same losses as
an uninterrupted run; a non-finite loss stops with a clear message and keeps the last checkpoint;
metrics lines; the per-epoch step cap."""

import json
import os
import signal

import pytest
import torch

from tests.support.tiny import run_config
from training.benchmarks.speed.step import SyntheticCrops
from training.distributed.groups import DistContext, DistEnv
from training.errors import UserError
from training.rundir import RunLayout
from training.trainer import TrainingDivergedError, train

torch.set_num_threads(1)

CPU = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)


class SignalAt(SyntheticCrops):
    """Sends SIGUSR1 to this process while yielding batch `index` of epoch `epoch` (a real signal)."""

    def __init__(self, config, *, batches, at=None, nan_at=None):
        super().__init__(config, batches=batches)
        self.at, self.nan_at = at, nan_at

    def __iter__(self):
        for index, (crops, labels) in enumerate(super().__iter__()):
            if (self.epoch, index) == self.at:
                os.kill(os.getpid(), signal.SIGUSR1)
            if (self.epoch, index) == self.nan_at:
                crops = [c * float("nan") for c in crops]
            yield crops, labels


def factory(batches, **kwargs):
    def make(config, ctx):
        loader = SignalAt(config, batches=batches, **kwargs)
        return loader, loader
    return make


def step_losses(run_dir) -> dict[int, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if line["kind"] == "step"}


@pytest.mark.slow
def test_resume_after_preemption_continues_with_identical_losses(tmp_path):
    reference = train(run_config(tmp_path / "ref"), CPU, loader_factory=factory(3))
    assert reference.global_step == 6 and not reference.preempted

    config = run_config(tmp_path / "run")
    layout = RunLayout.from_config(config)
    first = train(config, CPU, loader_factory=factory(3, at=(1, 0)))
    assert first.preempted and first.global_step == 4  # stopped after the first step of epoch 2
    marker = json.loads(layout.preempted_marker.read_text())
    assert marker["signal"] == "SIGUSR1" and marker["step"] == 4
    saved = torch.load(layout.latest_checkpoint, weights_only=False)
    assert (saved["epoch"], saved["step_in_epoch"]) == (1, 1)

    second = train(config, CPU, loader_factory=factory(3))
    assert second.global_step == 6 and not second.preempted
    assert not layout.preempted_marker.exists()
    assert step_losses(tmp_path / "run") == pytest.approx(step_losses(tmp_path / "ref"), rel=1e-6)
    final, ref_final = (torch.load(RunLayout(tmp_path / d).latest_checkpoint, weights_only=False)
                        for d in ("run", "ref"))
    for key, value in ref_final["teacher"].items():
        assert torch.allclose(final["teacher"][key], value, atol=1e-6), key
    assert torch.allclose(final["dino_loss"]["center"], ref_final["dino_loss"]["center"], atol=1e-7)


@pytest.mark.slow
def test_non_finite_loss_stops_with_a_clear_message_and_keeps_the_checkpoint(tmp_path):
    config = run_config(tmp_path)
    layout = RunLayout.from_config(config)
    with pytest.raises(TrainingDivergedError, match=r"non-finite loss \(nan\) at epoch 2, step 2 of the epoch") as error:
        train(config, CPU, loader_factory=factory(2, nan_at=(1, 1)))
    assert f"last good checkpoint: {layout.latest_checkpoint}. Try" in str(error.value)
    saved = torch.load(layout.latest_checkpoint, weights_only=False)
    assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (1, 0, 2)
    assert all(torch.isfinite(v).all() for v in saved["student"].values())


@pytest.mark.slow
def test_a_step_read_one_step_late_still_stops_at_the_step_whose_loss_was_not_finite(tmp_path):
    """Mid-epoch, with a time-based save asked for after every step: the flags of step 2 (NaN) are
    read at the start of step 3, before its batch is fetched, and the run stops there naming step 2.
    Step 1's save (read at the start of step 2) went ahead; step 2's update, applied in memory
    before its loss was read, reached no checkpoint."""
    config = run_config(tmp_path, **{"train.checkpoint_every_minutes": 1e-9, "optim.epochs": 1})
    layout = RunLayout.from_config(config)
    fetched, reported = [], []

    class Counted(SignalAt):
        def __iter__(self):
            for index, batch in enumerate(super().__iter__()):
                fetched.append(index)
                yield batch

    def make(config, ctx):
        loader = Counted(config, batches=4, nan_at=(0, 1))
        return loader, loader

    with pytest.raises(TrainingDivergedError, match=r"at epoch 1, step 2 of the epoch \(global step 2\)"):
        train(config, CPU, loader_factory=make, on_step=reported.append)
    assert fetched == [0, 1] and reported == [1]
    saved = torch.load(layout.latest_checkpoint, weights_only=False)
    assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (0, 1, 1)
    assert all(torch.isfinite(v).all() for v in saved["student"].values())
    assert [json.loads(line)["step"] for line in layout.metrics.read_text().splitlines()] == [1]


@pytest.mark.slow
def test_metrics_lines_and_step_cap(tmp_path):
    config = run_config(tmp_path, **{"train.max_steps_per_epoch": 2, "train.log_every": 2,
                                      "train.tensorboard": True})
    result = train(config, CPU, loader_factory=factory(5))
    assert result.global_step == 4 and result.epochs_completed == 2
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(line["kind"], line["step"]) for line in lines] == [
        ("step", 2), ("epoch", 2), ("step", 4), ("epoch", 4)]
    keys = {"kind", "epoch", "step", "loss", "lr", "wd", "momentum", "images_per_s", "data_wait_s",
            "step_time_s", "time"}
    assert all(keys <= set(line) for line in lines)
    assert lines[0]["images_per_s"] > 0 and lines[2]["lr"] > 0 and lines[2]["momentum"] > 0.996
    assert any((tmp_path / "tensorboard").iterdir())
    assert [p.name for p in sorted(RunLayout(tmp_path).checkpoints.glob("*.pth"))] == [
        "checkpoint.pth", "checkpoint_0001.pth", "checkpoint_0002.pth", "checkpoint_previous.pth"]


@pytest.mark.slow
def test_resume_refuses_a_changed_model_and_warns_about_a_changed_schedule(tmp_path, caplog):
    train(run_config(tmp_path), CPU, loader_factory=factory(2))
    with pytest.raises(UserError, match=r"model.out_dim=256 \(now 512\).*another run.output_dir"):
        train(run_config(tmp_path, **{"model.out_dim": 512}), CPU, loader_factory=factory(2))
    caplog.set_level("WARNING", logger="training.trainer")
    result = train(run_config(tmp_path, **{"optim.epochs": 3, "data.normalization": "per_image"}), CPU,
                   loader_factory=factory(2))
    assert "optim.epochs: 2 -> 3" in caplog.text and "optim.lr" not in caplog.text
    assert "data.normalization: 'dataset' -> 'per_image'" in caplog.text
    assert result.epochs_completed == 3
