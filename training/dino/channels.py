"""Which channels a training step shows a channel-adaptive model.

model.kind "bag_of_channels" (`step_bag_crops`, at the end): each image shows its own channel(s),
each as a single-channel image. model.kind "channel_vit", below: one subset per step.

The channel_vit rule (model.channel_sampling: hierarchical), after ChannelViT's hierarchical channel sampling:
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
import torch.distributed as dist

from training.config import Config
from training.errors import UserError

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


_BAG_STREAM = 0xBA6C
"""Separates the bag-of-channels draw from the channel_vit draw above."""


def bag_channel_draw(n_images: int, n_channels: int, per_image: int, seed: int, step: int,
                     rank: int) -> np.ndarray:
    """For a "bag_of_channels" step: (n_images, per_image) distinct channel positions per image.

    Drawn per image (IC-ViT's and the bag-of-channels papers' recipe: every image of a batch shows
    its own channel) from (run.seed, global step, rank) alone, so a resumed run draws the same and
    every rank draws its own images' channels; teacher and student (every view) get the same draw.
    """
    if not 1 <= per_image <= n_channels:
        raise UserError(f"model.bag_channels_per_image={per_image} must be between 1 and the {n_channels} "
                        "channels of data.channels")
    rng = np.random.default_rng([seed, step, rank, _BAG_STREAM])
    if per_image == 1:
        return rng.integers(0, n_channels, size=(n_images, 1))
    return np.argsort(rng.random((n_images, n_channels)), axis=1)[:, :per_image]


def bag_of_channels(crops: list[torch.Tensor], draw: np.ndarray) -> list[torch.Tensor]:
    """Each view (B, C, H, W) as single-channel images (B x k, 1, H, W): image i's channels
    draw[i, 0..k-1], image-major (image i's k channels are rows i*k .. i*k + k - 1 of every view)."""
    index = torch.as_tensor(draw)
    batch, per_image = index.shape
    rows = torch.arange(batch).repeat_interleave(per_image)
    columns = index.reshape(-1)
    device = crops[0].device
    if device.type == "cuda":  # through pinned memory: a copy from pageable memory waits for the GPU
        rows, columns = (host.pin_memory().to(device, non_blocking=True) for host in (rows, columns))
    return [crop[rows, columns].unsqueeze(1) for crop in crops]


def step_bag_crops(crops: list[torch.Tensor], config: Config, step: int) -> list[torch.Tensor]:
    """The crops a "bag_of_channels" model trains on at global step `step` (unchanged for other kinds)."""
    if config.model.kind != "bag_of_channels":
        return crops
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    draw = bag_channel_draw(len(crops[0]), crops[0].shape[1], config.model.bag_channels_per_image,
                            config.run.seed, step, rank)
    return bag_of_channels(crops, draw)
