"""DINO's per-iteration schedules: cosine learning rate with warm-up, cosine weight decay, teacher momentum."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.config import Config
from training.cosine_schedule import cosine_schedule


def scaled_lr(config: Config, world_size: int) -> float:
    """DINO's linear scaling rule: optim.lr is the rate for a global batch of 256 images."""
    return config.optim.lr * config.optim.batch_size_per_gpu * world_size / 256.0


@dataclass(frozen=True)
class Schedules:
    lr: np.ndarray
    weight_decay: np.ndarray
    momentum: np.ndarray

    def at(self, iteration: int) -> tuple[float, float, float]:
        i = min(iteration, len(self.lr) - 1)
        return float(self.lr[i]), float(self.weight_decay[i]), float(self.momentum[i])


def build_schedules(config: Config, iters_per_epoch: int, world_size: int) -> Schedules:
    """The three schedules over the whole run; warm-up is capped at the run length."""
    optim, epochs = config.optim, config.optim.epochs
    return Schedules(
        lr=cosine_schedule(
            scaled_lr(config, world_size), optim.min_lr, epochs, iters_per_epoch,
            warmup_epochs=min(optim.warmup_epochs, epochs - 1),
        ),
        weight_decay=cosine_schedule(optim.weight_decay, optim.weight_decay_end, epochs, iters_per_epoch),
        momentum=cosine_schedule(config.dino.momentum_teacher, 1.0, epochs, iters_per_epoch),
    )
