"""Feature sets on disk (<run>/features/<tag>/): `features.npy` (N, D) float32, `rows.npy` (N,) int64
(the per-cell table's row of each feature row, ascending) and a small `index.json`.

Binary arrays load in milliseconds and memory-map, where scDINO's CSV of floats takes minutes and
gigabytes for 100k images; nothing in the index grows with the number of cells, so reading a set
of 10^7 rows parses a few hundred bytes of JSON. A set is keyed by table rows only: labels, paths,
batches and every metadata column are the table's (and labels.json's), never a second list kept
in step. The files are written to temporary names and renamed, the index last, so an interrupted
step never leaves a half-written feature set behind.

The index records both arrays' sizes and CRC-32s ("features_bytes", "features_crc32", "rows_bytes",
"rows_crc32", computed while writing). A reader checks the sizes from the arrays' own headers at
every open and the CRC-32s where recorded; a damaged or incomplete set is a DamagedFileError that
says to rerun `features`, which recomputes such a set. A set written before rows.npy (its rows
listed in index.json as "indices") is still read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.errors import DamagedFileError, MissingInputError, UserError
from training.rundir import tags
from training.rundir.integrity import (
    Crc32Writer,
    check_crc32,
    check_present,
    crc32_hex,
    npy_layout,
    parse_json,
    rerun,
    size_problem,
)
from training.writes.atomic import atomic_path, write_json_atomic

log = logging.getLogger(__name__)

FEATURES_FILE = "features.npy"
ROWS_FILE = "rows.npy"
INDEX_FILE = "index.json"


@dataclass
class FeatureSet:
    """Row i of `features` belongs to the cell in row `indices[i]` of the per-cell table (ascending)."""

    features: np.ndarray
    indices: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.indices) != len(self.features):
            raise ValueError(f"feature set rows disagree: {len(self.features)} features, {len(self.indices)} table rows")

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    def select(self, rows: np.ndarray, where: object = "the feature set") -> "FeatureSet":
        """The features of the table rows `rows`, in that order; a UserError when any is absent."""
        rows = np.asarray(rows, np.int64)
        position = np.searchsorted(self.indices, rows)
        found = position < len(self.indices)
        found[found] = self.indices[position[found]] == rows[found]
        if not found.all():
            raise UserError(f"{where} lacks {int((~found).sum())} of the {len(rows)} cells asked for (e.g. table row "
                            f"{int(rows[~found][0])}): rerun `python -m training features --force`, then `labels`")
        if len(rows) == len(self.indices) and np.array_equal(rows, self.indices):
            return self
        return FeatureSet(np.asarray(self.features[position]), rows, dict(self.meta))


def _save_npy(path: Path, array: np.ndarray) -> Crc32Writer:
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        written = Crc32Writer(handle)
        np.save(written, array)
    return written


def save_features(directory: Path, feature_set: FeatureSet) -> None:
    """Write `features.npy`, `rows.npy` and `index.json` atomically (the index last: it marks completion)."""
    array = np.ascontiguousarray(feature_set.features, dtype=np.float32)
    rows = np.ascontiguousarray(feature_set.indices, dtype=np.int64)
    if len(rows) > 1 and not (np.diff(rows) > 0).all():
        raise ValueError("feature set rows must be ascending and distinct")
    features, row_file = _save_npy(directory / FEATURES_FILE, array), _save_npy(directory / ROWS_FILE, rows)
    index = {
        **feature_set.meta,
        "n_images": int(array.shape[0]),
        "dim": int(array.shape[1]),
        "features_bytes": features.size,
        "features_crc32": crc32_hex(features.crc),
        "rows_bytes": row_file.size,
        "rows_crc32": crc32_hex(row_file.crc),
    }
    write_json_atomic(directory / INDEX_FILE, index, indent=None)
    log.info("wrote %d x %d features to %s", array.shape[0], array.shape[1], directory)


REMEDY = rerun("features")
"""`features` recomputes a damaged or incomplete set (plan.py), --force not needed."""
_INDEX_KEYS = ("n_images",)


def read_index(directory: Path) -> dict[str, Any] | None:
    """The index of a feature set, None when there is none; DamagedFileError when the set is
    incomplete (one of its files missing), its index damaged or an array of the wrong size."""
    path, array, rows = directory / INDEX_FILE, directory / FEATURES_FILE, directory / ROWS_FILE
    if not path.exists() and not array.exists():
        return None
    for file, other in ((path, array), (array, path)):
        check_present(file, REMEDY, other.name)
    index = parse_json(path, REMEDY)
    if not isinstance(index, dict) or any(key not in index for key in _INDEX_KEYS) or \
            ("indices" not in index and "rows_bytes" not in index):
        raise DamagedFileError(path, f"lacks one of {', '.join(_INDEX_KEYS)} or the set's rows", REMEDY)
    if "rows_bytes" in index:
        check_present(rows, REMEDY, path.name)
    for name, file in (("features", array), ("rows", rows)):
        if f"{name}_bytes" not in index and name == "rows":
            continue
        shape, _, size = npy_layout(file, REMEDY)
        problem = size_problem(file.stat().st_size, size, "its header")
        if problem is None and shape[:1] != (index["n_images"],):
            problem = f"holds {shape[0] if shape else 'no'} rows, {INDEX_FILE} records {index['n_images']}"
        if problem is None and f"{name}_bytes" in index:
            problem = size_problem(file.stat().st_size, int(index[f"{name}_bytes"]), INDEX_FILE)
        if problem:
            raise DamagedFileError(file, problem, REMEDY)
    return index


CHECKSUM_READ_LIMIT = 1 << 30
"""A reader of some rows of a larger set checks its CRC-32s only up to this many bytes (~1 s): the
kNN, probe and plots of a 10^7-cell dataset read 20,000 rows of features/final, and reading all of
its 15 GB to check them would make each epoch's evaluation grow with the dataset again. Sizes are
checked at every open whatever the size."""


def checked_index(directory: Path, *, checksum: bool = True) -> dict[str, Any] | None:
    """read_index, plus the arrays' CRC-32s where the index records them and `checksum` (a full
    read of the arrays)."""
    index = read_index(directory)
    if index is not None and checksum:
        for name, file in (("features", FEATURES_FILE), ("rows", ROWS_FILE)):
            if f"{name}_crc32" in index:
                check_crc32(directory / file, index[f"{name}_crc32"], INDEX_FILE, REMEDY)
    return index


def load_features(directory: Path, *, mmap: bool = False, rows: np.ndarray | None = None) -> FeatureSet:
    """Load a feature set, or with `rows` the features of those table rows (FeatureSet.select);
    MissingInputError names the `features` step when it is absent, a damaged one is a
    DamagedFileError. Its CRC-32s are checked when every row is read or the set is small
    (CHECKSUM_READ_LIMIT)."""
    index = read_index(directory)
    if index is None:
        raise MissingInputError("features", directory, "features")
    every_row = rows is None or len(rows) >= int(index["n_images"])
    set_bytes = int(index.get("features_bytes", 0)) + int(index.get("rows_bytes", 0))
    checked_index(directory, checksum=every_row or set_bytes <= CHECKSUM_READ_LIMIT)
    mode = "r" if mmap or rows is not None else None
    array = np.load(directory / FEATURES_FILE, mmap_mode=mode)
    if "rows_bytes" in index:
        table_rows = np.load(directory / ROWS_FILE, mmap_mode=mode)
    else:
        table_rows = np.asarray(index["indices"], dtype=np.int64)
    if array.ndim != 2 or not array.shape[0] == index["n_images"] == len(table_rows):
        raise DamagedFileError(directory / INDEX_FILE, f"does not describe {FEATURES_FILE} (shape {array.shape}, "
                               f"{index['n_images']} images, {len(table_rows)} rows)", REMEDY)
    meta = {k: v for k, v in index.items() if k not in ("labels", "indices", "paths")}
    loaded = FeatureSet(features=array, indices=table_rows.astype(np.int64, copy=False), meta=meta)
    return loaded if rows is None else loaded.select(rows, directory)


def list_tags(features_root: Path) -> list[str]:
    """Tags with a feature set (or what is left of one: loading it says what is wrong) under
    <run>/features, in a stable order; a file where the folder or a set's folder belongs is a
    DamagedFileError."""
    if not features_root.exists():
        return []
    check_present(features_root, REMEDY, folder=True)
    for entry in features_root.iterdir():
        if tags.is_tag(entry.name):
            check_present(entry, REMEDY, folder=True)
    return sorted(p.name for p in features_root.iterdir()
                  if (p / INDEX_FILE).exists() or (p / FEATURES_FILE).exists())
