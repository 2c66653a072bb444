"""Atomic file writes: a step that dies half-way never leaves a half-written file behind.

Every writer in the package goes through `atomic_path`: the content is written to a temporary
name beside the target (`.<name>.<pid>.tmp`, same directory so the rename cannot cross file
systems), then renamed over it. A reader sees either the old file or the new one, never a mix.
A folder where the file belongs, or a file where its folder does, is a PathTakenError before
anything is written (`check_writable`; a step that writes several files checks them all first).
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from training.errors import PathTakenError


def temp_name(path: Path) -> Path:
    """The temporary file `path` is written to before the rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def check_writable(paths: Iterable[str | Path]) -> None:
    """PathTakenError when a file of `paths` cannot be written where it belongs: a folder stands in
    its place, or a file where one of its folders belongs."""
    for path in map(Path, paths):
        if path.is_dir():
            raise PathTakenError(path, "is a folder where a file belongs")
        folder = path.parent
        while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise PathTakenError(folder, "is a file where a folder belongs")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write to; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    check_writable([path])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | Path, payload: Any, *, indent: int | None = 1) -> None:
    write_text_atomic(path, json.dumps(payload, indent=indent))


def save_torch_atomic(state: Any, path: str | Path) -> None:
    """torch.save through a temporary file (checkpoints, fine-tuned weights). The file is opened
    here, not by torch: a save that fails (a full disk) then closes it, and the space its partial
    write took is free again when the error reaches the caller."""
    import torch

    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        torch.save(state, handle)


def copy_atomic(source: Path, path: Path) -> None:
    """Copy `source`'s bytes to `path` through a temporary file (a copy that stays if the source changes)."""
    with atomic_path(path) as tmp:
        shutil.copyfile(source, tmp)


def link_atomic(source: Path, path: Path) -> None:
    """Make `path` a hard link to `source` (same bytes, no second write), replacing it atomically."""
    with atomic_path(path) as tmp:
        os.link(source, tmp)
