"""Subpopulation shares beside a well's profile (training/eval/profiles/subpopulations.py), checked
against what the cells were made of: cells drawn from known, well-separated states give each well
its true mixture of them (up to the clusters' order); a cell's subpopulation is its nearest centre
as scipy's distance matrix finds it; the shares are centred on the controls and hold the configured
part of the squared norm; a perturbation that moves half of its cells one way and half the other,
leaving the well's mean where the controls' is, is retrieved with the shares and not without; and a
pilot's centres, written and read back, count new cells by scipy's nearest centre, for features of
their model only."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from tests.support.tiny import tiny_config
from training.config import ConfigError
from training.errors import UserError
from training.eval.profiles.subpopulations import (
    against_pilot,
    beside_shares,
    controls_shift,
    nearest,
    read_centres,
    signatures,
    subpopulations,
    well_shares,
    write_centres,
)
from training.eval.profiles.wells import group_wells
from training.eval.retrieval import MapSetup, tag_map, well_profiles
from training.models.card import ModelCard, Recipe


def _states(dim: int = 16) -> np.ndarray:
    """Four orthogonal unit directions: cell states k-means cannot confuse."""
    return np.eye(dim, dtype=np.float32)[:4] * 3.0


def test_each_wells_shares_are_the_mixture_its_cells_were_drawn_from():
    rng = np.random.default_rng(0)
    mixtures = np.array([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0.25, 0.25, 0.25, 0.25], [0, 0, 0.75, 0.25],
                         [0, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]])
    cells_per_well = 40
    states = np.concatenate([rng.permutation(np.repeat(np.arange(4), np.round(m * cells_per_well).astype(int)))
                             for m in mixtures])
    features = _states()[states] + 0.05 * rng.standard_normal((len(states), 16)).astype(np.float32)
    shuffle = rng.permutation(len(states))  # cells stored in no well order: the grouping must find them
    features, wells_of = features[shuffle], np.repeat(np.arange(len(mixtures)), cells_per_well)[shuffle]
    wells = group_wells(np.zeros(len(states), np.int64), wells_of)
    shares = well_shares(features, wells, 4, seed=3)
    # match clusters to states through the wells of one state alone
    cluster_of_state = {state: int(np.argmax(shares[well])) for state, well in ((0, 0), (1, 4))}
    assert cluster_of_state[0] != cluster_of_state[1]
    recovered = {tuple(np.sort(row)) for row in shares}
    assert recovered == {tuple(np.sort(m)) for m in mixtures}
    np.testing.assert_allclose(shares[1][[cluster_of_state[0], cluster_of_state[1]]], [0.5, 0.5])
    np.testing.assert_allclose(shares.sum(axis=1), 1.0)


def test_a_cell_belongs_to_the_centre_nearest_its_unit_features_read_a_block_at_a_time():
    rng = np.random.default_rng(1)
    features = rng.standard_normal((300, 8)).astype(np.float32) * rng.uniform(0.1, 10, (300, 1)).astype(np.float32)
    centres = rng.standard_normal((5, 8)).astype(np.float32)
    rows = rng.permutation(300)[:250]
    unit = features[rows] / np.linalg.norm(features[rows], axis=1, keepdims=True)
    expected = np.argmin(cdist(unit, centres), axis=1)
    np.testing.assert_array_equal(nearest(features, rows, centres, block_cells=7), expected)
    np.testing.assert_array_equal(nearest(features, rows, centres), expected)


def test_the_centres_are_fitted_on_a_seeded_sample_and_refuse_more_subpopulations_than_cells():
    rng = np.random.default_rng(2)
    features = _states()[rng.integers(0, 4, 500)] + 0.05 * rng.standard_normal((500, 16)).astype(np.float32)
    rows = np.arange(500)
    first = subpopulations(features, rows, 4, seed=5, sample=120)
    np.testing.assert_array_equal(first, subpopulations(features, rows, 4, seed=5, sample=120))
    # four states found from 120 of the cells: every centre points at one state
    assert sorted(np.argmax(first, axis=1)) == [0, 1, 2, 3]
    with pytest.raises(UserError, match="eval.profile_subpopulations=8 .* 6 profiled cells"):
        subpopulations(features, rows[:6], 8, seed=5)


def test_the_shares_are_centred_on_the_controls_and_hold_their_weight_of_the_squared_norm():
    rng = np.random.default_rng(3)
    profiles = rng.standard_normal((12, 10)) * 4
    shares = rng.dirichlet(np.ones(5), size=12)
    controls = np.zeros(12, bool)
    controls[:4] = True
    out = beside_shares(profiles, shares, controls, 0.2).astype(np.float64)
    assert out.shape == (12, 15)
    profile_part, share_part = out[:, :10], out[:, 10:]
    np.testing.assert_allclose(share_part[controls].mean(axis=0), 0.0, atol=1e-6)
    power = np.sum(out ** 2, axis=1).mean()
    assert np.sum(share_part ** 2, axis=1).mean() / power == pytest.approx(0.2, rel=1e-5)
    # each block is only scaled: the profile block's direction is the profiles', the shares' theirs less the controls'
    np.testing.assert_allclose(profile_part / np.linalg.norm(profile_part), profiles / np.linalg.norm(profiles),
                               atol=1e-6)
    centred = shares - shares[:4].mean(axis=0)
    np.testing.assert_allclose(share_part / np.linalg.norm(share_part), centred / np.linalg.norm(centred), atol=1e-6)
    with pytest.raises(ValueError, match="in \\(0, 1\\)"):
        beside_shares(profiles, shares, controls, 1.0)


def _mixture_screen(rng: np.random.Generator):
    """Two plates of 6 control wells, whose cells sit midway between two states, and 6 wells of each
    of two perturbations, whose cells are half at one state and half at the other: a treated well's
    mean is the controls' (up to noise), its subpopulations are not."""
    states = _states(12)
    middle = (states[0] + states[1]) / 2
    features, plates, wells, perturbations = [], [], [], []
    for plate in range(2):
        for well in range(18):
            kind = "DMSO" if well < 6 else ("A" if well < 12 else "B")
            if kind == "DMSO":
                cells = np.repeat(middle[None], 20, axis=0)
            else:
                first, second = (0, 1) if kind == "A" else (2, 3)
                cells = np.concatenate([np.repeat(states[first][None], 10, 0), np.repeat(states[second][None], 10, 0)])
                cells = cells - cells.mean(axis=0) + middle  # the same mean as the controls
            features.append(cells + 0.1 * rng.standard_normal(cells.shape))
            plates += [plate] * 20
            wells += [well] * 20
            perturbations.append(kind)
    grouped = group_wells(np.asarray(plates), np.asarray(wells))
    perturbations = np.asarray(perturbations, dtype=object)
    keys = np.asarray([f"{p}/{w}" for p in range(2) for w in range(18)], dtype=object)
    setup = MapSetup(grouped, perturbations, np.repeat(np.array(["p0", "p1"], dtype=object), 18), keys,
                     perturbations == "DMSO", None, None, (), {}, None, aggregation="mean")
    return np.concatenate(features).astype(np.float32), setup


def test_a_perturbation_that_splits_its_cells_is_retrieved_by_its_shares_not_its_mean():
    import dataclasses

    features, setup = _mixture_screen(np.random.default_rng(4))
    alone = tag_map(features, setup, seed=0)["map"]
    beside = tag_map(features, dataclasses.replace(setup, subpopulations=5, subpopulations_weight=0.5), seed=0)["map"]
    assert beside["n_significant"] == 2 and beside["mean_map"] > 0.95
    assert alone["mean_map"] < beside["mean_map"] - 0.2


@pytest.mark.parametrize("changes, message", [
    ({"eval.profile_subpopulations": 1}, "0 \\(the profile alone\\) or a number of subpopulations >= 2"),
    ({"eval.profile_subpopulations": -3}, "got -3"),
    ({"eval.profile_subpopulations": True}, "got True"),
    ({"eval.profile_subpopulations_weight": 0.0}, "eval.profile_subpopulations_weight must be in \\(0, 1\\)"),
    ({"eval.profile_subpopulations_weight": 1.5}, "got 1.5"),
    ({"eval.profile_subpopulation_centres": "pilot/profiles/subpopulations.parquet"},
     "eval.profile_subpopulations is 0 \\(no shares\\): set it to the file's number of subpopulations"),
])
def test_bad_subpopulation_settings_are_one_line_naming_the_key(changes, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(changes)


def _card(step: int) -> dict:
    return ModelCard(("DNA", "RNA"), (0, 1), recipe=Recipe(run="pilot", arch="vit_tiny", global_step=step,
                                                        config_sha256="ab" * 32)).to_dict()


def _pilot_centres(tmp_path, rng, k: int = 4, dim: int = 16):
    """A pilot's centres, as export writes them: k unit directions with the card of step 100."""
    centres = _states(dim)[:k] / 3.0 + 0.01 * rng.standard_normal((k, dim)).astype(np.float32)
    path = tmp_path / "subpopulations.parquet"
    write_centres(path, centres, [f"f{i}" for i in range(dim)], np.arange(k) + 10, _card(100),
                  {"fitted": {"cells": 500, "run": "pilot"}})
    return centres, path


def test_a_pilots_centres_read_back_count_new_cells_by_the_nearest_centre(tmp_path):
    rng = np.random.default_rng(5)
    centres, path = _pilot_centres(tmp_path, rng)
    carried = read_centres(path)
    np.testing.assert_array_equal(carried.centres, centres)
    assert carried.card == _card(100) and carried.k == 4 and carried.about["fitted"]["cells"] == 500
    # new plates whose cells sit near two of the pilot's four states only: a k-means of their own would
    # split those two into four; the pilot's centres keep them in the pilot's subpopulations
    features = _states()[rng.choice([0, 2], 240)] + 0.4 * rng.standard_normal((240, 16)).astype(np.float32)
    wells_of = np.repeat(np.arange(6), 40)
    wells = group_wells(np.zeros(240, np.int64), wells_of)
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    members = np.argmin(cdist(unit, centres), axis=1)
    expected = np.stack([np.bincount(members[wells_of == w], minlength=4) / 40 for w in range(6)])
    np.testing.assert_allclose(well_shares(features, wells, 4, seed=0, carried=carried), expected)
    assert expected[:, [1, 3]].sum() < 0.05 * 6  # the two states the new cells lack hold (almost) none
    refit = well_shares(features, wells, 4, seed=0)
    assert (refit > 0.05).sum(axis=0).min() > 0  # fitted on the new cells, all four clusters hold cells


def test_carried_centres_count_only_their_models_features_and_refuse_others_in_one_line(tmp_path, caplog):
    import dataclasses
    import logging

    rng = np.random.default_rng(6)
    _, path = _pilot_centres(tmp_path, rng, dim=12)
    carried = read_centres(path)
    assert carried.fits(_card(100), 12) == ""
    assert "differ in recipe" in carried.fits(_card(200), 12) and "step 200" in carried.fits(_card(200), 12)
    assert "12-wide, the features 8-wide" in carried.fits(_card(100), 8)
    assert "carry no model card" in carried.fits(None, 12)
    with pytest.raises(UserError, match="holds 4 subpopulations, eval.profile_subpopulations asks for 3: set it to 4"):
        carried.check(_card(100), 12, 3, "features/final")
    with pytest.raises(UserError, match="cannot count features/final: their model cards differ in recipe"):
        carried.check(_card(200), 12, 4, "features/final")
    # retrieval's profiles: the carried centres for the model's features, the set's own fit for any other
    features, setup = _mixture_screen(np.random.default_rng(4))
    setup = dataclasses.replace(setup, subpopulations=4, subpopulations_weight=0.5, centres=carried)
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    members = np.argmin(cdist(unit[setup.wells.order], carried.centres), axis=1)
    well_of = np.repeat(np.arange(setup.wells.count), setup.wells.sizes)
    counted = np.stack([np.bincount(members[well_of == w], minlength=4) for w in range(setup.wells.count)])
    plain = well_profiles(features, dataclasses.replace(setup, subpopulations=0), seed=0).profiles
    expected = beside_shares(plain, counted / setup.wells.sizes[:, None], setup.controls, 0.5)
    np.testing.assert_allclose(well_profiles(features, setup, seed=0, card=_card(100)).profiles, expected, atol=1e-6)
    with caplog.at_level(logging.INFO):
        other = well_profiles(features, setup, seed=0, card=_card(200)).profiles
    assert [r for r in caplog.records if "subpopulations of their own, not " in r.message]
    fitted = beside_shares(plain, well_shares(features, setup.wells, 4, 0), setup.controls, 0.5)
    np.testing.assert_allclose(other, fitted, atol=1e-6)


def test_a_centres_file_that_is_missing_or_another_file_is_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pytest.raises(UserError, match="subpopulations.parquet: no such file"):
        read_centres(tmp_path / "subpopulations.parquet")
    pq.write_table(pa.table({"Metadata_Plate": ["P1"], "f0": [0.5]}), tmp_path / "wells.parquet")
    with pytest.raises(UserError, match="holds no subpopulation centres"):
        read_centres(tmp_path / "wells.parquet")
    (tmp_path / "notes.parquet").write_text("not parquet")
    with pytest.raises(UserError, match="is not a Parquet file"):
        read_centres(tmp_path / "notes.parquet")


def test_new_plates_are_read_against_the_pilots_controls_and_perturbations():
    """controls_shift is half the L1 distance of two mixtures (total variation: 0 alike, 1 disjoint);
    a perturbation's signature is its treated wells' mean shares less the controls'; against_pilot
    finds each new perturbation's nearest of the pilot's by the cosine of their signatures."""
    assert controls_shift(np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.5, 0.5])) == pytest.approx(1.0)
    assert controls_shift(np.array([0.25] * 4), np.array([0.25] * 4)) == 0.0
    assert controls_shift(np.array([0.7, 0.3]), np.array([0.5, 0.5])) == pytest.approx(0.2)
    shares = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.9, 0.1, 0.0], [0.1, 0.1, 0.8], [0.2, 0.0, 0.8]])
    perturbations = np.array(["DMSO", "DMSO", "A", "B", "B"], dtype=object)
    controls = perturbations == "DMSO"
    found = signatures(shares, perturbations, controls)
    assert list(found) == ["A", "B"]
    np.testing.assert_allclose(found["A"], [0.4, -0.4, 0.0], atol=1e-6)
    np.testing.assert_allclose(found["B"], [-0.35, -0.45, 0.8], atol=1e-6)
    # the pilot: A and B as here, C another direction; a new screen whose A reads as the pilot's B
    pilot = {"control_shares": [0.5, 0.5, 0.0], "signatures": {"A": [0.4, -0.4, 0.0], "B": [-0.35, -0.45, 0.8],
                                                                "C": [-0.5, 0.5, 0.0]}}
    versus = against_pilot(shares[controls].mean(axis=0), found, pilot)
    cosine = 1 - cdist(np.array([found["A"], found["B"]]), np.array(list(pilot["signatures"].values())), "cosine")
    assert versus == {"controls_shift": 0.0, "perturbations": 2, "nearest_is_itself": 2, "cosine_same": 1.0,
                      "cosine_others": pytest.approx(np.mean([cosine[0, 1], cosine[0, 2], cosine[1, 0], cosine[1, 2]]),
                                                     abs=1e-4)}
    swapped = against_pilot(np.array([0.5, 0.5, 0.0]), {"A": found["B"], "B": found["A"]}, pilot)
    assert swapped["nearest_is_itself"] == 0 and swapped["cosine_same"] == pytest.approx(cosine[0, 1], abs=1e-4)
    assert against_pilot(np.array([0.6, 0.4, 0.0]), {"A": found["A"]}, pilot) == {"controls_shift": 0.1,
                                                                                  "perturbations": 1}
