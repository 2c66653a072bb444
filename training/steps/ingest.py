"""ingest: cut single cells out of whole fields of view (a CellProfiler LoadData table and label
masks or centres) straight into the packed dataset, then fix the split.

    python -m training ingest --config run.yaml                          (every field, one process)

    python -m training ingest --config run.yaml --part 3 --parts 8       (one task of a Slurm array)
    python -m training ingest --config run.yaml --merge --parts 8        (after every task)

    python -m training ingest --config run.yaml --propose-crop-size      (prints a crop size for ingest.crop_size)

    python -m training ingest --config run.yaml --verify                 (checks what ingest wrote, every byte)

Reads ingest.table (CSV or Parquet, one row per field of view: FileName_/PathName_ per channel,
ObjectsFileName_/ObjectsPathName_ per mask, any other column metadata; training/data/ingest_table.py)
and writes <run>/packed (or data.packed_dir) as `prepare` does, with one row per cell in its
per-cell table (field, object number, centre, area and every metadata column, Metadata_-prefixed),
the seeded split (<run>/split.json, split.npy; data.label_column gives the classes it is stratified
by), <run>/ingest_report.json (fields read and bad, objects cut and skipped per reason, the
settings) and, when a field is unusable, <run>/bad_images.json. data.on_bad_image=fail stops at the
first bad field instead of skipping it. With ingest.cellprofiler it also measures every cut cell as
CellProfiler does, into <packed>/cellprofiler.npy and .json, one row per row of the per-cell table
(training/data/cellprofiler.py), which `features` evaluates as the "cellprofiler" baseline.

With --parts N, task K cuts the K-th of N slices of the table's rows into
<packed>.parts/part-K-of-N/; a finished part made from the same tables and settings is kept when
the task runs again (an interrupted array is resumed by running it again), and --merge joins the
parts (linking their pixel files), then writes the split and the report:
`sbatch --array=0-7 slurm/ingest.slurm CONFIG`, then `sbatch slurm/ingest.slurm CONFIG --merge --parts 8`.
A damaged part (its part.json, a pixel file or a table) is cut again by its task, with a warning.

Settings that cannot work are refused before any field is cut, each by what it is: a crop smaller
than one patch of the model or (ingest.edge=skip) larger than the fields of view, a label or batch
column with one value in every row, a control value in no row of its column.

--verify writes nothing: as `prepare --verify`, it checks the packed dataset (every byte against the
CRC-32s in packed/index.json), the split and the bad-field report, and says "intact" or names the
damaged file (exit 2).
"""

from __future__ import annotations

import argparse
import json
import logging

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part", type=int, metavar="K", help="cut only the K-th slice (0-based) of --parts")
    parser.add_argument("--parts", type=int, default=1, metavar="N",
                        help="how many slices the table's rows are cut in (one per task of a Slurm array)")
    parser.add_argument("--merge", action="store_true", help="join the finished parts into the packed dataset")
    parser.add_argument("--propose-crop-size", action="store_true",
                        help="print a crop size from the objects' sizes (JSON) and write nothing")
    parser.add_argument("--verify", action="store_true",
                        help="check the packed dataset (every byte against its checksum), the split and the "
                             "bad-field report instead of writing them")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    from training.data.ingest import check_crop_size
    from training.data.ingest_table import LoadTable
    from training.data.store.parts import check_part_arguments

    parts, part = args.parts, args.part
    if getattr(args, "verify", False):
        from training.data.finish import verify_packed

        return verify_packed(config, layout, "ingest")
    check_part_arguments(part, parts)
    check_settings(config)
    if args.merge:
        finish(config, layout, parts)
        return 0
    load = LoadTable(config)
    check_columns(config, load)
    if args.propose_crop_size:
        from training.data.ingest import propose

        print(json.dumps(propose(config, load), indent=2))
        return 0
    require_crop_size(config, load)
    check_crop_size(config, load)
    for k in ([part] if part is not None else range(parts)):
        cut_one_part(config, layout, load, k, parts)
    if part is None:
        finish(config, layout, parts)
    return 0


def check_settings(config: Config) -> None:
    if not config.ingest.table:
        raise UserError("ingest.table is not set: name the load table (CSV or Parquet, one row per field of view), "
                        "e.g. --set ingest.table=screen/load_data.csv; class folders of single cells go to `prepare`")
    if config.data.split_method == "scdino":
        raise UserError("data.split_method=scdino draws scDINO's split over a folder of images, and ingest cuts cells "
                        "out of fields of view: set data.split_method=stratified")


def check_columns(config: Config, load) -> None:
    """data.label_column, batch_column and control_column name columns the cells will have, a label
    or batch column of the load table has two values or more, and data.control_value is in a row of
    its column: checked before any cell is cut rather than when the split is drawn or the wells are
    profiled."""
    from training.data.ingest_table import FIELD_COLUMNS
    from training.data.store.cells import column_name

    columns = [*load.metadata.values(), *FIELD_COLUMNS]
    found = {}
    for setting in ("label_column", "batch_column", "control_column"):
        name = getattr(config.data, setting)
        if name:
            try:
                found[setting] = column_name(columns, name, f"data.{setting}")
            except UserError:
                raise UserError(f"data.{setting}={name!r} names no column of {load.name} (its metadata columns, "
                                f"Metadata_-prefixed: {', '.join(load.metadata.values())}): set data.{setting} "
                                "to one of them") from None
    table_column = {cell: column for column, cell in load.metadata.items()}  # ingest's own columns are in none
    for setting, why in (("label_column", "the classes the split, kNN and the probe tell apart need two or more"),
                         ("batch_column", "not-same-batch kNN needs cells of another batch to compare with")):
        if setting in found and found[setting] in table_column:
            values = column_values(load, table_column[found[setting]])
            if len(values) < 2:
                held = f"one value ({values[0]!r})" if values else "no value"
                raise UserError(f"data.{setting}={getattr(config.data, setting)!r} holds {held} in every row of "
                                f"{load.name}: {why}; name another column, or leave data.{setting} empty")
    if "control_column" in found and found["control_column"] in table_column and config.data.control_value:
        values = column_values(load, table_column[found["control_column"]])
        if config.data.control_value not in values:
            shown = ", ".join(map(repr, values[:10])) + (", ..." if len(values) > 10 else "")
            raise UserError(f"data.control_value={config.data.control_value!r} is in no row of {load.name}'s "
                            f"{table_column[found['control_column']]} (its values: {shown}): set data.control_value "
                            "to the controls' value")


def column_values(load, column: str) -> list[str]:
    """The distinct values of a load-table column as text (as the cells' categories read them), sorted."""
    return sorted({str(value) for value in load.frame[column].dropna().tolist()})


def require_crop_size(config: Config, load) -> None:
    """ingest.crop_size must be set; when it is not, the error proposes one."""
    if config.ingest.crop_size:
        return
    from training.data.ingest import propose

    proposal = propose(config, load)
    if "crop_size" not in proposal:
        raise UserError("ingest.crop_size is not set, and no object was found to propose one: set it in pixels")
    raise UserError(f"ingest.crop_size is not set: {proposal['objects']:,} objects of {proposal['from']} "
                    f"(median area {proposal['area_median']:.0f} px, 95 % reaching {proposal['reach_p95']} px from "
                    f"their centre) suggest ingest.crop_size: {proposal['crop_size']}; set it (--set "
                    f"ingest.crop_size={proposal['crop_size']})")


def cut_one_part(config: Config, layout: RunLayout, load, part: int, parts: int) -> None:
    """Cut slice `part` of `parts` of the table's rows, unless a finished part of the same inputs is there."""
    from training.data.ingest import describe, ingest_part, part_identity, summarise
    from training.data.store.parts import finished_part, part_dir, part_rows

    rows, folder = part_rows(len(load), part, parts), part_dir(layout, part, parts)
    identity = part_identity(config, load, rows)
    if finished_part(folder, identity, "ingest") is not None:
        log.info("part %d of %d (rows %d..%d) is already cut in %s: kept", part + 1, parts, rows.start + 1,
                 rows.stop, folder)
        return
    log.info("ingest part %d of %d: rows %d..%d of %d in %s", part + 1, parts, rows.start + 1, rows.stop, len(load),
             load.name)
    info = ingest_part(config, load, rows, folder, identity)
    print(f"ingest part {part + 1} of {parts}: {describe(summarise([info]))}", flush=True)


def finish(config: Config, layout: RunLayout, parts: int) -> None:
    """Add up the parts' counts into the report, then merge them into <packed> and write the split."""
    from training.atomic import write_json_atomic
    from training.data.dataset import write_bad_report
    from training.data.finish import merge_and_split
    from training.data.ingest import describe, summarise
    from training.data.store.parts import part_dir, part_remedy, read_part
    from training.data.tiff import BadImage

    folders = [part_dir(layout, k, parts) for k in range(parts)]
    infos = [read_part(folder, part_remedy("ingest", folder)) for folder in folders]
    unfinished = [str(f) for f, info in zip(folders, infos) if info is None]
    if unfinished:
        raise UserError(f"{len(unfinished)} of {parts} part(s) are not finished ({', '.join(unfinished[:3])}): run "
                        "their tasks again (finished parts are kept), then merge")
    summary = summarise(infos)
    report = {"step": "ingest", "table": config.ingest.table, "settings": config.to_dict()["ingest"],
              "parts": parts, **summary}
    layout.root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(layout.ingest_report, report, indent=1)
    write_bad_report(layout.bad_images, "ingest", [BadImage(b["field"], f"{b['column']}: {b['reason']}")
                                                   for b in summary["bad"]])
    print(f"ingest: {describe(summary)}; counts in {layout.ingest_report}", flush=True)
    if not summary.get("cut"):
        raise UserError(f"no cell was cut from the {summary.get('fields', 0)} fields of {config.ingest.table} "
                        f"({summary.get('bad_fields', 0)} bad): see {layout.ingest_report}")
    counts = {key: value for key, value in summary.items() if key != "bad"}
    beside = measurements_merger(config, folders, infos)
    split = merge_and_split(config, layout, folders, step="ingest", beside=beside, source=config.ingest.table,
                            ingest=counts)
    log.info("ingested %d cells into %s; split: %d train, %d hold-out", summary["cut"], layout.packed,
             len(split.train), len(split.holdout))


def measurements_merger(config: Config, folders: list, infos: list[dict]):
    """Under ingest.cellprofiler, what writes the parts' measurements into the merged folder, and
    prints what they cost; None otherwise."""
    if not config.ingest.cellprofiler:
        return None
    from training.data.cellprofiler import merge_measurements

    def merge(folder) -> None:
        index = merge_measurements(folders, infos, folder)
        per_cell = 1000 * index["seconds"] / max(index["n_cells"], 1)
        print(f"ingest: CellProfiler's measurements: {len(index['features']):,} features of {index['n_cells']:,} "
              f"cells, measured in {index['seconds']:.1f} s ({per_cell:.1f} ms a cell)", flush=True)

    return merge
