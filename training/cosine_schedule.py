"""The cosine schedule with a linear warm-up, one value per iteration: DINO's schedules
(training/dino/schedules.py) and fine-tuning's (training/eval/finetune.py) are made of it."""

from __future__ import annotations

import numpy as np


def cosine_schedule(
    base: float,
    final: float,
    epochs: int,
    iters_per_epoch: int,
    *,
    warmup_epochs: int = 0,
    warmup_start: float = 0.0,
) -> np.ndarray:
    """One value per iteration: linear warm-up to `base`, then a half cosine from `base` to `final`."""
    warmup_iters = warmup_epochs * iters_per_epoch
    warmup = np.linspace(warmup_start, base, warmup_iters) if warmup_iters > 0 else np.array([])
    iters = np.arange(epochs * iters_per_epoch - warmup_iters)
    length = max(len(iters), 1)
    cosine = final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / length))
    return np.concatenate((warmup, cosine))
