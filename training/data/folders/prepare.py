"""The run of `prepare` (what it does and writes: training/steps/prepare.py): each part packed
(`pack_one_part`), then the parts' bad images listed and the parts merged (`merge_prepare_parts`)."""

from __future__ import annotations

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


def prepare(config: Config, layout: RunLayout, *, part: int | None, parts: int, merge: bool) -> None:
    """Pack part `part` of `parts` (None: every part, then merge them), or with `merge` only merge."""
    from training.data.store.format import is_packed
    from training.data.store.parts import check_part_arguments

    check_part_arguments(part, parts)
    source = Path(config.data.source)
    if is_packed(source):
        raise UserError(f"data.source {source} is already a packed dataset; point it at the TIFF folder")
    if part is not None:
        pack_one_part(config, layout, part, parts)
        return
    if not merge:
        for k in range(parts):
            pack_one_part(config, layout, k, parts)
    merge_prepare_parts(config, layout, parts)


def pack_one_part(config: Config, layout: RunLayout, part: int, parts: int) -> None:
    """Pack slice `part` of `parts` of the sorted image list, unless a finished part of the same
    images is there."""
    from training.data.folders.index import scan_images
    from training.data.folders.pack import pack_part
    from training.data.store.parts import finished_part, part_rows

    source = Path(config.data.source)
    index = scan_images(source, config.data.folder_depth_for_labels)
    rows, folder = part_rows(len(index), part, parts), layout.part(part, parts)
    identity = {"source": str(source.resolve()), "n_images": len(index), "rows": [rows.start, rows.stop],
                "first": index.paths[rows.start] if len(rows) else None}
    if finished_part(folder, identity, "prepare") is not None:
        log.info("part %d of %d (%d images) is already packed in %s: kept", part + 1, parts, len(rows), folder)
        return
    log.info("packing part %d of %d: images %d..%d of %d", part + 1, parts, rows.start, rows.stop - 1, len(index))
    info = pack_part(source, index, rows, folder, channel_axis=config.data.channel_axis,
                     on_bad=_raise if config.data.on_bad_image == "fail" else _note, identity=identity)
    log.info("part %d of %d: %d cells packed, %d bad", part + 1, parts, info["n_cells"], len(info["bad"]))


def merge_prepare_parts(config: Config, layout: RunLayout, parts: int) -> None:
    """List the parts' bad images, then merge the parts into <packed> and write the split
    (training/data/store/merge.py)."""
    from training.data.store.merge import merge_and_split, read_finished_parts
    from training.rundir.artifacts import write_bad_images

    folders = [layout.part(k, parts) for k in range(parts)]
    infos = read_finished_parts(folders, "prepare")
    bad = [(b["path"], b["reason"]) for info in infos for b in info.get("bad", [])]
    n_cells = sum(info["n_cells"] for info in infos)
    write_bad_images(layout, "prepare", bad)
    if n_cells == 0:
        raise UserError(f"none of the images under {config.data.source} is readable ({len(bad)} bad); see "
                        f"{layout.bad_images}")
    split = merge_and_split(config, layout, folders, step="prepare", source=str(config.data.source),
                            folder_depth_for_labels=config.data.folder_depth_for_labels)
    log.info("packed %d images (%d skipped) into %s; split: %d train, %d hold-out",
             n_cells, len(bad), layout.packed, len(split.train), len(split.holdout))
