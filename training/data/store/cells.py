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

A wrong row is never handed out. The writer records a CRC-32 of each column as it lies in the file
(`column_checksum`: its type, length, null count and every buffer, its dictionary's too), and a
reader checks a column the first time it reads it in a process: a column garbled in place (a disk,
a copy, an edit) is a DamagedFileError naming the file and the column before any of its values is
used, where pyarrow would read a wrong value or fail far away (an index out of bounds, bytes that
are no UTF-8). Only the columns a step reads are checked: training reads where each cell lies and
its label and batch codes, 18 bytes a cell, not its path (most of the ~108). What it costs, at 10^7 cells:
docs/training.md, "Damaged run files". A table written before the column checksums has each
column checked by Arrow's own full validation instead (`validate(full=True)`: indices and offsets
in bounds, strings UTF-8), which catches a garbled structure but not a garbled number.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from training.errors import DamagedFileError, UserError
from training.rundir.integrity import crc32_hex, file_crc32, one_line, present_problem, rerun
from training.writes.atomic import atomic_path

log = logging.getLogger(__name__)

CELLS_FILE = "cells.arrow"
METADATA_PREFIX = "Metadata_"
CLASS_COLUMN = "Metadata_Class"
"""The class folder of each image (scDINO's labels), for datasets packed from class folders."""
STORAGE_COLUMNS = ("path", "shard", "offset", "height", "width")
DEFAULT_REMEDY = rerun("prepare")
"""What a table read on its own (without its dataset's index, which names its writer) says to do."""


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
    """Read access to cells.arrow (or to a table held in memory, for a dataset that could not be converted).

    `checksums` (column -> CRC-32, as the dataset's index records them): each column is checked
    the first time this process reads it (numbers, strings, categories, column, or the whole
    `table`); `remedy` is what a DamagedFileError says to do. The schema and the row count come
    from the file's footer and cost nothing to check."""

    def __init__(self, path: Path, *, table: pa.Table | None = None, checksums: dict[str, str] | None = None,
                 remedy: str = DEFAULT_REMEDY) -> None:
        self.path = Path(path)
        self._table = table
        self._in_memory = table is not None
        self.checksums, self.remedy = checksums, remedy
        self._categories: dict[str, Categories] = {}
        self._checked: set[str] = set()

    def __getstate__(self) -> dict:
        # a worker maps the file again and checks again what it reads
        state = {**self.__dict__, "_categories": {}, "_checked": set()}
        return state if self._in_memory else {**state, "_table": None}

    @property
    def mapped(self) -> pa.Table:
        """The table as mapped, its columns unchecked: for its schema and row count only."""
        if self._table is None:
            self._table = read_table(self.path, self.remedy)
        return self._table

    @property
    def table(self) -> pa.Table:
        """The whole table, every column checked (a full read of the file, once per process)."""
        for name in self.columns:
            self._array(name)
        return self.mapped

    @property
    def schema(self) -> pa.Schema:
        return self.mapped.schema

    def __len__(self) -> int:
        return self.mapped.num_rows

    @property
    def columns(self) -> list[str]:
        return self.mapped.column_names

    @property
    def metadata_columns(self) -> list[str]:
        return [name for name in self.columns if name.startswith(METADATA_PREFIX)]

    def _array(self, name: str) -> pa.Array:
        array = one_array(self.mapped, name)
        if name not in self._checked and not self._in_memory:
            self._check(name, array)
            self._checked.add(name)
        return array

    def _check(self, name: str, array: pa.Array) -> None:
        if self.checksums is None:
            try:
                array.validate(full=True)
            except (pa.ArrowInvalid, pa.ArrowIndexError) as exc:
                raise DamagedFileError(self.path, f"is damaged (its column {name}: {one_line(exc)})",
                                       self.remedy) from None
            return
        expected = self.checksums.get(name)
        if expected is None:
            raise DamagedFileError(self.path, f"has a column {name} its index records no checksum of (the "
                                   f"columns it records: {', '.join(self.checksums)})", self.remedy)
        actual = column_checksum(array)
        if actual != expected:
            raise DamagedFileError(self.path, f"fails its checksum (column {name}: CRC-32 {actual}, the index "
                                   f"records {expected})", self.remedy)

    def column(self, name: str) -> pa.Array:
        """A column as one Arrow array, checked."""
        return self._array(name)

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


def one_array(table: pa.Table, name: str) -> pa.Array:
    """A column as one array: the file's one record batch as it is mapped (no copy)."""
    column = table.column(name)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


_ARRAY_SHAPE = struct.Struct("<qqq")
"""Length, null count and offset of an array, as column_checksum hashes them."""


def column_checksum(array: pa.Array) -> str:
    """CRC-32 (hex) of a column as it lies in the file: its type, length, null count and every
    buffer, then its dictionary's the same way (a dictionary column)."""
    crc = zlib.crc32(str(array.type).encode())
    crc = zlib.crc32(_ARRAY_SHAPE.pack(len(array), array.null_count, array.offset), crc)
    for buffer in array.buffers():
        if buffer is not None:
            crc = zlib.crc32(struct.pack("<q", buffer.size), crc)
            crc = zlib.crc32(buffer, crc)
    if pa.types.is_dictionary(array.type):
        crc = zlib.crc32(bytes.fromhex(column_checksum(array.dictionary)), crc)
    return crc32_hex(crc)


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


class WrittenTable(NamedTuple):
    """What write_table wrote: its size, its CRC-32 and each column's checksum (column_checksum)."""

    bytes: int
    crc32: int
    columns: dict[str, str]


def write_table(path: Path, table: pa.Table) -> WrittenTable:
    """Write `table` as cells.arrow atomically, as one record batch; its size, CRC-32 and column
    checksums come from the file as written (read back through its map, as a reader reads it)."""
    table = encode_metadata(table)
    with atomic_path(path) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(table.num_rows, 1))
        written = read_table(tmp)
        columns = {name: column_checksum(one_array(written, name)) for name in written.column_names}
        del written
        return WrittenTable(tmp.stat().st_size, file_crc32(tmp), columns)


def read_table(path: Path, remedy: str = DEFAULT_REMEDY) -> pa.Table:
    """cells.arrow, memory-mapped; DamagedFileError when it is not there or not a readable Arrow file."""
    problem = present_problem(path)
    if problem:
        raise DamagedFileError(path, problem, remedy)
    try:
        source = pa.memory_map(str(path), "r")
        return pa.ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise DamagedFileError(path, f"is not a readable Arrow table ({one_line(exc)})", remedy) from None


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


def check_storage_columns(columns: Sequence[str], path: Path, remedy: str) -> None:
    missing = [name for name in STORAGE_COLUMNS if name not in columns]
    if missing:
        raise DamagedFileError(path, f"lacks the column(s) {', '.join(missing)}", remedy)
