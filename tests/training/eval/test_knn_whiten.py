"""eval.knn_whiten: the whitened cosine against the Mahalanobis cosine computed independently from
the references' inverse sample covariance, fitted on references only, a no-op on features that do
not vary, and the kNN it changes: a large nuisance direction drowns the class in the plain cosine
and not in the whitened one."""

import logging

import numpy as np
import pytest

from training.config import EvalConfig
from training.eval.knn import evaluate_feature_sets, whiten
from training.rundir.features import FeatureSet


def correlated(rng, n, d):
    """Rows with a rotated covariance of eigenvalues 4 to 0.25 (well conditioned), offset from 0."""
    rotation, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return rng.standard_normal((n, d)) * np.linspace(2.0, 0.5, d) @ rotation + 5.0


def test_whitened_cosine_is_the_mahalanobis_cosine_of_the_references():
    """With many more references than dimensions Ledoit-Wolf barely shrinks, so the whitened rows'
    cosine must equal (a - m)' S^-1 (b - m) / norms, S the references' covariance (numpy, bias=True)."""
    rng = np.random.default_rng(0)
    x = correlated(rng, 5000, 6)
    ref = np.arange(4000)
    white = whiten(x.astype(np.float32), ref)
    assert np.allclose(np.linalg.norm(white, axis=1), 1.0, atol=1e-5)
    centred = x - x[ref].mean(axis=0)
    inverse = np.linalg.inv(np.cov(x[ref], rowvar=False, bias=True))
    gram = centred @ inverse @ centred.T
    expected = gram / np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
    rows = np.r_[0:20, 4000:4020]  # references and queries
    assert white[rows] @ white[rows].T == pytest.approx(expected[np.ix_(rows, rows)], abs=0.02)
    plain = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert np.abs(plain[rows] @ plain[rows].T - expected[np.ix_(rows, rows)]).max() > 0.1  # it does change them


def test_only_the_references_are_fitted():
    rng = np.random.default_rng(1)
    x = correlated(rng, 300, 8).astype(np.float32)
    ref = np.arange(200)
    changed = x.copy()
    changed[200:] = rng.standard_normal((100, 8)) * 100
    assert np.array_equal(whiten(x, ref)[ref], whiten(changed, ref)[ref])


def test_fewer_references_than_dimensions_still_whiten_finitely():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 960)).astype(np.float32)  # a bag of five 192-wide features, 30 references
    white = whiten(x, np.arange(30))
    assert np.isfinite(white).all() and np.allclose(np.linalg.norm(white, axis=1), 1.0, atol=1e-5)


def test_features_that_do_not_vary_are_left_as_they_are(caplog):
    x = np.tile(np.array([[0.6, 0.8]], np.float32), (10, 1))  # a collapsed model: every row alike
    with caplog.at_level(logging.WARNING, logger="training.eval.knn"):
        assert np.array_equal(whiten(x, np.arange(8)), x)
    assert "whitening skipped" in caplog.text


def test_whitening_recovers_a_class_drowned_by_a_large_nuisance_direction():
    """Two classes apart by 1 along a quiet direction, a nuisance of spread 300 along another: the plain
    cosine is dominated by the nuisance, the whitened one is not; knn.json records which rule ran."""
    rng = np.random.default_rng(3)
    n = 400
    labels = np.repeat([0, 1], n // 2)
    x = np.stack([300 * rng.standard_normal(n), labels + 0.15 * rng.standard_normal(n),
                  rng.standard_normal(n)], axis=1).astype(np.float32)
    x += np.array([0.0, 0.0, 10.0], np.float32)  # away from the origin, as features usually are
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    features = {"final": FeatureSet(features=x,
                                    indices=np.arange(n), meta={})}
    label_file = {"labels": labels.tolist(), "class_names": ["a", "b"]}
    plain = evaluate_feature_sets(features, label_file, EvalConfig(knn_k=(10,)), seed=0)
    whitened = evaluate_feature_sets(features, label_file, EvalConfig(knn_k=(10,), knn_whiten=True), seed=0)
    assert (plain["whitened"], whitened["whitened"]) == (False, True)
    assert whitened["tags"]["final"]["top1"]["10"] > 0.95
    assert plain["tags"]["final"]["top1"]["10"] < whitened["tags"]["final"]["top1"]["10"] - 0.15
