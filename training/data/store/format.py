"""The packed dataset's format: every cell's pixels in a few large flat files, and one per-cell table.

    packed/index.json          format, pixel type, channels, the shape every cell shares (if any),
                               the pixel files in order with each one's size in elements and bytes and
                               its CRC-32, the table's size and CRC-32, where the images came from
    packed/cells.arrow         the per-cell table (training/data/store/cells.py): path, pixel file,
                               offset, size and every Metadata_ column, one row per cell
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
(training/data/store/cells.py), and every batch's rows against the pixel files they point into;
`verify` (`python -m training prepare --verify`, or `ingest --verify`) checks the CRC-32 of every
byte. Damage is a DamagedFileError that names the file and the step that writes the dataset again:
the one index.json records (`writer_step`, where every such remedy comes from), `prepare` for
class folders, `ingest` for cells cut out of fields of view.

A pack written before the table (format scdino-packed-v1: images.bin and an index.json listing
every path, label, shape and offset) is converted once on first open, with a log line (convert.py); a
v1 pack in a read-only folder is read into memory instead, every time, with a warning.

All cells are stored in one pixel type: their own when they share it (the usual case), else the
smallest type that holds every image exactly (float32 for uint16 among float32). Each image is
min-max scaled on its own when read, so the stored type changes no result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.data.store.cells import CELLS_FILE
from training.errors import DamagedFileError
from training.rundir.integrity import check_present, rerun

FORMAT = "scdino-packed-v2"
FORMAT_V1 = "scdino-packed-v1"
PART_FORMAT = "scdino-packed-part-v1"
INDEX_FILE = "index.json"
PART_FILE = "part.json"
IMAGES_FILE = "images.bin"
"""The single pixel file of a v1 pack."""

WRITERS = ("prepare", "ingest")
"""The steps that write a packed dataset (and the split over it); index.json records which ("step")."""


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
