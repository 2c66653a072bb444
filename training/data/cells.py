"""The per-cell table: one row per cell of a packed dataset, columnar and memory-mapped.

    packed/cells.arrow   an Arrow IPC file (uncompressed, one record batch)

Opening it maps the file and reads its footer: the cost is the same at 10^3 and 10^7 cells, no
process builds a Python object per cell, and what a DataLoader worker receives when the table is
pickled is its path (the map is opened again, lazily, in the worker; the pages are the page
cache's, shared by every process on the node).

Columns:
    path            large_string  where the cell came from: an image's path relative to data.source
                                  (class folders), or "<field of view>#<object number>" (`ingest`)
    shard           uint16        which pixel file holds it (index.json lists the files in order)
    offset          int64         where its pixels start in that file, in elements
    height, width   int32         its size; the channel count is the dataset's (index.json)
    Metadata_*                    everything known about the cell, passed through untouched:
                                  Metadata_Class (the class folder), a plate map's columns, and
                                  for cut cells the field of view, object number, centre and area

Every later file of a run (the split, feature sets, labels, profiles) is keyed by the row number of
this table. String columns other than `path` are dictionary-encoded with sorted dictionaries: a
column's codes are its category ids (labels, batches), read without decoding a single string.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from training.atomic import atomic_path
from training.errors import DamagedFileError, UserError
from training.rundir.integrity import file_crc32, one_line

log = logging.getLogger(__name__)

CELLS_FILE = "cells.arrow"
METADATA_PREFIX = "Metadata_"
CLASS_COLUMN = "Metadata_Class"
"""The class folder of each image (scDINO's labels), for datasets packed from class folders."""
STORAGE_COLUMNS = ("path", "shard", "offset", "height", "width")


@dataclass(frozen=True)
class Categories:
    """A column read as categories: `codes[row]` indexes `names` (sorted); -1 where the value is missing."""

    codes: np.ndarray
    names: list[str]


class StringColumn(Sequence[str]):
    """A string column read one value at a time, without turning the column into Python strings."""

    def __init__(self, array: pa.Array) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return self.array[i].to_pylist()
        return self.array[int(i)].as_py()

    def __iter__(self) -> Iterator[str]:
        for chunk in range(0, len(self.array), 65536):
            yield from self.array[chunk:chunk + 65536].to_pylist()

    def take(self, rows: np.ndarray) -> list[str]:
        return self.array.take(pa.array(np.asarray(rows, np.int64))).to_pylist()


def column_name(columns: Sequence[str], name: str, setting: str) -> str:
    """The column a setting names, given with or without the Metadata_ prefix; a UserError that lists
    the columns there are when it names none."""
    for candidate in (name, METADATA_PREFIX + name):
        if candidate in columns:
            return candidate
    shown = ", ".join(c for c in columns if c not in STORAGE_COLUMNS) or "none"
    raise UserError(f"{setting}={name!r} names no column of the per-cell table (its columns: {shown}): "
                    f"set {setting} to one of them")


class CellTable:
    """Read access to cells.arrow (or to a table held in memory, for a dataset that could not be converted)."""

    def __init__(self, path: Path, *, table: pa.Table | None = None) -> None:
        self.path = Path(path)
        self._table = table
        self._in_memory = table is not None
        self._categories: dict[str, Categories] = {}

    def __getstate__(self) -> dict:
        if self._in_memory:
            return {**self.__dict__, "_categories": {}}
        return {**self.__dict__, "_table": None, "_categories": {}}

    @property
    def table(self) -> pa.Table:
        if self._table is None:
            self._table = read_table(self.path)
        return self._table

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def columns(self) -> list[str]:
        return self.table.column_names

    @property
    def metadata_columns(self) -> list[str]:
        return [name for name in self.columns if name.startswith(METADATA_PREFIX)]

    def _array(self, name: str) -> pa.Array:
        column = self.table.column(name)
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()

    def numbers(self, name: str) -> np.ndarray:
        """A numeric column as a NumPy array: a read-only view of the map when it has no missing values."""
        array = self._array(name)
        if array.null_count == 0 and pa.types.is_primitive(array.type) and not pa.types.is_boolean(array.type):
            return array.to_numpy(zero_copy_only=True)
        return array.to_numpy(zero_copy_only=False)

    def strings(self, name: str) -> StringColumn:
        array = self._array(name)
        if pa.types.is_dictionary(array.type):
            array = array.cast(array.type.value_type)
        return StringColumn(array)

    def categories(self, name: str) -> Categories:
        """A column as sorted categories; for a dictionary column written here, a view of its codes."""
        if name not in self._categories:
            self._categories[name] = categories_of(self._array(name))
        return self._categories[name]

    def find(self, name: str, setting: str) -> str:
        return column_name(self.columns, name, setting)


def categories_of(array: pa.Array) -> Categories:
    """Codes into sorted names: zero-copy for a dictionary array whose dictionary is sorted and
    has no missing values, else computed (numbers and booleans become their text)."""
    written_sorted = not pa.types.is_dictionary(array.type)
    if written_sorted:
        array = sorted_dictionary(array)  # numbers sort as numbers, then read as text
    names = [str(name) for name in array.dictionary.to_pylist()]
    indices = array.indices
    if indices.null_count:
        codes = indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
    else:
        codes = indices.to_numpy(zero_copy_only=True)
    if not written_sorted and names != sorted(names):
        order = np.argsort(np.asarray(names, dtype=object), kind="stable")
        remap = np.empty(len(names) + 1, np.int32)
        remap[order] = np.arange(len(names), dtype=np.int32)
        remap[-1] = -1
        codes, names = remap[codes], [names[i] for i in order]
    return Categories(codes=codes, names=[str(n) for n in names])


def sorted_dictionary(array: pa.Array) -> pa.DictionaryArray:
    """An array dictionary-encoded with its distinct values in sorted order (int32 codes)."""
    names = pc.unique(array.drop_null()) if array.null_count else pc.unique(array)
    names = names.take(pc.sort_indices(names))
    codes = pc.index_in(array, value_set=names)
    return pa.DictionaryArray.from_arrays(codes.cast(pa.int32()), names)


def encode_metadata(table: pa.Table) -> pa.Table:
    """String metadata columns dictionary-encoded with sorted dictionaries, in one chunk each."""
    table = table.combine_chunks()
    for i, name in enumerate(table.column_names):
        column = table.column(name).chunk(0) if table.num_rows else table.column(name).combine_chunks()
        kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        if name != "path" and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            plain = column.cast(kind) if pa.types.is_dictionary(column.type) else column
            table = table.set_column(i, name, sorted_dictionary(plain.cast(pa.string())))
    return table


def write_table(path: Path, table: pa.Table) -> tuple[int, int]:
    """Write `table` as cells.arrow atomically, as one record batch; returns (bytes, CRC-32)."""
    table = encode_metadata(table)
    with atomic_path(path) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(table.num_rows, 1))
        return tmp.stat().st_size, file_crc32(tmp)


def read_table(path: Path, remedy: str = "") -> pa.Table:
    """cells.arrow, memory-mapped; DamagedFileError when it is not a readable Arrow file."""
    try:
        source = pa.memory_map(str(path), "r")
        return pa.ipc.open_file(source).read_all()
    except FileNotFoundError:
        raise DamagedFileError(path, "is missing", remedy or "rerun `python -m training prepare`") from None
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise DamagedFileError(path, f"is not a readable Arrow table ({one_line(exc)})",
                               remedy or "rerun `python -m training prepare`") from None


def storage_table(paths: Sequence[str], shards: np.ndarray, offsets: np.ndarray, heights: np.ndarray,
                  widths: np.ndarray, metadata: dict[str, pa.Array | Sequence] | None = None) -> pa.Table:
    """A per-cell table from its storage columns and any Metadata_ columns."""
    columns = {
        "path": pa.array(list(paths), pa.large_string()),
        "shard": pa.array(np.asarray(shards, np.uint16)),
        "offset": pa.array(np.asarray(offsets, np.int64)),
        "height": pa.array(np.asarray(heights, np.int32)),
        "width": pa.array(np.asarray(widths, np.int32)),
    }
    for name, values in (metadata or {}).items():
        if not name.startswith(METADATA_PREFIX):
            raise ValueError(f"metadata column {name!r} lacks the {METADATA_PREFIX} prefix")
        columns[name] = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    return pa.table(columns)


def check_storage_columns(table: pa.Table, path: Path, remedy: str) -> None:
    missing = [name for name in STORAGE_COLUMNS if name not in table.column_names]
    if missing:
        raise DamagedFileError(path, f"lacks the column(s) {', '.join(missing)}", remedy)
