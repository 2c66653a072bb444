"""A packed dataset written in parts, one per task of a Slurm array, then merged: what `prepare`
and `ingest` share.

    <packed>.parts/part-00003-of-00008/    part 3 of 8 (training/data/packed.py PartWriter)

Task K of N works on slice K of its inputs (`part_rows`). A finished part records the inputs it was
made from (its identity); a task that finds a finished part of the same identity keeps it, which
makes an interrupted array resumable. `merge_and_split` joins the parts into <packed>, writes the
seeded split and removes the parts.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from training.config import Config
from training.errors import DamagedFileError, UserError
from training.rundir import RunLayout

log = logging.getLogger(__name__)

PART_NAME = re.compile(r"part-(\d+)-of-(\d+)")


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


def part_remedy(step: str, folder: Path) -> str:
    """What makes a damaged part again: its task (`step --part K --parts N`, which cuts or packs a
    damaged part again rather than keeping it), then the merge; for a one-part run the step itself."""
    match = PART_NAME.fullmatch(Path(folder).name)
    if match is None or int(match.group(2)) == 1:
        return f"rerun `python -m training {step}`"
    part, parts = int(match.group(1)), int(match.group(2))
    return (f"rerun `python -m training {step} --part {part} --parts {parts}` (it makes this part again), then "
            f"`python -m training {step} --merge --parts {parts}`")


def finished_part(folder: Path, identity: dict[str, Any], step: str = "prepare") -> dict[str, Any] | None:
    """The part.json of a finished, intact part made from the same inputs, else None: a damaged part
    (part.json, a pixel file or a table) is made again, with a warning naming what is wrong."""
    from training.data.packed import check_part, read_part

    try:
        done = read_part(folder, part_remedy(step, folder))
        if done is not None and done.get("identity") == identity:
            check_part(folder, done, part_remedy(step, folder))
            return done
    except DamagedFileError as exc:
        log.warning("%s %s: making the part again", exc.path, exc.problem)
    return None


def merge_and_split(config: Config, layout: RunLayout, folders: list[Path], *, step: str,
                    beside: Callable[[Path], Any] | None = None, **extra: Any):
    """Merge the finished parts into <packed> (with `extra` in its index.json, and the files
    `beside` writes into the merged folder), then draw and save the split over the merged dataset;
    the parts are removed. `step` (prepare or ingest) is what the index records as its writer.
    Returns the split."""
    from training.data.dataset import open_images
    from training.data.packed import merge_parts
    from training.data.split import save_split, split_for

    merge_parts(folders, layout.packed, step=step, part_remedy=lambda folder: part_remedy(step, folder),
                beside=beside, **extra)
    images = open_images(config.replace({"data.loader": "packed"}))
    split = split_for(config, images)
    save_split(config, split, images)
    shutil.rmtree(parts_root(layout), ignore_errors=True)
    return split


def verify_packed(config: Config, layout: RunLayout, step: str) -> int:
    """`prepare --verify` and `ingest --verify`: check what `step` wrote as the later steps read it,
    every CRC-32 in full; print "intact: ..." (or raise the one-line error) and write nothing."""
    from training.data.dataset import dataset_step, resolve_source
    from training.data.packed import PackedImages, writer_step
    from training.data.split import load_split
    from training.errors import MissingInputError
    from training.rundir.artifacts import bad_image_paths, read_split
    from training.rundir.integrity import rerun

    kind, folder = resolve_source(config.replace({"data.loader": "packed"}))
    if kind != "packed":
        raise MissingInputError("packed dataset", layout.packed, step)
    guess = dataset_step(config)
    images = PackedImages(folder, label_column=config.data.label_column, batch_column=config.data.batch_column,
                          guess=guess)
    writer = writer_step(folder, guess)
    checked = "size and checksum" if images.verify() else "size only: no checksum recorded"
    if checked.startswith("size only"):
        log.warning("%s was packed before checksums were recorded: only its size was checked; %s to record one",
                    folder, rerun(writer))
    split = load_split(config, images)
    saved = "saved" if read_split(layout, images.remedy) is not None else "computed, no split file"
    print(f"intact: {folder}, {len(images)} images ({checked}); split {saved}: {len(split.train)} train, "
          f"{len(split.holdout)} hold-out; {len(bad_image_paths(layout, writer))} bad image(s) listed")
    return 0
