"""Screen benchmark: the screen chain from fields of view to kNN and mAP, read against its ceiling.

    python -m training bench screen --config configs/screen.yaml [--set key=value ...] [--ranks 2]
                                    [--reuse] [--out docs/benchmarks/screen.json]

Runs what `make screen` runs up to `knn`, each step a process as Slurm starts it (`synth-data
--screen` when the screen's load table is missing, then ingest, mean-std, pretrain on `--ranks`
ranks through torchrun, as the local cluster's two nodes run it, features, labels, knn), timing each;
`--reuse` keeps the steps whose files exist. Then the oracle: the synthetic screen knows each cell's
phenotype (truth.csv beside its load table), so the true phenotype is scored as a feature exactly as
the others are: per cell (one-hot, with a seeded 1e-6 jitter that only breaks ties) for kNN and
not-same-batch kNN, per well (the fractions of its evaluated cells in each phenotype) for the mAP,
not normalised: true fractions carry no imaging effect to correct, and the controls' fractions of
phenotypes they never show do not vary, which per-plate scaling and sphering cannot take. The JSON holds, per
feature set (trained, raw pixels, random init, CellProfiler where measured, oracle), kNN top-1,
not-same-batch top-1, phenotypic-activity mAP and the treatments retrieved, consistency mAP and the
groups retrieved, each also as its share of the oracle's (kNN above chance over the oracle's above
chance; mAP over the oracle's), the seconds of every step and the machine. The kNN figures are also
given with eval.knn_whiten flipped, and the trained model's lead over each baseline is counted
against that baseline's better protocol, so that whitening, which helps some feature sets and hurts
others, never makes the lead. Every kNN figure, the oracle's too, counts the queries of the config's
splits (eval.knn_folds: with folds, every held-out cell once). Likewise the mAPs are also given with
the wells profiled by the other aggregation (eval.profile_aggregation: median or mean) and, where the
run shrinks its sphering (eval.spherize_shrinkage), under plain ZCA with each, where the run sets
subpopulation shares beside the profiles (eval.profile_subpopulations), each also without them,
where it sets the standard median profile beside them (eval.profile_median_beside), each of those
also without it, and the goals hold CellProfiler's activity and consistency at the best of them;
gaps_to_cellprofiler reads the model's against those best compound by compound (mechanism by
mechanism), with the standard error of the mean difference.
figures_phenotype reads each feature set against the true phenotypes instead of the mechanisms (kNN
plainly and not same batch, and per phenotype): how much of a cell's phenotype survives a change of
imaging batch.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from training.config import Config, EvalConfig
from training.data.store.format import INDEX_FILE
from training.errors import UserError
from training.rundir import RunLayout, tags
from training.rundir.features import INDEX_FILE as FEATURE_SET_INDEX

log = logging.getLogger(__name__)

ORACLE = "oracle"
STEPS = ("ingest", "mean-std", "pretrain", "features", "labels", "knn")
JITTER = 1e-6
TRUTH_KEYS = ("Metadata_Plate", "Metadata_Well", "Metadata_Site")


def step_done(layout: RunLayout, step: str, settings: EvalConfig | None = None) -> bool:
    """Whether `step`'s main file exists (for --reuse); a knn.json scored with another kNN protocol
    (whitening, folds) or well profile (eval.profile_aggregation, eval.profile_subpopulations and its
    weight, eval.profile_median_beside) than `settings` is not done, since the benchmark's figures would not be the config's."""
    done = {"ingest": layout.packed / INDEX_FILE, "mean-std": layout.mean_std,
            "pretrain": layout.latest_checkpoint, "features": layout.features(tags.FINAL) / FEATURE_SET_INDEX,
            "labels": layout.labels, "knn": layout.knn_json}
    if not done[step].exists():
        return False
    if step == "knn" and settings is not None:
        knn = json.loads(layout.knn_json.read_text())
        scored = knn.get("map")
        wanted = (settings.profile_aggregation, settings.profile_subpopulations, settings.profile_subpopulations_weight,
                  settings.profile_median_beside)
        profile = wanted if scored is None else (
            scored.get("aggregation", "median"), scored.get("subpopulations", 0),
            scored.get("subpopulations_weight", settings.profile_subpopulations_weight), scored.get("median_beside", 0.0))
        return (knn.get("whitened"), knn.get("folds", 1), *profile) == (settings.knn_whiten, settings.knn_folds, *wanted)
    return True


def step_command(step: str, config_path: Path | None, overrides: list[str], ranks: int) -> list[str]:
    """The command Slurm's script would run for `step` (pretrain on `ranks` ranks through torchrun)."""
    args = [step, *(["--config", str(config_path)] if config_path else []),
            *[a for o in overrides for a in ("--set", o)]]
    if step == "pretrain" and ranks > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                "-m", "training", *args]
    return [sys.executable, "-m", "training", *args]


def make_screen(config: Config, config_path: Path | None, overrides: list[str]) -> float | None:
    """`synth-data --screen` into ingest.table's folder when the screen's load table is missing (its
    seconds; None when the table was there): the screen a benchmark's steps then read."""
    table = Path(config.ingest.table)
    if table.is_file():
        return None
    start = time.perf_counter()
    command = [sys.executable, "-m", "training", "synth-data", "--screen", "--out", str(table.parent),
               *(["--config", str(config_path)] if config_path else []), *[a for o in overrides for a in ("--set", o)]]
    _run(command, "synth-data")
    return round(time.perf_counter() - start, 1)


def run_chain(config: Config, config_path: Path | None, overrides: list[str], *, ranks: int,
              reuse: bool) -> dict[str, float]:
    """Every step not already done (with --reuse), in order, each in its own process; seconds per step."""
    layout = RunLayout.from_config(config)
    seconds: dict[str, float] = {}
    made = make_screen(config, config_path, overrides)
    if made is not None:
        seconds["synth-data"] = made
    for step in STEPS:
        if reuse and step_done(layout, step, config.eval):
            log.info("bench screen: %s already done (--reuse)", step)
            continue
        start = time.perf_counter()
        _run(step_command(step, config_path, overrides, ranks), step)
        seconds[step] = round(time.perf_counter() - start, 1)
        log.info("bench screen: %s took %.1f s", step, seconds[step])
    return seconds


def _run(command: list[str], step: str) -> None:
    done = subprocess.run(command)
    if done.returncode != 0:
        raise UserError(f"bench screen: `{step}` failed (exit {done.returncode}); its error is above")


def cell_phenotypes(config: Config, rows: np.ndarray, truth_path: Path | None = None) -> tuple[np.ndarray, list[str]]:
    """Each table row's true phenotype (codes into the sorted names) from the screen's truth.csv."""
    import pandas as pd

    from training.data.dataset import open_images

    path = truth_path or Path(config.ingest.table).parent / "truth.csv"
    if not path.is_file():
        raise UserError(f"the oracle needs the synthetic screen's truth.csv, and {path} does not exist: run on a "
                        "screen from `python -m training synth-data --screen`, or give --truth")
    truth = pd.read_csv(path, dtype={k: str for k in TRUTH_KEYS})
    table = open_images(config).table
    cells = pd.DataFrame({k: np.asarray(table.strings(k).take(rows), dtype=object) for k in TRUTH_KEYS})
    cells["ObjectNumber"] = np.asarray(table.numbers("Metadata_ObjectNumber"))[rows]
    found = cells.merge(truth[[*TRUTH_KEYS, "ObjectNumber", "Phenotype"]], how="left", on=[*TRUTH_KEYS, "ObjectNumber"])
    if found["Phenotype"].isna().any():
        raise UserError(f"{int(found['Phenotype'].isna().sum())} evaluated cells are not in {path}: is it the truth "
                        "of the screen this run ingested?")
    names = sorted(found["Phenotype"].unique())
    return found["Phenotype"].map({n: i for i, n in enumerate(names)}).to_numpy(np.int64), names


@dataclass(frozen=True)
class HeldOut:
    """The evaluated cells as `knn` splits them (eval.knn_folds), read once for every feature set the
    benchmark scores."""

    labels: dict[str, Any]
    y: np.ndarray
    splits: list[tuple[np.ndarray, np.ndarray]]
    batches: np.ndarray | None


def held_out(config: Config, layout: RunLayout) -> HeldOut:
    """labels.json, the seeded reference/query split and each cell's batch for not-same-batch kNN."""
    from training.eval.knn import evaluation_batches, knn_splits
    from training.rundir.artifacts import load_labels

    labels = load_labels(layout)
    y = np.asarray(labels["labels"], np.int64)
    return HeldOut(labels, y, knn_splits(y, config.eval, config.run.seed), evaluation_batches(config, labels, layout))


def oracle_entry(config: Config, held: HeldOut, truth_path: Path | None) -> dict[str, Any]:
    """The oracle's knn.json-like entry: kNN and not-same-batch kNN on one-hot phenotypes, mAP on
    per-well phenotype fractions."""
    from training.eval.knn import evaluate_tag
    from training.eval.retrieval import WellProfiles, evaluation_wells, profile_map
    from training.rundir.features import FeatureSet

    labels = held.labels
    rows = np.asarray(labels["indices"], np.int64)
    phenotype, names = cell_phenotypes(config, rows, truth_path)
    onehot = np.eye(len(names))[phenotype] + JITTER * np.random.default_rng(config.run.seed).standard_normal(
        (len(rows), len(names)))
    onehot /= np.linalg.norm(onehot, axis=1, keepdims=True)
    entry = evaluate_tag(FeatureSet(onehot.astype(np.float32), rows, {"kind": ORACLE}), held.y,
                         held.splits, config.eval, len(labels["class_names"]), held.batches)
    setup = evaluation_wells(config, labels)
    if setup is not None:
        if setup.cells != "evaluated":  # eval.profile_cells: all: the wells hold every cell
            phenotype, names = cell_phenotypes(config, np.arange(setup.wells.order.size), truth_path)
        fractions = np.stack([np.bincount(phenotype[setup.wells.order[a:b]], minlength=len(names)) / (b - a)
                              for a, b in zip(setup.wells.starts[:-1], setup.wells.starts[1:])])
        controls = setup.controls if setup.controls is not None else np.zeros(len(fractions), bool)
        entry.update(profile_map(WellProfiles(fractions, setup.perturbations, setup.plates, setup.keys, controls,
                                              setup.groups), setup.controls is not None, config.run.seed,
                                 same_plate=setup.same_plate))
    entry["phenotypes"] = names
    return entry


def phenotype_figures(config: Config, held: HeldOut, sets: dict[str, Any],
                      truth_path: Path | None) -> dict[str, dict[str, Any]]:
    """How well each feature set (`sets`, scored_sets') tells the evaluated cells' true phenotypes
    apart, by the run's kNN with the phenotypes as classes: top-1 plainly and not same batch, and the
    not-same-batch top-1 of each phenotype. The gap between the two is what the imaging batches cost a
    representation, and the MOA figures cannot show it: a cell's mechanism is only partly its phenotype."""
    from training.eval.knn import evaluate_tag, knn_splits

    phenotype, names = cell_phenotypes(config, np.asarray(held.labels["indices"], np.int64), truth_path)
    splits = knn_splits(phenotype, config.eval, config.run.seed)
    out = {}
    for tag in (tags.FINAL, *tags.BASELINES, tags.HYBRID):
        if tag in sets:
            entry = evaluate_tag(sets[tag], phenotype, splits, config.eval, len(names), held.batches)
            row, nsb = row_of(entry), entry.get("not_same_batch")
            out["trained" if tag == tags.FINAL else tag] = {
                "knn_top1": row["knn_top1"], "knn_not_same_batch_top1": row["knn_not_same_batch_top1"],
                "per_phenotype_not_same_batch": None if not nsb else dict(zip(names, nsb["per_class_top1"]))}
    return out


def scored_sets(config: Config, layout: RunLayout, held: HeldOut) -> dict[str, Any]:
    """The run's feature sets of the evaluated cells, the hybrid among them where the run scores it:
    read once for both of the benchmark's other protocols."""
    from training.eval.profiles.hybrid import with_hybrid
    from training.rundir.artifacts import load_tagged_features

    sets = load_tagged_features(layout, held.labels)
    return with_hybrid(sets) if config.eval.hybrid_cellprofiler else sets


def other_protocol(config: Config, held: HeldOut, sets: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """kNN and not-same-batch kNN of the trained model and the baselines (`sets`, scored_sets') with
    eval.knn_whiten flipped, so that each feature set can be read at the protocol that suits it best."""
    import dataclasses

    from training.eval.knn import evaluate_tag

    settings = dataclasses.replace(config.eval, knn_whiten=not config.eval.knn_whiten)
    classes = len(held.labels["class_names"])
    return {("trained" if tag == tags.FINAL else tag): row_of(evaluate_tag(sets[tag], held.y, held.splits,
                                                                           settings, classes, held.batches))
            for tag in (tags.FINAL, *tags.BASELINES, tags.HYBRID) if tag in sets}


def other_profiles(config: Config, layout: RunLayout, held: HeldOut,
                   sets: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Activity and consistency mAP of the trained model and the baselines (`sets`, scored_sets') under
    each well-profile protocol the run does not use, so that each baseline is read at the one that
    suits it best: plain ZCA where the run shrinks its sphering (eval.spherize_shrinkage > 0),
    "spherize_plain"; the other aggregation (eval.profile_aggregation), e.g. "mean_profiles"; and both,
    e.g. "mean_profiles_spherize_plain"; where the run sets subpopulation shares beside the profiles
    (eval.profile_subpopulations), the run's protocol and each of those without them, "no_subpopulations",
    "mean_profiles_no_subpopulations", ...; and where the run sets the standard median profile beside
    them (eval.profile_median_beside), every protocol so far also without it, "no_median_beside",
    "spherize_plain_no_median_beside", .... Keyed by protocol, then by feature set. The wells are
    found once; each protocol only changes how their profiles are made and sphered (MapSetup's fields)."""
    import dataclasses

    from training.eval.profiles.wells import AGGREGATIONS
    from training.eval.retrieval import profiled_features, tag_map

    shrinks = "spherize" in config.eval.profile_normalization and config.eval.spherize_shrinkage > 0
    other = next(a for a in AGGREGATIONS if a != config.eval.profile_aggregation)
    protocols = {**({"spherize_plain": {"sphere_shrinkage": 0.0}} if shrinks else {}),
                 f"{other}_profiles": {"aggregation": other},
                 **({f"{other}_profiles_spherize_plain": {"aggregation": other, "sphere_shrinkage": 0.0}}
                    if shrinks else {})}
    if config.eval.profile_subpopulations:
        protocols = {**protocols, "no_subpopulations": {"subpopulations": 0},
                     **{f"{name}_no_subpopulations": {**changes, "subpopulations": 0} for name, changes in protocols.items()}}
    if config.eval.profile_median_beside:
        protocols = {**protocols, "no_median_beside": {"median_beside": 0.0},
                     **{f"{name}_no_median_beside": {**changes, "median_beside": 0.0} for name, changes in protocols.items()}}
    setup, scored = profiled_features(config, layout, held.labels, sets)
    if setup is None:
        return {}
    chosen = [tag for tag in (tags.FINAL, *tags.BASELINES, tags.HYBRID) if tag in scored]
    return {name: {("trained" if tag == tags.FINAL else tag):
                   map_row(tag_map(scored[tag][0], dataclasses.replace(scored[tag][1], **changes), config.run.seed))
                   for tag in chosen}
            for name, changes in protocols.items()}


def leads(rows: dict[str, Any], other: dict[str, Any], of: str = "trained") -> dict[str, float | None]:
    """`of`'s figures (the run's protocol; the trained model by default) minus each baseline's better one
    over both kNN protocols: the lead that does not depend on the protocol favouring the model."""
    out = {}
    for name in rows:
        if name in ("trained", ORACLE, tags.HYBRID, of):
            continue
        for key in ("knn_top1", "knn_not_same_batch_top1"):
            values = [v for v in (rows[name].get(key), other.get(name, {}).get(key)) if v is not None]
            mine = rows[of].get(key)
            out[f"{key}_over_{name}"] = None if mine is None or not values else round(mine - max(values), 4)
    return out


GOALS = {"nsb_over_cellprofiler": 0.03, "nsb_over_raw_pixels": 0.05, "nsb_share_of_oracle": 0.9}
"""Issue #48's bar: not-same-batch kNN 3 points above CellProfiler's and 5 above raw pixels' (each at
its better protocol), NSB at least 0.9 of the oracle's, activity and consistency mAP at least
CellProfiler's."""


def goal_figures(rows: dict[str, Any], lead: dict[str, float | None], of: str,
                 protocols: dict[str, dict[str, dict[str, Any]]] | None = None) -> dict[str, float | None]:
    """The figures GOALS' bars read for `of` (trained or hybrid): its not-same-batch kNN, its leads over
    CellProfiler and raw pixels at their better protocol (`lead`, leads'), its share of the oracle's,
    its activity and consistency mAP, and CellProfiler's best activity and consistency over the run's
    well profiles and every other protocol (`protocols`, other_profiles'), each measure on its own.
    None where a figure is missing."""
    mine, oracle = rows[of], rows.get(ORACLE, {})
    best = {key: cellprofiler_best(rows, protocols, key)[1].get(key) for key in ("map_activity", "map_consistency")}
    nsb = "knn_not_same_batch_top1"
    return {"nsb": mine.get(nsb),
            "nsb_over_cellprofiler": lead.get(f"{nsb}_over_{tags.CELLPROFILER}"),
            "nsb_over_raw_pixels": lead.get(f"{nsb}_over_{tags.RAW_PIXELS}"),
            "nsb_share_of_oracle": None if mine.get(nsb) is None or not oracle.get(nsb) else mine[nsb] / oracle[nsb],
            "activity": mine.get("map_activity"), "consistency": mine.get("map_consistency"),
            "cellprofiler_activity": best["map_activity"], "cellprofiler_consistency": best["map_consistency"]}


def cellprofiler_best(rows: dict[str, Any], protocols: dict[str, dict[str, dict[str, Any]]] | None,
                      key: str) -> tuple[str | None, dict[str, Any]]:
    """The protocol ("run": the run's own) and figures of CellProfiler's best `key` (map_activity or
    map_consistency) over the run's well profiles and every other protocol; (None, {}) where none has it."""
    readings = [("run", rows.get(tags.CELLPROFILER, {})),
                *((name, figures.get(tags.CELLPROFILER, {})) for name, figures in (protocols or {}).items())]
    scored = [(name, reading) for name, reading in readings if reading.get(key) is not None]
    return max(scored, key=lambda item: item[1][key]) if scored else (None, {})


TIE = 1e-9
"""Two mAPs closer than this are a tie (copairs gives a perfectly retrieved name exactly 1.0)."""


def paired_gap(mine: dict[str, float] | None, theirs: dict[str, float] | None) -> dict[str, Any] | None:
    """`mine` minus `theirs`, perturbation by perturbation (or group by group: the per-name mAPs map_row
    keeps) over the names both score: the mean difference, its standard error (the differences'
    standard deviation over the square root of their count) and how many names are ahead, tied and
    behind. A bar missed by less than two standard errors is a miss these wells cannot tell from a
    tie. None where fewer than two names are shared."""
    names = sorted(set(mine or {}) & set(theirs or {}))
    if len(names) < 2:
        return None
    d = np.array([mine[n] - theirs[n] for n in names], np.float64)
    side = np.where(np.abs(d) <= TIE, 0, np.sign(d))
    return {"difference": round(float(d.mean()), 4), "standard_error": round(float(d.std(ddof=1) / np.sqrt(d.size)), 4),
            "ahead": int(np.sum(side > 0)), "tied": int(np.sum(side == 0)), "behind": int(np.sum(side < 0)),
            "per_name": {n: round(float(x), 4) for n, x in zip(names, d)}}


def gaps_to_cellprofiler(rows: dict[str, Any], of: str,
                         protocols: dict[str, dict[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """`of`'s activity and consistency (the run's protocol) against CellProfiler at its best protocol for
    each (cellprofiler_best's), compound by compound and mechanism by mechanism (paired_gap's), so that
    a bar met or missed by a few thousandths is read against how much the compounds scatter."""
    out = {}
    for key, per in (("map_activity", "per_treatment_activity"), ("map_consistency", "per_group_consistency")):
        protocol, theirs = cellprofiler_best(rows, protocols, key)
        gap = paired_gap(rows[of].get(per), theirs.get(per))
        out[key.removeprefix("map_")] = None if gap is None else {"cellprofiler_protocol": protocol, **gap}
    return out


def bars_met(figures: dict[str, float | None]) -> dict[str, bool | None]:
    """Whether goal_figures' `figures` meet each of GOALS' bars; None where a figure is missing."""
    def at_least(value: float | None, bar: float | None) -> bool | None:
        return None if value is None or bar is None else bool(value >= bar - 1e-12)

    return {**{name: at_least(figures[name], bar) for name, bar in GOALS.items()},
            "activity_at_least_cellprofiler": at_least(figures["activity"], figures["cellprofiler_activity"]),
            "consistency_at_least_cellprofiler": at_least(figures["consistency"], figures["cellprofiler_consistency"])}


def goals(rows: dict[str, Any], lead: dict[str, float | None], of: str,
          protocols: dict[str, dict[str, dict[str, Any]]] | None = None) -> dict[str, bool | None]:
    """Whether `of` (trained or hybrid) meets each of GOALS' bars (goal_figures', bars_met's)."""
    return bars_met(goal_figures(rows, lead, of, protocols))


def row_of(entry: dict[str, Any]) -> dict[str, Any]:
    """The figures of one feature set."""
    def best(e: dict[str, Any] | None) -> float | None:
        return None if not e else e["top1"][str(e["best_k"])]

    return {"knn_top1": best(entry), "knn_not_same_batch_top1": best(entry.get("not_same_batch")), **map_row(entry)}


def map_row(entry: dict[str, Any]) -> dict[str, Any]:
    """The mAP figures of one feature set: activity's and consistency's mean, how many were retrieved of
    how many, and each treatment's (each group's) mAP."""
    activity, consistency = entry.get("map") or {}, entry.get("map_consistency") or {}

    def per_name(scores: dict[str, Any]) -> dict[str, float] | None:
        per = {name: v["map"] for name, v in (scores.get("per_treatment") or {}).items() if v.get("map") is not None}
        return per or None

    return {"map_activity": activity.get("mean_map"), "treatments_retrieved": activity.get("n_significant"),
            "treatments": activity.get("n_treatments"), "map_consistency": consistency.get("mean_map"),
            "groups_retrieved": consistency.get("n_significant"), "groups": consistency.get("n_treatments"),
            "per_treatment_activity": per_name(activity), "per_group_consistency": per_name(consistency)}


def shares(row: dict[str, Any], oracle: dict[str, Any], chance: float) -> dict[str, float | None]:
    """Each figure as a share of the oracle's: kNN above chance over the oracle's above chance, mAP
    over the oracle's."""
    def ratio(key: str, offset: float) -> float | None:
        if row.get(key) is None or oracle.get(key) is None or oracle[key] - offset <= 0:
            return None
        return round((row[key] - offset) / (oracle[key] - offset), 3)

    return {"knn_top1": ratio("knn_top1", chance), "knn_not_same_batch_top1": ratio("knn_not_same_batch_top1", chance),
            "map_activity": ratio("map_activity", 0.0), "map_consistency": ratio("map_consistency", 0.0)}


def machine() -> dict[str, Any]:
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def run_screen_benchmark(config: Config, config_path: Path | None, overrides: list[str], *, ranks: int = 2,
                         reuse: bool = False, truth: Path | None = None) -> dict[str, Any]:
    """The benchmark of the module docstring; returns its JSON payload."""
    if ranks < 1:
        raise UserError(f"--ranks must be at least 1, got {ranks}")
    start = time.perf_counter()
    seconds = run_chain(config, config_path, overrides, ranks=ranks, reuse=reuse)
    layout = RunLayout.from_config(config)
    knn = json.loads(layout.knn_json.read_text())
    entries = {tag: knn["tags"][tag] for tag in (tags.FINAL, *tags.BASELINES, tags.HYBRID) if tag in knn["tags"]}
    held = held_out(config, layout)
    entries[ORACLE] = oracle_entry(config, held, truth)
    chance = 1.0 / len(knn["class_names"])
    rows = {("trained" if tag == tags.FINAL else tag): row_of(entry) for tag, entry in entries.items()}
    sets = scored_sets(config, layout, held)
    other = other_protocol(config, held, sets)
    protocols = other_profiles(config, layout, held, sets)
    phenotypes = phenotype_figures(config, held, sets, truth)
    read = {name: goal_figures(rows, leads(rows, other, of=name), name, protocols)
            for name in ("trained", tags.HYBRID) if name in rows}
    screen_json = Path(config.ingest.table).parent / "screen.json"
    screen = json.loads(screen_json.read_text()) if screen_json.is_file() else {}
    return {
        "benchmark": "screen", "date": date.today().isoformat(), "machine": machine(),
        "config": str(config_path) if config_path else None, "overrides": overrides, "ranks": ranks,
        "screen": {"seed": screen.get("seed"), "cells": screen.get("cells"), **screen.get("sizes", {})},
        "n_reference": knn["n_reference"], "n_query": knn["n_query"], "knn_folds": knn.get("folds", 1),
        "classes": knn["class_names"],
        "chance": round(chance, 4), "oracle_phenotypes": entries[ORACLE]["phenotypes"],
        "seconds": seconds, "seconds_total": round(time.perf_counter() - start, 1),
        "knn_whitened": config.eval.knn_whiten, "figures": rows,
        "share_of_oracle": {name: shares(row, rows[ORACLE], chance) for name, row in rows.items()},
        "figures_knn_whitened" if not config.eval.knn_whiten else "figures_knn_plain": other,
        "lead_over_best_protocol": leads(rows, other),
        **{f"figures_{name}": figures for name, figures in protocols.items()},
        "figures_phenotype": phenotypes,
        "goal_figures": read,
        "goals": {name: bars_met(figures) for name, figures in read.items()},
        "gaps_to_cellprofiler": {name: gaps_to_cellprofiler(rows, name, protocols) for name in read},
    }


def markdown(result: dict[str, Any]) -> str:
    """The figures as a table, for the log and the docs."""
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    lines = ["| features | kNN top-1 % | not same batch % | mAP activity | retrieved | mAP consistency | groups |",
             "|---|---|---|---|---|---|---|"]
    for name, r in result["figures"].items():
        retrieved = "-" if r["treatments"] is None else f"{r['treatments_retrieved']} / {r['treatments']}"
        groups = "-" if not r["groups"] else f"{r['groups_retrieved']} / {r['groups']}"
        lines.append(f"| {name} | {pct(r['knn_top1'])} | {pct(r['knn_not_same_batch_top1'])} | "
                     f"{num(r['map_activity'])} | {retrieved} | {num(r['map_consistency'])} | {groups} |")
    lines += [f"\n{name}'s {measure} minus CellProfiler's best ({gap['cellprofiler_protocol']}): "
              f"{gap['difference']:+.3f} +- {gap['standard_error']:.3f} (standard error over {len(gap['per_name'])}: "
              f"{gap['ahead']} ahead, {gap['tied']} tied, {gap['behind']} behind)"
              for name, gaps in result["gaps_to_cellprofiler"].items() for measure, gap in gaps.items() if gap is not None]
    return "\n".join(lines)
