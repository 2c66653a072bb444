"""Reading a packed dataset: its index checked (a v1 index converted first, training/data/store/convert.py),
then cells read from the memory-mapped pixel files by the rows of the per-cell table."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from training.data.store.cells import (
    CELLS_FILE,
    CLASS_COLUMN,
    Categories,
    CellTable,
    StringColumn,
    check_storage_columns,
)
from training.data.store.convert import convert_v1
from training.data.store.format import FORMAT, FORMAT_V1, INDEX_FILE, writer_of
from training.errors import DamagedFileError
from training.rundir.integrity import check_crc32, check_present, check_size, parse_json, require_keys, rerun

log = logging.getLogger(__name__)

INDEX_KEYS = ("format", "dtype", "channels", "shards", "table", "n_cells")
NO_LABEL = "all"
"""The one class of a dataset without a label column (every cell counts as one class)."""


def read_packed_index(folder: Path, guess: str = "prepare") -> dict[str, Any]:
    """index.json of a v2 pack, checked to list its files; a v1 index is converted first."""
    path = Path(folder) / INDEX_FILE
    meta = parse_json(path, rerun(guess))  # an index that cannot be read cannot say who wrote it
    fix = rerun(writer_of(meta, guess))
    if isinstance(meta, dict) and meta.get("format") == FORMAT_V1:
        return convert_v1(Path(folder), meta)
    meta = require_keys(meta, INDEX_KEYS, path, fix)
    if meta["format"] != FORMAT:
        raise DamagedFileError(path, f"is not a {FORMAT} index (format {meta['format']!r})", fix)
    try:
        np.dtype(meta["dtype"])
        int(meta["n_cells"]), int(meta["channels"])
        for shard in meta["shards"]:
            int(shard["elements"]), int(shard["bytes"]), str(shard["file"])
        int(meta["table"]["bytes"]), str(meta["table"]["file"])
        if not isinstance(meta["table"].get("columns", {}), dict):
            raise TypeError("the table's column checksums are not an object")
    except (TypeError, ValueError, KeyError) as exc:
        raise DamagedFileError(path, f"holds an unreadable dtype, count or file list ({exc})", fix) from None
    return meta


class PackedImages:
    """Read access to a packed dataset; cheap to pickle (maps and table reopen per process).

    `labels` and `class_names` come from `label_column` (empty: the class folders, Metadata_Class,
    where there are any, else one class for every cell); `batches` and `batch_names` from
    `batch_column` (empty: none). Opening checks the index and the size of every file; each column
    of the table is checked the first time it is read, and the rows of every read against the pixel
    files (DamagedFileError, whose remedy is `remedy`: the step index.json records, else `guess`);
    `verify` checks every file's CRC-32."""

    def __init__(self, folder: Path, *, label_column: str = "", batch_column: str = "", guess: str = "prepare") -> None:
        self.folder = Path(folder)
        self.meta = read_packed_index(self.folder, guess)
        self.remedy = rerun(writer_of(self.meta, guess))
        for shard in self.meta["shards"]:
            self._check_file(shard["file"], int(shard["bytes"]))
        table_entry = self.meta["table"]
        if "in_memory" in table_entry:
            self.table = CellTable(self.folder / CELLS_FILE, table=table_entry["in_memory"])
            self.meta = {**self.meta, "table": {"file": CELLS_FILE}}
        else:
            self._check_file(table_entry["file"], int(table_entry["bytes"]))
            self.table = CellTable(self.folder / table_entry["file"], checksums=table_entry.get("columns"),
                                   remedy=self.remedy)
        self.dtype = np.dtype(self.meta["dtype"])
        self.channels = int(self.meta["channels"])
        shape = self.meta.get("shape")
        self.uniform_shape: tuple[int, int, int] | None = tuple(shape) if shape else None
        self.label_column, self.batch_column = label_column, batch_column
        self._elements = np.array([int(shard["elements"]) for shard in self.meta["shards"]], np.int64)
        self._maps: dict[int, np.ndarray] = {}
        self._checked = False

    def _check_file(self, name: str, expected: int) -> None:
        """A file index.json lists: there, and of the size it records."""
        check_present(self.folder / name, self.remedy, INDEX_FILE)
        check_size(self.folder / name, expected, INDEX_FILE, self.remedy)

    def __len__(self) -> int:
        return int(self.meta["n_cells"])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_maps": {}}

    def _check_table(self) -> None:
        if not self._checked:
            check_storage_columns(self.table.schema.names, self.table.path, self.remedy)
            if len(self.table) != len(self):
                raise DamagedFileError(self.table.path, f"has {len(self.table)} rows, {INDEX_FILE} "
                                       f"records {len(self)} cells", self.remedy)
            self._checked = True

    @property
    def paths(self) -> StringColumn:
        self._check_table()
        return self.table.strings("path")

    def _label_categories(self) -> Categories:
        if self.label_column:
            return self.table.categories(self.table.find(self.label_column, "data.label_column"))
        if CLASS_COLUMN in self.table.columns:
            return self.table.categories(CLASS_COLUMN)
        return Categories(np.zeros(len(self), np.int32), [NO_LABEL])

    @property
    def labels(self) -> np.ndarray:
        """Each cell's class id (int32; -1 where its label column holds no value)."""
        self._check_table()
        return self._label_categories().codes

    @property
    def class_names(self) -> list[str]:
        self._check_table()
        return self._label_categories().names

    def batch_categories(self) -> Categories | None:
        """Each cell's imaging batch (data.batch_column), None without one."""
        if not self.batch_column:
            return None
        self._check_table()
        return self.table.categories(self.table.find(self.batch_column, "data.batch_column"))

    def pixel_file(self, shard: int) -> np.ndarray:
        """Pixel file `shard` as a flat memory map, opened once per process."""
        if shard not in self._maps:
            entry = self.meta["shards"][shard]
            count = max(int(entry["elements"]), 1)
            self._maps[shard] = np.memmap(self.folder / entry["file"], dtype=self.dtype, mode="r", shape=(count,))
        return self._maps[shard]

    def verify(self) -> bool:
        """Check every byte of the pixel files and the table against the CRC-32s in the index (a full
        read: about a second per few GB from the page cache), and every column of the table against
        its checksum; False when the index records none."""
        entries = [*self.meta["shards"], self.meta["table"]]
        if any(not entry.get("crc32") for entry in entries):
            return False
        start = time.perf_counter()
        for entry in entries:
            check_crc32(self.folder / entry["file"], entry["crc32"], INDEX_FILE, self.remedy)
        self._check_table()
        _ = self.table.table  # every column against its own checksum, as a reader checks it
        total = sum(int(entry.get("bytes", 0)) for entry in entries)
        log.info("%s matches its CRC-32s (%d files, %.1f GB in %.1f s)", self.folder, len(entries), total / 1e9,
                 time.perf_counter() - start)
        return True

    def _check_rows(self, rows: np.ndarray, shards: np.ndarray, offsets: np.ndarray, size: int) -> None:
        """The rows of a batch lie inside their pixel files, each at a whole cell's position: a last
        guard, for packs whose table has no column checksums (from before them)."""
        known = shards < len(self._elements)
        bad = ~known | (offsets < 0) | (offsets % size != 0) | (offsets + size > self._elements[np.where(known, shards, 0)])
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            self._row_error(int(rows[first]), int(shards[first]), int(offsets[first]), size)

    def _row_error(self, row: int, shard: int, offset: int, size: int) -> None:
        raise DamagedFileError(self.table.path, f"is damaged (row {row} points to elements {offset}..{offset + size} "
                               f"of pixel file {shard}, which {INDEX_FILE} does not list as such)", self.remedy)

    def read(self, i: int) -> np.ndarray:
        """Cell i as a (C, H, W) array view of the memory map."""
        self._check_table()
        shard, offset = int(self.table.numbers("shard")[i]), int(self.table.numbers("offset")[i])
        h, w = int(self.table.numbers("height")[i]), int(self.table.numbers("width")[i])
        size = self.channels * h * w
        if not (shard < len(self._elements) and 0 <= offset and h > 0 and w > 0
                and offset + size <= self._elements[shard]):
            self._row_error(int(i), shard, offset, size)
        return self.pixel_file(shard)[offset:offset + size].reshape(self.channels, h, w)

    def read_batch(self, indices: np.ndarray) -> np.ndarray | list[np.ndarray]:
        """A (B, C, H, W) copy when all cells share a shape, else a list of (C, H, W) arrays."""
        indices = np.asarray(indices, np.int64)
        if self.uniform_shape is None:
            return [np.asarray(self.read(int(i))) for i in indices]
        self._check_table()
        size = int(np.prod(self.uniform_shape))
        shards, offsets = self.table.numbers("shard")[indices], self.table.numbers("offset")[indices]
        self._check_rows(indices, shards, offsets, size)
        slots = offsets // size
        out = np.empty((len(indices), *self.uniform_shape), self.dtype)
        for shard in np.unique(shards):
            chosen = shards == shard
            flat = self.pixel_file(int(shard))
            stack = flat[: (len(flat) // size) * size].reshape(-1, *self.uniform_shape)
            out[chosen] = stack[slots[chosen]]
        return out


def pixel_bytes(meta: dict[str, Any]) -> int:
    """All pixel bytes of a pack, from its index."""
    return sum(int(shard["bytes"]) for shard in meta["shards"])
