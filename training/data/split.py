"""The seeded train / hold-out split: pretraining sees only `train`; evaluation uses `holdout`.

As in scDINO, a fraction (data.holdout_fraction, 0.2) is held out. data.split_method picks the draw:
"stratified" (default) per class, so that small datasets keep every class in both parts; "scdino"
exactly scDINO's (main_dino and compute_CLS_features), so that an scDINO-trained checkpoint is
evaluated on the images it did not see. `prepare` saves the split by image path in
<run>/split.json, so later steps agree even if the dataset order were to change.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.atomic import write_json_atomic
from training.config import Config
from training.data.index import ImageIndex
from training.errors import UserError
from training.rundir import RunLayout
from training.rundir.artifacts import read_split

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


IMAGEFOLDER_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""The files torchvision's ImageFolder lists (any case): scDINO shuffles them all, TIFF or not."""


def imagefolder_order(root: Path) -> list[str]:
    """The image files below `root`, relative, in the order of torchvision's ImageFolder, whose
    indices scDINO shuffles: class folders (root's subfolders) by name, then the folders os.walk
    finds below each sorted as path strings (so "a/b-c" comes before "a/b/x"), then file names."""
    root = Path(root)
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    listed = []
    for name in classes:
        for folder, _, files in sorted(os.walk(root / name, followlinks=True)):
            for file in sorted(files):
                if file.lower().endswith(IMAGEFOLDER_SUFFIXES):
                    listed.append(Path(folder, file).relative_to(root).as_posix())
    return listed


def scdino_split(paths: list[str], order: list[str], holdout_fraction: float, seed: int) -> Split:
    """scDINO's split of `order` (imagefolder_order): indices 0..n-1 shuffled in place by NumPy's
    legacy generator seeded with `seed`, the first floor(fraction x n) held out. Our images
    (`paths`) are then members by path; one scDINO does not list (none, for TIFF folders) trains."""
    shuffled = list(range(len(order)))
    np.random.RandomState(seed).shuffle(shuffled)
    count = int(np.floor(holdout_fraction * len(order)))
    held = {order[i] for i in shuffled[:count]}
    holdout = np.array([i for i, p in enumerate(paths) if p in held], dtype=np.int64)
    return Split(train=np.setdiff1d(np.arange(len(paths)), holdout).astype(np.int64), holdout=holdout)


def split_for(config: Config, index: ImageIndex, root: Path | None = None) -> Split:
    """The split data.split_method asks for, over `index` (whose paths are relative to `root`,
    data.source by default: scDINO's split needs the original image folder)."""
    if config.data.split_method == "scdino":
        root = Path(root or config.data.source)
        if not root.is_dir() or not any(entry.is_dir() for entry in os.scandir(root)):
            raise UserError(f"data.split_method=scdino lists the image folder as scDINO does, but data.source "
                            f"{root} has no class folders: point it at the TIFF folder")
        return scdino_split(index.paths, imagefolder_order(root), config.data.holdout_fraction, config.run.seed)
    return make_split(np.asarray(index.labels), config.data.holdout_fraction, config.run.seed)


def save_split(config: Config, split: Split, paths: list[str]) -> None:
    """Write split.json: membership by path, plus the settings that produced it."""
    layout = RunLayout.from_config(config)
    write_json_atomic(layout.split, {
        "seed": config.run.seed,
        "holdout_fraction": config.data.holdout_fraction,
        "method": config.data.split_method,
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
    layout = RunLayout.from_config(config)
    path = layout.split
    saved = read_split(layout)
    if saved is not None:
        if saved.get("method", "stratified") != config.data.split_method:
            raise UserError(f"{path} holds a {saved.get('method', 'stratified')} split but data.split_method="
                            f"{config.data.split_method}: re-run `python -m training prepare`")
        return split_from_paths(saved, index.paths)
    log.info("no %s: computing the split (seed %d) on the fly", path, config.run.seed)
    return split_for(config, index)


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
