"""CellProfiler's per-cell measurements, made at `ingest` (ingest.cellprofiler) and stored beside the
cells; `features` turns them into the "cellprofiler" baseline (training/eval/cellprofiler.py).

What is measured: every object of a field of view, on the whole field, each channel inside the
object's own label mask, by cp_measure (the Carpenter lab's library of CellProfiler's measurements),
each feature named as CellProfiler names it. The columns, in this order:

    AreaShape_<feature>                            MeasureObjectSizeShape: area, perimeter, axes,
                                                   eccentricity, solidity, form factor, radii, moments,
                                                   Zernike shape moments to degree 9, Feret diameters
    Intensity_<feature>_<channel>                  MeasureObjectIntensity: integrated, mean, std, min,
                                                   max, quartiles, MAD, mass displacement; the same of
                                                   the object's edge
    RadialDistribution_<feature>_<channel>_<i>of4  MeasureObjectIntensityDistribution without Zernikes:
                                                   FracAtD, MeanFrac, RadialCV in 4 scaled rings
    Texture_<feature>_<channel>_3_<direction>_256  MeasureTexture: 13 Haralick features at scale 3, in 4
                                                   directions, 256 grey levels (CellProfiler's defaults)

Left out: where an object lies in its field (AreaShape_Center_X/Y, _BoundingBoxMinimum/Maximum_X/Y,
Location_*), which says nothing of the cell; MeasureGranularity (a third of the cost of all the
above per channel) and MeasureColocalization. Intensities are CellProfiler's: an integer image
divided by its type's maximum (0..1), a float image as it is (texture's quantisation clips it to
0..1). Texture uses cp_measure's numba kernel, which agrees with mahotas' (its default) to 1e-5
relative and takes 12 ms a field where mahotas takes up to 2 s at 256 grey levels; it is compiled once
and cached by numba. A channel's name: data.channel_names where it names the channel, else its
LoadData image column's (FileName_DNA: DNA) when that column holds one channel, else ch<index>.
A measurement CellProfiler leaves undefined (the texture of an object smaller than its scale, a
ring without pixels) is stored as NaN, as is anything else not finite.

Cost, one core of the 2-core machine, on the synthetic screen (96 fields of 256 x 256 px, 5 channels,
1,920 objects measured, 1,723 cut): 128 ms a field, 7 ms a cut cell, of which the radial
distribution is 89 ms (cp_measure computes its geometry again for every channel), intensity 12,
texture 9, shape 18; docs/training.md ("CellProfiler's measurements") has the whole step's times.

Storage, beside the per-cell table (names from training/rundir/layout.py):

    <packed>/cellprofiler.npy    (cells, features) float32; row i is the cell of row i of cells.arrow
    <packed>/cellprofiler.json   format, n_cells, features (names, in column order), channels (each
                                 feature's channel index; null for shape), channel_names, bytes and
                                 crc32 of the .npy, the settings, seconds spent measuring

Each ingest part appends its cells' rows to a raw float32 file (PART_FILE) as it cuts them, so that
memory holds one field's rows, and records it in its part.json; the merge writes the .npy from the
parts' files in part order, as it concatenates their tables, inside the merged folder before that
folder is swapped into place: the measurements and the table are always of the same cells.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from training.data.store.format import PART_FILE as PART_INDEX
from training.errors import DamagedFileError, MissingInputError, UserError
from training.rundir import RunLayout
from training.rundir.integrity import (
    Crc32Writer,
    check_crc32,
    check_present,
    check_size,
    crc32_hex,
    npy_layout,
    parse_json,
    require_keys,
    rerun,
)
from training.writes.atomic import write_json_atomic

FORMAT = "scdino-cellprofiler-v1"
PART_FILE = "cellprofiler.f32"
"""A part's measurements: raw float32 rows, appended field by field (part.json has the count)."""
TEXTURE_SCALE, GREY_LEVELS, RADIAL_BINS, ZERNIKE_DEGREE = 3, 256, 4, 9
SETTINGS = {"texture_scale": TEXTURE_SCALE, "grey_levels": GREY_LEVELS, "radial_bins": RADIAL_BINS,
            "zernike_degree": ZERNIKE_DEGREE}
SHAPE_MODULES = ("sizeshape", "zernike", "feret")
"""cp_measure's measurements of the mask alone (MeasureObjectSizeShape)."""
CHANNEL_MODULES = ("intensity", "radial_distribution", "texture")
"""cp_measure's measurements of each channel inside the mask, in column order."""
POSITION = frozenset({"Center_X", "Center_Y", "BoundingBoxMinimum_X", "BoundingBoxMaximum_X", "BoundingBoxMinimum_Y",
                      "BoundingBoxMaximum_Y"})
"""Shape features that say where the object lies in the field (Intensity's Location_* likewise)."""
REMEDY = rerun("ingest")
COPY_CHUNK = 1 << 24
"""Bytes copied at a time from a part's measurements into the merged file."""
INDEX_KEYS = ("format", "n_cells", "features", "channels", "bytes", "crc32")


def measurement_files(packed: Path) -> tuple[Path, Path]:
    """The measurements and their index beside the packed dataset in `packed` (a run's packed
    folder, data.source's, or the folder a merge is written to)."""
    layout = RunLayout(Path(packed).parent, packed=Path(packed))
    return layout.cellprofiler, layout.cellprofiler_index


def measurement_functions() -> dict[str, Callable]:
    """cp_measure's per-object functions (labels 1..N relabelled from any labels), texture from its
    numba backend."""
    import cp_measure
    from cp_measure.bulk import get_core_measurements

    functions = get_core_measurements()
    previous = getattr(cp_measure, "_ACCELERATOR", None)
    cp_measure.set_accelerator("numba")
    try:
        functions["texture"] = get_core_measurements()["texture"]
    except (RuntimeError, ImportError) as exc:
        raise UserError(f"ingest.cellprofiler measures texture with cp_measure's numba backend, which failed to "
                        f"load ({exc}): install numba (pip install 'cp-measure[numba]')") from None
    finally:
        cp_measure.set_accelerator(previous)
    return functions


def channel_names(configured: dict[int, str], columns: list[tuple[str, int]]) -> list[str]:
    """Each channel's name from data.channel_names (`configured`: channel index -> name), else its
    image column's (`columns`: (LoadData column, channels it holds)) when the column holds one
    channel, else ch<index>; a name given twice gets its channel index appended."""
    names = []
    for column, planes in columns:
        for _ in range(planes):
            index = len(names)
            own = column[len("FileName_"):] if column.startswith("FileName_") else column
            names.append(configured.get(index) or (own if planes == 1 else f"ch{index}"))
    return [f"{name}{i}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def cellprofiler_name(module: str, key: str, channel: str) -> str:
    """CellProfiler's name of cp_measure's `key` of `module` measured on `channel`."""
    if module == "intensity":
        return f"{key}_{channel}"
    if module == "radial_distribution":
        head, _, rings = key.rpartition("_")
        return f"{head}_{channel}_{rings}"
    feature, _, scale = key.partition("_")
    return f"Texture_{feature}_{channel}_{scale}"


def intensities(plane: np.ndarray) -> np.ndarray:
    """A plane as CellProfiler reads it: integers over their type's maximum, floats as they are."""
    if plane.dtype.kind in "iu":
        return plane.astype(np.float64) / np.iinfo(plane.dtype).max
    return plane.astype(np.float64)


class FieldMeasurer:
    """CellProfiler's measurements of the objects of one field after another; the features' names
    and channels are fixed by the first field."""

    def __init__(self, names: list[str]) -> None:
        self.channel_names = names
        self.functions = measurement_functions()
        self.names: list[str] | None = None
        self.channels: list[int | None] = []

    def measure(self, pixels: list[np.ndarray], labels: np.ndarray, present: np.ndarray,
                chosen: np.ndarray) -> np.ndarray:
        """(len(chosen), features) float32 of the field whose channels are `pixels` (CellProfiler's
        intensities) and label mask `labels`: the objects `chosen` among the labels `present` (every
        label of `labels`, ascending, as cp_measure numbers its rows), non-finite values as NaN."""
        found = self._measure_all(pixels, labels)
        if self.names is None:
            self.names, self.channels = list(found), [channel for _, channel in found.values()]
        elif list(found) != self.names:
            raise RuntimeError("cp_measure returned other features for this field than for the first one")
        rows = np.searchsorted(present, chosen)
        table = np.empty((len(chosen), len(found)), np.float32)
        for column, (values, _) in enumerate(found.values()):
            table[:, column] = np.asarray(values, np.float64)[rows]
        table[~np.isfinite(table)] = np.nan
        return table

    def _measure_all(self, pixels: list[np.ndarray], labels: np.ndarray) -> dict[str, tuple[np.ndarray, int | None]]:
        found: dict[str, tuple[np.ndarray, int | None]] = {}
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # an empty ring or one-pixel object: NaN, as intended
            for module in SHAPE_MODULES:
                options = {"zernike_numbers": ZERNIKE_DEGREE} if module == "zernike" else {}
                for key, values in self.functions[module](labels, None, **options).items():
                    if key not in POSITION:
                        found[f"AreaShape_{key}"] = (values, None)
            options = {"intensity": {}, "radial_distribution": {"bin_count": RADIAL_BINS},
                       "texture": {"scale": TEXTURE_SCALE, "gray_levels": GREY_LEVELS}}
            for module in CHANNEL_MODULES:
                for channel, (name, plane) in enumerate(zip(self.channel_names, pixels)):
                    plane = np.clip(plane, 0, 1) if module == "texture" else plane
                    for key, values in self.functions[module](labels, plane, **options[module]).items():
                        if not key.startswith("Location_"):
                            found[cellprofiler_name(module, key, name)] = (values, channel)
        return found


class PartMeasurements:
    """One ingest part's measurements: rows appended to PART_FILE field by field, with their CRC-32."""

    def __init__(self, folder: Path, configured_names: dict[int, str]) -> None:
        self.path, self.configured = Path(folder) / PART_FILE, configured_names
        self.handle = open(self.path, "wb")
        self.file = Crc32Writer(self.handle)
        self.measurer: FieldMeasurer | None = None
        self.rows, self.seconds = 0, 0.0

    def add(self, columns: list[str], sources: list[np.ndarray], labels: np.ndarray, present: np.ndarray,
            chosen: np.ndarray) -> None:
        """Measure the objects `chosen` of a field whose images are `sources` (one (C_i, H, W) array
        per LoadData column of `columns`) and label mask `labels`; `present` is every label, ascending."""
        if not len(chosen):
            return
        start = time.perf_counter()
        if self.measurer is None:
            self.measurer = FieldMeasurer(channel_names(self.configured, [(c, len(s)) for c, s in zip(columns, sources)]))
        pixels = [intensities(plane) for source in sources for plane in source]
        rows = self.measurer.measure(pixels, labels, present, chosen)
        self.file.write(np.ascontiguousarray(rows))
        self.rows += len(rows)
        self.seconds += time.perf_counter() - start

    def finish(self, cells: int) -> dict[str, Any]:
        """Close the file; what part.json records of it (its rows must be the part's `cells`)."""
        self.handle.close()
        if self.rows != cells:
            raise RuntimeError(f"{self.path}: {self.rows} rows of measurements for {cells} cells")
        measurer = self.measurer
        return {"file": PART_FILE, "rows": self.rows, "bytes": self.file.size, "crc32": crc32_hex(self.file.crc),
                "seconds": round(self.seconds, 3), "features": measurer.names if measurer else None,
                "channels": measurer.channels if measurer else None,
                "channel_names": measurer.channel_names if measurer else None}


def part_entries(parts: list[Path], infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each part's measurements as its part.json records them, checked against its cells and file."""
    entries = []
    for part, info in zip(parts, infos):
        entry = info.get("cellprofiler")
        if entry is None:
            raise UserError(f"{part} was cut without ingest.cellprofiler: run its task again with it set "
                            "(--part K --parts N), then merge")
        remedy = f"delete {part} and run its task again (--part K --parts N), then merge"
        if not (part / entry["file"]).is_file():
            raise DamagedFileError(part / entry["file"], f"is missing ({PART_INDEX} is there)", remedy)
        check_size(part / entry["file"], entry["bytes"], PART_INDEX, remedy)
        if entry["rows"] != info["n_cells"]:
            raise DamagedFileError(part / PART_INDEX, f"records {entry['rows']} rows of measurements for "
                                   f"{info['n_cells']} cells", remedy)
        entries.append({**entry, "path": part / entry["file"]})
    return entries


def merge_measurements(parts: list[Path], infos: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    """Write the measurements of the finished `parts` (with their part.json `infos`), in order, into
    the packed folder `folder`; returns their index."""
    entries = part_entries(parts, infos)
    measured = [entry for entry in entries if entry["features"]]
    if not measured:
        raise UserError("no cell was measured: no part cut any cell")
    first = measured[0]
    for entry in measured[1:]:
        if entry["features"] != first["features"]:
            raise UserError(f"{entry['path']} and {first['path']} hold different features (the parts disagree on "
                            "the channels): run every part's task again, then merge")
    n_cells, width = sum(entry["rows"] for entry in entries), len(first["features"])
    array, index = measurement_files(folder)
    with open(array, "wb") as handle:
        out = Crc32Writer(handle)
        np.lib.format.write_array_header_1_0(out, {"descr": np.dtype(np.float32).str, "fortran_order": False,
                                                   "shape": (n_cells, width)})
        for entry in entries:
            with open(entry["path"], "rb") as part:
                while chunk := part.read(COPY_CHUNK):
                    out.write(chunk)
    payload = {"format": FORMAT, "n_cells": n_cells, "features": first["features"], "channels": first["channels"],
               "channel_names": first["channel_names"], "bytes": out.size, "crc32": crc32_hex(out.crc),
               "settings": SETTINGS, "cp_measure": _cp_measure_version(),
               "seconds": round(sum(entry["seconds"] for entry in entries), 3)}
    write_json_atomic(index, payload)
    return payload


def _cp_measure_version() -> str:
    from importlib.metadata import version

    return version("cp-measure")


@dataclass(frozen=True)
class Measurements:
    """The measurements of a packed dataset: `values` (cells, features) float32, memory-mapped."""

    values: np.ndarray
    index: dict[str, Any]
    path: Path

    @property
    def names(self) -> list[str]:
        return list(self.index["features"])

    @property
    def channels(self) -> list[int | None]:
        return list(self.index["channels"])

    def verify(self) -> None:
        """Every byte against the CRC-32 of the index (a full read)."""
        check_crc32(self.path, self.index["crc32"], measurement_files(self.path.parent)[1].name, REMEDY)


def read_measurements_index(packed: Path, *, required: bool) -> dict[str, Any] | None:
    """The index of the measurements beside the packed dataset in `packed`; None when it has none
    (a MissingInputError when `required`: ingest.cellprofiler is set); DamagedFileError when one of
    the two files is missing or the index is damaged."""
    array, index = measurement_files(packed)
    if not array.exists() and not index.exists():
        if required:
            raise MissingInputError("CellProfiler's measurements (ingest.cellprofiler)", array, "ingest")
        return None
    for file, other in ((array, index), (index, array)):
        check_present(file, REMEDY, other.name)
    payload = require_keys(parse_json(index, REMEDY), INDEX_KEYS, index, REMEDY)
    if len(payload["features"]) != len(payload["channels"]):
        raise DamagedFileError(index, f"names {len(payload['features'])} features and the channels of "
                               f"{len(payload['channels'])}", REMEDY)
    return payload


def open_measurements(packed: Path, n_cells: int, *, required: bool = True) -> Measurements | None:
    """The measurements beside the packed dataset in `packed` of `n_cells` cells, memory-mapped, after
    checking their files' sizes against each other and the table (DamagedFileError names the file
    at fault); None when there are none and they are not `required`."""
    index = read_measurements_index(packed, required=required)
    if index is None:
        return None
    array, index_path = measurement_files(packed)
    shape, dtype, size = npy_layout(array, REMEDY)
    check_size(array, size, "its header", REMEDY)
    check_size(array, index["bytes"], index_path.name, REMEDY)
    expected = (int(index["n_cells"]), len(index["features"]))
    if tuple(shape) != expected or dtype != np.float32:
        raise DamagedFileError(array, f"holds {dtype} {tuple(shape)}, {index_path.name} records float32 {expected}",
                               REMEDY)
    if expected[0] != n_cells:
        raise DamagedFileError(array, f"holds {expected[0]} cells, the per-cell table {n_cells}", REMEDY)
    return Measurements(np.load(array, mmap_mode="r"), index, array)
