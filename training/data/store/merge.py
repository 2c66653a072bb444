"""Merging finished parts into one packed dataset, atomically, linking their pixel files (no pixel
is copied but where a part's pixel type is narrower than the widest)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa

from training.data.store.cells import CELLS_FILE, CellTable, storage_table, write_table
from training.data.store.format import FORMAT, INDEX_FILE, shard_name
from training.data.store.parts import check_part, read_part
from training.data.store.write import widen_file
from training.errors import UserError
from training.files.atomic import write_json_atomic
from training.rundir.integrity import crc32_hex, rerun


def merge_parts(parts: Iterable[Path], out_dir: Path, *, step: str = "prepare",
                part_remedy: Callable[[Path], str] | None = None, beside: Callable[[Path], Any] | None = None,
                **extra: Any) -> dict[str, Any]:
    """Make one packed dataset of finished parts, in order, atomically (temporary folder, then
    rename), recording in its index the `step` that writes it. Each part is checked first
    (check_part; `part_remedy(part)` says what makes a damaged one again). Pixel files are
    hard-linked (copied only across file systems), the tables concatenated with each cell's pixel
    file numbered; files of another pixel type are rewritten in the widest. `beside` writes more
    files row by row with the table into the merged folder before it is swapped into place
    (ingest's CellProfiler measurements)."""
    parts = [Path(p) for p in parts]
    remedy_of = part_remedy or (lambda part: rerun(step))
    infos = [read_part(p, remedy_of(p)) for p in parts]
    missing = [str(p) for p, info in zip(parts, infos) if info is None]
    if missing:
        raise UserError(f"{len(missing)} part(s) are not finished ({', '.join(missing[:3])}): run their tasks "
                        "again (finished parts are kept), then merge")
    for part, info in zip(parts, infos):
        check_part(part, info, remedy_of(part))
    channels = {info["channels"] for info in infos if info["n_cells"]}
    if len(channels) > 1:
        raise UserError(f"the parts disagree on the channel count ({sorted(channels)}): {rerun(step)}")
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tables = [CellTable(part / shard["table"], checksums=shard.get("table_columns"), remedy=remedy_of(part))
                  for part, info in zip(parts, infos) for shard in info["shards"]]
        index = _merge_into(tmp, parts, infos, channels.pop() if channels else 0, tables, {"step": step, **extra})
        if beside is not None:
            beside(tmp)
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return index


def _merge_into(tmp: Path, parts: list[Path], infos: list[dict], channels: int, part_tables: list[CellTable],
                extra: dict) -> dict[str, Any]:
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
                       "columns": written.columns}, **extra}
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
