"""prepare: pack the TIFF folder into a few flat pixel files + the per-cell table, and fix the split.

    python -m training prepare --config run.yaml

    python -m training prepare --config run.yaml --part 3 --parts 8     (one task of a Slurm array)
    python -m training prepare --config run.yaml --merge --parts 8      (after every task)

    python -m training prepare --config run.yaml --verify

Reads data.source (class folders), writes <run>/packed (or data.packed_dir) atomically, the
seeded train/hold-out split (<run>/split.json, split.npy) and, if any image is unusable, the report
<run>/bad_images.json (path and reason of each). data.on_bad_image=fail stops at the first one.

With --parts N, task K packs the K-th of N slices of the sorted image list into
<packed>.parts/part-K-of-N/ (a finished part is kept and skipped when the task runs again), and
--merge joins the finished parts into <packed> (linking their pixel files, copying no pixel), then
writes the split and the report: `sbatch --array=0-7 slurm/prepare.slurm CONFIG` does both.

--verify writes nothing: it checks what `prepare` wrote, every byte of the pixel files and the
table against the CRC-32s in packed/index.json included, and says "intact" or names the damaged
file (exit 2).
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
    parser.add_argument("--part", type=int, metavar="K", help="pack only the K-th slice (0-based) of --parts")
    parser.add_argument("--parts", type=int, default=1, metavar="N",
                        help="how many slices the images are packed in (one per task of a Slurm array)")
    parser.add_argument("--merge", action="store_true", help="join the finished parts into the packed dataset")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    if getattr(args, "verify", False):
        return verify(config, layout)
    from training.data.parts import check_part_arguments

    parts, part = getattr(args, "parts", 1), getattr(args, "part", None)
    check_part_arguments(part, parts)
    source = Path(config.data.source)
    from training.data.packed import is_packed

    if is_packed(source):
        raise UserError(f"data.source {source} is already a packed dataset; point it at the TIFF folder")
    if part is not None:
        pack_one_part(config, layout, part, parts)
        return 0
    if not getattr(args, "merge", False):
        for k in range(parts):
            pack_one_part(config, layout, k, parts)
    finish(config, layout, parts)
    return 0


def pack_one_part(config: Config, layout: RunLayout, part: int, parts: int) -> None:
    """Pack slice `part` of `parts` of the sorted image list, unless a finished part of the same
    images is there."""
    from training.data.index import scan_images
    from training.data.pack_tiffs import pack_part
    from training.data.parts import finished_part, part_dir, part_rows

    source = Path(config.data.source)
    index = scan_images(source, config.data.folder_depth_for_labels)
    rows, folder = part_rows(len(index), part, parts), part_dir(layout, part, parts)
    identity = {"source": str(source.resolve()), "n_images": len(index), "rows": [rows.start, rows.stop],
                "first": index.paths[rows.start] if len(rows) else None}
    if finished_part(folder, identity, "prepare") is not None:
        log.info("part %d of %d (%d images) is already packed in %s: kept", part + 1, parts, len(rows), folder)
        return
    log.info("packing part %d of %d: images %d..%d of %d", part + 1, parts, rows.start, rows.stop - 1, len(index))
    info = pack_part(source, index, rows, folder, channel_axis=config.data.channel_axis,
                     on_bad=_raise if config.data.on_bad_image == "fail" else _note, identity=identity)
    log.info("part %d of %d: %d cells packed, %d bad", part + 1, parts, info["n_cells"], len(info["bad"]))


def finish(config: Config, layout: RunLayout, parts: int) -> None:
    """Merge the parts into <packed>, then write the bad-image report and the split."""
    from training.data.dataset import write_bad_report
    from training.data.packed import read_part
    from training.data.parts import merge_and_split, part_dir, part_remedy
    from training.data.tiff import BadImage

    folders = [part_dir(layout, k, parts) for k in range(parts)]
    infos = [read_part(folder, part_remedy("prepare", folder)) for folder in folders]
    bad = [BadImage(b["path"], b["reason"]) for info in infos if info for b in info.get("bad", [])]
    n_cells = sum(info["n_cells"] for info in infos if info)
    write_bad_report(layout.bad_images, "prepare", bad)
    if n_cells == 0 and all(infos):
        raise UserError(f"none of the images under {config.data.source} is readable ({len(bad)} bad); see "
                        f"{layout.bad_images}")
    split = merge_and_split(config, layout, folders, step="prepare", source=str(config.data.source),
                            folder_depth_for_labels=config.data.folder_depth_for_labels)
    log.info("packed %d images (%d skipped) into %s; split: %d train, %d hold-out",
             n_cells, len(bad), layout.packed, len(split.train), len(split.holdout))


def verify(config: Config, layout: RunLayout) -> int:
    """Check prepare's files as the later steps read them, every CRC-32 in full."""
    from training.data.parts import verify_packed

    return verify_packed(config, layout, "prepare")
