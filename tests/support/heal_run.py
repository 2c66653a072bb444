"""A tiny CPU pretraining run whose loader can act at chosen batches, for the self-healing tests.

    tiny_config(out_dir, **overrides)   tiny.run_config's two-epoch ViT-tiny run on 32 px crops (seconds on CPU)
    scripted(batches, actions)          a loader factory: actions[(epoch, index)] runs while that
                                        batch is handed out (advance a fake clock, crash, stall, ...)
    assert_same_weights(a, b)           two run directories ended with bit-identical training state
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from tests.support.tiny import run_config
from training.benchmarks.speed.step import SyntheticCrops
from training.config import Config
from training.distributed.groups import DistContext, DistEnv
from training.rundir import RunLayout

CPU = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)


def tiny_config(out_dir: Path, **overrides: object) -> Config:
    """tiny.run_config's two-epoch run, in fp32 and without the Spot watcher unless a test asks."""
    return run_config(out_dir, **{"train.precision": "fp32", "train.spot_watch": "off", **overrides})


class ScriptedCrops(SyntheticCrops):
    """Synthetic batches; `actions[(epoch, index)]()` runs just before batch `index` of `epoch`."""

    def __init__(self, config: Config, *, batches: int, actions: dict[tuple[int, int], Callable[[], None]]):
        super().__init__(config, batches=batches)
        self.actions = actions

    def __iter__(self):
        for index, batch in enumerate(super().__iter__()):
            action = self.actions.get((self.epoch, index))
            if action is not None:
                action()
            yield batch


def scripted(batches: int, actions: dict | None = None):
    def make(config, ctx):
        loader = ScriptedCrops(config, batches=batches, actions=actions or {})
        return loader, loader
    return make


def final_checkpoint(run_dir: Path) -> dict:
    return torch.load(RunLayout(run_dir).latest_checkpoint, weights_only=False)


def assert_same_weights(run_dir: Path, reference_dir: Path) -> None:
    """Student, teacher, loss centre and optimizer moments are equal bit for bit."""
    got, want = final_checkpoint(run_dir), final_checkpoint(reference_dir)
    assert (got["epoch"], got["global_step"]) == (want["epoch"], want["global_step"])
    for net in ("student", "teacher"):
        for key, value in want[net].items():
            assert torch.equal(got[net][key], value), f"{net}.{key}"
    assert torch.equal(got["dino_loss"]["center"], want["dino_loss"]["center"])
    for index, moments in want["optimizer"]["state"].items():
        for name, value in moments.items():
            assert torch.equal(torch.as_tensor(got["optimizer"]["state"][index][name]), torch.as_tensor(value)), name
