"""The run of `ingest` (what it does and writes: training/steps/ingest.py): the settings checked, each
part cut (`cut_one_part`), then the parts' counts added up and the parts merged (`merge_ingest_parts`)."""

from __future__ import annotations

import json
import logging

from training.config import Config
from training.data.ingest.checks import (
    check_columns,
    check_crop_size,
    check_paths,
    check_settings,
    propose,
    require_crop_size,
)
from training.data.ingest.measurements import merge_measurements
from training.data.ingest.part import describe, ingest_part, part_identity, summarise
from training.data.ingest.table import LoadTable
from training.data.store.merge import merge_and_split, read_finished_parts
from training.data.store.parts import check_part_arguments, finished_part, part_rows
from training.errors import UserError
from training.rundir import RunLayout
from training.rundir.artifacts import write_bad_images
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)


def ingest(config: Config, layout: RunLayout, *, part: int | None, parts: int, merge: bool,
           propose_crop_size: bool) -> None:
    """Cut part `part` of `parts` (None: every part, then merge them), or with `merge` only merge;
    with `propose_crop_size`, print a crop size (JSON) and write nothing."""
    check_part_arguments(part, parts)
    check_settings(config)
    if merge:
        merge_ingest_parts(config, layout, parts)
        return
    load = LoadTable(config)
    check_columns(config, load)
    check_paths(load)
    if propose_crop_size:
        print(json.dumps(propose(config, load), indent=2))
        return
    require_crop_size(config, load)
    check_crop_size(config, load)
    for k in ([part] if part is not None else range(parts)):
        cut_one_part(config, layout, load, k, parts)
    if part is None:
        merge_ingest_parts(config, layout, parts)


def cut_one_part(config: Config, layout: RunLayout, load: LoadTable, part: int, parts: int) -> None:
    """Cut slice `part` of `parts` of the table's rows, unless a finished part of the same inputs is there."""
    rows, folder = part_rows(len(load), part, parts), layout.part(part, parts)
    identity = part_identity(config, load, rows)
    if finished_part(folder, identity, "ingest") is not None:
        log.info("part %d of %d (rows %d..%d) is already cut in %s: kept", part + 1, parts, rows.start + 1,
                 rows.stop, folder)
        return
    log.info("ingest part %d of %d: rows %d..%d of %d in %s", part + 1, parts, rows.start + 1, rows.stop, len(load),
             load.name)
    info = ingest_part(config, load, rows, folder, identity)
    print(f"ingest part {part + 1} of {parts}: {describe(summarise([info]))}", flush=True)


def merge_ingest_parts(config: Config, layout: RunLayout, parts: int) -> None:
    """Add up the parts' counts into the report and list their bad fields, then merge the parts into
    <packed> and write the split (training/data/store/merge.py)."""
    folders = [layout.part(k, parts) for k in range(parts)]
    infos = read_finished_parts(folders, "ingest")
    summary = summarise(infos)
    report = {"step": "ingest", "table": config.ingest.table, "settings": config.to_dict()["ingest"],
              "parts": parts, **summary}
    layout.root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(layout.ingest_report, report, indent=1)
    write_bad_images(layout, "ingest", [(b["field"], f"{b['column']}: {b['reason']}") for b in summary["bad"]])
    print(f"ingest: {describe(summary)}; counts in {layout.ingest_report}", flush=True)
    if not summary.get("cut"):
        raise UserError(f"no cell was cut from the {summary.get('fields', 0)} fields of {config.ingest.table} "
                        f"({summary.get('bad_fields', 0)} bad): see {layout.ingest_report}")
    counts = {key: value for key, value in summary.items() if key != "bad"}
    split = merge_and_split(config, layout, folders, step="ingest",
                            write_extra_files=measurements_merger(config, folders, infos),
                            source=config.ingest.table, ingest=counts)
    log.info("ingested %d cells into %s; split: %d train, %d hold-out", summary["cut"], layout.packed,
             len(split.train), len(split.holdout))


def measurements_merger(config: Config, folders: list, infos: list[dict]):
    """Under ingest.cellprofiler, what writes the parts' measurements into the merged folder, and
    prints what they cost; None otherwise."""
    if not config.ingest.cellprofiler:
        return None

    def merge(folder) -> None:
        index = merge_measurements(folders, infos, folder)
        per_cell = 1000 * index["seconds"] / max(index["n_cells"], 1)
        print(f"ingest: CellProfiler's measurements: {len(index['features']):,} features of {index['n_cells']:,} "
              f"cells, measured in {index['seconds']:.1f} s ({per_cell:.1f} ms a cell)", flush=True)

    return merge
