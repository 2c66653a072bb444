"""Normalisation of per-well profiles (training/eval/profiles/normalization.py) against the definitions
the field's libraries document, computed here: per-plate robust scaling on the plate's controls
(pycytominer's mad_robustize: median and MAD x 1.4826), ZCA sphering that makes the controls white
on L2-normalised features like ours, Harmony oriented as harmonypy expects; bad settings named."""

from __future__ import annotations

from dataclasses import replace

import harmonypy
import numpy as np
import pytest

from training.config import Config, ConfigError
from training.errors import UserError
from training.eval.profiles.normalization import WellContext, check_steps, normalize_profiles


def l2_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def feature_like_profiles(rng: np.random.Generator, wells: int = 120, dim: int = 64) -> np.ndarray:
    """Medians of L2-normalised features: rows near one direction, spread of ~1e-4 to 1e-1 per
    direction, so that their covariance's eigenvalues span 1e-8 to 1e-2 (the issue's case)."""
    base = np.zeros(dim)
    base[0] = 1.0
    scales = np.logspace(-4, -1, dim)
    return l2_rows(base + rng.standard_normal((wells, dim)) * scales @ np.linalg.qr(rng.standard_normal((dim, dim)))[0])


def test_sphering_makes_l2_normalised_controls_white():
    rng = np.random.default_rng(0)
    profiles = feature_like_profiles(rng)
    controls = np.arange(120) < 80  # 80 control wells in 64 dimensions
    eigen = np.linalg.eigvalsh(np.cov(profiles[controls], rowvar=False))
    assert eigen.min() < 1e-7 and eigen.max() > 1e-3  # the case where adding epsilon to eigenvalues fails
    context = WellContext(plates=np.array(["P1"] * 120, dtype=object), controls=controls)
    sphered, kept = normalize_profiles(profiles, ("spherize",), context)
    assert kept.tolist() == list(range(64))
    covariance = np.cov(sphered[controls].astype(np.float64), rowvar=False)
    np.testing.assert_allclose(covariance, np.eye(64), atol=1e-3)
    np.testing.assert_allclose(sphered[controls].mean(axis=0), 0.0, atol=1e-4)
    # ZCA, not only any whitening: the symmetric transform, W = C^(-1/2), computed from its definition
    centred = profiles[controls] - profiles[controls].mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    zca = (profiles - profiles[controls].mean(axis=0)) @ (vectors / np.sqrt(values)) @ vectors.T
    np.testing.assert_allclose(sphered, zca, rtol=1e-2, atol=2e-2 * np.abs(zca).max())


def robust_by_definition(x: np.ndarray, plates: np.ndarray, controls: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for plate in np.unique(plates):
        rows = plates == plate
        reference = x[rows & controls]
        median = np.median(reference, axis=0)
        mad = 1.4826 * np.median(np.abs(reference - median), axis=0)
        out[rows] = (x[rows] - median) / mad
    return out


@pytest.mark.parametrize("samples", ["controls", "all"])
def test_each_plate_is_scaled_by_the_median_and_mad_of_its_own_controls_or_wells(samples):
    rng = np.random.default_rng(1)
    plates = np.repeat(np.array(["P1", "P2", "P3"], dtype=object), 10)
    controls = np.tile(np.arange(10) < 3, 3)
    x = rng.standard_normal((30, 6)) * np.repeat([[1.0], [3.0], [0.2]], 10, axis=0) + np.repeat([[0], [5], [-2]], 10, 0)
    context = WellContext(plates, controls, mad_samples=samples)
    normalised, kept = normalize_profiles(x, ("mad_robustize",), context)
    reference = controls if samples == "controls" else np.ones(30, bool)
    np.testing.assert_allclose(normalised, robust_by_definition(x, plates, reference), rtol=1e-5, atol=1e-5)
    assert kept.tolist() == list(range(6))


def test_a_feature_constant_on_a_plates_controls_is_dropped_not_blown_up():
    rng = np.random.default_rng(2)
    plates = np.repeat(np.array(["P1", "P2"], dtype=object), 8)
    controls = np.tile(np.arange(8) < 3, 2)
    x = rng.standard_normal((16, 5))
    x[plates == "P2", 3] = 7.0  # constant on P2 (its controls included): its MAD there is 0
    normalised, kept = normalize_profiles(x, ("mad_robustize", "spherize"), WellContext(plates, controls))
    assert kept.tolist() == [0, 1, 2, 4] and normalised.shape == (16, 4)
    assert np.isfinite(normalised).all() and np.abs(normalised).max() < 1e3


def test_harmony_gets_the_profiles_in_the_orientation_harmonypy_expects():
    rng = np.random.default_rng(3)
    for wells, dim in ((40, 8), (8, 8)):  # a square matrix must not be read transposed
        batches = np.repeat(np.array(["B1", "B2"], dtype=object), wells // 2)
        x = rng.standard_normal((wells, dim)) + 3.0 * (batches == "B2")[:, None]
        corrected, _ = normalize_profiles(x, ("harmony",), WellContext(batches, None, batches, seed=0))
        direct = harmonypy.run_harmony(x.T.copy(), {"batch": batches.astype(str)}, "batch", random_state=0,
                                       nclust=max(1, round(wells / 30)), verbose=False).Z_corr
        np.testing.assert_allclose(corrected, direct, rtol=1e-5, atol=1e-5)
        first = batches == "B1"
        before = np.linalg.norm(x[first].mean(0) - x[~first].mean(0))
        after = np.linalg.norm(corrected[first].mean(0) - corrected[~first].mean(0))
        assert after < 0.5 * before


def test_steps_that_lack_what_they_are_fitted_on_are_named():
    with pytest.raises(UserError, match="fitted on the control wells: set data.control_column"):
        check_steps(("mad_robustize", "spherize"), controls=False, batches=True)
    with pytest.raises(UserError, match="harmony corrects the batches of data.batch_column: set it"):
        check_steps(("harmony",), controls=True, batches=False)
    plates = np.array(["P1"] * 3 + ["P2"] * 3, dtype=object)
    one_control = np.array([True, False, False, True, True, False])
    with pytest.raises(UserError, match="plate P1 has 1 control well among the profiled wells: mad_robustize needs "
                                        "at least 2"):
        normalize_profiles(np.random.default_rng(4).standard_normal((6, 3)), ("mad_robustize",),
                           WellContext(plates, one_control))
    dependent = np.random.default_rng(5).standard_normal((12, 3)) @ np.array([[1.0, 2.0, 3.0, 0.5]] * 3)
    with pytest.raises(UserError, match=r"cannot be sphered: they are linearly dependent \(rank 1, 4 expected"):
        normalize_profiles(dependent, ("spherize",), WellContext(np.array(["P1"] * 12, dtype=object), np.ones(12, bool)))


def test_the_setting_takes_steps_in_order_and_reads_an_older_single_value():
    assert Config().replace({"eval.profile_normalization": "spherize"}).eval.profile_normalization == ("spherize",)
    assert Config().replace({"eval.profile_normalization": "none"}).eval.profile_normalization == ()
    both = Config().replace({"eval.profile_normalization": ["mad_robustize", "spherize"]})
    assert both.eval.profile_normalization == ("mad_robustize", "spherize")
    with pytest.raises(ConfigError, match="distinct steps in the order they run"):
        Config().replace({"eval.profile_normalization": ["spherize", "mad_robustize"]})
    with pytest.raises(ConfigError, match="must be one of"):
        Config().replace({"eval.profile_normalization": ["whiten"]})


def test_a_feature_blown_up_by_a_tiny_control_spread_is_dropped_as_pycytominer_drops_outliers():
    rng = np.random.default_rng(6)
    plates = np.repeat(np.array(["P1", "P2"], dtype=object), 10)
    controls = np.tile(np.arange(10) < 4, 2)
    x = rng.standard_normal((20, 6))
    x[:, 2] = np.where(controls, 1e-6 * rng.standard_normal(20), 1.0)  # controls nearly constant, others not
    normalised, kept = normalize_profiles(x, ("mad_robustize", "spherize"), WellContext(plates, controls))
    assert kept.tolist() == [0, 1, 3, 4, 5]
    assert np.abs(normalised).max() < 500


def test_shrunk_sphering_divides_each_direction_by_its_spread_plus_a_share_of_the_controls_rms_spread():
    """eval.spherize_shrinkage k: each principal direction of the controls, of standard deviation s_i,
    is divided by s_i + k * s_rms (s_rms: the controls' root-mean-square standard deviation per feature),
    the ZCA transform V diag(1 / (s_i + k s_rms)) V^T computed here from that definition with numpy's
    eigh. Its strong directions are still sphered; its weak ones, which plain ZCA divides by almost
    nothing, keep their scale relative to each other. (More controls than features here: with fewer,
    pycytominer divides the directions the controls do not span by their weakest spread.)"""
    rng = np.random.default_rng(3)
    wells, dim = 90, 30
    profiles = rng.standard_normal((wells, dim)) * np.logspace(-2, 0, dim)  # spreads from 0.01 to 1
    controls = np.arange(wells) < 60
    context = WellContext(plates=np.array(["P1"] * wells, dtype=object), controls=controls, sphere_shrinkage=10.0)
    shrunk, _ = normalize_profiles(profiles, ("spherize",), context)
    reference = profiles[controls]
    covariance = np.cov(reference, rowvar=False)
    rms_std = np.sqrt(np.trace(covariance) / dim)
    variances, vectors = np.linalg.eigh(covariance)
    divisor = np.sqrt(np.clip(variances, 0, None)) + 10.0 * rms_std
    expected = (profiles - reference.mean(axis=0)) @ (vectors / divisor) @ vectors.T
    np.testing.assert_allclose(shrunk, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())
    plain, _ = normalize_profiles(profiles, ("spherize",), replace(context, sphere_shrinkage=0.0))
    assert np.abs(plain - shrunk).max() > 0.5 * np.abs(shrunk).max()  # not plain ZCA


def test_a_negative_shrinkage_is_refused():
    with pytest.raises(ConfigError, match="eval.spherize_shrinkage must be >= 0"):
        Config().replace({"eval.spherize_shrinkage": -1.0})
