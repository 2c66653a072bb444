"""prepare: pack the TIFF folder into one memory-mapped array + index, and fix the hold-out split.

    python -m training prepare --config run.yaml

    python -m training prepare --config run.yaml --verify

Reads data.source (class folders), writes <run>/packed (or data.packed_dir) atomically, the
seeded train/hold-out split (<run>/split.json) and, if any image is unusable, the report
<run>/bad_images.json (path and reason of each). data.on_bad_image=fail stops at the first one.

--verify writes nothing: it checks what `prepare` wrote, every byte of packed/images.bin against
the CRC-32 in packed/index.json included, and says "intact" or names the damaged file (exit 2).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def _raise(bad) -> None:
    from training.data.dataset import BadImageError

    raise BadImageError(bad)


def _note(bad) -> None:
    log.debug("bad image %s: %s", bad.path, bad.reason)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verify", action="store_true",
                        help="check the packed dataset (every byte against its checksum), the split and the "
                             "bad-image report instead of writing them")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    if getattr(args, "verify", False):
        return verify(config, layout)
    from training.data.dataset import write_bad_report
    from training.data.index import scan_images
    from training.data.packed import is_packed, pack_images
    from training.data.split import save_split, split_for

    source = Path(config.data.source)
    if is_packed(source):
        raise UserError(f"data.source {source} is already a packed dataset; point it at the TIFF folder")
    index = scan_images(source, config.data.folder_depth_for_labels)
    report = pack_images(source, index, layout.packed, channel_axis=config.data.channel_axis,
                         on_bad=_raise if config.data.on_bad_image == "fail" else _note,
                         folder_depth_for_labels=config.data.folder_depth_for_labels)
    if report.n_images == 0:
        raise UserError(f"none of the {len(index)} images under {source} is readable; see the log")
    write_bad_report(layout.bad_images, "prepare", report.bad)
    kept = index.without({b.path for b in report.bad})
    split = split_for(config, kept, source)
    save_split(config, split, kept.paths)
    log.info("packed %d images (%d skipped) into %s; split: %d train, %d hold-out",
             report.n_images, len(report.bad), layout.packed, len(split.train), len(split.holdout))
    return 0


def verify(config: Config, layout: RunLayout) -> int:
    """Check prepare's files as the later steps read them, images.bin's CRC-32 in full."""
    from training.data.dataset import resolve_source
    from training.data.packed import PackedImages
    from training.data.split import load_split
    from training.errors import MissingInputError
    from training.rundir.artifacts import bad_image_paths, read_split

    kind, folder = resolve_source(config.replace({"data.loader": "packed"}))
    if kind != "packed":
        raise MissingInputError("packed dataset", layout.packed, "prepare")
    images = PackedImages(folder)
    checked = "size and checksum" if images.verify() else "size only: no checksum recorded"
    if checked.startswith("size only"):
        log.warning("%s was packed before checksums were recorded: only its size was checked; rerun "
                    "`python -m training prepare` to record one", folder)
    split = load_split(config)
    saved = "saved" if read_split(layout) is not None else "computed, no split file"
    print(f"intact: {folder}, {len(images)} images ({checked}); split {saved}: {len(split.train)} train, "
          f"{len(split.holdout)} hold-out; {len(bad_image_paths(layout))} bad image(s) listed")
    return 0
