"""`ingest`: cut one crop per cell out of whole fields of view, straight into a packed dataset.

For each row of the load table (training/data/ingest_table.py): read its images (TIFF, OME-TIFF or
OME-Zarr, one per channel or one multi-channel image) and its label mask, or its objects from a
table of centres; measure the objects and cut a crop centred on each (training/data/ingest_crops.py);
append the crops to the part's pixel files with one row each in the per-cell table:

    path                   "<field>#<object number>", <field> the first image's path relative to the table
    Metadata_FieldOfView   the field's row in the load table (1-based, CellProfiler's ImageNumber)
    Metadata_ObjectNumber  the object's label in the mask (or ObjectNumber of the centres table)
    Metadata_Center_X, _Y  its centroid, x the column and y the row, 0-based (CellProfiler's Location_Center_X/Y)
    Metadata_Area          its area in pixels (-1 when a table of centres gives none)
    Metadata_<column>      every other column of the load table, values as written

Under ingest.cellprofiler each cut cell is also measured as CellProfiler measures it, in its field,
and the part keeps the measurements row by row with the table (training/data/cellprofiler.py).

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
from typing import Any, Iterator

import numpy as np
import tifffile
from tqdm import tqdm

from training.config import Config
from training.data.cellprofiler import PartMeasurements
from training.data.ingest_crops import CropSettings, Objects, cut_crops, measure_objects
from training.data.ingest_table import FIELD_COLUMNS, BadField, CentresTable, FieldSpec, LoadTable
from training.data.read_ahead import read_in_order
from training.data.store.write import PartWriter
from training.data.tiff import BadImage, missing_codec, to_channels_first
from training.diskspace import require_free
from training.errors import UserError

log = logging.getLogger(__name__)

READ_THREADS, READ_AHEAD = 2, 4
"""Threads reading fields, and how many fields may wait in memory ahead of the cropper."""
PROBE_ROWS = 8
"""How many leading rows may be tried to learn the channel count and pixel type (every part tries the same)."""


def crop_settings(config: Config) -> CropSettings:
    ingest = config.ingest
    return CropSettings(size=ingest.crop_size, edge=ingest.edge, min_area=ingest.min_area, max_area=ingest.max_area,
                        mask_other_cells=ingest.mask_other_cells)


def read_planes(path: Path, table: str, row: int, column: str, channel_axis: str) -> np.ndarray:
    """One image file as (C, H, W): an OME-TIFF's channel axis from its metadata, else
    data.channel_axis; a folder is read as an OME-Zarr image (read_ngff)."""
    if path.is_dir() and path.suffix.lower() in (".tif", ".tiff"):
        raise BadField(table, row, column, f"{path} is a folder where a TIFF file belongs")
    if path.is_dir():
        return read_ngff(path, lambda problem: BadField(table, row, column, f"{path} {problem}"))
    if not path.is_file():
        raise BadField(table, row, column, f"no such file {path}")
    try:
        with tifffile.TiffFile(path) as tif:
            series = tif.series[0]
            axes, array = series.axes, series.asarray()
    except Exception as exc:  # tifffile raises many types for damaged files
        missing = missing_codec(path, exc)
        if missing:
            raise UserError(missing) from None
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise BadField(table, row, column, f"{path} is not a readable TIFF ({reason})") from None
    return channels_first(array, axes, channel_axis, lambda problem: BadField(table, row, column, f"{path} {problem}"))


def read_ngff(path: Path, bad) -> np.ndarray:
    """The full-resolution level of an OME-Zarr (NGFF 0.4 or 0.5) image as (C, H, W), read with
    zarr-python: the first multiscale's first dataset, its axes named by the multiscale."""
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r")
        attrs = dict(group.attrs)
        multiscale = attrs.get("ome", attrs)["multiscales"][0]
        names = [axis["name"] if isinstance(axis, dict) else axis for axis in multiscale.get("axes", [])]
        array = np.asarray(group[multiscale["datasets"][0]["path"]][...])
    except Exception as exc:  # zarr and its codecs raise many types for what is not an NGFF image
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise bad(f"is not a readable OME-Zarr image ({type(exc).__name__}: {reason})") from None
    return channels_first(array, "".join(str(n)[:1].upper() for n in names), "first", bad)


def channels_first(array: np.ndarray, axes: str, channel_axis: str, bad) -> np.ndarray:
    """(C, H, W) from a TIFF series' array and its axes: the channel axis the file names (C, or S for
    samples such as RGB), else data.channel_axis's rule; axes of length 1 are dropped first."""
    kept = "".join(axis for axis, n in zip(axes, array.shape) if n > 1) if len(axes) == array.ndim else ""
    array = array.reshape([n for n in array.shape if n > 1] or [1, 1])
    if array.ndim == 2:
        return array[None]
    if array.ndim == 3:
        named = [kept.index(a) for a in "CS" if a in kept]
        if named:
            return np.moveaxis(array, named[0], 0)
        try:
            return to_channels_first(array, channel_axis, "")
        except BadImage as found:
            raise bad(found.reason) from None
    raise bad(f"has shape {array.shape} (axes {kept or '?'}): expected one plane (H, W) or channels and a plane "
              "(C, H, W or H, W, C)")


def read_labels(path: Path, table: str, row: int, column: str, shape: tuple[int, int]) -> np.ndarray:
    """A label mask (H, W) of non-negative integers, of the field's shape."""
    labels = read_planes(path, table, row, column, "first")
    if labels.shape[0] != 1:
        raise BadField(table, row, column, f"{path} holds {labels.shape[0]} planes: a label mask is one plane")
    labels = labels[0]
    if labels.dtype.kind == "f":
        if not (np.isfinite(labels).all() and (labels == np.round(labels)).all()):
            raise BadField(table, row, column, f"{path} is not a label mask (non-integer values)")
        labels = labels.astype(np.int64)
    if labels.dtype.kind not in "iu" or (labels.dtype.kind == "i" and labels.size and labels.min() < 0):
        raise BadField(table, row, column, f"{path} is not a label mask ({labels.dtype}, 0 background, 1..n objects)")
    if labels.shape != shape:
        raise BadField(table, row, column, f"{path} is {labels.shape[0]} x {labels.shape[1]}, the field's images "
                                           f"{shape[0]} x {shape[1]}")
    return labels


def read_field(load: LoadTable, spec: FieldSpec, channel_axis: str) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The field's images, one (C_i, H, W) array per image column, and its label mask (or None)."""
    sources, shape = [], None
    for column, path in spec.images:
        planes = read_planes(path, load.name, spec.row, column, channel_axis)
        if shape is not None and planes.shape[-2:] != shape:
            raise BadField(load.name, spec.row, column, f"{path} is {planes.shape[-2]} x {planes.shape[-1]}, "
                                                        f"{spec.images[0][0]} {shape[0]} x {shape[1]}")
        shape = planes.shape[-2:]
        sources.append(planes)
    if spec.mask is None:
        return sources, None
    column, path = spec.mask
    return sources, read_labels(path, load.name, spec.row, column, shape)


def first_readable_field(load: LoadTable, channel_axis: str) -> tuple[FieldSpec, list[np.ndarray], np.ndarray | None] | None:
    """The first field among the leading PROBE_ROWS rows that can be read (every part tries the same
    rows), with its images and mask; None when none can."""
    for index in range(min(PROBE_ROWS, len(load))):
        try:
            spec = load.field(index)
            sources, labels = read_field(load, spec, channel_axis)
        except BadField:
            continue
        return spec, sources, labels
    return None


def probe_format(load: LoadTable, channel_axis: str) -> tuple[int, np.dtype, int]:
    """The channel count and pixel type of the first readable field among the leading rows, and how
    many objects its mask holds (0 without masks)."""
    found = first_readable_field(load, channel_axis)
    if found is None:
        return 0, np.dtype(np.uint16), 0
    _, sources, labels = found
    objects = len(np.unique(labels)) - 1 if labels is not None else 0
    return sum(s.shape[0] for s in sources), np.result_type(*sources), objects


def check_crop_size(config: Config, load: LoadTable) -> None:
    """Refuse, before any cell is cut, a crop no model or field can take: smaller than one patch of
    the model (model.patch_size), or, with ingest.edge=skip, larger than the fields of view (the
    first readable one's size), where every object would be skipped."""
    size, patch = config.ingest.crop_size, config.model.patch_size
    if size < patch:
        raise UserError(f"ingest.crop_size={size} px is smaller than one patch of the model (model.patch_size="
                        f"{patch} px), the smallest piece of an image the ViT reads: set ingest.crop_size to {patch} "
                        "px or more (`ingest --propose-crop-size` proposes one from the cells' sizes)")
    found = first_readable_field(load, config.data.channel_axis)
    if found is None or config.ingest.edge != "skip":
        return
    spec, sources, _ = found
    height, width = sources[0].shape[-2:]
    if size > min(height, width):
        raise UserError(f"ingest.crop_size={size} px is larger than the fields of view ({load.name} row {spec.row}: "
                        f"{height} x {width} px), so no cell's window fits in its field (ingest.edge=skip): set "
                        f"ingest.crop_size to at most {min(height, width)} (`ingest --propose-crop-size` proposes one "
                        "from the cells' sizes), or ingest.edge=pad")


def read_ahead(load: LoadTable, rows: range, channel_axis: str) -> Iterator[tuple[FieldSpec | None, Any]]:
    """(spec, (sources, labels)) or (spec or None, BadField) per row, in order, read by a few threads;
    at most READ_AHEAD fields wait in memory, and closing the generator cancels the reads not begun."""
    def read(index: int) -> tuple[FieldSpec | None, Any]:
        spec = None
        try:
            spec = load.field(index)
            return spec, read_field(load, spec, channel_axis)
        except BadField as bad:
            return spec, bad

    return read_in_order(read, rows, threads=READ_THREADS, ahead=READ_AHEAD)


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
    """The part's CellProfiler measurements under ingest.cellprofiler (training/data/cellprofiler.py)."""
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



PROPOSAL_FIELDS = 16
"""How many leading readable fields the crop-size proposal measures."""


def propose(config: Config, load: LoadTable) -> dict[str, Any]:
    """A crop size from the objects of the first PROPOSAL_FIELDS readable fields (ingest_crops.propose_crop_size);
    with a table of centres, from its AreaShape_Area (as discs), which it then needs."""
    from training.data.ingest_crops import object_extents, propose_crop_size

    areas, extents, read = [], [], 0
    centres = CentresTable(config, load) if config.ingest.centres else None
    if centres is not None:
        known = centres.area[centres.area > 0]
        if not len(known):
            raise UserError(f"ingest.centres={centres.path} has no AreaShape_Area column, so the objects' sizes are "
                            "unknown: set ingest.crop_size yourself (a little more than the largest cells' diameter)")
        return {**propose_crop_size(known, np.sqrt(known / np.pi)), "from": f"AreaShape_Area of {centres.path.name}"}
    for index in range(len(load)):
        try:
            _, labels = read_field(load, load.field(index), config.data.channel_axis)
        except BadField:
            continue
        objects = measure_objects(labels)
        areas.append(objects.area)
        extents.append(object_extents(labels, objects))
        read += 1
        if read == PROPOSAL_FIELDS:
            break
    areas_all = np.concatenate(areas) if areas else np.zeros(0)
    return {**propose_crop_size(areas_all, np.concatenate(extents) if extents else np.zeros(0)),
            "from": f"the label masks of {read} field(s)"}
