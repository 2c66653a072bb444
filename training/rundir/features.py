"""Feature sets on disk (<run>/features/<tag>/): `features.npy` (N, D) float32 plus `index.json` describing each row.

A binary array with a small JSON index loads in milliseconds and memory-maps, where scDINO's CSV of
floats takes minutes and gigabytes for 100k images. Both files are written to temporary names and
renamed, so an interrupted step never leaves a half-written feature set behind.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.atomic import atomic_path, write_json_atomic
from training.errors import MissingInputError, UserError

log = logging.getLogger(__name__)

FEATURES_FILE = "features.npy"
INDEX_FILE = "index.json"


@dataclass
class FeatureSet:
    """Rows of `features` belong to the images `paths` with integer `labels` (dataset order)."""

    features: np.ndarray
    labels: np.ndarray
    paths: list[str]
    indices: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.features)
        if not (len(self.labels) == len(self.paths) == len(self.indices) == n):
            raise ValueError(
                f"feature set rows disagree: {n} features, {len(self.labels)} labels, "
                f"{len(self.paths)} paths, {len(self.indices)} indices"
            )

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])


def save_features(directory: Path, feature_set: FeatureSet) -> None:
    """Write `features.npy` and `index.json` atomically (the index last: it marks completion)."""
    array = np.ascontiguousarray(feature_set.features, dtype=np.float32)
    with atomic_path(directory / FEATURES_FILE) as tmp, open(tmp, "wb") as handle:
        np.save(handle, array)
    index = {
        **feature_set.meta,
        "n_images": int(array.shape[0]),
        "dim": int(array.shape[1]),
        "labels": [int(v) for v in feature_set.labels],
        "indices": [int(v) for v in feature_set.indices],
        "paths": list(feature_set.paths),
    }
    write_json_atomic(directory / INDEX_FILE, index, indent=None)
    log.info("wrote %d x %d features to %s", array.shape[0], array.shape[1], directory)


def read_index(directory: Path) -> dict[str, Any] | None:
    """The index of a complete feature set, or None when there is none (or it is unreadable)."""
    path = directory / INDEX_FILE
    if not path.is_file() or not (directory / FEATURES_FILE).is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        log.warning("ignoring unreadable feature index %s", path)
        return None


def load_features(directory: Path, *, mmap: bool = False) -> FeatureSet:
    """Load a feature set; MissingInputError names the `features` step when it is absent."""
    index = read_index(directory)
    if index is None:
        raise MissingInputError("features", directory, "features")
    array = np.load(directory / FEATURES_FILE, mmap_mode="r" if mmap else None)
    if array.shape[0] != index["n_images"]:
        raise UserError(
            f"{directory} is inconsistent ({array.shape[0]} rows, index says {index['n_images']}): "
            "rerun `python -m training features --force`"
        )
    meta = {k: v for k, v in index.items() if k not in ("labels", "indices", "paths")}
    return FeatureSet(
        features=array,
        labels=np.asarray(index["labels"], dtype=np.int64),
        paths=list(index["paths"]),
        indices=np.asarray(index["indices"], dtype=np.int64),
        meta=meta,
    )


def list_tags(features_root: Path) -> list[str]:
    """Tags with a complete feature set under <run>/features, in a stable order."""
    if not features_root.is_dir():
        return []
    return sorted(p.name for p in features_root.iterdir() if read_index(p) is not None)
