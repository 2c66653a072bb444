"""Feature sets on disk (<run>/features/<tag>/): `features.npy` (N, D) float32, `rows.npy` (N,) int64
(the per-cell table's row of each feature row, ascending) and a small `index.json`.

Binary arrays load in milliseconds and memory-map, where scDINO's CSV of floats takes minutes and
gigabytes for 100k images; nothing in the index grows with the number of cells, so reading a set
of 10^7 rows parses a few hundred bytes of JSON. A set is keyed by table rows only: labels, paths,
batches and every metadata column are the table's (and labels.json's), never a second list kept
in step. The files are written to temporary names and renamed, the index last, so an interrupted
step never leaves a half-written feature set behind. FeatureSetWriter writes them block by block as
the rows come (the `features` step never holds a set: 15 GB at 10^7 cells of 384 float32); on
several ranks each rank writes its part beside the set under a hidden name (FeaturePartWriter) and
rank 0 merges the parts into the set (merge_parts).

The index records both arrays' sizes and CRC-32s ("features_bytes", "features_crc32", "rows_bytes",
"rows_crc32", computed while writing). A reader checks the sizes from the arrays' own headers at
every open and the CRC-32s where recorded; a damaged or incomplete set is a DamagedFileError that
says to rerun `features`, which recomputes such a set. A set written before rows.npy (its rows
listed in index.json as "indices") is still read.
"""

from __future__ import annotations

import io
import logging
import zlib
from contextlib import ExitStack
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
from training.writes.atomic import atomic_path, check_writable, write_json_atomic

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


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """np.save's header of an array of `dtype` and `shape` (C order, format 1.0). numpy pads it so
    that its length does not change as the first dimension grows: a writer can leave the header's
    room, stream the rows, then write the header of the rows it wrote."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": shape})
    return header.getvalue()


_CRC32_POLY = 0xEDB88320
"""CRC-32's polynomial, bit-reflected as zlib computes it."""


def _crc32_multiply(a: int, b: int) -> int:
    """a x b modulo CRC-32's polynomial (zlib's multmodp)."""
    bit, product = 1 << 31, 0
    while True:
        if a & bit:
            product ^= b
            if not a & (bit - 1):
                return product
        bit >>= 1
        b = (b >> 1) ^ _CRC32_POLY if b & 1 else b >> 1


def _crc32_zeros(count: int) -> int:
    """x^(8 count) modulo the polynomial: appending `count` zero bytes, as an operator (zlib's x2nmodp)."""
    product, power = 1 << 31, 1 << 30  # 1 and x, in the reflected bit order; x squared thrice is x^8: a byte
    for _ in range(3):
        power = _crc32_multiply(power, power)
    while count:
        if count & 1:
            product = _crc32_multiply(power, product)
        count >>= 1
        power = _crc32_multiply(power, power)
    return product


def crc32_combine(first: int, second: int, second_size: int) -> int:
    """The CRC-32 of A then B from the CRC-32s of A and B and B's size (zlib's crc32_combine, which
    Python's zlib does not expose): a streamed file's header, written last, joins its data's CRC."""
    return _crc32_multiply(_crc32_zeros(second_size), first) ^ second


class _NpyStream:
    """One .npy file written block by block through a temporary name (training/writes/atomic.py):
    the header's room first, the blocks through a Crc32Writer, then the header of the rows written."""

    def __init__(self, files: ExitStack, path: Path, dtype: type, row_shape: tuple[int, ...]) -> None:
        self.dtype, self.row_shape = np.dtype(dtype), row_shape
        self.handle = files.enter_context(open(files.enter_context(atomic_path(path)), "wb"))
        self.header_size = self.handle.write(_npy_header(self.dtype, (0, *row_shape)))
        self.data = Crc32Writer(self.handle)
        self.rows = 0

    def write(self, block: np.ndarray) -> None:
        self.data.write(np.ascontiguousarray(block, dtype=self.dtype))
        self.rows += len(block)

    def finish(self) -> tuple[int, str]:
        """Write the header of the rows written: the file's size and CRC-32 (hex)."""
        header = _npy_header(self.dtype, (self.rows, *self.row_shape))
        if len(header) != self.header_size:
            raise RuntimeError(f"numpy {np.__version__} does not leave room in a .npy header for its rows to grow "
                               "(numpy >= 1.23 does)")
        self.handle.seek(0)
        self.handle.write(header)
        return self.header_size + self.data.size, crc32_hex(crc32_combine(zlib.crc32(header), self.data.crc,
                                                                          self.data.size))


class FeatureSetWriter:
    """A feature set written block by block, with the bytes save_features writes, holding no more
    than the block it is given: `features.npy` and `rows.npy` go to temporary names as the blocks
    come, and on a clean exit are renamed and the index written last, atomically, with their sizes and
    CRC-32s. An exception inside the block leaves the earlier set (if any) as it was and nothing
    else; a crash after the renames, before the index, leaves arrays without an index, which
    read_index reports as incomplete and `features` recomputes.

        with FeatureSetWriter(directory, dim, meta) as writer:
            writer.append(rows, features)  # table rows ascending and distinct, over every block
    """

    def __init__(self, directory: Path, dim: int, meta: dict[str, Any] | None = None) -> None:
        self.directory, self.dim, self.meta = Path(directory), int(dim), dict(meta or {})
        self.last_row = -1

    def __enter__(self) -> "FeatureSetWriter":
        check_writable([self.directory / name for name in (FEATURES_FILE, ROWS_FILE, INDEX_FILE)])
        with ExitStack() as files:
            self.feature_file = _NpyStream(files, self.directory / FEATURES_FILE, np.float32, (self.dim,))
            self.row_file = _NpyStream(files, self.directory / ROWS_FILE, np.int64, ())
            self.files = files.pop_all()
        return self

    def append(self, rows: np.ndarray, features: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 1 or np.shape(features) != (len(rows), self.dim):
            raise ValueError(f"a block of {np.shape(features)} features for {rows.shape} rows; expected "
                             f"({len(rows)}, {self.dim})")
        if len(rows) and (rows[0] <= self.last_row or not (np.diff(rows) > 0).all()):
            raise ValueError("feature set rows must be ascending and distinct")
        self.feature_file.write(features)
        self.row_file.write(rows)
        self.last_row = int(rows[-1]) if len(rows) else self.last_row

    @property
    def count(self) -> int:
        """Rows appended so far."""
        return self.row_file.rows

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is not None:
            return bool(self.files.__exit__(kind, error, traceback))  # temporary files removed, nothing renamed
        with self.files:  # on leaving: both files closed, then renamed
            (features_bytes, features_crc), (rows_bytes, rows_crc) = self.feature_file.finish(), self.row_file.finish()
            (self.directory / INDEX_FILE).unlink(missing_ok=True)  # never an index beside other arrays
        write_json_atomic(self.directory / INDEX_FILE, {
            **self.meta, "n_images": self.count, "dim": self.dim, "features_bytes": features_bytes,
            "features_crc32": features_crc, "rows_bytes": rows_bytes, "rows_crc32": rows_crc}, indent=None)
        log.info("wrote %d x %d features to %s", self.count, self.dim, self.directory)
        return False


def save_features(directory: Path, feature_set: FeatureSet) -> None:
    """Write `features.npy`, `rows.npy` and `index.json` atomically (the index last: it marks completion)."""
    with FeatureSetWriter(directory, feature_set.dim, feature_set.meta) as writer:
        writer.append(feature_set.indices, feature_set.features)


PART_PREFIX = ".part-"
"""A rank's part of a feature set lies in the set's folder under a hidden name (`.part-00001-of-00004.`
then features.npy or rows.npy): no reader takes it for a set, and merge_parts removes it."""
MERGE_BYTES = 1 << 26
"""Feature bytes the merge holds at a time, over all the parts (64 MB)."""


def part_paths(directory: Path, rank: int, ranks: int) -> tuple[Path, Path]:
    """The features and rows files of rank `rank`'s part of the set in `directory`."""
    stem = f"{PART_PREFIX}{rank:05d}-of-{ranks:05d}."
    return Path(directory) / (stem + FEATURES_FILE), Path(directory) / (stem + ROWS_FILE)


class FeaturePartWriter:
    """One rank's rows of a feature set, in the order it computed them, block by block: two .npy
    files written as the set's are (through temporary names, renamed on a clean exit), for
    merge_parts to read memory-mapped once every rank has written its part."""

    def __init__(self, directory: Path, rank: int, ranks: int, dim: int) -> None:
        self.paths, self.dim = part_paths(directory, rank, ranks), int(dim)

    def __enter__(self) -> "FeaturePartWriter":
        with ExitStack() as files:
            self.feature_file = _NpyStream(files, self.paths[0], np.float32, (self.dim,))
            self.row_file = _NpyStream(files, self.paths[1], np.int64, ())
            self.files = files.pop_all()
        return self

    def append(self, rows: np.ndarray, features: np.ndarray) -> None:
        self.feature_file.write(np.reshape(features, (len(rows), self.dim)))
        self.row_file.write(rows)

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None:
            self.feature_file.finish()
            self.row_file.finish()
        return bool(self.files.__exit__(kind, error, traceback))


@dataclass
class _Part:
    """A part's rows ascending (`rows`, memory-mapped when the rank wrote them in order) and where
    each one's features are in the part (`order`, None when in place)."""

    rows: np.ndarray
    features: np.ndarray
    order: np.ndarray | None

    def features_of(self, start: int, stop: int) -> np.ndarray:
        if self.order is None:
            return np.asarray(self.features[start:stop])
        return self.features[self.order[start:stop]]


def _ascending(rows: np.ndarray, block: int) -> bool:
    """Whether memory-mapped `rows` are ascending and distinct, read `block` at a time."""
    return all((np.diff(rows[max(0, start - 1):start + block]) > 0).all() for start in range(0, len(rows), block))


def _open_part(directory: Path, rank: int, ranks: int, dim: int, block: int) -> _Part:
    features_path, rows_path = part_paths(directory, rank, ranks)
    for path in (features_path, rows_path):
        if not path.is_file():
            raise UserError(f"{path} is missing after every rank wrote its part of the feature set: the run's folder "
                            "must be on a file system every node shares (FSx), as run.output_dir is on the cluster")
    features, rows = np.load(features_path, mmap_mode="r"), np.load(rows_path, mmap_mode="r")
    if features.shape != (len(rows), dim):
        raise DamagedFileError(features_path, f"holds {features.shape} features for {len(rows)} rows of {dim}", REMEDY)
    if _ascending(rows, block):
        return _Part(rows, features, None)
    order = np.argsort(rows, kind="stable")  # a rank that computed its rows out of order: only they are held
    return _Part(np.asarray(rows)[order], features, order)


def _merged(parts: list[_Part], block: int):
    """The parts' (rows, features) in ascending row order, in blocks of at most `block` rows over all
    parts: each round takes up to block / len(parts) rows of every part not yet done and hands on
    those up to the smallest of their last rows, which no later row of any part can precede."""
    per_part, done, last = max(1, block // len(parts)), [0] * len(parts), -1
    while live := [i for i, part in enumerate(parts) if done[i] < len(part.rows)]:
        window = {i: np.asarray(parts[i].rows[done[i]:done[i] + per_part]) for i in live}
        bound = min(int(rows[-1]) for rows in window.values())
        taken = {i: int(np.searchsorted(rows, bound, side="right")) for i, rows in window.items()}
        rows = np.concatenate([window[i][:taken[i]] for i in live])
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        if rows[0] <= last or not (np.diff(rows) > 0).all():
            raise RuntimeError("ranks extracted overlapping shards: the eval loader must not pad or repeat images")
        features = np.concatenate([parts[i].features_of(done[i], done[i] + taken[i]) for i in live])[order]
        for i in live:
            done[i] += taken[i]
        last = int(rows[-1])
        yield rows, features


def merge_parts(directory: Path, ranks: int, dim: int, meta: dict[str, Any]) -> None:
    """The feature set in `directory` from the parts of its `ranks` ranks (FeaturePartWriter), in
    ascending row order through FeatureSetWriter, MERGE_BYTES of features at a time whatever the
    set's size; then every part there is removed. RuntimeError when two parts hold the same row."""
    block = max(1, MERGE_BYTES // (max(1, dim) * 4))
    parts = [_open_part(directory, rank, ranks, dim, block) for rank in range(ranks)]
    log.info("merging %d rows from %d ranks' parts into %s", sum(len(p.rows) for p in parts), ranks, directory)
    with FeatureSetWriter(directory, dim, meta) as writer:
        for rows, features in _merged(parts, block):
            writer.append(rows, features)
    for path in Path(directory).glob(PART_PREFIX + "*"):
        path.unlink()


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
