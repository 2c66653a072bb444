"""The merge of a run's parts, `prepare`'s and `ingest`'s alike: the one room where the per-task parts
of a Slurm array (or of one process) become the run's packed dataset and its split.

`merge_and_split` (their --merge, and the end of a run in one process): every part must be finished
(`read_finished_parts`); `merge_parts` checks each one (training/data/store/parts.py), joins them in
order into <packed> atomically (a temporary folder, then a rename), hard-linking their pixel files
(copied only across file systems, rewritten only where a part's pixel type is narrower than the
widest) and concatenating their per-cell tables with each cell's pixel file numbered; then the split
is drawn over the merged dataset and saved (training/data/split.py), and the parts are removed.
What each step adds before it (the bad-image list, ingest's counts) is the step's own
(training/data/folders/prepare.py, training/data/ingest/run.py). `verify_packed` is both steps'
--verify: what the merge wrote, checked as the later steps read it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
import pyarrow as pa

from training.data.split import Split, load_split, save_split, split_for
from training.data.store.cells import CELLS_FILE, CellTable, storage_table, write_table
from training.data.store.format import FORMAT, INDEX_FILE, shard_name, writer_step
from training.data.store.parts import check_part, part_remedy, read_part
from training.data.store.read import PackedImages
from training.data.store.write import widen_file
from training.errors import MissingInputError, UserError
from training.rundir import RunLayout
from training.rundir.artifacts import bad_image_paths, read_split
from training.rundir.integrity import crc32_hex, rerun
from training.writes.atomic import write_json_atomic

if TYPE_CHECKING:
    from training.config import Config

log = logging.getLogger(__name__)


def read_finished_parts(parts: list[Path], step: str) -> list[dict[str, Any]]:
    """Every part's part.json, in order; a UserError names the unfinished ones, for their tasks to run again."""
    infos = [read_part(part, part_remedy(step, part)) for part in parts]
    unfinished = [str(part) for part, info in zip(parts, infos) if info is None]
    if unfinished:
        raise UserError(f"{len(unfinished)} of {len(parts)} part(s) are not finished ({', '.join(unfinished[:3])}): "
                        "run their tasks again (finished parts are kept), then merge")
    return infos


def merge_and_split(config: Config, layout: RunLayout, parts: list[Path], *, step: str,
                    write_extra_files: Callable[[Path], Any] | None = None, **index_fields: Any) -> Split:
    """Merge the finished parts into <packed> (`merge_parts`), then draw and save the split over the
    merged dataset; the parts are removed. Returns the split."""
    from training.data.dataset import open_images

    merge_parts(parts, layout.packed, step=step, write_extra_files=write_extra_files, **index_fields)
    images = open_images(config.replace({"data.loader": "packed"}))
    split = split_for(config, images)
    save_split(config, split, images)
    shutil.rmtree(layout.parts, ignore_errors=True)
    return split


def merge_parts(parts: Iterable[Path], out_dir: Path, *, step: str = "prepare",
                write_extra_files: Callable[[Path], Any] | None = None, **index_fields: Any) -> dict[str, Any]:
    """Make one packed dataset of finished parts, in order, atomically, recording in its index the
    `step` that writes it and `index_fields` (where the images came from, ingest's counts). Each part
    is checked first (check_part; part_remedy says what makes a damaged one again).
    `write_extra_files` writes more files, row by row with the table, into the merged folder before
    it is swapped into place (ingest's CellProfiler measurements). Returns the index."""
    parts = [Path(p) for p in parts]
    infos = read_finished_parts(parts, step)
    for part, info in zip(parts, infos):
        check_part(part, info, part_remedy(step, part))
    channels = {info["channels"] for info in infos if info["n_cells"]}
    if len(channels) > 1:
        raise UserError(f"the parts disagree on the channel count ({sorted(channels)}): {rerun(step)}")
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tables = [CellTable(part / shard["table"], checksums=shard.get("table_columns"),
                            remedy=part_remedy(step, part))
                  for part, info in zip(parts, infos) for shard in info["shards"]]
        index = _merge_into(tmp, parts, infos, channels.pop() if channels else 0, tables,
                            {"step": step, **index_fields})
        if write_extra_files is not None:
            write_extra_files(tmp)
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return index


def _merge_into(tmp: Path, parts: list[Path], infos: list[dict], channels: int, part_tables: list[CellTable],
                index_fields: dict) -> dict[str, Any]:
    shards = [(part, shard) for part, info in zip(parts, infos) for shard in info["shards"]]
    dtype = np.result_type(*[np.dtype(s["dtype"]) for _, s in shards]) if shards else np.dtype(np.uint16)
    files, tables = [], []
    for number, ((part, shard), part_table) in enumerate(zip(shards, part_tables)):
        target = tmp / shard_name(number)
        link_or_copy(part / shard["file"], target)
        entry = {"file": target.name, "elements": shard["elements"], "bytes": shard["bytes"], "crc32": shard["crc32"]}
        if np.dtype(shard["dtype"]) != dtype:
            entry["crc32"] = crc32_hex(widen_file(target, np.dtype(shard["dtype"]), dtype, shard["elements"]))
            entry["bytes"] = shard["elements"] * dtype.itemsize
        files.append(entry)
        table = part_table.table
        tables.append(table.set_column(1, "shard", pa.array(np.full(table.num_rows, number, np.uint16))))
    merged = pa.concat_tables(tables, promote_options="permissive") if tables else storage_table([], *[[]] * 4)
    written = write_table(tmp / CELLS_FILE, merged)
    shapes = {tuple(info["shape"]) if info["shape"] else None for info in infos if info["n_cells"]}
    uniform = len(shapes) == 1 and None not in shapes
    index = {"format": FORMAT, "dtype": dtype.str, "channels": channels, "n_cells": merged.num_rows,
             "shape": list(shapes.pop()) if uniform else None, "shards": files,
             "table": {"file": CELLS_FILE, "bytes": written.bytes, "crc32": crc32_hex(written.crc32),
                       "columns": written.columns}, **index_fields}
    write_json_atomic(tmp / INDEX_FILE, index)
    return index


def link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def replace_dir(new: Path, target: Path) -> None:
    """Swap a finished folder into place; an existing one is removed only after the swap."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def verify_packed(config: Config, layout: RunLayout, step: str) -> int:
    """`prepare --verify` and `ingest --verify`: check what `step` wrote as the later steps read it,
    every CRC-32 in full; print "intact: ..." (or raise the one-line error) and write nothing."""
    from training.data.dataset import dataset_step, resolve_source

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
