"""ingest: cut single cells out of whole fields of view (a CellProfiler LoadData table and label
masks or centres) straight into the packed dataset, then fix the split.

    python -m training ingest --config run.yaml                          (every field, one process)

    python -m training ingest --config run.yaml --part 3 --parts 8       (one task of a Slurm array)
    python -m training ingest --config run.yaml --merge --parts 8        (after every task)

    python -m training ingest --config run.yaml --propose-crop-size      (prints a crop size for ingest.crop_size)

    python -m training ingest --config run.yaml --verify                 (checks what ingest wrote, every byte)

Reads ingest.table (CSV or Parquet, one row per field of view: FileName_/PathName_ per channel,
ObjectsFileName_/ObjectsPathName_ per mask, any other column metadata; training/data/ingest/table.py)
and writes <run>/packed (or data.packed_dir) as `prepare` does, with one row per cell in its
per-cell table (field, object number, centre, area and every metadata column, Metadata_-prefixed),
the seeded split (<run>/split.json, split.npy; data.label_column gives the classes it is stratified
by), <run>/ingest_report.json (fields read and bad, objects cut and skipped per reason, the
settings) and, when a field is unusable, <run>/bad_images.json. data.on_bad_image=fail stops at the
first bad field instead of skipping it. With ingest.cellprofiler it also measures every cut cell as
CellProfiler does, into <packed>/cellprofiler.npy and .json, one row per row of the per-cell table
(training/data/ingest/measurements.py), which `features` evaluates as the "cellprofiler" baseline.

With --parts N, task K cuts the K-th of N slices of the table's rows into
<packed>.parts/part-K-of-N/; a finished part made from the same tables and settings is kept when
the task runs again (an interrupted array is resumed by running it again), and --merge adds up the
parts' counts into the report and the bad-field list, joins the parts (linking their pixel files),
then writes the split (training/data/store/merge.py, the same merge as `prepare`'s):
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

from training.config import Config
from training.rundir import RunLayout


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
    if getattr(args, "verify", False):
        from training.data.store.merge import verify_packed

        return verify_packed(config, layout, "ingest")
    from training.data.ingest.run import ingest

    ingest(config, layout, part=args.part, parts=args.parts, merge=args.merge,
           propose_crop_size=args.propose_crop_size)
    return 0
