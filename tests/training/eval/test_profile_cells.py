"""eval.profile_cells: all on a screen-like run (tests/support/screen_run.py) through the real `knn`
step: the well profiles of final, CellProfiler's set and their hybrid are the medians of every cell
of a well, a set that covers the evaluated cells only (a numbered epoch, the fixture's raw pixels) is
scored on those, knn.json says which, and the mAP equals the average precision computed here from
its definition (tests/training/eval/test_retrieval.py) on medians and hybrids computed here; with
eval.profile_aggregation: mean, on means computed here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.screen_run import features_of, plate_map, screen_run
from tests.support.tiny import run_cli
from tests.training.eval.test_retrieval import activity_by_definition
from training.config.validation import ConfigError
from training.rundir import RunLayout, tags
from training.rundir.artifacts import load_labels
from training.rundir.features import FeatureSet, load_features, save_features

CELLS_PER_WELL = 8


def well_activity(features: np.ndarray, columns: dict[str, list], rows: np.ndarray,
                  aggregate=np.median) -> dict[str, float]:
    """Activity mAP per treatment of the medians (or `aggregate`s) of `rows`' cells (`features` indexed
    by table row), well by well, from the definition."""
    plates = np.asarray(columns["Metadata_Plate"], dtype=object)[rows]
    wells = np.asarray(columns["Metadata_Well"], dtype=object)[rows]
    treatments = np.asarray(columns["Metadata_Treatment"], dtype=object)[rows]
    features = features[rows]
    keys = sorted(set(zip(plates, wells)))
    medians, well_plates, well_treatments = [], [], []
    for plate, well in keys:
        mine = (plates == plate) & (wells == well)
        medians.append(aggregate(np.asarray(features[mine], np.float64), axis=0))
        well_plates.append(plate)
        well_treatments.append(treatments[mine][0])
    perturbations = np.asarray(well_treatments, dtype=object)
    return activity_by_definition(np.asarray(medians), perturbations, np.asarray(well_plates, dtype=object),
                                  perturbations == "DMSO")


def block(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return (x - x.mean(axis=0)) / x.std(axis=0) / np.sqrt(x.shape[1])


def test_every_cell_of_a_well_is_profiled_and_knn_json_says_which(tmp_path):
    config = screen_run(tmp_path, cells_per_well=CELLS_PER_WELL,
                        **{"eval.profile_cells": "all", "eval.hybrid_cellprofiler": True})
    layout = RunLayout.from_config(config)
    columns = plate_map(CELLS_PER_WELL)
    every = np.arange(len(columns["Metadata_Plate"]))
    evaluated = np.asarray(load_labels(layout)["indices"])
    epoch = features_of(columns, dim=8, batch_strength=1.0, seed=4)[evaluated]
    save_features(layout.features(tags.epoch_tag(2)), FeatureSet(epoch, evaluated, {"kind": "checkpoint", "epoch": 2}))
    measured = features_of(columns, dim=12, batch_strength=0.5, seed=5) * np.linspace(1, 50, 12, dtype=np.float32)
    save_features(layout.features(tags.CELLPROFILER), FeatureSet(measured, every, {"kind": tags.CELLPROFILER}))

    assert run_cli(config, "knn") == 0
    knn = json.loads(layout.knn_json.read_text())
    assert knn["map"]["profiles"] == "median of each well's cells"
    assert {tag: entry["map_cells"] for tag, entry in knn["tags"].items()} == {
        tags.FINAL: "all", tags.epoch_tag(2): "evaluated", tags.RAW_PIXELS: "evaluated",
        tags.RANDOM_INIT: "evaluated", tags.CELLPROFILER: "all", tags.HYBRID: "all"}

    final = np.asarray(load_features(layout.features(tags.FINAL)).features)
    hybrid = np.concatenate([block(final), block(measured)], axis=1)
    expected = {tags.FINAL: well_activity(final, columns, every), tags.HYBRID: well_activity(hybrid, columns, every),
                tags.epoch_tag(2): well_activity(_spread(epoch, evaluated, len(every)), columns, evaluated)}
    for tag, per_treatment in expected.items():
        scored = knn["tags"][tag]["map"]["per_treatment"]
        for name, value in per_treatment.items():
            assert scored[name]["map"] == pytest.approx(value, abs=1e-6), (tag, name)
    # the fixture's wells differ between all cells and the evaluated half, so the check above can fail
    assert well_activity(final, columns, every) != pytest.approx(well_activity(final, columns, evaluated), abs=1e-6)
    assert "median of every cell of the well" in layout.knn_md.read_text()


def _spread(features: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """Features of `rows` placed at their table rows in an (n, D) array."""
    out = np.zeros((n, features.shape[1]), features.dtype)
    out[rows] = features
    return out


def test_profiling_every_cell_needs_every_cell_embedded(tmp_path):
    with pytest.raises(ConfigError, match="eval.embed_all_cells"):
        screen_run(tmp_path, **{"eval.profile_cells": "all", "eval.embed_all_cells": False})


def test_mean_profiles_are_each_wells_mean_and_knn_json_says_so(tmp_path):
    """eval.profile_aggregation: mean through the real `knn` step: each tag's activity mAP is the one
    of the wells' means computed here, which differs from the medians' on these wells."""
    config = screen_run(tmp_path, cells_per_well=CELLS_PER_WELL,
                        **{"eval.profile_cells": "all", "eval.profile_aggregation": "mean"})
    layout = RunLayout.from_config(config)
    columns = plate_map(CELLS_PER_WELL)
    every = np.arange(len(columns["Metadata_Plate"]))
    assert run_cli(config, "knn") == 0
    knn = json.loads(layout.knn_json.read_text())
    assert knn["map"]["profiles"] == "mean of each well's cells" and knn["map"]["aggregation"] == "mean"
    final = np.asarray(load_features(layout.features(tags.FINAL)).features)
    expected = well_activity(final, columns, every, np.mean)
    scored = knn["tags"][tags.FINAL]["map"]["per_treatment"]
    for name, value in expected.items():
        assert scored[name]["map"] == pytest.approx(value, abs=1e-6), name
    assert expected != pytest.approx(well_activity(final, columns, every), abs=1e-6)  # the means are not the medians
    assert "mean of every cell of the well" in layout.knn_md.read_text()
