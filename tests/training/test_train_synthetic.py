"""End to end on the embedded synthetic data, through the real data pipeline (synth-data, prepare,
mean-std, the multi-crop loader): the DINO loss falls, and a run pre-empted mid-epoch resumes to the
same losses as an uninterrupted one."""

import json
import os
import shutil
import signal

import pytest
import torch

from tests.support.tiny import TINY_MODEL
from training.cli import main
from training.config import Config, load_config
from training.distributed.groups import DistContext, DistEnv
from training.trainer import default_loader_factory, train

pytestmark = pytest.mark.slow

torch.set_num_threads(1)

CPU = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small synthetic dataset, packed, with its mean/std, shared by the tests of this module."""
    root = tmp_path_factory.mktemp("synthetic")
    config_path = root / "run.yaml"
    config_path.write_text(
        f"run: {{output_dir: {root / 'run'}, seed: 0}}\n"
        f"data: {{source: {root / 'images'}, channels: '012', num_workers: 0}}\n"
    )
    assert main(["synth-data", "--config", str(config_path), "--classes", "3", "--per-class", "16",
                 "--size", "32", "--channels", "3"]) == 0
    for step in ("prepare", "mean-std"):
        assert main([step, "--config", str(config_path)]) == 0
    return load_config(config_path)


def tiny(prepared: Config, out_dir, **overrides) -> Config:
    """Copies the prepared inputs into a fresh run directory and returns its config."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = prepared.run.output_dir
    for name in ("packed", "split.json", "split.npy", "mean_std.json"):
        src = os.path.join(source, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, out_dir / name)
    base = {
        **TINY_MODEL, "run.output_dir": str(out_dir),
        "model.drop_path_rate": 0.0, "dino.global_crop_size": 24, "optim.batch_size_per_gpu": 8, "optim.epochs": 4,
        "optim.warmup_epochs": 1, "optim.lr": 0.01, "optim.freeze_last_layer": 0,
        "dino.momentum_teacher": 0.9,
        "train.log_every": 1, "train.tensorboard": False,
    }
    return prepared.replace({**base, **overrides})


def epoch_losses(run_dir) -> list[float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line["loss"] for line in lines if line["kind"] == "epoch"]


def step_losses(run_dir) -> dict[int, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if line["kind"] == "step"}


def test_pretraining_on_synthetic_cells_lowers_the_loss(prepared, tmp_path):
    config = tiny(prepared, tmp_path)
    result = train(config, CPU)
    assert result.epochs_completed == 4 and not result.preempted
    losses = epoch_losses(tmp_path)
    assert len(losses) == 4 and all(map(torch.isfinite, torch.tensor(losses)))
    assert sum(losses[-2:]) / 2 < losses[0] - 0.05, losses


def test_preempted_run_resumes_to_the_same_losses_with_the_real_loader(prepared, tmp_path):
    reference = tiny(prepared, tmp_path / "ref", **{"optim.epochs": 2})
    train(reference, CPU)

    def signalling(config, ctx):
        loader, sampler = default_loader_factory(config, ctx)

        class Interrupting:
            def __len__(self):
                return len(loader)

            def __iter__(self):
                for index, batch in enumerate(loader):
                    if (sampler.epoch, index) == (1, 0):
                        os.kill(os.getpid(), signal.SIGUSR1)
                    yield batch

        return Interrupting(), sampler

    interrupted = tiny(prepared, tmp_path / "run", **{"optim.epochs": 2})
    assert train(interrupted, CPU, loader_factory=signalling).preempted
    assert train(interrupted, CPU).epochs_completed == 2
    assert step_losses(tmp_path / "run") == pytest.approx(step_losses(tmp_path / "ref"), rel=1e-6)
