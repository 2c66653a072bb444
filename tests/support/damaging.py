"""Damage done to a finished run's files, as a disk, a copy or a typo does it, for the damaged-file tests.

    copy_run(source, target, own=(...))     a copy whose large files are hard links, but for `own`
    damage(path, how)                       delete, truncate, garble (same size), folder, file, short, plant
    garble_column(table, column)            bytes of one column of cells.arrow overwritten in place
    snapshot(path)                          what is there, to show a step left it as it was
    error_line(capsys)                      the one `error:` line of a failed step (and no traceback)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

LARGE = (".pth", ".bin", ".npy", ".arrow")
GARBAGE = b"\xff\x00garbled\x00bytes\xff"


def copy_run(source: Path, target: Path, own: tuple[str, ...] = ()) -> None:
    """Copy a run: small files copied, large ones hard-linked, except the files named in `own`
    (relative paths; a folder's files too) and their hard links, which get one copy of their own,
    linked among themselves. Steps replace files by renaming, so the source is never changed."""
    owned = {p.stat().st_ino for rel in own for p in [source / rel, *(source / rel).rglob("*")] if p.is_file()}
    copies: dict[int, Path] = {}
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        inode = path.stat().st_ino
        if inode in copies:
            os.link(copies[inode], dest)
        elif path.suffix in LARGE and inode not in owned:
            os.link(path, dest)
        else:
            shutil.copy2(path, dest)
            copies[inode] = dest


def damage(path: Path, how: str) -> None:
    """delete (a file or a folder), truncate (to half), garble (16 bytes in the middle, the size kept),
    folder (a folder in the file's place), file (a file in the folder's place), short (an .npy saved
    again five entries shorter, a valid file of another length than its neighbours), plant (a garbled
    file where a step that has not run here would have written one)."""
    if how in ("delete", "folder", "file"):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if how == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    elif how == "garble":
        with open(path, "r+b") as handle:
            handle.seek(path.stat().st_size // 2)
            handle.write(GARBAGE)
    elif how == "folder":
        path.mkdir()
    elif how == "file":
        path.write_text("not a folder\n")
    elif how == "short":
        np.save(path, np.load(path)[:-5])
    elif how == "plant":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b'{"written": \xff\x00garbled')


def garble_column(table: Path, column: str, *, buffer: int = -1) -> None:
    """Overwrite the first bytes of one of a column's buffers (the last: its values) in the Arrow
    file `table`, in place, the size kept: found through the file's own memory map."""
    source = pa.memory_map(str(table), "r")
    whole = source.read_buffer()
    array = pa.ipc.open_file(source).read_all().column(column).chunk(0)
    data = [b for b in array.buffers() if b is not None][buffer]
    start, count = data.address - whole.address, min(data.size, len(GARBAGE))
    assert 0 <= start and start + count <= whole.size
    del array, data, whole, source
    with open(table, "r+b") as handle:
        handle.seek(start)
        handle.write(GARBAGE[:count])


def snapshot(path: Path):
    """A file's bytes, a folder's files and their bytes, or None where nothing is."""
    if path.is_dir():
        return sorted((p.relative_to(path).as_posix(), p.read_bytes()) for p in path.rglob("*") if p.is_file())
    return path.read_bytes() if path.exists() else None


def error_line(capsys) -> str:
    """The one `error:` line of a failed step (and no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0].removeprefix("error: ")
