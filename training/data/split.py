"""The seeded train / hold-out split: pretraining sees only `train`; evaluation uses `holdout`.

As in scDINO, a fraction (data.holdout_fraction, 0.2) is held out. data.split_method picks the draw:
"stratified" (default) per class, so that small datasets keep every class in both parts; "scdino"
exactly scDINO's (main_dino and compute_CLS_features), so that an scDINO-trained checkpoint is
evaluated on the images it did not see.

`prepare` (or `ingest`) saves the split keyed by the per-cell table's rows: <run>/split.npy, one byte
per cell (0 train, 1 held out), memory-mapped, and <run>/split.json with the settings that drew it,
the identity of the table it belongs to (its cell count and CRC-32), so that a split of another
pack is refused, and split.npy's own size and CRC-32 (10^7 cells: 10 MB, checked in a few ms at
every read). A split.json from before the table (membership by path) is converted once, with a log line.

The evaluated cells (`evaluated_rows`): the held-out cells with a label, or at most eval.max_cells
of them, a seeded sample stratified by label, so that each epoch's evaluation costs the same at any
dataset size.
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

from training.config import Config
from training.errors import DamagedFileError, UserError
from training.rundir import RunLayout
from training.rundir.artifacts import read_split
from training.rundir.integrity import Crc32Writer, check_crc32, check_present, check_size, crc32_hex, npy_layout, rerun
from training.writes.atomic import atomic_path, write_json_atomic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Split:
    """Dataset indices of the training and held-out images (each sorted ascending)."""

    train: np.ndarray
    holdout: np.ndarray


def class_members(labels: np.ndarray) -> list[np.ndarray]:
    """The rows of each class in ascending label order, each ascending: one sort, not a scan per class."""
    labels = np.asarray(labels)
    order = np.argsort(labels, kind="stable")
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    return np.split(order, bounds) if len(order) else []


def make_split(labels: np.ndarray, holdout_fraction: float, seed: int) -> Split:
    """Hold out round(fraction * n_class) images of each class, drawn with a seeded generator."""
    rng = np.random.default_rng(seed)
    holdout: list[np.ndarray] = []
    for members in class_members(labels):
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


def split_for(config: Config, images) -> Split:
    """The split data.split_method asks for, over the dataset `images` (packed or TIFF folder;
    scDINO's split needs the original image folder, data.source)."""
    if config.data.split_method == "scdino":
        root = Path(config.data.source)
        if not root.is_dir() or not any(entry.is_dir() for entry in os.scandir(root)):
            raise UserError(f"data.split_method=scdino lists the image folder as scDINO does, but data.source "
                            f"{root} has no class folders: point it at the TIFF folder")
        return scdino_split(list(images.paths), imagefolder_order(root), config.data.holdout_fraction,
                            config.run.seed)
    return make_split(np.asarray(images.labels), config.data.holdout_fraction, config.run.seed)


def table_identity(images) -> dict[str, Any]:
    """What ties a split to one packed dataset: its cell count and its table's CRC-32."""
    meta = getattr(images, "meta", None) or {}
    return {"n_cells": len(images), "table_crc32": (meta.get("table") or {}).get("crc32")}


def save_split(config: Config, split: Split, images) -> None:
    """Write split.npy (one byte per cell: 1 held out) and split.json (the settings, the table's
    identity, split.npy's size and CRC-32)."""
    layout = RunLayout.from_config(config)
    member = np.zeros(len(images), np.uint8)
    member[split.holdout] = 1
    with atomic_path(layout.split_rows) as tmp, open(tmp, "wb") as handle:
        written = Crc32Writer(handle)
        np.save(written, member)
    write_json_atomic(layout.split, {
        "format": "rows", "seed": config.run.seed, "holdout_fraction": config.data.holdout_fraction,
        "method": config.data.split_method, "n_train": int(len(split.train)), "n_holdout": int(len(split.holdout)),
        **table_identity(images), "rows_bytes": written.size, "rows_crc32": crc32_hex(written.crc),
    })


def split_remedy(images) -> str:
    """What writes the split again: the step that wrote the packed dataset (packed.writer_step)."""
    return getattr(images, "remedy", None) or rerun("prepare")


def split_from_rows(layout: RunLayout, saved: dict[str, Any], images) -> Split:
    """A saved split, checked to be whole (split.npy there, of its size and CRC-32, one 0 or 1 per
    cell, as many of each as split.json records) and to belong to this dataset."""
    remedy, path = split_remedy(images), layout.split_rows
    recorded = [saved.get(key) for key in ("n_cells", "n_train", "n_holdout", "rows_bytes") if key in saved]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in recorded) or \
            not isinstance(saved.get("rows_crc32", ""), str) or ("rows_bytes" in saved) != ("rows_crc32" in saved):
        raise DamagedFileError(layout.split, "records counts, a size or a checksum that are not what it writes",
                               remedy)
    check_present(path, remedy, layout.split.name)
    shape, dtype, size = npy_layout(path, remedy)
    check_size(path, size, "its header", remedy)
    identity = table_identity(images)
    if saved.get("n_cells") != identity["n_cells"] or \
            (saved.get("table_crc32") and identity["table_crc32"] and saved["table_crc32"] != identity["table_crc32"]):
        raise UserError(f"{layout.split} belongs to another packing of the data ({saved.get('n_cells')} cells, "
                        f"table CRC-32 {saved.get('table_crc32')}; the dataset has {identity['n_cells']}, "
                        f"{identity['table_crc32']}): {remedy}")
    if dtype != np.uint8 or len(shape) != 1 or shape[0] != len(images):
        raise DamagedFileError(path, f"holds {dtype} {tuple(shape)}, one byte per cell of the dataset's "
                               f"{len(images)} ({layout.split.name} records {saved.get('n_cells')})", remedy)
    if "rows_bytes" in saved:
        check_size(path, int(saved["rows_bytes"]), layout.split.name, remedy)
        check_crc32(path, saved["rows_crc32"], layout.split.name, remedy)
    member = np.load(path, mmap_mode="r")
    train, holdout = np.flatnonzero(member == 0), np.flatnonzero(member == 1)
    if len(train) + len(holdout) != len(member) or (len(train), len(holdout)) != (saved["n_train"], saved["n_holdout"]):
        raise DamagedFileError(path, f"holds {len(train)} train and {len(holdout)} held-out cells and "
                               f"{len(member) - len(train) - len(holdout)} of neither, {layout.split.name} records "
                               f"{saved['n_train']} and {saved['n_holdout']}", remedy)
    return Split(train=train, holdout=holdout)


def split_from_paths(saved: dict, paths) -> Split:
    """Map a split saved by path (before the per-cell table) onto dataset rows; every row must be in it."""
    position = {p: i for i, p in enumerate(paths)}
    train = [position[p] for p in saved["train"] if p in position]
    holdout = [position[p] for p in saved["holdout"] if p in position]
    if len(train) + len(holdout) != len(position):
        raise UserError(
            f"the saved split does not match the dataset ({len(position)} images, "
            f"{len(train) + len(holdout)} in the split): re-run `python -m training prepare`"
        )
    return Split(np.sort(np.array(train, dtype=np.int64)), np.sort(np.array(holdout, dtype=np.int64)))


def load_split(config: Config, images=None) -> Split:
    """The saved split if `prepare` wrote one (one by path is converted once), else the same split
    computed on the fly."""
    from training.data.dataset import open_images

    images = images if images is not None else open_images(config)
    layout = RunLayout.from_config(config)
    saved = read_split(layout, split_remedy(images))
    if saved is None:
        log.info("no %s: computing the split (seed %d) on the fly", layout.split, config.run.seed)
        return split_for(config, images)
    if saved.get("method", "stratified") != config.data.split_method:
        raise UserError(f"{layout.split} holds a {saved.get('method', 'stratified')} split but data.split_method="
                        f"{config.data.split_method}: {split_remedy(images)}")
    if saved.get("format") == "rows":
        return split_from_rows(layout, saved, images)
    split = split_from_paths(saved, images.paths)
    try:
        save_split(config, split, images)
        log.info("%s: converted the split by path to one by row (%s), read from now on", layout.split,
                 layout.split_rows.name)
    except OSError as exc:
        log.warning("%s could not be converted to a split by row (%s): it is read by path on every start", layout.split,
                    exc)
    return split


def stratified_sample(labels: np.ndarray, rows: np.ndarray, cap: int, seed: int) -> np.ndarray:
    """At most `cap` of `rows` (sorted), each class keeping its share (rounded, at least one), seeded."""
    if cap <= 0 or len(rows) <= cap:
        return np.sort(rows)
    rng = np.random.default_rng(seed)
    chosen = []
    for members in class_members(labels[rows]):
        count = max(1, int(math.floor(cap * len(members) / len(rows) + 0.5)))
        chosen.append(rows[rng.permutation(members)[:count]])
    return np.sort(np.concatenate(chosen))


def evaluated_rows(config: Config, images, split: Split | None = None) -> np.ndarray:
    """The held-out cells that features, kNN, the probe and the plots evaluate: those with a label,
    at most eval.max_cells of them (a seeded sample stratified by label)."""
    split = split if split is not None else load_split(config, images)
    labels = np.asarray(images.labels)
    held = split.holdout[labels[split.holdout] >= 0]
    if len(held) < len(split.holdout):
        log.warning("%d held-out cells have no value in the label column and are not evaluated",
                    len(split.holdout) - len(held))
    rows = stratified_sample(labels, held, config.eval.max_cells, config.run.seed)
    if len(rows) < len(held):
        log.info("evaluating %d of the %d held-out cells (eval.max_cells, a sample stratified by label)", len(rows),
                 len(held))
    return rows


def holdout_labels(config: Config) -> dict[str, Any]:
    """The labels.json payload: the evaluated cells (table rows) with their classes and batches."""
    from training.data.dataset import open_images, paths_of

    images = open_images(config)
    rows = evaluated_rows(config, images)
    labels = [int(v) for v in np.asarray(images.labels)[rows]]
    counts = Counter(labels)
    payload = {
        "class_names": list(images.class_names),
        "counts": {name: counts.get(i, 0) for i, name in enumerate(images.class_names)},
        "n_images": len(rows),
        "source": config.data.source,
        "label_column": config.data.label_column,
        "folder_depth_for_labels": config.data.folder_depth_for_labels,
        "seed": config.run.seed,
        "indices": [int(i) for i in rows],
        "labels": labels,
        "paths": paths_of(images, rows),
    }
    batches = images.batch_categories()
    if batches is not None:
        payload.update(batch_column=config.data.batch_column, batch_names=batches.names,
                       batches=[int(b) for b in batches.codes[rows]])
    return payload
