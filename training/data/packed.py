"""The packed dataset: every cell's pixels in a few large flat files, and one per-cell table.

    packed/index.json          format, pixel type, channels, the shape every cell shares (if any),
                               the pixel files in order with each one's size in elements and bytes and
                               its CRC-32, the table's size and CRC-32, where the images came from
    packed/cells.arrow         the per-cell table (training/data/cells.py): path, pixel file, offset,
                               size and every Metadata_ column, one row per cell
    packed/images-00000.bin    raw pixels, each cell channel-first (C, H, W) in C order, back to back;
    packed/images-00001.bin    one file per SHARD_BYTES or so

Why shards of a few GB rather than one file: FSx for Lustre loads a file lazily from its S3
repository in whole on first read, and stripes a file over its storage servers by the file
system's layout; a few-GB file is restored quickly and many of them spread over every server,
where one file of hundreds of GB is restored before the first image reads and served by the
servers its stripes land on. A Slurm array writes one part per task (`prepare --part`,
`ingest --part`), and merging the parts links their pixel files into place: no pixel is copied.

Integrity: opening checks index.json and the size of every file against it, in microseconds; each
column of the table is checked against its checksum the first time a process reads it
(training/data/cells.py), and every batch's rows against the pixel files they point into;
`verify` (`python -m training prepare --verify`, or `ingest --verify`) checks the CRC-32 of every
byte. Damage is a DamagedFileError that names the file and the step that writes the dataset again:
the one index.json records (`writer_step`, where every such remedy comes from), `prepare` for
class folders, `ingest` for cells cut out of fields of view.

A pack written before the table (format scdino-packed-v1: images.bin and an index.json listing
every path, label, shape and offset) is converted once on first open, with a log line; a v1 pack
in a read-only folder is read into memory instead, every time, with a warning.

All cells are stored in one pixel type: their own when they share it (the usual case), else the
smallest type that holds every image exactly (float32 for uint16 among float32). Each image is
min-max scaled on its own when read, so the stored type changes no result.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa

from training.atomic import write_json_atomic
from training.data.cells import (
    CELLS_FILE,
    CLASS_COLUMN,
    Categories,
    CellTable,
    StringColumn,
    check_storage_columns,
    storage_table,
    write_table,
)
from training.errors import DamagedFileError, UserError
from training.rundir.integrity import (
    check_crc32,
    check_present,
    check_size,
    crc32_hex,
    parse_json,
    require_keys,
    rerun,
)

log = logging.getLogger(__name__)

FORMAT = "scdino-packed-v2"
FORMAT_V1 = "scdino-packed-v1"
PART_FORMAT = "scdino-packed-part-v1"
INDEX_FILE = "index.json"
PART_FILE = "part.json"
IMAGES_FILE = "images.bin"
"""The single pixel file of a v1 pack."""
SHARD_BYTES = 4 << 30
"""Pixel bytes per file before the writer starts the next one."""
WIDEN_CHUNK = 1 << 24
"""Elements converted at a time when a pixel file is rewritten in a wider pixel type."""

WRITERS = ("prepare", "ingest")
"""The steps that write a packed dataset (and the split over it); index.json records which ("step")."""
INDEX_KEYS = ("format", "dtype", "channels", "shards", "table", "n_cells")
V1_KEYS = ("format", "dtype", "channels", "paths", "labels", "class_names", "shapes", "offsets", "total_elements")
NO_LABEL = "all"
"""The one class of a dataset without a label column (every cell counts as one class)."""


def shard_name(number: int) -> str:
    return f"images-{number:05d}.bin"


def writer_step(folder: Path, guess: str = "prepare") -> str:
    """The step that writes the packed dataset in `folder` again, and the split drawn over it: the
    one its index.json records ("step"; an index from before that record was kept names `ingest` by
    the counts ingest adds to it), else `guess`, what the caller knows of the run (the config:
    training/data/dataset.py dataset_step) for an index that is missing or unreadable. Every remedy
    for a damaged packed dataset is `remedy(folder, guess)`."""
    try:
        meta = json.loads((Path(folder) / INDEX_FILE).read_bytes())
    except (OSError, ValueError):
        return guess
    return writer_of(meta, guess)


def writer_of(meta: Any, guess: str = "prepare") -> str:
    """writer_step of an index already read."""
    if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, FORMAT_V1):
        return guess
    if meta.get("step") in WRITERS:
        return meta["step"]
    return "ingest" if "ingest" in meta else "prepare"


def remedy(folder: Path, guess: str = "prepare") -> str:
    """What a DamagedFileError about the packed dataset in `folder` (or the split over it) says to do."""
    return rerun(writer_step(folder, guess))


def is_packed(folder: Path) -> bool:
    folder = Path(folder)
    return (folder / INDEX_FILE).is_file() and ((folder / CELLS_FILE).is_file() or (folder / IMAGES_FILE).is_file())


def check_not_half_packed(folder: Path, guess: str = "prepare") -> None:
    """DamagedFileError when the run's packed folder is there but not whole: a file in its place, an
    index without its table (or a folder in place of either), pixel files or a table without an index."""
    folder = Path(folder)
    if not folder.exists():
        return
    check_present(folder, remedy(folder, guess), folder=True)
    index, table = folder / INDEX_FILE, folder / CELLS_FILE
    if index.exists():
        check_present(index, remedy(folder, guess))
        if not (folder / IMAGES_FILE).is_file():  # a v1 pack has no table until it is converted
            check_present(table, remedy(folder, guess), INDEX_FILE)
        return
    present = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".arrow"))
    if present:
        raise DamagedFileError(index, f"is missing ({present[0]} is there)", remedy(folder, guess))


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


def read_part(folder: Path, fix: str = rerun("prepare")) -> dict[str, Any] | None:
    """A finished part's part.json; None while the part is unfinished (or never started). `fix`: what
    a DamagedFileError says makes the part again (training/data/parts.py part_remedy)."""
    path = Path(folder) / PART_FILE
    if not path.exists():
        return None
    return require_keys(parse_json(path, fix), ("format", "channels", "shards", "shape"), path, fix)


def check_part(folder: Path, info: dict[str, Any], fix: str) -> None:
    """A finished part's files as its part.json records them: each pixel file there and of its size,
    each table there and of its size and CRC-32 (a merge reads the tables whole anyway)."""
    folder = Path(folder)
    for shard in info["shards"]:
        check_present(folder / shard["file"], fix, PART_FILE)
        check_size(folder / shard["file"], int(shard["bytes"]), PART_FILE, fix)
        check_present(folder / shard["table"], fix, PART_FILE)
        if "table_bytes" in shard:  # parts written before the tables' checksums were recorded: none
            check_size(folder / shard["table"], int(shard["table_bytes"]), PART_FILE, fix)
            check_crc32(folder / shard["table"], shard["table_crc32"], PART_FILE, fix)


def merge_parts(parts: Iterable[Path], out_dir: Path, *, step: str = "prepare",
                part_remedy: Callable[[Path], str] | None = None, beside: Callable[[Path], Any] | None = None,
                **extra: Any) -> dict[str, Any]:
    """Make one packed dataset of finished parts, in order, atomically (temporary folder, then
    rename), recording in its index the `step` that writes it. Each part is checked first
    (check_part; `part_remedy(part)` says what makes a damaged one again). Pixel files are
    hard-linked (copied only across file systems), the tables concatenated with each cell's pixel
    file numbered; files of another pixel type are rewritten in the widest. `beside` writes more
    files row by row with the table into the merged folder before it is swapped into place
    (ingest's CellProfiler measurements)."""
    parts = [Path(p) for p in parts]
    remedy_of = part_remedy or (lambda part: rerun(step))
    infos = [read_part(p, remedy_of(p)) for p in parts]
    missing = [str(p) for p, info in zip(parts, infos) if info is None]
    if missing:
        raise UserError(f"{len(missing)} part(s) are not finished ({', '.join(missing[:3])}): run their tasks "
                        "again (finished parts are kept), then merge")
    for part, info in zip(parts, infos):
        check_part(part, info, remedy_of(part))
    channels = {info["channels"] for info in infos if info["n_cells"]}
    if len(channels) > 1:
        raise UserError(f"the parts disagree on the channel count ({sorted(channels)}): {rerun(step)}")
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tables = [CellTable(part / shard["table"], checksums=shard.get("table_columns"), remedy=remedy_of(part))
                  for part, info in zip(parts, infos) for shard in info["shards"]]
        index = _merge_into(tmp, parts, infos, channels.pop() if channels else 0, tables, {"step": step, **extra})
        if beside is not None:
            beside(tmp)
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return index


def _merge_into(tmp: Path, parts: list[Path], infos: list[dict], channels: int, part_tables: list[CellTable],
                extra: dict) -> dict[str, Any]:
    shards = [(part, shard) for part, info in zip(parts, infos) for shard in info["shards"]]
    dtype = np.result_type(*[np.dtype(s["dtype"]) for _, s in shards]) if shards else np.dtype(np.uint16)
    files, tables = [], []
    for number, ((part, shard), part_table) in enumerate(zip(shards, part_tables)):
        target = tmp / shard_name(number)
        link_or_copy(part / shard["file"], target)
        entry = {"file": target.name, "elements": shard["elements"], "bytes": shard["bytes"], "crc32": shard["crc32"]}
        if np.dtype(shard["dtype"]) != dtype:
            entry["crc32"] = crc32_hex(widen_file(target, np.dtype(shard["dtype"]), dtype, shard["elements"]))
            entry["bytes"] = shard["elements"] * dtype.itemsize
        files.append(entry)
        table = part_table.table
        tables.append(table.set_column(1, "shard", pa.array(np.full(table.num_rows, number, np.uint16))))
    merged = pa.concat_tables(tables, promote_options="permissive") if tables else storage_table([], *[[]] * 4)
    written = write_table(tmp / CELLS_FILE, merged)
    shapes = {tuple(info["shape"]) if info["shape"] else None for info in infos if info["n_cells"]}
    uniform = len(shapes) == 1 and None not in shapes
    index = {"format": FORMAT, "dtype": dtype.str, "channels": channels, "n_cells": merged.num_rows,
             "shape": list(shapes.pop()) if uniform else None, "shards": files,
             "table": {"file": CELLS_FILE, "bytes": written.bytes, "crc32": crc32_hex(written.crc32),
                       "columns": written.columns}, **extra}
    write_json_atomic(tmp / INDEX_FILE, index)
    return index


def link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def replace_dir(new: Path, target: Path) -> None:
    """Swap a finished folder into place; an existing one is removed only after the swap."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


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
