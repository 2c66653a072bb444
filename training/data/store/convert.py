"""Converting a pack of the first format (scdino-packed-v1: images.bin and an index.json listing
every path, label, shape and offset) to the per-cell table, once, on its first open; in a read-only
folder it is read into memory instead, every time, with a warning."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from training.data.store.cells import CELLS_FILE, CLASS_COLUMN, storage_table, write_table
from training.data.store.format import FORMAT, FORMAT_V1, IMAGES_FILE, INDEX_FILE
from training.errors import DamagedFileError
from training.rundir.integrity import crc32_hex, require_keys, rerun
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)

V1_KEYS = ("format", "dtype", "channels", "paths", "labels", "class_names", "shapes", "offsets", "total_elements")


def convert_v1(folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """A v1 index (every path, label, shape and offset listed in JSON) as a v2 pack: cells.arrow
    written beside it and index.json replaced, once; in memory when the folder is read-only."""
    path, fix = folder / INDEX_FILE, rerun("prepare")
    meta = require_keys(meta, V1_KEYS, path, fix)
    table = _v1_table(meta, path)
    data = folder / IMAGES_FILE
    data_bytes = int(meta.get("data_bytes", int(meta["total_elements"]) * np.dtype(meta["dtype"]).itemsize))
    shapes = {tuple(s) for s in np.asarray(meta["shapes"], np.int64).reshape(-1, 3).tolist()}
    index = {"format": FORMAT, "step": "prepare", "dtype": meta["dtype"], "channels": int(meta["channels"]),
             "n_cells": table.num_rows, "shape": list(shapes.pop()) if len(shapes) == 1 else None,
             "shards": [{"file": data.name, "elements": int(meta["total_elements"]), "bytes": data_bytes,
                         "crc32": meta.get("data_crc32")}],
             "source": meta.get("source"), "folder_depth_for_labels": meta.get("folder_depth_for_labels", 0),
             "converted_from": FORMAT_V1}
    try:
        written = write_table(folder / CELLS_FILE, table)
        index["table"] = {"file": CELLS_FILE, "bytes": written.bytes, "crc32": crc32_hex(written.crc32),
                          "columns": written.columns}
        write_json_atomic(path, index)
        log.info("%s: converted the %s index (%d cells) to %s: the per-cell table %s, read from now on",
                 folder, FORMAT_V1, table.num_rows, FORMAT, CELLS_FILE)
    except OSError as exc:
        log.warning("%s is a %s pack in a folder that cannot be written (%s): its index is read into memory on "
                    "every open; rerun `python -m training prepare` to convert it", folder, FORMAT_V1, exc)
        index["table"] = {"file": CELLS_FILE, "in_memory": table}
    return index


def _v1_table(meta: dict[str, Any], path: Path) -> pa.Table:
    try:
        shapes = np.asarray(meta["shapes"], dtype=np.int64).reshape(-1, 3)
        offsets = np.asarray(meta["offsets"], dtype=np.int64)
        labels = np.asarray(meta["labels"], dtype=np.int64)
        names = np.asarray(meta["class_names"], dtype=object)
    except (TypeError, ValueError) as exc:
        raise DamagedFileError(path, f"holds unreadable shapes, offsets or labels ({exc})", rerun("prepare")) from None
    lengths = {len(meta["paths"]), len(labels), len(shapes), len(offsets)}
    ends = offsets + shapes.prod(axis=1) if len(lengths) == 1 else offsets
    if len(lengths) != 1 or (len(ends) and (ends.max() > int(meta["total_elements"]) or offsets.min() < 0)) \
            or (len(labels) and (labels.min() < 0 or labels.max() >= len(names))):
        raise DamagedFileError(path, "is inconsistent (paths, labels, shapes and offsets disagree, or an image "
                               "lies beyond total_elements)", rerun("prepare"))
    return storage_table(meta["paths"], np.zeros(len(offsets)), offsets, shapes[:, 1], shapes[:, 2],
                         {CLASS_COLUMN: pa.array(list(names[labels]) if len(labels) else [], pa.string())})
