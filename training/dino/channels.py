"""Which channels a training step shows a channel-adaptive ViT (model.kind: channel_vit).

The rule (model.channel_sampling: hierarchical), after ChannelViT's hierarchical channel sampling:
per step, a subset size k uniform in 1..C, then k of the C channels uniform without replacement,
kept in data.channels order. Drawing the size first trains every size equally often (a uniform
non-empty subset would be of size C/2 most of the time and a single channel only C / (2^C - 1) of
the time), and single channels and the full set are exactly the combinations users evaluate.

One subset per step, shared by every image, every DINO view, teacher and student, and every rank:
DINO's loss asks the student to match the teacher on the same content, and a view without a
channel the teacher saw would be asked to guess it (a different, harder objective); one subset per
step also keeps every rank's sequence length, hence its step time, equal. It is drawn from
(run.seed, global step) alone, never from a running RNG, so a resumed run and every rank draw the
same subsets without sharing state.
"""

from __future__ import annotations

import numpy as np
import torch

from training.config import Config

_STREAM = 0xC4A7
"""Separates this draw from any other use of (seed, step) as a seed."""


def hierarchical_subset(channel_ids: tuple[int, ...], seed: int, step: int) -> tuple[int, ...]:
    """The channels of step `step`: k uniform in 1..C, then k distinct channels, in their given order."""
    rng = np.random.default_rng([seed, step, _STREAM])
    size = int(rng.integers(1, len(channel_ids) + 1))
    picked = sorted(rng.choice(len(channel_ids), size=size, replace=False).tolist())
    return tuple(channel_ids[i] for i in picked)


def step_channels(config: Config, step: int) -> tuple[int, ...] | None:
    """The original channel ids step `step` trains on, or None: the crops as they are (all channels,
    or a plain ViT, whose forward takes no channel ids)."""
    if config.model.kind != "channel_vit" or config.model.channel_sampling == "all":
        return None
    return hierarchical_subset(config.data.channel_indices, config.run.seed, step)


def select_channels(crops: list[torch.Tensor], config: Config, channels: tuple[int, ...]) -> list[torch.Tensor]:
    """The crops (B, C, H, W) restricted to `channels` (original ids among data.channels)."""
    configured = config.data.channel_indices
    positions = [configured.index(c) for c in channels]
    if positions == list(range(len(configured))):
        return crops
    return [crop[:, positions] for crop in crops]
