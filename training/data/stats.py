"""Per-channel mean and std of the dataset, as scDINO computes them for normalisation.

Over a seeded random fraction (data.mean_std_fraction) of the training images, at most
data.mean_std_max_images of them, each image is
min-max scaled per channel first (as the loader does), then pixel moments are accumulated per
channel. The file holds every channel of the images; `load_mean_std` picks data.channels.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
from tqdm import tqdm

from training.config import Config
from training.data.dataset import BadImageError, open_images
from training.data.split import load_split
from training.data.tiff import BadImage
from training.errors import UserError
from training.rundir import RunLayout
from training.rundir.artifacts import read_mean_std

log = logging.getLogger(__name__)


def sample_for_stats(train: np.ndarray, fraction: float, seed: int, max_images: int = 0) -> np.ndarray:
    """The seeded subset of training indices the statistics are computed on (at least one, at most
    `max_images` unless it is 0)."""
    count = max(1, int(math.ceil(fraction * len(train))))
    if max_images and count > max_images:
        log.info("mean-std: %d of the %d training images (data.mean_std_max_images), not the %d of "
                 "data.mean_std_fraction=%g", max_images, len(train), count, fraction)
        count = max_images
    return np.sort(np.random.default_rng([seed, 1]).choice(train, size=min(count, len(train)), replace=False))


def scaled_float64(raw: np.ndarray) -> np.ndarray:
    """Per-channel min-max scaling in float64 (a constant channel becomes 0)."""
    image = raw.astype(np.float64)
    low = image.min(axis=(1, 2), keepdims=True)
    span = image.max(axis=(1, 2), keepdims=True) - low
    return (image - low) / np.where(span > 0, span, 1.0)


def compute_mean_std(config: Config) -> dict:
    """Mean and std per channel (all channels of the images) over the sampled training images."""
    images = open_images(config)
    chosen = sample_for_stats(load_split(config).train, config.data.mean_std_fraction, config.run.seed,
                              config.data.mean_std_max_images)
    total = squares = None
    pixels, used, skipped = 0, 0, 0
    for i in tqdm(chosen, desc="mean-std", unit="img"):
        try:
            image = scaled_float64(images.read(int(i)))
        except BadImage as bad:
            if config.data.on_bad_image == "fail":
                raise BadImageError(bad) from None
            log.warning("skipping bad image %s: %s", bad.path, bad.reason)
            skipped += 1
            continue
        flat = image.reshape(image.shape[0], -1)
        total = flat.sum(1) if total is None else total + flat.sum(1)
        squares = (flat ** 2).sum(1) if squares is None else squares + (flat ** 2).sum(1)
        pixels += flat.shape[1]
        used += 1
    if not used:
        raise UserError("no readable training image to compute the mean and std from")
    mean = total / pixels
    std = np.sqrt(np.maximum(squares / pixels - mean ** 2, 0.0))
    return {"mean": mean.tolist(), "std": std.tolist(), "n_images": used, "n_skipped": skipped,
            "fraction": config.data.mean_std_fraction, "max_images": config.data.mean_std_max_images,
            "seed": config.run.seed}


def load_mean_std(config: Config) -> tuple[list[float], list[float]]:
    """The mean and std of the selected channels (data.channels), from <run>/mean_std.json."""
    layout = RunLayout.from_config(config)
    path = Path(config.data.mean_std_file) if config.data.mean_std_file else layout.mean_std
    stats = read_mean_std(path, layout)
    mean, std = stats["mean"], stats["std"]
    picks = config.data.channel_indices
    if max(picks) >= len(mean):
        raise UserError(f"{path} has {len(mean)} channels but data.channels={config.data.channels!r} "
                        "needs more: re-run `python -m training mean-std`")
    flat = [c for c in picks if float(std[c]) <= 0]
    if flat:
        remedy = "rerun `python -m training mean-std`" if path == layout.mean_std else "fix the file"
        raise UserError(f"{path}: channel(s) {flat} of data.channels={config.data.channels!r} have std 0 (every "
                        f"sampled training image is constant in them, so normalising would divide by zero): drop them "
                        f"from data.channels, or {remedy} if the images have changed")
    return [float(mean[c]) for c in picks], [float(std[c]) for c in picks]
