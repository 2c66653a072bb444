"""The `ingest:` section: a screen's LoadData table, fields of view and masks cut into one crop per cell."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from training.config.validation import ConfigError


@dataclass(frozen=True)
class IngestConfig:
    """`ingest`: single cells cut out of whole fields of view, instead of `prepare`'s folder of crops."""

    table: str = ""
    """The load table (CSV or Parquet), one row per field of view in CellProfiler's LoadData naming:
    FileName_<Channel> + PathName_<Channel> per image file (PathName_ relative to the table's folder
    or absolute), ObjectsFileName_<Objects> + ObjectsPathName_<Objects> for a label mask; every other
    column is metadata carried to each cell. Set, `slurm/submit_pipeline.sh` starts the chain with
    `ingest` instead of `prepare`. Empty: no ingest (class folders, `prepare`)."""
    path_map: tuple[tuple[str, str], ...] = ()
    """Pairs [from, to]: a PathName_ (or absolute FileName_) that starts with `from` is read from `to`
    instead, the longest matching `from` winning; a prefix ends at a "/" (s3://b/x maps s3://b/x/y,
    never s3://b/xy). For tables whose paths point elsewhere: JUMP's s3:// folders
    ([s3://cellpainting-gallery/, /fsx/data/mirror/]) or another machine's absolute ones. Applied
    before relative paths are resolved from the table's folder. Empty: paths as written; a table that
    `upload-data --table` wrote has relative paths and needs none."""
    channels: tuple[str, ...] = ()
    """The image columns' names (<Channel> of FileName_<Channel>) in the order their channels are
    stacked, e.g. [DNA, ER, RNA, AGP, Mito]; a file holding several channels gives them all in
    place. Empty: every FileName_ column in the table's order (one multi-channel file per row is then
    its single FileName_ column)."""
    objects: str = ""
    """The LoadData objects name whose label masks segment the cells (ObjectsFileName_<objects>),
    e.g. Cells. Empty: the table's one ObjectsFileName_ column, if it has exactly one."""
    centres: str = ""
    """A per-object table (CSV or Parquet) of object centres instead of label masks, in
    CellProfiler's naming: Location_Center_X/Y or AreaShape_Center_X/Y (x the column, y the row,
    0-based), optionally ObjectNumber and AreaShape_Area; linked to the fields by ImageNumber, else
    by the Metadata_ columns both tables share. Without masks there is no area unless the table has
    AreaShape_Area, and no other cell to mask out."""
    crop_size: int = 0
    """Side in pixels of the square crop cut around each object's centroid. 0: `ingest` stops and
    proposes one from the objects' sizes (also `ingest --propose-crop-size`)."""
    edge: Literal["skip", "pad"] = "skip"
    """An object whose crop would leave the field: "skip" it (counted as window_leaves_field), or
    "pad" the part outside with zeros, so that cells at the border are kept, each less complete."""
    min_area: int = 0
    """Objects of fewer pixels are skipped and counted (debris, fragments); 0: no lower bound."""
    max_area: int = 0
    """Objects of more pixels are skipped and counted (clumps, segmentation failures); 0: no upper bound."""
    mask_other_cells: bool = False
    """Set the pixels of every other object in a crop to 0, so that a crop shows one cell and the
    background around it; needs label masks."""
    cellprofiler: bool = False
    """Also measure every cut cell as CellProfiler does (the cp_measure library: intensity, texture,
    size and shape, ... of each channel inside the cell's own mask), stored beside the cells, so that
    `features` evaluates them as the "cellprofiler" baseline next to raw pixels and random init: the
    features a lab already trusts. Needs label masks (ingest.objects), not a table of centres."""

    def __post_init__(self) -> None:
        check_path_map(self.path_map)
        if self.crop_size < 0 or self.crop_size == 1:
            raise ConfigError(f"ingest.crop_size must be >= 2 pixels (0: propose one), got {self.crop_size}")
        if self.min_area < 0 or self.max_area < 0:
            raise ConfigError(f"ingest.min_area and ingest.max_area must be >= 0 pixels (0: no bound), got "
                              f"{self.min_area} and {self.max_area}")
        if self.max_area and self.min_area > self.max_area:
            raise ConfigError(f"ingest.min_area ({self.min_area}) is above ingest.max_area ({self.max_area})")
        if len(set(self.channels)) != len(self.channels) or not all(self.channels):
            raise ConfigError(f"ingest.channels must name distinct image columns, got {list(self.channels)}")
        if self.objects and self.centres:
            raise ConfigError("ingest.objects (label masks) and ingest.centres (a table of centres) are two ways to "
                              f"find the cells: set one, got {self.objects!r} and {self.centres!r}")
        if self.centres and self.cellprofiler:
            raise ConfigError("ingest.cellprofiler measures each cell inside its label mask, and ingest.centres gives "
                              "only centres: set cellprofiler: false, or give label masks (ingest.objects)")
        if self.centres and self.mask_other_cells:
            raise ConfigError("ingest.mask_other_cells needs label masks (ingest.objects), and ingest.centres gives "
                              "only centres: set mask_other_cells: false")



URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A location that names a server, not a path of this machine (s3://, gs://, https://)."""


def check_path_map(entries: tuple[tuple[str, str], ...]) -> None:
    """Each pair maps a prefix onto a local folder, and no prefix is given twice."""
    seen: set[str] = set()
    for i, (source, target) in enumerate(entries):
        key = f"ingest.path_map[{i}]"
        if not source.strip("/") or not target.strip():
            raise ConfigError(f"{key} must be [from, to], two non-empty prefixes (e.g. [s3://cellpainting-gallery/, "
                              f"/fsx/data/jump/]), got {[source, target]}")
        if URL_SCHEME.match(target):
            raise ConfigError(f"{key} maps {source} onto {target}, a URL: map it onto the folder of this machine "
                              "that holds the files (e.g. /fsx/data/jump/)")
        if source.rstrip("/") in seen:
            raise ConfigError(f"{key}: {source} is mapped twice: keep one entry for it")
        seen.add(source.rstrip("/"))
