"""What `prepare` and `ingest` do with a packed dataset once its parts are written: merge them and
draw the split over the merged dataset (`merge_and_split`), and check it all (`verify_packed`,
their --verify)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, Callable

from training.config import Config
from training.data.store.parts import part_remedy
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def merge_and_split(config: Config, layout: RunLayout, folders: list[Path], *, step: str,
                    beside: Callable[[Path], Any] | None = None, **extra: Any):
    """Merge the finished parts into <packed> (with `extra` in its index.json, and the files
    `beside` writes into the merged folder), then draw and save the split over the merged dataset;
    the parts are removed. `step` (prepare or ingest) is what the index records as its writer.
    Returns the split."""
    from training.data.dataset import open_images
    from training.data.split import save_split, split_for
    from training.data.store.merge import merge_parts

    merge_parts(folders, layout.packed, step=step, part_remedy=lambda folder: part_remedy(step, folder),
                beside=beside, **extra)
    images = open_images(config.replace({"data.loader": "packed"}))
    split = split_for(config, images)
    save_split(config, split, images)
    shutil.rmtree(layout.parts, ignore_errors=True)
    return split


def verify_packed(config: Config, layout: RunLayout, step: str) -> int:
    """`prepare --verify` and `ingest --verify`: check what `step` wrote as the later steps read it,
    every CRC-32 in full; print "intact: ..." (or raise the one-line error) and write nothing."""
    from training.data.dataset import dataset_step, resolve_source
    from training.data.split import load_split
    from training.data.store.format import writer_step
    from training.data.store.read import PackedImages
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
