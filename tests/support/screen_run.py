"""A screen-like run directory for the profile tests, without training: a packed dataset whose
per-cell table has a plate map (plates in imaging batches, wells, treatments, a DMSO control), the
split, labels.json from the real `labels` step, and feature sets whose geometry is known: each
treatment has a direction, each batch an offset of `batch_strength` (the batch effect), each cell
noise. Plates 1-2 form batch B1, plates 3-4 batch B2; and as in the synthetic screen, each batch
holds more wells of some treatments (the layout is confounded with the batches), so that a batch
effect inflates plain kNN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.packing import write_packed
from tests.support.tiny import TINY_RUN, run_cli, tiny_config
from training.config import Config
from training.data.split import make_split, save_split
from training.data.store.read import PackedImages
from training.rundir import RunLayout, tags
from training.rundir.artifacts import load_labels
from training.rundir.features import FeatureSet, save_features

TREATMENTS = ("DMSO", "cpdA", "cpdB", "cpdC")
LAYOUT = {  # per batch: the treatment of each well of its plates; B1 favours cpdA, B2 cpdB and cpdC
    "B1": ("DMSO", "cpdA", "cpdA", "cpdA", "cpdB", "cpdC"),
    "B2": ("DMSO", "cpdB", "cpdB", "cpdC", "cpdC", "cpdA"),
}
PLATES = {"P1": "B1", "P2": "B1", "P3": "B2", "P4": "B2"}


def plate_map(cells_per_well: int) -> dict[str, list]:
    """Per cell: plate, well, site, treatment, batch (the table's Metadata_ columns), well by well."""
    columns: dict[str, list] = {f"Metadata_{n}": [] for n in ("Plate", "Well", "Site", "Treatment", "Batch")}
    for plate, batch in PLATES.items():
        for number, treatment in enumerate(LAYOUT[batch]):
            for cell in range(cells_per_well):
                for name, value in (("Plate", plate), ("Well", f"A{number + 1:02d}"), ("Site", 1 + cell % 2),
                                    ("Treatment", treatment), ("Batch", batch)):
                    columns[f"Metadata_{name}"].append(value)
    return columns


def screen_config(base: Path, **overrides: Any) -> Config:
    values = {**TINY_RUN, "run.output_dir": str(base / "run"), "data.source": str(base / "packed"),
              "data.channels": "01", "data.label_column": "Treatment", "data.batch_column": "Metadata_Batch",
              "data.control_column": "Metadata_Treatment", "data.control_value": "DMSO", "data.holdout_fraction": 0.5,
              "eval.knn_k": [1, 5, 10], "eval.max_cells": 0}
    return tiny_config({**values, **overrides})


def features_of(columns: dict[str, list], *, dim: int, batch_strength: float, seed: int) -> np.ndarray:
    """L2-normalised features: a treatment direction, plus the batch's offset, plus cell noise."""
    rng = np.random.default_rng(seed)
    treatment = {t: rng.standard_normal(dim) for t in TREATMENTS}
    batch = {b: rng.standard_normal(dim) for b in LAYOUT}
    x = np.stack([0.6 * treatment[t] + batch_strength * batch[b] for t, b in
                  zip(columns["Metadata_Treatment"], columns["Metadata_Batch"])])
    x += rng.standard_normal(x.shape)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def cell_images(columns: dict[str, list], size: int, seed: int = 0) -> list[np.ndarray]:
    """(2, size, size) uint16 cells: a blob whose channel and width follow the treatment, brighter
    and on a higher background in batch B2 (an imaging batch effect raw pixels keep)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size] - (size - 1) / 2
    images = []
    for treatment, batch in zip(columns["Metadata_Treatment"], columns["Metadata_Batch"]):
        t = TREATMENTS.index(treatment)
        image = rng.normal(300 if batch == "B1" else 900, 60, (2, size, size))
        image[t % 2] += (3000 if batch == "B1" else 6000) * np.exp(-(yy ** 2 + xx ** 2) / (2 * (1.5 + t) ** 2))
        images.append(np.clip(image, 0, 65535).astype(np.uint16))
    return images


def screen_run(base: Path, *, cells_per_well: int = 8, batch_strength: float = 2.0, dim: int = 16,
               image_size: int = 4, **overrides: Any) -> Config:
    """The run directory of the module docstring; returns its config (`labels` has run)."""
    columns = plate_map(cells_per_well)
    n = len(columns["Metadata_Plate"])
    images = cell_images(columns, image_size)
    write_packed(base / "packed", images, ["cell"] * n, metadata=columns)
    config = screen_config(base, **overrides)
    packed = PackedImages(base / "packed", label_column="Treatment")
    save_split(config, make_split(packed.labels, config.data.holdout_fraction, config.run.seed), packed)
    assert run_cli(config, "labels") == 0
    write_feature_sets(config, columns, dim=dim, batch_strength=batch_strength)
    return config


def write_feature_sets(config: Config, columns: dict[str, list], *, dim: int, batch_strength: float) -> None:
    """final of every cell, the baselines of the evaluated cells (each its own treatment and batch directions)."""
    layout = RunLayout.from_config(config)
    every = np.arange(len(columns["Metadata_Plate"]))
    evaluated = np.asarray(load_labels(layout)["indices"])
    final = features_of(columns, dim=dim, batch_strength=batch_strength, seed=1)
    save_features(layout.features(tags.FINAL), FeatureSet(final, every, {"kind": "checkpoint", "epoch": 3}))
    for tag, seed in ((tags.RAW_PIXELS, 2), (tags.RANDOM_INIT, 3)):
        x = features_of(columns, dim=dim, batch_strength=batch_strength, seed=seed)[evaluated]
        save_features(layout.features(tag), FeatureSet(x, evaluated, {"kind": tag}))
