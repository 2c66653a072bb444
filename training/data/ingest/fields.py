"""Reading a field of view of `ingest`: its images (TIFF, OME-TIFF or OME-Zarr, one per channel or
one multi-channel image) as (C, H, W) and its label mask, each problem a BadField naming the load
table's row, column and file; a few fields read ahead by threads (read_ahead)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tifffile

from training.data.ingest.table import BadField, FieldSpec, LoadTable
from training.data.read_ahead import read_in_order
from training.data.tiff import BadImage, missing_codec, to_channels_first
from training.errors import UserError

READ_THREADS, READ_AHEAD = 2, 4
"""Threads reading fields, and how many fields may wait in memory ahead of the cropper."""
PROBE_ROWS = 8
"""How many leading rows may be tried to learn the channel count and pixel type (every part tries the same)."""


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
