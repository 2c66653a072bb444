"""Feature sets on disk (<run>/features/<tag>/): `features.npy` (N, D) float32 plus `index.json` describing each row.

A binary array with a small JSON index loads in milliseconds and memory-maps, where scDINO's CSV of
floats takes minutes and gigabytes for 100k images. Both files are written to temporary names and
renamed, the index last, so an interrupted step never leaves a half-written feature set behind.

The index also records the array file's size and CRC-32 ("features_bytes", "features_crc32",
computed while writing). A reader checks the size from the array's own header at every open and
the CRC-32 where recorded (sets written before it are checked by size); a damaged or incomplete set
is a DamagedFileError that says to rerun `features`, which recomputes such a set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.atomic import atomic_path, write_json_atomic
from training.errors import DamagedFileError, MissingInputError
from training.rundir.integrity import Crc32Writer, check_crc32, crc32_hex, one_line, parse_json, rerun, size_problem

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
        written = Crc32Writer(handle)
        np.save(written, array)
    index = {
        **feature_set.meta,
        "n_images": int(array.shape[0]),
        "dim": int(array.shape[1]),
        "features_bytes": written.size,
        "features_crc32": crc32_hex(written.crc),
        "labels": [int(v) for v in feature_set.labels],
        "indices": [int(v) for v in feature_set.indices],
        "paths": list(feature_set.paths),
    }
    write_json_atomic(directory / INDEX_FILE, index, indent=None)
    log.info("wrote %d x %d features to %s", array.shape[0], array.shape[1], directory)


REMEDY = rerun("features")
"""`features` recomputes a damaged or incomplete set (plan.py), --force not needed."""
_INDEX_KEYS = ("n_images", "labels", "indices", "paths")


def read_index(directory: Path) -> dict[str, Any] | None:
    """The index of a feature set, None when there is none; DamagedFileError when the set is
    incomplete (one of its two files missing), its index damaged or its array of the wrong size."""
    path, array = directory / INDEX_FILE, directory / FEATURES_FILE
    if not path.is_file() and not array.is_file():
        return None
    if not path.is_file() or not array.is_file():
        present, absent = (path, array) if path.is_file() else (array, path)
        raise DamagedFileError(absent, f"is missing ({present.name} is there)", REMEDY)
    index = parse_json(path, REMEDY)
    if not isinstance(index, dict) or any(key not in index for key in _INDEX_KEYS):
        raise DamagedFileError(path, f"lacks one of {', '.join(_INDEX_KEYS)}", REMEDY)
    problem = size_problem(array.stat().st_size, _npy_bytes(array), "its header")
    if problem is None and "features_bytes" in index:
        problem = size_problem(array.stat().st_size, int(index["features_bytes"]), INDEX_FILE)
    if problem:
        raise DamagedFileError(array, problem, REMEDY)
    return index


def _npy_bytes(path: Path) -> int:
    """The size a .npy file must have: its header, then shape x item size bytes."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = header(handle)
            return handle.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    except (ValueError, OSError, SyntaxError, TypeError) as exc:
        raise DamagedFileError(path, f"has no valid .npy header ({one_line(exc)})", REMEDY) from None


def checked_index(directory: Path) -> dict[str, Any] | None:
    """read_index, plus the array's CRC-32 where the index records one (a full read of the array:
    kNN, the probe and the plots read every row anyway)."""
    index = read_index(directory)
    if index is not None and "features_crc32" in index:
        check_crc32(directory / FEATURES_FILE, index["features_crc32"], INDEX_FILE, REMEDY)
    return index


def load_features(directory: Path, *, mmap: bool = False) -> FeatureSet:
    """Load a feature set; MissingInputError names the `features` step when it is absent, a damaged
    one (checked_index) is a DamagedFileError."""
    index = checked_index(directory)
    if index is None:
        raise MissingInputError("features", directory, "features")
    array = np.load(directory / FEATURES_FILE, mmap_mode="r" if mmap else None)
    if array.ndim != 2 or not array.shape[0] == index["n_images"] == len(index["labels"]):
        raise DamagedFileError(directory / INDEX_FILE, f"does not describe {FEATURES_FILE} (shape {array.shape}, "
                               f"{index['n_images']} images, {len(index['labels'])} labels)", REMEDY)
    meta = {k: v for k, v in index.items() if k not in ("labels", "indices", "paths")}
    return FeatureSet(
        features=array,
        labels=np.asarray(index["labels"], dtype=np.int64),
        paths=list(index["paths"]),
        indices=np.asarray(index["indices"], dtype=np.int64),
        meta=meta,
    )


def list_tags(features_root: Path) -> list[str]:
    """Tags with a feature set (or what is left of one: loading it says what is wrong) under
    <run>/features, in a stable order."""
    if not features_root.is_dir():
        return []
    return sorted(p.name for p in features_root.iterdir()
                  if (p / INDEX_FILE).is_file() or (p / FEATURES_FILE).is_file())
