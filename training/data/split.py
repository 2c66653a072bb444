"""The seeded train / hold-out split: pretraining sees only `train`; evaluation uses `holdout`.

As in scDINO, a fraction (data.holdout_fraction, 0.2) is held out; here the draw is stratified per
class so that small datasets keep every class in both parts. `prepare` saves the split by image
path in <run>/split.json, so later steps agree even if the dataset order were to change.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout
from training.atomic import write_json_atomic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Split:
    """Dataset indices of the training and held-out images (each sorted ascending)."""

    train: np.ndarray
    holdout: np.ndarray


def make_split(labels: np.ndarray, holdout_fraction: float, seed: int) -> Split:
    """Hold out round(fraction * n_class) images of each class, drawn with a seeded generator."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    holdout: list[np.ndarray] = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = int(math.floor(holdout_fraction * len(members) + 0.5))
        holdout.append(rng.permutation(members)[:count])
    held = np.sort(np.concatenate(holdout)) if holdout else np.zeros(0, dtype=np.int64)
    train = np.setdiff1d(np.arange(len(labels)), held)
    return Split(train=train.astype(np.int64), holdout=held.astype(np.int64))


def save_split(config: Config, split: Split, paths: list[str]) -> None:
    """Write split.json: membership by path, plus the settings that produced it."""
    layout = RunLayout.from_config(config)
    write_json_atomic(layout.split, {
        "seed": config.run.seed,
        "holdout_fraction": config.data.holdout_fraction,
        "train": [paths[i] for i in split.train],
        "holdout": [paths[i] for i in split.holdout],
    })


def split_from_paths(saved: dict, paths: list[str]) -> Split:
    """Map a saved split back onto dataset indices; every dataset image must be in it."""
    position = {p: i for i, p in enumerate(paths)}
    train = [position[p] for p in saved["train"] if p in position]
    holdout = [position[p] for p in saved["holdout"] if p in position]
    if len(train) + len(holdout) != len(paths):
        raise UserError(
            f"the saved split does not match the dataset ({len(paths)} images, "
            f"{len(train) + len(holdout)} in the split): re-run `python -m training prepare`"
        )
    return Split(np.sort(np.array(train, dtype=np.int64)), np.sort(np.array(holdout, dtype=np.int64)))


def load_split(config: Config) -> Split:
    """The saved split if `prepare` wrote one, else the same split computed on the fly."""
    from training.data.dataset import load_index

    index = load_index(config)
    path = RunLayout.from_config(config).split
    if path.exists():
        return split_from_paths(json.loads(path.read_text()), index.paths)
    log.info("no %s: computing the split (seed %d) on the fly", path, config.run.seed)
    return make_split(np.asarray(index.labels), config.data.holdout_fraction, config.run.seed)


def holdout_labels(config: Config) -> dict[str, Any]:
    """The labels.json payload: held-out images in dataset order with their classes."""
    from training.data.dataset import open_dataset

    dataset = open_dataset(config)
    holdout = load_split(config).holdout
    labels = [int(dataset.labels[i]) for i in holdout]
    counts = Counter(labels)
    return {
        "class_names": list(dataset.class_names),
        "counts": {name: counts.get(i, 0) for i, name in enumerate(dataset.class_names)},
        "n_images": len(holdout),
        "source": config.data.source,
        "folder_depth_for_labels": config.data.folder_depth_for_labels,
        "seed": config.run.seed,
        "indices": [int(i) for i in holdout],
        "labels": labels,
        "paths": [dataset.paths[i] for i in holdout],
    }
