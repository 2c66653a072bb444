"""Writing a packed dataset: one part (a whole `prepare`, or one task of a Slurm array) at a time.

PartWriter appends cells to pixel files of about SHARD_BYTES each (PixelWriter, which widens the
pixel type when an image needs it), collects the table rows of each file (ShardRows), and writes
part.json last, which marks the part complete; training/data/store/merge.py joins the parts into the
packed dataset (the format: training/data/store/format.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from training.data.store.cells import storage_table, write_table
from training.data.store.format import PART_FILE, PART_FORMAT, shard_name
from training.rundir.integrity import crc32_hex
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)

SHARD_BYTES = 4 << 30
"""Pixel bytes per file before the writer starts the next one."""
WIDEN_CHUNK = 1 << 24
"""Elements converted at a time when a pixel file is rewritten in a wider pixel type."""


class PixelWriter:
    """Appends images to one flat pixel file in one type, widening the type when an image needs it.

    Widening rewrites what was written so far (once per new type, and only for a mixed folder);
    offsets count elements, not bytes, so those already recorded stay valid. The CRC-32 of the
    file is kept up to date as it is written (no second read).
    """

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.elements, self.crc = Path(path), np.dtype(dtype), 0, 0
        self.file = open(self.path, "wb")

    def append(self, image: np.ndarray) -> int:
        """Write one image; returns its offset in elements."""
        if not np.can_cast(image.dtype, self.dtype, casting="safe"):
            self._widen(image.dtype)
        offset = self.elements
        data = image.astype(self.dtype, copy=False).tobytes()
        self.file.write(data)
        self.crc = zlib.crc32(data, self.crc)
        self.elements += image.size
        return offset

    def _widen(self, other: np.dtype) -> None:
        dtype = np.promote_types(self.dtype, other)
        log.info("pixel types differ (%s and %s): packing every image as %s", self.dtype, other, dtype)
        self.file.close()
        self.crc = widen_file(self.path, self.dtype, dtype, self.elements)
        self.dtype, self.file = dtype, open(self.path, "ab")

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.itemsize

    def close(self) -> None:
        self.file.close()


def widen_file(path: Path, dtype: np.dtype, wider: np.dtype, elements: int) -> int:
    """Rewrite a pixel file of `elements` values in a wider type; returns the new file's CRC-32."""
    tmp, crc = path.with_name(path.name + ".wider"), 0
    with open(tmp, "wb") as out:
        if elements:
            written = np.memmap(path, dtype=dtype, mode="r", shape=(elements,))
            for start in range(0, elements, WIDEN_CHUNK):
                data = written[start:start + WIDEN_CHUNK].astype(wider).tobytes()
                out.write(data)
                crc = zlib.crc32(data, crc)
            del written
    os.replace(tmp, path)
    return crc


ROW_CHUNK = 8192
"""Table rows kept as Python lists before they are turned into an Arrow chunk: a part's memory per
cell is then a few dozen bytes, whatever its metadata, up to the SHARD_BYTES of a pixel file."""


@dataclass
class ShardRows:
    """The table rows of the cells in one pixel file, collected while it is written: the latest
    rows as lists, the earlier ones as Arrow chunks of ROW_CHUNK rows."""

    paths: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    heights: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    metadata: dict[str, list] = field(default_factory=dict)
    chunks: list[pa.Table] = field(default_factory=list)
    count: int = 0

    def add(self, path: str, offset: int, shape: tuple[int, ...], metadata: dict[str, Any]) -> None:
        if not self.count:
            self.metadata = {name: [] for name in metadata}
        elif metadata.keys() != self.metadata.keys():
            raise ValueError(f"cell {path}: metadata columns {sorted(metadata)} differ from the first cell's "
                             f"{sorted(self.metadata)}")
        self.paths.append(path)
        self.offsets.append(offset)
        self.heights.append(int(shape[-2]))
        self.widths.append(int(shape[-1]))
        for name, value in metadata.items():
            self.metadata[name].append(value)
        self.count += 1
        if len(self.paths) >= ROW_CHUNK:
            self.chunks.append(self._lists_table())

    def _lists_table(self) -> pa.Table:
        n = len(self.paths)
        table = storage_table(self.paths, np.zeros(n, np.uint16), self.offsets, self.heights, self.widths,
                              self.metadata)
        self.paths, self.offsets, self.heights, self.widths = [], [], [], []
        self.metadata = {name: [] for name in self.metadata}
        return table

    def table(self) -> pa.Table:
        if self.paths or not self.chunks:
            self.chunks.append(self._lists_table())
        return pa.concat_tables(self.chunks, promote_options="permissive") if len(self.chunks) > 1 else self.chunks[0]


class PartWriter:
    """One part of a packed dataset (a whole `prepare`, or one task of a Slurm array): pixel files
    of about SHARD_BYTES each, the table rows of each, and part.json, written last, which marks the
    part complete. Memory holds the rows of one pixel file at a time."""

    def __init__(self, folder: Path, *, channels: int, dtype: np.dtype, shard_bytes: int = SHARD_BYTES) -> None:
        self.folder, self.channels, self.dtype, self.shard_bytes = Path(folder), channels, np.dtype(dtype), shard_bytes
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self.shards: list[dict[str, Any]] = []
        self.shapes: set[tuple[int, int, int]] = set()
        self.writer: PixelWriter | None = None
        self.rows = ShardRows()

    def append(self, image: np.ndarray, path: str, metadata: dict[str, Any] | None = None) -> None:
        """Add one cell: its (C, H, W) pixels, its path and its Metadata_ values."""
        if image.shape[0] != self.channels:
            raise ValueError(f"{path}: {image.shape[0]} channels, the part has {self.channels}")
        if self.writer is None or self.writer.nbytes >= self.shard_bytes:
            self._next_shard()
        offset = self.writer.append(image)
        self.rows.add(path, offset, image.shape, metadata or {})
        self.shapes.add(tuple(int(s) for s in image.shape))

    def _next_shard(self) -> None:
        self._close_shard()
        number = len(self.shards)
        self.writer = PixelWriter(self.folder / shard_name(number), self.dtype)
        self.rows = ShardRows()

    def _close_shard(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        table = f"cells-{len(self.shards):05d}.arrow"
        written = write_table(self.folder / table, self.rows.table())
        self.shards.append({"file": self.writer.path.name, "table": table, "dtype": self.writer.dtype.str,
                            "elements": self.writer.elements, "bytes": self.writer.nbytes,
                            "crc32": crc32_hex(self.writer.crc), "cells": self.rows.count,
                            "table_bytes": written.bytes, "table_crc32": crc32_hex(written.crc32),
                            "table_columns": written.columns})
        self.dtype, self.writer = self.writer.dtype, None

    def finish(self, **extra: Any) -> dict[str, Any]:
        """Close the last pixel file and write part.json (with `extra`, e.g. what was skipped and why)."""
        self._close_shard()
        shape = next(iter(self.shapes)) if len(self.shapes) == 1 else None  # None: cells of several shapes
        part = {"format": PART_FORMAT, "channels": self.channels, "shards": self.shards,
                "shape": list(shape) if shape else None,
                "n_cells": sum(s["cells"] for s in self.shards), **extra}
        write_json_atomic(self.folder / PART_FILE, part)
        return part
