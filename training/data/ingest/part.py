"""`ingest`: cut one crop per cell out of whole fields of view, straight into a packed dataset.

For each row of the load table (table.py): read its images (TIFF, OME-TIFF or
OME-Zarr, one per channel or one multi-channel image) and its label mask, or its objects from a
table of centres; measure the objects and cut a crop centred on each (crops.py);
append the crops to the part's pixel files with one row each in the per-cell table:

    path                   "<field>#<object number>", <field> the first image's path relative to the table
    Metadata_FieldOfView   the field's row in the load table (1-based, CellProfiler's ImageNumber)
    Metadata_ObjectNumber  the object's label in the mask (or ObjectNumber of the centres table)
    Metadata_Center_X, _Y  its centroid, x the column and y the row, 0-based (CellProfiler's Location_Center_X/Y)
    Metadata_Area          its area in pixels (-1 when a table of centres gives none)
    Metadata_<column>      every other column of the load table, values as written

Under ingest.cellprofiler each cut cell is also measured as CellProfiler measures it, in its field,
and the part keeps the measurements row by row with the table (measurements.py).

Nothing is dropped silently: each part records how many objects were skipped and why, and the bad
fields (unreadable, missing or misshapen files, each named by row, column and file); the merge adds
them up into <run>/ingest_report.json, lists the bad fields in bad_images.json, and prints them.

Memory holds a few fields read ahead and the table rows of one pixel file, whatever the number of
fields (the load table itself is one small row per field).
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from training.config import Config
from training.data.ingest.crops import CropSettings, Objects, cut_crops, measure_objects
from training.data.ingest.fields import probe_format, read_ahead
from training.data.ingest.measurements import PartMeasurements
from training.data.ingest.table import FIELD_COLUMNS, BadField, CentresTable, FieldSpec, LoadTable
from training.data.store.write import PartWriter
from training.errors import UserError
from training.writes.diskspace import require_free

log = logging.getLogger(__name__)


def crop_settings(config: Config) -> CropSettings:
    ingest = config.ingest
    return CropSettings(size=ingest.crop_size, edge=ingest.edge, min_area=ingest.min_area, max_area=ingest.max_area,
                        mask_other_cells=ingest.mask_other_cells)


class PartCounts:
    """What one part found: fields read and bad, objects found, cut and skipped per reason."""

    def __init__(self) -> None:
        self.fields = self.fields_without_objects = self.objects = self.cut = 0
        self.skipped: Counter = Counter()
        self.bad: list[dict[str, Any]] = []

    def as_dict(self) -> dict[str, Any]:
        return {"fields": self.fields, "bad_fields": len(self.bad), "fields_without_objects": self.fields_without_objects,
                "objects": self.objects, "cut": self.cut, "skipped": dict(sorted(self.skipped.items()))}


def field_objects(spec: FieldSpec, labels: np.ndarray | None, centres: CentresTable | None, key: str | None) -> Objects:
    if labels is not None:
        return measure_objects(labels)
    return centres.objects_of(key)  # type: ignore[union-attr]


def write_cells(writer: PartWriter, spec: FieldSpec, crops: np.ndarray, objects: Objects) -> None:
    """Append one field's crops, each with the field's metadata and its own."""
    rows = zip(objects.numbers.tolist(), objects.x.tolist(), objects.y.tolist(), objects.area.tolist())
    for crop, (number, x, y, area) in zip(crops, rows):
        own = dict(zip(FIELD_COLUMNS, (spec.row, number, x, y, area)))
        writer.append(crop, f"{spec.name}#{number}", {**spec.metadata, **own})


def ingest_part(config: Config, load: LoadTable, rows: range, folder: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """Cut the cells of the fields `rows` into one part; returns its part.json (with the counts)."""
    settings, channel_axis = crop_settings(config), config.data.channel_axis
    centres = CentresTable(config, load) if config.ingest.centres else None
    keys = centres.field_keys(load) if centres is not None else None
    channels, dtype, objects = probe_format(load, channel_axis)
    crop_bytes = channels * settings.size ** 2 * dtype.itemsize
    require_free(folder.parent, crop_bytes * max(objects, 1) * len(rows), "the ingested crops (as many per field "
                 "as the first one has)")
    writer, counts = PartWriter(folder, channels=channels, dtype=dtype), PartCounts()
    measured = part_measurements(config, folder)
    bar = tqdm(total=len(rows), desc="ingest", unit="field")
    with closing(read_ahead(load, rows, channel_axis)) as fields, bar:
        for index, (spec, found) in zip(rows, fields):
            bar.update()
            counts.fields += 1
            try:
                if isinstance(found, BadField):
                    raise found
                sources, labels = found
                if sum(s.shape[0] for s in sources) != channels:
                    raise BadField(load.name, spec.row, spec.images[0][0], f"{sum(s.shape[0] for s in sources)} "
                                   f"channels, the dataset has {channels} (as the first readable field)")
            except BadField as bad:
                note_bad(config, counts, bad, spec)
                continue
            objects = field_objects(spec, labels, centres, None if keys is None else keys.iloc[index])
            cut = cut_crops(sources, labels, objects, settings)
            write_cells(writer, spec, cut.crops, cut.objects)
            if measured is not None:
                measured.add([column for column, _ in spec.images], sources, labels, objects.numbers,
                              cut.objects.numbers)
            counts.objects += len(objects)
            counts.cut += len(cut.objects)
            counts.skipped.update(cut.skipped)
            counts.fields_without_objects += not len(objects)
            bar.set_postfix(cells=counts.cut, refresh=False)
    extra = {"centres_without_field": centres.unmatched} if centres is not None else {}
    if measured is not None:
        extra["cellprofiler"] = measured.finish(counts.cut)
    return writer.finish(counts=counts.as_dict(), bad=counts.bad, identity=identity, **extra)


def part_measurements(config: Config, folder: Path) -> PartMeasurements | None:
    """The part's CellProfiler measurements under ingest.cellprofiler (measurements.py)."""
    if not config.ingest.cellprofiler:
        return None
    return PartMeasurements(folder, dict(zip(config.data.channel_indices, config.data.channel_names)))


def note_bad(config: Config, counts: PartCounts, bad: BadField, spec: FieldSpec | None) -> None:
    """A bad field: stop under data.on_bad_image=fail, else count and list it."""
    if config.data.on_bad_image == "fail":
        raise UserError(f"{bad}; fix it, or set data.on_bad_image=skip to leave the field out") from None
    counts.bad.append({"row": bad.row, "field": spec.name if spec else f"row {bad.row}", "column": bad.column,
                       "reason": str(bad)})
    log.warning("skipped a bad field of view: %s", bad)


def part_identity(config: Config, load: LoadTable, rows: range) -> dict[str, Any]:
    """What a finished part was made from: the tables (path, size, time), its rows and the settings."""
    tables = [Path(p) for p in (config.ingest.table, config.ingest.centres) if p]
    # the measurements are named after data.channel_names, which name data.channels
    named = {"channels": config.data.channels, "channel_names": list(config.data.channel_names)} \
        if config.ingest.cellprofiler else {}
    return {"tables": [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in tables],
            "n_rows": len(load), "rows": [rows.start, rows.stop], "ingest": config.to_dict()["ingest"],
            "channel_axis": config.data.channel_axis, "on_bad_image": config.data.on_bad_image, **named}


def summarise(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The parts' counts added up, and every bad field."""
    total: Counter = Counter()
    skipped: Counter = Counter()
    for info in infos:
        counts = info["counts"]
        total.update({k: v for k, v in counts.items() if k != "skipped"})
        skipped.update(counts["skipped"])
    summary = {**dict(total), "skipped": dict(sorted(skipped.items())), "skipped_total": sum(skipped.values()),
               "bad": [bad for info in infos for bad in info.get("bad", [])]}
    if infos and "centres_without_field" in infos[0]:
        summary["centres_without_field"] = infos[0]["centres_without_field"]
    return summary


def describe(summary: dict[str, Any]) -> str:
    """One line with every count, as printed at the end of `ingest`."""
    skipped = ", ".join(f"{n:,} {reason}" for reason, n in summary["skipped"].items()) or "none"
    line = (f"{summary.get('fields', 0):,} fields of view ({summary.get('bad_fields', 0):,} bad, "
            f"{summary.get('fields_without_objects', 0):,} without objects), {summary.get('objects', 0):,} objects: "
            f"{summary.get('cut', 0):,} cut, {summary['skipped_total']:,} skipped ({skipped})")
    if summary.get("centres_without_field"):
        line += f"; {summary['centres_without_field']:,} objects of the centres table match no field"
    return line
