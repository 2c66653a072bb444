"""Retrieval mean average precision (mAP) of per-well profiles in the two setups copairs documents
(Kalinin et al., Nat Commun 2025), as JUMP Cell Painting scores a representation.

Each well's profile is the median (or mean: eval.profile_aggregation) of its evaluated cells'
features, normalised as eval.profile_normalization lists (training/eval/profiles/normalization.py:
per-plate mad_robustize and sphering on the controls, Harmony), beside the shares of its cells in
the screen's subpopulations where eval.profile_subpopulations asks (profiles/subpopulations.py),
and beside the field's standard median profile where eval.profile_median_beside asks. A query's
average precision (AP) ranks its candidates by cosine similarity: the mean, over its positives, of
the precision at each positive's rank.

    phenotypic activity     can a perturbation's wells be told from the negative controls? Each
                            perturbation well queries its replicate wells (positives: same
                            perturbation, another well) against the control wells of its own plate
                            (negatives; every control well with eval.activity_negatives: all),
                            copairs' reference-index setup; per perturbation, the mean AP
    phenotypic consistency  do perturbations annotated alike (eval.consistency_column, e.g. a
                            mechanism of action) look alike? Among the active perturbations (activity
                            q below the threshold; every non-control perturbation when no controls
                            are configured), each well queries the wells of the other perturbations
                            of its group (positives) against those of other groups (negatives); per
                            group, the mean AP

copairs' notebook scores consistency on one consensus profile per perturbation; here the wells are
kept, so that a group of two perturbations can reach significance (with consensus profiles its one
positive among n candidates gives a permutation p of at least 1/n). Each mAP gets copairs'
permutation p-value (the same numbers of positives and negatives ranked at random), corrected for
the false discovery rate (Benjamini-Hochberg) over the perturbations (or groups); the headline is the
fraction retrieved: the share with a corrected p (q) below 0.05. A screen without controls has no
phenotypic activity, and says so in one line.
"""

from __future__ import annotations

import logging
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator

import numpy as np

from training.config import Config
from training.data.store.cells import CellTable
from training.errors import UserError
from training.eval.profiles.hybrid import hybrid_set
from training.eval.profiles.normalization import WellContext, beside_unit, check_steps, normalize_profiles
from training.eval.profiles.subpopulations import Centres, beside_shares, read_centres, well_shares
from training.eval.profiles.wells import (
    DEFAULT_PLATE,
    DEFAULT_WELL,
    Wells,
    cell_wells,
    comparable_values,
    control_wells,
    perturbation_column,
    shared_in_every_well,
    well_aggregates,
    well_columns,
)
from training.rundir import RunLayout, tags
from training.rundir.features import FeatureSet, load_features, read_index

log = logging.getLogger(__name__)

PROFILES = {"evaluated": "each well's evaluated held-out cells", "all": "each well's cells"}
"""Whose cells make a well's profile under each eval.profile_cells, as knn.json describes it."""
NULL_SIZE = 10000
"""Random rankings per (positives, total) pair of the permutation test: p-values down to 1e-4."""
THRESHOLD = 0.05
"""A perturbation (or group) is retrieved when its FDR-corrected p-value (q) is below this."""
PERTURBATION, PLATE, WELL, REFERENCE, GROUP = "perturbation", "plate", "well", "reference_index", "group"
"""The copairs metadata columns (names of our own: the user's columns are mapped onto them)."""
NO_CONTROLS = ("no phenotypic activity: the screen names no negative controls (set data.control_column and "
               "data.control_value, e.g. Metadata_Treatment and DMSO)")


def profiles_described(aggregation: str, cells: str) -> str:
    """knn.json's "profiles": e.g. "median of each well's cells"."""
    return f"{aggregation} of {PROFILES[cells]}"


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


@dataclass(frozen=True)
class WellProfiles:
    """One row per well: its profile, perturbation, plate, a key unique to the well, whether it is a
    control, and its group for consistency (None: no groups)."""

    profiles: np.ndarray
    perturbations: np.ndarray
    plates: np.ndarray
    keys: np.ndarray
    controls: np.ndarray
    groups: np.ndarray | None = None


def _copairs_map(meta, profiles: np.ndarray, sameby: str, *, pos: tuple[list[str], list[str]],
                 neg: tuple[list[str], list[str]], seed: int):
    """copairs' per-row AP and per-`sameby` mAP table with p and q (cosine)."""
    import copairs.map

    with quiet_copairs(), tempfile.TemporaryDirectory() as cache:
        scores = copairs.map.average_precision(meta, np.asarray(profiles, np.float64), pos_sameby=pos[0],
                                               pos_diffby=pos[1], neg_sameby=neg[0], neg_diffby=neg[1],
                                               distance="cosine", progress_bar=False)
        scores = scores.dropna(subset=["average_precision"])
        if scores.empty:
            return None
        return copairs.map.mean_average_precision(scores, [sameby], null_size=NULL_SIZE, threshold=THRESHOLD,
                                                  seed=seed, progress_bar=False, cache_dir=cache)


def phenotypic_activity(wells: WellProfiles, *, seed: int, same_plate: bool = True) -> dict[str, Any]:
    """Each perturbation's mAP against the control wells of the query's plate, or all of them (see
    the module)."""
    import pandas as pd
    from copairs.matching import assign_reference_index

    meta = pd.DataFrame({PERTURBATION: wells.perturbations, PLATE: wells.plates, WELL: wells.keys,
                         "control": np.asarray(wells.controls, bool)})
    meta = assign_reference_index(meta, "control", reference_col=REFERENCE, default_value=-1)
    table = _copairs_map(meta.drop(columns="control"), wells.profiles, PERTURBATION,
                         pos=([PERTURBATION, REFERENCE], []), neg=([PLATE] if same_plate else [], [PERTURBATION, REFERENCE]),
                         seed=seed)
    counts = pd.Series(wells.perturbations[~wells.controls]).value_counts().to_dict()
    summary = summarise(table, PERTURBATION, counts, "treatments")
    summary["n_control_wells"] = int(np.sum(wells.controls))
    return summary


def phenotypic_consistency(wells: WellProfiles, active: list[str] | None, *, seed: int) -> dict[str, Any]:
    """Each group's mAP among the wells of `active` perturbations (None: every non-control one)."""
    import pandas as pd

    chosen = ~wells.controls & np.array([g is not None and g == g and str(g) != "" for g in wells.groups])
    if active is not None:
        chosen &= np.isin(wells.perturbations, np.asarray(active, dtype=object))
    groups = pd.Series(wells.groups[chosen], dtype=object)
    perturbations_per_group = pd.Series(wells.perturbations[chosen]).groupby(groups.values).nunique()
    scorable = perturbations_per_group[perturbations_per_group >= 2]
    base = {"n_active_perturbations": int(len(set(wells.perturbations[chosen]))),
            "active_filter": "activity q < threshold" if active is not None else "none (no controls)"}
    reason = ("no group has two active perturbations to retrieve each other" if scorable.empty else
              "the active perturbations are all of one group: no other group to tell them from"
              if groups.nunique() < 2 else None)
    if reason:
        return {**base, "mean_map": None, "fraction_significant": None, "n_treatments": 0, "n_significant": 0,
                "n_wells": int(chosen.sum()), "per_treatment": {}, "skipped": reason}
    meta = pd.DataFrame({GROUP: groups.values, PERTURBATION: wells.perturbations[chosen], WELL: wells.keys[chosen]})
    table = _copairs_map(meta, wells.profiles[chosen], GROUP, pos=([GROUP], [PERTURBATION]), neg=([], [GROUP]),
                         seed=seed)
    counts = groups.value_counts().to_dict()
    return {**base, **summarise(table, GROUP, counts, "groups")}


def summarise(table, column: str, wells_of: dict[str, int], what: str) -> dict[str, Any]:
    """A knn.json entry from copairs' table: every perturbation's (or group's) mAP, p and q (None where
    it has no positive to retrieve), the mean over them and the fraction retrieved (q < THRESHOLD)."""
    per = {str(name): {"map": None, "p_value": None, "q_value": None, "significant": None, "n_wells": int(n)}
           for name, n in sorted(wells_of.items())}
    if table is not None:
        for row in table.itertuples(index=False):
            per[str(getattr(row, column))].update(
                map=float(row.mean_average_precision), p_value=float(row.p_value),
                q_value=float(row.corrected_p_value), significant=bool(row.below_corrected_p))
    scored = [v for v in per.values() if v["map"] is not None]
    return {
        "mean_map": float(np.mean([v["map"] for v in scored])) if scored else None,
        "fraction_significant": float(np.mean([v["significant"] for v in scored])) if scored else None,
        "n_treatments": len(scored), "n_significant": int(sum(v["significant"] for v in scored)),
        "n_wells": int(sum(wells_of.values())), "scored": what, "per_treatment": per,
    }


@dataclass(frozen=True)
class MapSetup:
    """What mAP needs besides the features: the evaluated cells grouped by well (positions in
    labels.json's rows) and each well's perturbation, plate, key, control flag, group and batch."""

    wells: Wells
    perturbations: np.ndarray
    plates: np.ndarray
    keys: np.ndarray
    controls: np.ndarray | None
    groups: np.ndarray | None
    batches: np.ndarray | None
    normalization: tuple[str, ...]
    settings: dict[str, Any]
    consistency_settings: dict[str, Any] | None
    same_plate: bool = True
    """Activity's negatives: the control wells of the query's plate (else every control well)."""
    mad_samples: str = "controls"
    """The wells each plate's mad_robustize is fitted on (eval.mad_robustize_samples)."""
    sphere_shrinkage: float = 0.0
    """Spherize's shrinkage (eval.spherize_shrinkage)."""
    cells: str = "evaluated"
    """Whose cells the wells hold: "evaluated" (labels.json's) or "all" (eval.profile_cells)."""
    aggregation: str = "median"
    """How a well's cells make its profile (eval.profile_aggregation)."""
    subpopulations: int = 0
    """Subpopulations whose shares stand beside each profile (eval.profile_subpopulations; 0: none)."""
    subpopulations_weight: float = 0.2
    """The shares' part of a well's squared norm (eval.profile_subpopulations_weight)."""
    centres: Centres | None = None
    """The subpopulations eval.profile_subpopulation_centres carries (a pilot's): a feature set of
    their model counts its cells in them; any other (a baseline's) fits its own."""
    median_beside: float = 0.0
    """The standard median profile's part of the cosine beside the profile (eval.profile_median_beside)."""


def _per_well(table: CellTable, name: str, rows: np.ndarray, wells: Wells, setting: str) -> np.ndarray:
    """A column's value of each well (its first evaluated cell's); a UserError naming `setting` when the
    cells of a well disagree."""
    values = comparable_values(table, name)[rows]
    if not shared_in_every_well(values, wells):
        raise UserError(f"{setting}={name} is not one value per well (the cells of a well differ): name a "
                        "column that the plate map gives per well")
    return np.asarray(table.strings(name).take(rows[wells.first]), dtype=object)


def map_setup(table: CellTable, config: Config, labels: dict[str, Any]) -> MapSetup | None:
    """The wells of the evaluated cells (labels.json), or None, with one log line saying why, when the
    table has no plate and well columns or the perturbation is not one value per well."""
    columns = well_columns(table, config)
    if columns is None:
        log.info("no plate and well columns (%s, %s; eval.plate_column, eval.well_column): no retrieval mAP",
                 DEFAULT_PLATE, DEFAULT_WELL)
        return None
    rows = np.asarray(labels["indices"], np.int64)
    wells = cell_wells(table, columns, rows)
    name = perturbation_column(table, config)
    if wells.count < 2 or not shared_in_every_well(comparable_values(table, name)[rows], wells):
        log.info("the perturbation (%s) is not one value per well of %s and %s: no retrieval mAP", name, *columns)
        return None
    first = rows[wells.first]
    perturbations = np.asarray(table.strings(name).take(first), dtype=object)
    plates = np.asarray(table.strings(columns[0]).take(first), dtype=object)
    keys = plates + "/" + np.asarray(table.strings(columns[1]).take(first), dtype=object)
    controls = control_wells(table, config, wells, rows) if config.data.control_column else None
    steps = config.eval.profile_normalization
    batches = _per_well(table, table.find(config.data.batch_column, "data.batch_column"), rows, wells,
                        "data.batch_column") if config.data.batch_column and "harmony" in steps else None
    check_steps(steps, controls=controls is not None, batches=batches is not None,
                mad_samples=config.eval.mad_robustize_samples)
    groups, consistency = None, None
    if config.eval.consistency_column:
        group_name = table.find(config.eval.consistency_column, "eval.consistency_column")
        groups = _per_well(table, group_name, rows, wells, "eval.consistency_column")
        consistency = consistency_settings(group_name, name, controls is not None)
    settings = activity_settings(name, columns, steps, config, controls)
    return MapSetup(wells, perturbations, plates, keys, controls, groups, batches, steps, settings, consistency,
                    same_plate=config.eval.activity_negatives == "same_plate",
                    mad_samples=config.eval.mad_robustize_samples, sphere_shrinkage=config.eval.spherize_shrinkage,
                    aggregation=config.eval.profile_aggregation, subpopulations=config.eval.profile_subpopulations,
                    subpopulations_weight=config.eval.profile_subpopulations_weight, centres=carried_centres(config),
                    median_beside=config.eval.profile_median_beside)


def carried_centres(config: Config) -> Centres | None:
    """eval.profile_subpopulation_centres' centres (None when unset); a UserError of one line when the
    file is not one or holds another number of subpopulations than eval.profile_subpopulations."""
    if not (config.eval.profile_subpopulations and config.eval.profile_subpopulation_centres):
        return None
    centres = read_centres(config.eval.profile_subpopulation_centres)
    centres.check_k(config.eval.profile_subpopulations)
    return centres


def evaluation_wells(config: Config, labels: dict[str, Any], *, cells: str | None = None) -> MapSetup | None:
    """The wells of the cells retrieval mAP scores (`cells`, else eval.profile_cells: the evaluated
    held-out cells labels.json lists, or "all" of the dataset's); None (logged) for a dataset without a
    per-cell table (a TIFF folder) or without plate and well columns."""
    from training.data.dataset import open_images

    table = getattr(open_images(config), "table", None)
    if table is None:
        log.info("a TIFF folder has no per-cell table, so no wells: no retrieval mAP")
        return None
    which = cells or config.eval.profile_cells
    if which == "all":
        labels = {**labels, "indices": np.arange(len(table), dtype=np.int64)}
    setup = map_setup(table, config, labels)
    return None if setup is None else replace(
        setup, cells=which, settings={**setup.settings, "profiles": profiles_described(setup.aggregation, which)})


def profiled_features(config: Config, layout: RunLayout, labels: dict[str, Any],
                      sets: dict[str, FeatureSet]) -> tuple[MapSetup | None, dict[str, tuple[np.ndarray, MapSetup]]]:
    """The wells retrieval mAP scores (eval.profile_cells) and, per tag of `sets` (the evaluated
    cells' features), its features of those wells' cells with their setup. Under "all", a tag whose
    features cover the evaluated cells only (a numbered epoch's) is scored on the evaluated cells' wells;
    the setup's `cells` says which. (None, {}) where there are no wells to profile."""
    evaluated = evaluation_wells(config, labels, cells="evaluated")
    if evaluated is None or config.eval.profile_cells == "evaluated":
        return evaluated, {tag: (s.features, evaluated) for tag, s in sets.items()} if evaluated else {}
    every = evaluation_wells(config, labels, cells="all")
    cells = int(every.wells.order.size) if every is not None else 0
    scored = {}
    for tag, feature_set in sets.items():
        whole = _every_cell(layout, tag, cells)
        scored[tag] = (whole.features, every) if whole is not None else (feature_set.features, evaluated)
        if whole is None:
            log.info("features/%s covers the evaluated cells only: its mAP reads their wells", tag)
    return every, scored


def _every_cell(layout: RunLayout, tag: str, cells: int) -> FeatureSet | None:
    """A tag's features of every cell, memory-mapped (the hybrid composed of final's and cellprofiler's),
    or None when its set holds fewer cells."""
    if tag == tags.HYBRID:
        parts = [_every_cell(layout, part, cells) for part in (tags.FINAL, tags.CELLPROFILER)]
        return None if None in parts else hybrid_set(*parts)
    index = read_index(layout.features(tag))
    if index is None or int(index.get("n_images", 0)) != cells:
        return None
    return load_features(layout.features(tag), mmap=True)


def activity_settings(name: str, columns: tuple[str, str], steps: tuple[str, ...], config: Config,
                      controls: np.ndarray | None) -> dict[str, Any]:
    """How the phenotypic-activity mAP in knn.json was measured, recorded beside it."""
    common = {"perturbation_column": name, "plate_column": columns[0], "well_column": columns[1],
              "profiles": profiles_described(config.eval.profile_aggregation, "evaluated"),
              "aggregation": config.eval.profile_aggregation,
              "normalization": list(steps) or ["none"], "mad_robustize_samples": config.eval.mad_robustize_samples,
              **({"spherize_shrinkage": config.eval.spherize_shrinkage} if "spherize" in steps else {}),
              **({"subpopulations": config.eval.profile_subpopulations,
                  "subpopulations_weight": config.eval.profile_subpopulations_weight,
                  "subpopulation_centres": config.eval.profile_subpopulation_centres or "fitted on each feature set",
                  "subpopulation_shares": "k-means on the L2-normalised cell features; shares less the control "
                                          "wells' mean, beside the normalised profile"}
                 if config.eval.profile_subpopulations else {}),
              **({"median_beside": config.eval.profile_median_beside,
                  "median_profile": "the median of each well's cells, the same steps with plain ZCA, no shares; "
                                    "each block unit-normalised per well"} if config.eval.profile_median_beside else {}),
              "distance": "cosine", "null_size": NULL_SIZE,
              "fdr": "Benjamini-Hochberg", "threshold": THRESHOLD}
    if controls is None:
        return {**common, "setup": "phenotypic activity", "skipped": NO_CONTROLS}
    negatives = "the control wells of the query's plate" if config.eval.activity_negatives == "same_plate" else \
        "every control well of the screen"
    return {**common, "setup": "phenotypic activity",
            "controls": f"{config.data.control_column} = {config.data.control_value}",
            "positives": "same perturbation, another well", "negatives": negatives}


def consistency_settings(group: str, perturbation: str, has_controls: bool) -> dict[str, Any]:
    return {"setup": "phenotypic consistency", "group_column": group, "perturbation_column": perturbation,
            "wells": "of active perturbations (activity q < threshold)" if has_controls else
            "of every perturbation (no controls, so no activity filter)",
            "positives": "wells of another perturbation of the same group",
            "negatives": "wells of perturbations of other groups", "distance": "cosine", "null_size": NULL_SIZE,
            "fdr": "Benjamini-Hochberg", "threshold": THRESHOLD}


def well_profiles(features: np.ndarray, setup: MapSetup, seed: int, card: dict[str, Any] | None = None,
                  name: str = "the features") -> WellProfiles:
    """One feature set's per-well profiles: medians or means (eval.profile_aggregation), normalised as
    configured, beside their cells' subpopulation shares where eval.profile_subpopulations asks: in
    the carried centres (setup.centres) for features of their model (`card`, the set's model card),
    else in subpopulations fitted on these cells; and beside the standard median profile where
    eval.profile_median_beside asks."""
    context = WellContext(setup.plates, setup.controls, setup.batches, seed, setup.mad_samples,
                          setup.sphere_shrinkage)
    profiles, _ = normalize_profiles(well_aggregates(features, setup.wells, setup.aggregation), setup.normalization,
                                     context)
    if setup.subpopulations:
        carried = setup.centres
        problem = carried.fits(card, features.shape[1]) if carried is not None else ""
        if problem:
            log.info("%s: subpopulations of their own, not %s's (%s)", name, carried.path, problem)
            carried = None
        elif carried is not None:
            log.info("%s: cells counted in the %d subpopulations of %s", name, carried.k, carried.path)
        shares = well_shares(features, setup.wells, setup.subpopulations, seed, carried)
        profiles = beside_shares(profiles, shares, setup.controls, setup.subpopulations_weight)
    if setup.median_beside:
        standard = replace(setup, aggregation="median", sphere_shrinkage=0.0, subpopulations=0, median_beside=0.0)
        profiles = beside_unit(profiles, well_profiles(features, standard, seed, card, name).profiles,
                               setup.median_beside)
    controls = setup.controls if setup.controls is not None else np.zeros(len(profiles), bool)
    return WellProfiles(profiles, setup.perturbations, setup.plates, setup.keys, controls, setup.groups)


def tag_map(features: np.ndarray, setup: MapSetup, seed: int, card: dict[str, Any] | None = None,
            name: str = "the features") -> dict[str, Any]:
    """One feature set's knn.json entries: "map" (phenotypic activity) and, with groups,
    "map_consistency"; `card` is the set's model card (which subpopulations count its cells), `name`
    what the log calls it."""
    return profile_map(well_profiles(features, setup, seed, card, name), setup.controls is not None, seed,
                       same_plate=setup.same_plate)


def profile_map(wells: WellProfiles, has_controls: bool, seed: int, *, same_plate: bool = True) -> dict[str, Any]:
    """Activity (or the reason it is not measured) and consistency of ready per-well profiles."""
    out: dict[str, Any] = {}
    active = None
    if has_controls:
        out["map"] = phenotypic_activity(wells, seed=seed, same_plate=same_plate)
        active = [name for name, v in out["map"]["per_treatment"].items() if v["significant"]]
    else:
        out["map"] = {"mean_map": None, "fraction_significant": None, "n_treatments": 0, "n_significant": 0,
                      "skipped": NO_CONTROLS}
    if wells.groups is not None:
        out["map_consistency"] = phenotypic_consistency(wells, active, seed=seed)
    return out
