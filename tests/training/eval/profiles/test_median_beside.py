"""The field's standard median profile beside the configured one (eval.profile_median_beside),
checked against references computed here: the blend's cosine between two wells is the weighted mean
of the two blocks' cosines as scipy computes them; the second block is each well's numpy median,
sphered by a ZCA whitening written out from the controls' covariance (the published formula, not
pycytominer's code), at unit norm; the first is the configured profile at unit norm; and a bad
weight is one line naming the key."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from tests.support.tiny import tiny_config
from training.config import ConfigError
from training.eval.profiles.normalization import SPHERE_EPSILON, beside_unit
from training.eval.profiles.wells import group_wells
from training.eval.retrieval import MapSetup, well_profiles


def test_the_cosine_beside_a_second_block_is_the_weighted_mean_of_the_blocks_cosines():
    rng = np.random.default_rng(5)
    first, second = rng.standard_normal((9, 7)) * 3, rng.standard_normal((9, 4)) + 1
    for weight in (0.2, 0.5, 0.9):
        blended = beside_unit(first, second, weight).astype(np.float64)
        expected = (1 - weight) * (1 - cdist(first, first, "cosine")) + weight * (1 - cdist(second, second, "cosine"))
        np.testing.assert_allclose(1 - cdist(blended, blended, "cosine"), expected, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(blended, axis=1), 1.0, atol=1e-6)


def test_a_row_of_zeros_stays_zeros_and_a_weight_outside_0_1_is_refused():
    first = np.array([[0.0, 0.0], [3.0, 4.0]])
    second = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out = beside_unit(first, second, 0.25)
    np.testing.assert_allclose(out, [[0, 0, 0.5, 0, 0], [0.6 * np.sqrt(0.75), 0.8 * np.sqrt(0.75), 0, 0, 0]],
                               atol=1e-7)
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="in \\(0, 1\\)"):
            beside_unit(first, second, bad)


def _screen(rng: np.random.Generator, dim: int = 6):
    """Two plates of 9 control wells and 5 wells of each of two perturbations, 11 cells a well, a few
    of them far off (so that a well's median is not its mean)."""
    features, plates, wells, perturbations = [], [], [], []
    shift = {"DMSO": np.zeros(dim), "A": np.eye(dim)[0] * 2, "B": np.eye(dim)[1] * 2}
    for plate in range(2):
        for well in range(19):
            kind = "DMSO" if well < 9 else ("A" if well < 14 else "B")
            cells = rng.standard_normal((11, dim)) + shift[kind]
            cells[0] += rng.standard_normal(dim) * 20
            features.append(cells)
            plates += [plate] * 11
            wells += [well] * 11
            perturbations.append(kind)
    grouped = group_wells(np.asarray(plates), np.asarray(wells))
    perturbations = np.asarray(perturbations, dtype=object)
    keys = np.asarray([f"{p}/{w}" for p in range(2) for w in range(19)], dtype=object)
    setup = MapSetup(grouped, perturbations, np.repeat(np.array(["p0", "p1"], dtype=object), 19), keys,
                     perturbations == "DMSO", None, None, ("spherize",), {}, None, aggregation="mean",
                     sphere_shrinkage=10.0)
    return np.concatenate(features).astype(np.float32), setup


def _zca(profiles: np.ndarray, controls: np.ndarray) -> np.ndarray:
    """ZCA whitening fitted on the control rows (Kessy et al. 2018): centred on their mean, times
    U diag(1 / sqrt(lambda + epsilon)) U^T of their covariance's eigenvectors U and eigenvalues lambda."""
    fit = profiles[controls]
    mean = fit.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(fit - mean, rowvar=False))
    return (profiles - mean) @ vectors @ np.diag(1 / np.sqrt(values + SPHERE_EPSILON)) @ vectors.T


def test_the_median_beside_is_each_wells_median_sphered_plainly_beside_the_profile_at_unit_norm():
    features, setup = _screen(np.random.default_rng(6))
    weight = 0.3
    out = well_profiles(features, dataclasses.replace(setup, median_beside=weight), seed=0).profiles.astype(np.float64)
    dim = features.shape[1]
    assert out.shape == (setup.wells.count, 2 * dim)
    medians = np.stack([np.median(features[setup.wells.order[a:b]], axis=0)
                        for a, b in zip(setup.wells.starts[:-1], setup.wells.starts[1:])])
    reference = _zca(medians, np.asarray(setup.controls, bool))
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    np.testing.assert_allclose(out[:, dim:] / np.sqrt(weight), reference, atol=1e-4)
    alone = well_profiles(features, setup, seed=0).profiles.astype(np.float64)
    np.testing.assert_allclose(out[:, :dim] / np.sqrt(1 - weight), alone / np.linalg.norm(alone, axis=1, keepdims=True),
                               atol=1e-5)
    # the two blocks differ (the mean with shrunk sphering is not the median sphered plainly)
    assert np.abs(out[:, :dim] / np.sqrt(1 - weight) - reference).max() > 0.1


@pytest.mark.parametrize("value, message", [
    (1.0, "eval.profile_median_beside must be in \\[0, 1\\)"),
    (-0.1, "got -0.1"),
    (True, "got True"),
])
def test_a_bad_median_weight_is_one_line_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config({"eval.profile_median_beside": value})
