"""Free space on the file systems a run writes to: checked before a step writes much, and named
when a write runs out of it.

A full disk does not announce itself: torch.save on a full file system ends in
"RuntimeError: [enforce fail at inline_container.cc:...] . unexpected pos 111879744 vs 111879636",
which says nothing of space and which the retry logic took for a transient failure (retried 8
times, failing at the same save each time). `no_space_error` recognises such a failure (ENOSPC or
EDQUOT, torch's writer failing, or simply too little room left for what was being written) and
turns it into a DiskFullError: which file system, how much the write needs and how much is free.
It is a UserError, so the step fails deterministically (training/recovery/failures.py): no retry until
the user has made room, and a new attempt then carries on from the last intact file.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from training.errors import UserError

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
TORCH_WRITE_FAILURES = ("unexpected pos", "PytorchStreamWriter failed", "No space left on device")
"""How torch's zip writer words a write that the file system cut short."""
MARGIN = 1.05
"""Room asked for beyond an estimate: file system metadata and rounding."""


class DiskFullError(UserError):
    """A file system has no room for what a step must write."""


def existing(path: Path) -> Path:
    """The path itself, or its nearest ancestor that exists (what a not-yet-made folder will live on)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def mount_point(path: Path) -> Path:
    path = existing(path)
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def filesystem_type(mount: Path) -> str:
    """The file system type of a mount point from /proc/mounts ("lustre", "ext4", ...), or "unknown"."""
    try:
        with open("/proc/mounts") as mounts:
            entries = [line.split() for line in mounts]
    except OSError:
        return "unknown"
    kinds = [entry[2] for entry in entries if len(entry) > 2 and entry[1] == str(mount)]
    return kinds[-1] if kinds else "unknown"


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(existing(path)).free


def gigabytes(count: float) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e7 else f"{count / 1e6:.2f} MB"


def space_message(path: Path, needed: int, free: int, what: str) -> str:
    mount = mount_point(path)
    return (f"no space left on {mount} ({filesystem_type(mount)}) for {what} ({path}): it needs about "
            f"{gigabytes(needed)} and {gigabytes(free)} are free; free space there, or point the run at a file "
            f"system with room (run.output_dir, data.packed_dir)")


def require_free(path: Path, needed: int, what: str) -> None:
    """DiskFullError before a step starts writing `needed` bytes where there is less room."""
    free = free_bytes(path)
    if free < needed * MARGIN:
        raise DiskFullError(space_message(path, int(needed * MARGIN), free, what))


def room_problem(path: Path, needed: int, what: str) -> str | None:
    """require_free's message, or None when there is room (for a rank that tells the others)."""
    try:
        require_free(path, needed, what)
    except DiskFullError as exc:
        return str(exc)
    return None


def is_no_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
        return True
    return isinstance(exc, RuntimeError) and any(words in str(exc) for words in TORCH_WRITE_FAILURES)


def no_space_error(path: Path, needed: int, exc: BaseException, what: str) -> DiskFullError | None:
    """A DiskFullError explaining `exc`, a failed write of about `needed` bytes to `path`, when the
    file system is out of room (or says so); None when the failure has another cause."""
    free = free_bytes(path)
    if not is_no_space(exc) and free >= needed:
        return None
    return DiskFullError(space_message(path, needed, free, what) + f" (the write failed with: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:160]})")
