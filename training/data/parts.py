"""A packed dataset written in parts, one per task of a Slurm array, then merged: what `prepare`
and `ingest` share.

    <packed>.parts/part-00003-of-00008/    part 3 of 8 (training/data/packed.py PartWriter)

Task K of N works on slice K of its inputs (`part_rows`). A finished part records the inputs it was
made from (its identity); a task that finds a finished part of the same identity keeps it, which
makes an interrupted array resumable. `merge_and_split` joins the parts into <packed>, writes the
seeded split and removes the parts.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout


def check_part_arguments(part: int | None, parts: int) -> None:
    if parts < 1 or (part is not None and not 0 <= part < parts):
        raise UserError(f"--part must be in 0..{parts - 1} and --parts >= 1 (got --part {part} --parts {parts})")


def parts_root(layout: RunLayout) -> Path:
    return layout.packed.with_name(layout.packed.name + ".parts")


def part_dir(layout: RunLayout, part: int, parts: int) -> Path:
    return parts_root(layout) / f"part-{part:05d}-of-{parts:05d}"


def part_rows(total: int, part: int, parts: int) -> range:
    """Slice `part` of `parts` of `total` inputs: contiguous, sizes differing by one at most."""
    return range(total * part // parts, total * (part + 1) // parts)


def finished_part(folder: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The part.json of a finished part made from the same inputs, else None."""
    from training.data.packed import read_part

    done = read_part(folder)
    return done if done is not None and done.get("identity") == identity else None


def merge_and_split(config: Config, layout: RunLayout, folders: list[Path], *,
                    beside: Callable[[Path], Any] | None = None, **extra: Any):
    """Merge the finished parts into <packed> (with `extra` in its index.json, and the files
    `beside` writes into the merged folder), then draw and save the split over the merged dataset;
    the parts are removed. Returns the split."""
    from training.data.dataset import open_images
    from training.data.packed import merge_parts
    from training.data.split import save_split, split_for

    merge_parts(folders, layout.packed, beside=beside, **extra)
    images = open_images(config.replace({"data.loader": "packed"}))
    split = split_for(config, images)
    save_split(config, split, images)
    shutil.rmtree(parts_root(layout), ignore_errors=True)
    return split
