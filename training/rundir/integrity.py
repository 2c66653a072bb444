"""How a damaged run file is recognised and reported: the checks behind every reader of a run file.

Writes are atomic (training/writes/atomic.py), yet a file can still be damaged afterwards: a disk fills, a
node dies before its data reached FSx, an S3 import or a copy stops half-way, someone edits it.
The readers of run files (training/rundir/artifacts.py, features.py, training/data/store/ and the
checkpoint manager) check through these functions, so that damage always ends in a DamagedFileError
(the CLI prints one line and exits 2) naming the file, what is wrong with it and what writes it
again; never in a traceback from json, numpy or torch.

What is checked, and what it costs:
  JSON files         parsed; the message gives the parser's line and column.
  checkpoints        torch.save writes a zip archive whose every record carries a CRC-32 that
                     torch computes while writing, so saving pays nothing extra for it.
                     `zip_problem` reads the archive's directory, checks that every record lies
                     inside the file and recomputes the CRC-32 of each record over a memory map
                     (`full=False`: of the pickled part only, for readers that memory-map the weights).
                     Archives saved without CRCs (torch.serialization.set_crc32_options(False)
                     leaves them 0) get the structural checks only; pre-zip (legacy) files get
                     whatever torch.load reports.
  flat data files    (packed/images.bin, features.npy) their size against the index, at every open;
                     their CRC-32, which the writer recorded while writing (`Crc32Writer`), in full
                     on request (`prepare --verify`) or where the reader reads every byte anyway.
"""

from __future__ import annotations

import json
import mmap
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from training.errors import DamagedFileError

CHUNK = 1 << 24
"""Bytes checksummed at a time when a file is read for its CRC-32."""

_LOCAL_HEADER = struct.Struct("<4s22xHH")
"""A zip record's local header: its signature, then (at byte 26) the lengths of name and extra field."""
_LOCAL_SIGNATURE = b"PK\x03\x04"


def one_line(text: object, limit: int = 200) -> str:
    """An exception's or a parser's message on one short line, for inside a DamagedFileError."""
    words = " ".join(str(text).split())
    return words if len(words) <= limit else words[: limit - 3] + "..."


def rerun(step: str) -> str:
    """The remedy that names the step writing the file again."""
    return f"rerun `python -m training {step}`"


TAKEN_REMEDY = "move it away, then "
"""Before the remedy of a file that a folder stands in place of (or a folder a file does): its
writer replaces files by renaming and cannot replace a folder, and deletes nothing it did not write."""


def present_problem(path: Path, beside: str | None = None, *, folder: bool = False) -> str | None:
    """What keeps `path` from being read as the file (`folder`: the folder) a step wrote: "is
    missing" ("(<beside> is there)" when a file written with it shows it was written), "is a folder
    where a file belongs" or the reverse; None when it is there as it should be."""
    path = Path(path)
    if not path.exists():
        return f"is missing ({beside} is there)" if beside else "is missing"
    if folder and not path.is_dir():
        return "is a file where a folder belongs"
    if not folder and path.is_dir():
        return "is a folder where a file belongs"
    return None


def check_present(path: Path, remedy: str, beside: str | None = None, *, folder: bool = False) -> None:
    """DamagedFileError when `path` is not there as a file (`folder`: a folder), see present_problem;
    a folder or file in its place is to be moved away before `remedy`."""
    problem = present_problem(path, beside, folder=folder)
    if problem:
        raise DamagedFileError(path, problem, remedy if problem.startswith("is missing") else TAKEN_REMEDY + remedy)


def crc32_hex(value: int) -> str:
    return f"{value & 0xFFFFFFFF:08x}"


class Crc32Writer:
    """A binary file wrapper that keeps the CRC-32 and the size of everything written through it, so
    that a writer records its file's checksum without reading the file back."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.crc, self.size = handle, 0, 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


def file_crc32(path: Path) -> int:
    """CRC-32 of a whole file, read in CHUNK-sized pieces into one reused buffer."""
    crc, buffer = 0, bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                return crc
            crc = zlib.crc32(view[:count], crc)


def parse_json(path: Path, remedy: str) -> Any:
    """A JSON file's content; DamagedFileError when it is missing, a folder, empty or does not parse."""
    check_present(path, remedy)
    data = Path(path).read_bytes()
    if not data.strip():
        raise DamagedFileError(path, "is empty", remedy)
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise DamagedFileError(path, f"is not valid JSON (no UTF-8 text at byte {exc.start})", remedy) from None
    except json.JSONDecodeError as exc:
        raise DamagedFileError(path, f"is not valid JSON ({one_line(exc)})", remedy) from None


def require_keys(payload: Any, keys: tuple[str, ...], path: Path, remedy: str) -> dict[str, Any]:
    """A JSON object that has `keys`; DamagedFileError naming the first one missing."""
    if not isinstance(payload, dict):
        raise DamagedFileError(path, f"holds a JSON {type(payload).__name__}, not an object", remedy)
    missing = [key for key in keys if key not in payload]
    if missing:
        raise DamagedFileError(path, f"lacks {', '.join(map(repr, missing))}", remedy)
    return payload


def size_problem(actual: int, expected: int, source: str) -> str | None:
    """"is truncated" or "has the wrong size" against what `source` records; None when it matches."""
    if actual == expected:
        return None
    if actual < expected:
        return f"is truncated ({actual} of {expected} bytes, as {source} records)"
    return f"has the wrong size ({actual} bytes, {source} records {expected})"


def check_size(path: Path, expected: int, source: str, remedy: str) -> None:
    problem = size_problem(Path(path).stat().st_size, int(expected), source)
    if problem:
        raise DamagedFileError(path, problem, remedy)


def npy_layout(path: Path, remedy: str) -> tuple[tuple[int, ...], Any, int]:
    """A .npy file's shape, item type and the size it must have (its header, then shape x item size
    bytes); DamagedFileError when it has no valid header."""
    import numpy as np

    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = header(handle)
            return shape, dtype, handle.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    except (ValueError, OSError, SyntaxError, TypeError) as exc:
        raise DamagedFileError(path, f"has no valid .npy header ({one_line(exc)})", remedy) from None


def check_crc32(path: Path, expected: str, source: str, remedy: str) -> None:
    """The whole file's CRC-32 against the one `source` recorded (hex)."""
    actual = crc32_hex(file_crc32(path))
    if actual != expected:
        raise DamagedFileError(path, f"fails its checksum (CRC-32 {actual}, {source} records {expected})", remedy)


def zip_problem(path: Path, *, full: bool = True) -> str | None:
    """What is wrong with a zip archive (a torch checkpoint), or None when it is intact.

    Every record must lie inside the file behind a valid header; its CRC-32 is recomputed for every
    record (`full`) or only for those outside data/ (the pickle and metadata; the tensors' bytes are
    left to a reader that memory-maps them). Archives written without CRCs get the structural checks.
    """
    size = Path(path).stat().st_size
    if size == 0:
        return "is empty"
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, ValueError, struct.error, EOFError) as exc:
        return f"is truncated or damaged at its end (its zip directory cannot be read: {one_line(exc)})"
    if not records:
        return "is damaged (its zip directory lists no record)"
    checksummed = any(record.CRC for record in records if record.file_size)
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            for record in records:
                check = checksummed and (full or "/data/" not in f"/{record.filename}")
                problem = _record_problem(view, record, size, check)
                if problem:
                    return problem
        finally:
            view.release()
    return None


def _record_problem(view: memoryview, record: zipfile.ZipInfo, size: int, check_crc: bool) -> str | None:
    # torch names a record <archive>/<record>, the archive after the temporary file it saved to
    offset, name = record.header_offset, record.filename.partition("/")[2] or record.filename
    if offset + _LOCAL_HEADER.size > size:
        return f"is truncated (record {name} starts at byte {offset}, the file has {size})"
    signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(view, offset)
    if signature != _LOCAL_SIGNATURE:
        return f"is damaged (record {name} has no valid header at byte {offset})"
    start = offset + _LOCAL_HEADER.size + name_length + extra_length
    end = start + record.compress_size
    if end > size:
        return f"is truncated (record {name} ends at byte {end}, the file has {size})"
    if not check_crc or record.compress_type != zipfile.ZIP_STORED:
        return None  # torch stores records uncompressed; a compressed one is not ours to check
    with view[start:end] as data:
        actual = zlib.crc32(data)
    if actual != record.CRC:
        return (f"fails its checksum (record {name}: CRC-32 {crc32_hex(actual)}, the archive records "
                f"{crc32_hex(record.CRC)})")
    return None


def is_zip(path: Path) -> bool:
    """Whether the file starts as a zip archive (torch's format since 1.6) rather than a legacy pickle."""
    with open(path, "rb") as handle:
        return handle.read(4) == _LOCAL_SIGNATURE


def load_torch(path: Path, remedy: str, *, verify: bool = True, mmap_weights: bool = False) -> Any:
    """torch.load on the CPU after the archive's checks (`verify`; the CRC-32 of the tensors unless
    `mmap_weights`); DamagedFileError when either fails. Not weights-only: our checkpoints hold the
    config and RNG states."""
    import torch

    path = Path(path)
    if verify and (path.stat().st_size == 0 or is_zip(path)):
        problem = zip_problem(path, full=not mmap_weights)
        if problem:
            raise DamagedFileError(path, problem, remedy)
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap_weights)
    except MemoryError:
        raise
    except Exception as exc:  # unpickling a damaged file can raise almost anything
        raise DamagedFileError(path, f"cannot be read by torch.load ({one_line(exc)})", remedy) from None
