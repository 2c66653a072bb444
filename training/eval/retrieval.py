"""Retrieval mean average precision (mAP) of per-well profiles by treatment, with the copairs library,
as JUMP Cell Painting reports a representation.

Each well's profile (the median of its evaluated cells' features, optionally sphered on the control
wells) queries the other wells by cosine similarity. Positives: wells of the same treatment (the label
column), i.e. another well; negatives: wells of another treatment on the same plate. A query's average
precision is the mean, over its positives, of the precision at each positive's rank; a treatment's mAP
is the mean over its wells. copairs' permutation test (the mAP of the same numbers of positives and
negatives ranked at random) gives each treatment a p-value, Benjamini-Hochberg corrects them, and the
headline is the fraction of treatments (the control excluded) whose corrected p-value is below 0.05.
"""

from __future__ import annotations

import logging
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from training.config import Config
from training.data.cells import CLASS_COLUMN, CellTable
from training.errors import UserError
from training.eval.profiles import (
    DEFAULT_PLATE,
    DEFAULT_WELL,
    Wells,
    cell_wells,
    control_wells,
    normalized,
    shared_in_every_well,
    well_columns,
    well_medians,
)

log = logging.getLogger(__name__)

NULL_SIZE = 10000
"""Random rankings per (positives, total) pair of the permutation test: p-values down to 1e-4."""
THRESHOLD = 0.05
"""A treatment's mAP is significant when its FDR-corrected p-value (q) is below this."""
TREATMENT, PLATE, WELL = "treatment", "plate", "well"
"""The copairs metadata columns (names of our own: the user's columns are mapped onto them)."""


@dataclass(frozen=True)
class WellProfiles:
    """One row per well: its profile, treatment (label id), plate and a key unique to the well."""

    profiles: np.ndarray
    treatments: np.ndarray
    plates: np.ndarray
    keys: np.ndarray


@contextmanager
def quiet_copairs() -> Iterator[None]:
    """copairs logs each stage at INFO; keep our log to our own lines."""
    logger = logging.getLogger("copairs")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def treatment_map(wells: WellProfiles, class_names: list[str], *, seed: int,
                  control: list[str] = ()) -> dict[str, Any]:
    """mAP per treatment and the fraction of treatments with significant mAP (see the module)."""
    import copairs.map
    import pandas as pd

    meta = pd.DataFrame({TREATMENT: np.asarray(class_names, dtype=object)[wells.treatments],
                         PLATE: wells.plates, WELL: wells.keys})
    with quiet_copairs(), tempfile.TemporaryDirectory() as cache:
        scores = copairs.map.average_precision(meta, np.asarray(wells.profiles, np.float64), pos_sameby=[TREATMENT],
                                               pos_diffby=[WELL], neg_sameby=[PLATE], neg_diffby=[TREATMENT],
                                               distance="cosine", progress_bar=False)
        table = copairs.map.mean_average_precision(scores, [TREATMENT], null_size=NULL_SIZE, threshold=THRESHOLD,
                                                   seed=seed, progress_bar=False, cache_dir=cache)
    return summarise(table, meta, control)


def summarise(table, meta, control: list[str]) -> dict[str, Any]:
    """The knn.json entry from copairs' per-treatment table: every treatment's mAP, p and q (None
    where it has a single well, hence no positive), the mean over treatments and the significant fraction."""
    wells_of = meta[TREATMENT].value_counts().to_dict()
    per_treatment = {str(name): {"map": None, "p_value": None, "q_value": None, "significant": None,
                                 "n_wells": int(n)} for name, n in sorted(wells_of.items())}
    for row in table.itertuples(index=False):
        per_treatment[str(getattr(row, TREATMENT))].update(
            map=float(row.mean_average_precision), p_value=float(row.p_value), q_value=float(row.corrected_p_value),
            significant=bool(row.below_corrected_p))
    scored = [v for name, v in per_treatment.items() if v["map"] is not None and name not in control]
    return {
        "mean_map": float(np.mean([v["map"] for v in scored])) if scored else None,
        "fraction_significant": float(np.mean([v["significant"] for v in scored])) if scored else None,
        "n_treatments": len(scored), "n_significant": int(sum(v["significant"] for v in scored)),
        "n_wells": int(len(meta)), "per_treatment": per_treatment,
    }


def settings(label_column: str, columns: tuple[str, str], normalization: str, control: list[str]) -> dict[str, Any]:
    """How the mAP in knn.json was measured, recorded beside it."""
    return {"treatment_column": label_column, "plate_column": columns[0], "well_column": columns[1],
            "profiles": "median of each well's evaluated held-out cells", "normalization": normalization,
            "controls": control, "positives": "same treatment, other well",
            "negatives": "other treatment, same plate", "distance": "cosine", "null_size": NULL_SIZE,
            "fdr": "Benjamini-Hochberg", "threshold": THRESHOLD}


@dataclass(frozen=True)
class MapSetup:
    """What mAP needs besides the features: the evaluated cells grouped by well (positions in
    labels.json's rows), each well's treatment, plate and key, the control wells when sphering."""

    wells: Wells
    treatments: np.ndarray
    plates: np.ndarray
    keys: np.ndarray
    normalization: str
    controls: np.ndarray | None
    control: list[str]
    """The treatments of the control wells, left out of the headline figures."""
    settings: dict[str, Any]


def map_setup(table: CellTable, config: Config, labels: dict[str, Any]) -> MapSetup | None:
    """The wells of the evaluated cells (labels.json), or None, with one log line saying why, when
    the table has no plate and well columns, or the label is not one treatment per well."""
    columns = well_columns(table, config)
    if columns is None:
        log.info("no plate and well columns (%s, %s; eval.plate_column, eval.well_column): no retrieval mAP",
                 DEFAULT_PLATE, DEFAULT_WELL)
        return None
    rows, treatments = np.asarray(labels["indices"], np.int64), np.asarray(labels["labels"], np.int64)
    wells = cell_wells(table, columns, rows)
    if wells.count < 2 or not shared_in_every_well(treatments, wells):
        log.info("the label (%s) is not one value per well of %s and %s: no retrieval mAP by treatment",
                 config.data.label_column or "the class", *columns)
        return None
    first = rows[wells.first]
    plates = np.asarray(table.strings(columns[0]).take(first), dtype=object)
    keys = plates + "/" + np.asarray(table.strings(columns[1]).take(first), dtype=object)
    normalization = config.eval.profile_normalization
    controls = evaluated_controls(table, config, wells, rows)
    per_well = treatments[wells.first]
    control = sorted({labels["class_names"][t] for t in per_well[controls]}) if controls is not None else []
    label = table.find(config.data.label_column, "data.label_column") if config.data.label_column else CLASS_COLUMN
    return MapSetup(wells, per_well, plates, keys, normalization, controls, control,
                    settings(label, columns, normalization, control))


def evaluated_controls(table: CellTable, config: Config, wells: Wells, rows: np.ndarray) -> np.ndarray | None:
    """The control wells among the evaluated ones; needed for sphering (a UserError without them),
    else only to leave the controls out of the headline (a warning without them)."""
    if config.eval.profile_normalization != "none":
        return control_wells(table, config, wells, rows)
    if not config.data.control_column:
        return None
    try:
        return control_wells(table, config, wells, rows)
    except UserError as exc:
        log.warning("mAP counts every treatment: %s", exc)
        return None


def tag_map(features: np.ndarray, setup: MapSetup, class_names: list[str], seed: int) -> dict[str, Any]:
    """One feature set's mAP: its per-well medians, normalised as configured, scored by copairs."""
    profiles = normalized(well_medians(features, setup.wells), setup.normalization, setup.controls)
    return treatment_map(WellProfiles(profiles, setup.treatments, setup.plates, setup.keys), class_names,
                         seed=seed, control=setup.control)
