"""The "cellprofiler" baseline of `features`: CellProfiler's measurements of each cell, made at
`ingest` (ingest.cellprofiler; training/data/ingest/measurements.py), made comparable for a cosine kNN.

The measurements of data.channels (and the shape features, which belong to no channel) are
standardised feature by feature over every cell of the dataset as pycytominer's mad_robustize
does: minus the median, over the median absolute deviation x 1.4826 (the MAD of a normal
distribution is 0.6745 of its standard deviation), both over the cells where the feature is defined.

Dropped, each counted in the tag's index.json ("features_dropped", their names in "dropped_features"):
  non_finite  defined for no cell;
  constant    of one value: its spread over the cells is at most NOISE_FLOOR (CellProfiler's units,
              pixels and intensities in 0..1, put real variation far above it; a uniform channel's
              standard deviation comes out as ~1e-18 of rounding, which standardising would blow up
              to unit size);
  mad_zero    varying, but with a MAD of (at most) NOISE_FLOOR: half the cells or more share one
              value, e.g. AreaShape_EulerNumber; pycytominer divides by 0 + 1e-18 there, and such a
              feature would swamp every other in the cosine;
  outlier     standardised, beyond +-500 in some cell: pycytominer's feature_select "drop_outliers"
              with its outlier_cutoff. Hu moments and the like have tails of 10^3-10^5 MADs, and one
              such feature then holds most of a cell's L2 norm: on the synthetic screen, dropping the
              2 it finds raised leave-one-out kNN top-1 of this baseline from 0.29 to 0.34.
A value left undefined (stored as NaN: the texture of a cell smaller than the texture's scale, a
ring without pixels) becomes 0 after standardising, the dataset's median, so that it pulls the cell
toward no side. Rows are then L2-normalised, as every tag's are.

The statistics take every cell while its measurements fit STATS_BYTES (about 500,000 cells of 500
features), else a seeded sample of that many cells ("stats_cells" in the index); the median and MAD
of 500,000 cells stand for those of 10^7 to well under 1 % of the spread.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.config import Config
from training.data.ingest.measurements import open_measurements
from training.rundir.features import FeatureSet

log = logging.getLogger(__name__)

MAD_SCALE = 1.4826
"""pycytominer's (and scipy's 'normal') scale of the MAD: the standard deviation of a normal distribution."""
STATS_BYTES = 1 << 30
"""At most this many bytes of measurements are read for the medians and MADs."""
NOISE_FLOOR = 1e-12
"""A spread or MAD this small is the rounding of a constant, not a measurement."""
OUTLIER_CUTOFF = 500.0
"""pycytominer's outlier_cutoff: a standardised feature beyond it in any cell is dropped."""
COLUMNS_AT_ONCE = 64
"""Features whose statistics are computed together (their cells in float64)."""


@dataclass
class RobustScale:
    """Per kept feature (`kept`, column numbers) its median and MAD x 1.4826; the names of the dropped
    features by reason."""

    kept: np.ndarray
    median: np.ndarray
    scale: np.ndarray
    dropped: dict[str, list[str]] = field(default_factory=dict)


def robust_scale(values: np.ndarray, names: list[str]) -> RobustScale:
    """Median and scaled MAD of each column of `values` (cells, features) over its finite values;
    the columns that cannot be scaled (module docstring) are dropped."""
    medians, mads, lows, highs = [], [], [], []
    for start in range(0, values.shape[1], COLUMNS_AT_ONCE):
        block = np.asarray(values[:, start:start + COLUMNS_AT_ONCE], np.float64)
        block[~np.isfinite(block)] = np.nan
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "All-NaN slice": a feature no cell has, dropped
            median = np.nanmedian(block, axis=0)
            mads.append(np.nanmedian(np.abs(block - median), axis=0))
            lows.append(np.nanmin(block, axis=0))
            highs.append(np.nanmax(block, axis=0))
        medians.append(median)
    median, scale = np.concatenate(medians), MAD_SCALE * np.concatenate(mads)
    low, high = np.concatenate(lows), np.concatenate(highs)
    defined = np.isfinite(median)
    reasons = {"non_finite": ~defined, "constant": defined & ~(high - low > NOISE_FLOOR)}
    reasons["mad_zero"] = defined & ~reasons["constant"] & ~(scale > NOISE_FLOOR)
    usable = defined & ~reasons["constant"] & ~reasons["mad_zero"]
    with np.errstate(all="ignore"):
        reach = np.maximum(high - median, median - low) / scale
    reasons["outlier"] = usable & (reach > OUTLIER_CUTOFF)
    dropped = {reason: [names[i] for i in np.flatnonzero(hit)] for reason, hit in reasons.items()}
    kept = np.flatnonzero(usable & ~reasons["outlier"])
    return RobustScale(kept, median[kept], scale[kept], dropped)


def standardise(values: np.ndarray, scale: RobustScale) -> np.ndarray:
    """The kept features of `values` (cells, features) robustly standardised, undefined values 0,
    each row L2-normalised (float32)."""
    x = (np.asarray(values[:, scale.kept], np.float64) - scale.median) / scale.scale
    x[~np.isfinite(x)] = 0.0
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


def statistics_rows(n_cells: int, width: int, seed: int) -> np.ndarray | None:
    """The cells the statistics are taken over: None for every cell, else a seeded sample (ascending)."""
    limit = max(STATS_BYTES // max(width * 4, 1), 1)
    if n_cells <= limit:
        return None
    return np.sort(np.random.default_rng(seed).choice(n_cells, size=limit, replace=False))


def selected_features(channels: list[int | None], config: Config) -> np.ndarray:
    """The columns of data.channels' measurements and of the shape (no channel), in stored order."""
    wanted = set(config.data.channel_indices)
    return np.asarray([i for i, channel in enumerate(channels) if channel is None or channel in wanted], np.int64)


def cellprofiler_features(config: Config, packed: Path, n_cells: int, rows: np.ndarray,
                          meta: dict[str, Any]) -> FeatureSet:
    """The baseline's feature set of the table rows `rows` of the packed dataset in `packed` (of
    `n_cells` cells), with `meta` and what was kept and dropped in its index."""
    measurements = open_measurements(packed, n_cells)
    columns = selected_features(measurements.channels, config)
    sample = statistics_rows(n_cells, len(columns), config.run.seed)
    if sample is None:
        measurements.verify()  # every byte is read anyway
        values = np.asarray(measurements.values)[:, columns]
    else:
        values = np.asarray(measurements.values[sample])[:, columns]
    names = [measurements.names[i] for i in columns]
    scale = robust_scale(values, names)
    features = standardise(np.asarray(measurements.values[np.asarray(rows, np.int64)])[:, columns], scale)
    counts = {reason: len(found) for reason, found in scale.dropped.items()}
    log.info("cellprofiler: %d of %d measured features kept (dropped: %s), statistics over %d cells",
             len(scale.kept), len(columns), ", ".join(f"{n} {r}" for r, n in counts.items()) or "none",
             n_cells if sample is None else len(sample))
    extra = {"features_measured": len(columns), "features_kept": int(len(scale.kept)), "features_dropped": counts,
             "dropped_features": scale.dropped, "stats_cells": n_cells if sample is None else len(sample)}
    return FeatureSet(features=features, indices=np.asarray(rows, np.int64), meta={**meta, **extra})
