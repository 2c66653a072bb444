"""Per-well profiles: each well's cells grouped without a Python object per cell, the median (or
mean: eval.profile_aggregation) of their features, the metadata every cell of a well shares, and
which wells are controls, gathered for a set of cells in ProfiledWells (their normalisation on the
controls: training/eval/profiles/normalization.py).

Grouping sorts one integer key per cell (plate code x wells + well code): 10^7 cells cost an 80 MB
index, not 10^7 tuples. Profiles are taken a block of wells at a time (at most BLOCK_CELLS cells
gathered from the memory-mapped features at once), so memory stays bounded at any size.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from training.config import Config
from training.data.store.cells import CLASS_COLUMN, METADATA_PREFIX, CellTable
from training.errors import UserError
from training.eval.profiles.normalization import WellContext

log = logging.getLogger(__name__)

DEFAULT_PLATE, DEFAULT_WELL = "Metadata_Plate", "Metadata_Well"
OBJECT_COUNT = "Metadata_Object_Count"
"""How many cells a per-well profile aggregates (pycytominer's aggregate names it so)."""
BLOCK_CELLS = 1 << 16
"""Cells gathered at a time for the profiles: 2^16 x 384 float32 features are 100 MB."""


@dataclass(frozen=True)
class Wells:
    """Cells grouped by well: the cells of well w are `order[starts[w]:starts[w + 1]]` (positions
    in the cell list given to `group_wells`, ascending within a well); wells in plate, well order."""

    order: np.ndarray
    starts: np.ndarray
    left_out: int
    """Cells without a plate or well value, in no well."""

    @property
    def count(self) -> int:
        return len(self.starts) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.starts)

    @property
    def first(self) -> np.ndarray:
        """The position of each well's first cell."""
        return self.order[self.starts[:-1]]


def group_wells(plates: np.ndarray, wells: np.ndarray) -> Wells:
    """Group cells by (plate code, well code); a negative code (no value) leaves the cell out. Cells
    stored well by well, as a screen's table lists them, need no sort: the key and the order are then
    all that is held per cell (16 bytes, where the sort held 56)."""
    plates, wells = np.asarray(plates), np.asarray(wells)
    key = plates.astype(np.int64)
    key *= int(wells.max(initial=0)) + 1
    key += wells
    valid = (plates >= 0) & (wells >= 0)
    kept = None if valid.all() else np.flatnonzero(valid)
    del valid
    if kept is not None:
        key = key[kept]
    if len(key) > 1 and not (key[1:] >= key[:-1]).all():
        sort = np.argsort(key, kind="stable")
        order, key = (sort if kept is None else kept[sort]), key[sort]
    else:
        order = np.arange(len(key), dtype=np.int64) if kept is None else kept
    starts = np.concatenate([[0], np.flatnonzero(key[1:] != key[:-1]) + 1, [len(order)]]) if len(order) else np.zeros(1)
    return Wells(order=order, starts=starts.astype(np.int64), left_out=len(plates) - len(order))


def well_aggregates(features: np.ndarray, wells: Wells, how: str = "median",
                    block_cells: int = BLOCK_CELLS) -> np.ndarray:
    """(wells, D) float32: the median or mean (`how`) of each well's feature rows (`features` may be a
    memory map: at most `block_cells` rows, or one well's, are read at once, in ascending row order)."""
    if how not in AGGREGATIONS:
        raise ValueError(f"unknown well aggregation {how!r}: one of {tuple(AGGREGATIONS)}")
    reduce = AGGREGATIONS[how]
    out = np.empty((wells.count, features.shape[1]), np.float32)
    first = 0
    while first < wells.count:
        last = int(np.searchsorted(wells.starts, wells.starts[first] + block_cells, side="right")) - 1
        last = min(max(last, first + 1), wells.count)
        begin = wells.starts[first]
        rows = wells.order[begin:wells.starts[last]]
        if rows[-1] - rows[0] == len(rows) - 1 and (rows[1:] > rows[:-1]).all():  # stored well by well: one slice
            block = np.array(features[rows[0]:rows[-1] + 1], np.float32)
        else:
            ascending = np.argsort(rows, kind="stable")
            block = np.empty((len(rows), features.shape[1]), np.float32)
            block[ascending] = features[rows[ascending]]
        out[first:last] = reduce(block, wells.starts[first:last + 1] - begin)
        first = last
    return out


def _block_means(block: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Means of the row segments `starts[i]:starts[i + 1]` of `block` (every segment non-empty), summed
    in float64."""
    sums = np.add.reduceat(block, starts[:-1], axis=0, dtype=np.float64)
    return (sums / np.diff(starts)[:, None]).astype(np.float32)


def _block_medians(block: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Medians of the row segments `starts[i]:starts[i + 1]` of `block` (the mean of the two middle
    values for an even count, as np.median), one sort per distinct segment length (wells of a plate
    mostly hold similar numbers of cells)."""
    sizes = np.diff(starts)
    out = np.empty((len(sizes), block.shape[1]), np.float32)
    for size in np.unique(sizes):
        chosen = np.flatnonzero(sizes == size)
        ordered = np.sort(block[starts[chosen, None] + np.arange(size)], axis=1)  # (wells, size, D)
        out[chosen] = (ordered[:, (size - 1) // 2] + ordered[:, size // 2]) / 2  # np.median's, 3x faster here
    return out


AGGREGATIONS = {"median": _block_medians, "mean": _block_means}
"""eval.profile_aggregation's choices (how a well's cells make its profile), each with its reduction of
a block of wells."""


def shared_in_every_well(codes: np.ndarray, wells: Wells) -> bool:
    """Whether every cell of each well has the same value (a number or category code) as the others."""
    if wells.count == 0:
        return False
    grouped = np.asarray(codes)[wells.order]
    low = np.minimum.reduceat(grouped, wells.starts[:-1])
    high = np.maximum.reduceat(grouped, wells.starts[:-1])
    return bool(np.array_equal(low, high))


def well_columns(table: CellTable, config: Config) -> tuple[str, str] | None:
    """The plate and well columns per-well profiles group by: eval.plate_column and eval.well_column
    (each must name a column), else Metadata_Plate and Metadata_Well where the table has both; None
    when it has no such pair (a dataset of class folders)."""
    plate, well = config.eval.plate_column, config.eval.well_column
    if plate or well:
        plate = table.find(plate or DEFAULT_PLATE, "eval.plate_column")
        well = table.find(well or DEFAULT_WELL, "eval.well_column")
        return plate, well
    columns = table.columns
    return (DEFAULT_PLATE, DEFAULT_WELL) if DEFAULT_PLATE in columns and DEFAULT_WELL in columns else None


def cell_wells(table: CellTable, columns: tuple[str, str], rows: np.ndarray | None = None) -> Wells:
    """The cells of table `rows` (every row when None) grouped by the plate and well `columns`."""
    plates, wells = (table.categories(name).codes for name in columns)
    if rows is not None and not every_row(rows, len(plates)):
        plates, wells = plates[rows], wells[rows]
    return group_wells(plates, wells)


def every_row(rows: np.ndarray, count: int) -> bool:
    """Whether `rows` is 0, 1, ..., count - 1 (every cell of features/final), so that taking them copies
    nothing new."""
    return len(rows) == count and (count == 0 or (rows[0] == 0 and rows[-1] == count - 1
                                                  and bool((rows[1:] > rows[:-1]).all())))


def control_column(table: CellTable, config: Config) -> str | None:
    """The column data.control_column names (checked), None when no control is configured."""
    return table.find(config.data.control_column, "data.control_column") if config.data.control_column else None


def control_wells(table: CellTable, config: Config, wells: Wells, rows: np.ndarray | None = None) -> np.ndarray:
    """Which wells are controls (data.control_column = data.control_value, per each well's first
    cell); a UserError naming the settings when none is."""
    name = control_column(table, config)
    if name is None:
        raise UserError("no control wells are configured: set data.control_column and data.control_value (e.g. "
                        "Metadata_Treatment and DMSO)")
    categories = table.categories(name)
    value = config.data.control_value
    if value not in categories.names:
        shown = ", ".join(categories.names[:10]) + (", ..." if len(categories.names) > 10 else "")
        raise UserError(f"data.control_value={value!r} is no value of {name} (its values: {shown}): set "
                        "data.control_value to the controls' value")
    first = wells.first if rows is None else np.asarray(rows)[wells.first]
    chosen = categories.codes[first] == categories.names.index(value)
    if not chosen.any():
        raise UserError(f"no profiled well has {name}={value!r}, so nothing can be normalised on the controls or "
                        "retrieved against them: check data.control_value, or evaluate more cells (eval.max_cells)")
    return chosen


def is_numeric(table: CellTable, name: str) -> bool:
    kind = table.schema.field(name).type
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def comparable_values(table: CellTable, name: str) -> np.ndarray:
    """A column as numbers that are equal where its values are: a numeric column itself (no
    dictionary of 10^7 distinct floats is built), any other its category codes."""
    return table.numbers(name) if is_numeric(table, name) else table.categories(name).codes


def well_metadata(table: CellTable, wells: Wells, rows: np.ndarray | None = None) -> dict[str, Any]:
    """The Metadata_ columns every cell of each well shares, taken from each well's first cell
    (pyarrow arrays, their own types), plus OBJECT_COUNT."""
    first = wells.first if rows is None else np.asarray(rows)[wells.first]
    shared: dict[str, Any] = {}
    for name in table.metadata_columns:
        values = comparable_values(table, name)
        if shared_in_every_well(values if rows is None else values[rows], wells):
            shared[name] = table.column(name).take(first)
    shared[OBJECT_COUNT] = wells.sizes
    return shared


@dataclass
class ProfiledWells:
    """Per-well profiles of a set of cells (the exported ones): their medians or means
    (eval.profile_aggregation) and the metadata their cells share."""

    columns: tuple[str, str]
    profiles: np.ndarray
    metadata: dict[str, Any]
    controls: np.ndarray | None
    cells_without_well: int
    grouping: Wells | None = None
    """The cells of each well (positions in the rows given to profiled_wells)."""

    def context(self, config: Config) -> WellContext:
        """What the normalisation steps need of these wells: plates, controls and batches."""
        batch = config.data.batch_column
        found = [name for name in self.metadata if name in (batch, f"{METADATA_PREFIX}{batch}")] if batch else []
        batches = np.asarray(self.metadata[found[0]].to_pylist(), dtype=object) if found else None
        plates = np.asarray(self.metadata[self.columns[0]].to_pylist(), dtype=object)
        return WellContext(plates, self.controls, batches, config.run.seed, config.eval.mad_robustize_samples,
                           config.eval.spherize_shrinkage)


def profiled_wells(config: Config, table: CellTable, features: np.ndarray, rows: np.ndarray) -> ProfiledWells | None:
    """The per-well profiles of table `rows` (`features` holds their feature rows, in that order);
    None (one log line) for a dataset without wells."""
    columns = well_columns(table, config)
    if columns is None:
        log.info("the per-cell table has no Metadata_Plate and Metadata_Well columns (eval.plate_column, "
                 "eval.well_column): per-well profiles skipped, per-cell profiles written")
        return None
    wells = cell_wells(table, columns, rows)
    if wells.left_out:
        log.warning("%d cells have no %s or %s value and are in no per-well profile", wells.left_out, *columns)
    start = time.perf_counter()
    how = config.eval.profile_aggregation
    profiles = well_aggregates(features, wells, how)
    log.info("%ss of %d wells (%d cells) in %.1f s", how, wells.count, len(wells.order), time.perf_counter() - start)
    metadata = well_metadata(table, wells, rows)
    controls = control_wells(table, config, wells, rows) if config.data.control_column else None
    return ProfiledWells(columns, profiles, metadata, controls, wells.left_out, wells)


def perturbation_column(table: CellTable, config: Config) -> str:
    """The column whose replicate wells phenotypic activity retrieves: eval.perturbation_column, else
    data.label_column, else the class folder."""
    if config.eval.perturbation_column:
        return table.find(config.eval.perturbation_column, "eval.perturbation_column")
    if config.data.label_column:
        return table.find(config.data.label_column, "data.label_column")
    return CLASS_COLUMN
