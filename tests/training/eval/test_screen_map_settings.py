"""The knn step's retrieval mAP on a screen-like run (tests/support/screen_run.py): a screen without
controls says so in knn.json and knn.md instead of scoring every treatment against every other; a
consistency column that names no column, and sphering with too few control wells, are one line
naming the setting."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.screen_run import screen_run
from tests.support.tiny import run_cli
from training.errors import UserError
from training.eval.profiles.normalization import WellContext, normalize_profiles
from training.eval.retrieval import NO_CONTROLS
from training.rundir import RunLayout


def test_without_controls_knn_says_there_is_no_activity_and_scores_consistency(tmp_path):
    config = screen_run(tmp_path, **{"data.control_column": "", "data.control_value": "",
                                     "eval.consistency_column": "Metadata_Batch"})
    assert run_cli(config, "knn") == 0
    layout = RunLayout.from_config(config)
    knn = json.loads(layout.knn_json.read_text())
    assert knn["map"]["skipped"] == NO_CONTROLS
    for entry in knn["tags"].values():
        assert entry["map"]["mean_map"] is None and entry["map"]["skipped"] == NO_CONTROLS
        assert entry["map_consistency"]["active_filter"] == "none (no controls)"
    assert f"mAP: {NO_CONTROLS}." in layout.knn_md.read_text()


def test_a_consistency_column_that_names_nothing_is_one_line(tmp_path, capsys):
    config = screen_run(tmp_path, **{"eval.consistency_column": "Metadata_Target"})
    assert run_cli(config, "knn") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: eval.consistency_column='Metadata_Target' names no column of the per-cell table")


def test_sphering_needs_two_control_wells():
    profiles = np.random.default_rng(0).standard_normal((6, 3))
    one = np.array([True, False, False, False, False, False])
    with pytest.raises(UserError, match="sphering needs at least 2 control wells, got 1"):
        normalize_profiles(profiles, ("spherize",), WellContext(np.array(["P1"] * 6, dtype=object), one))
