"""The linear probe learns what a linear layer can learn, reproducibly."""

import numpy as np
import pytest

from training.eval.linear_probe import train_linear_probe


def _toy(seed, n=200, d=12, classes=3, noise=0.3):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, d)) * 3
    labels = rng.integers(0, classes, n)
    x = centres[labels] + noise * rng.standard_normal((n, d))
    return x.astype(np.float32), labels


def test_learns_a_linearly_separable_problem():
    x, y = _toy(0)
    result = train_linear_probe(x[:150], y[:150], x[150:], y[150:], num_classes=3, epochs=30, lr=0.05, seed=0)
    assert len(result.history) == 30
    assert result.history[0]["train_loss"] > result.history[-1]["train_loss"]
    assert result.final_top1 == 1.0
    assert result.predictions.shape == (50,)


def test_is_deterministic_for_a_seed_and_differs_across_seeds():
    x, y = _toy(1, noise=3.0)
    args = (x[:150], y[:150], x[150:], y[150:])
    a = train_linear_probe(*args, num_classes=3, epochs=3, lr=0.05, seed=4)
    b = train_linear_probe(*args, num_classes=3, epochs=3, lr=0.05, seed=4)
    c = train_linear_probe(*args, num_classes=3, epochs=3, lr=0.05, seed=5)
    assert a.history == b.history
    assert a.history[-1]["train_loss"] != pytest.approx(c.history[-1]["train_loss"], rel=1e-9)


def test_random_labels_stay_near_chance():
    """A probe cannot learn labels unrelated to the features: guards against leakage of val labels."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((400, 8)).astype(np.float32)
    y = rng.integers(0, 4, 400)
    result = train_linear_probe(x[:300], y[:300], x[300:], y[300:], num_classes=4, epochs=10, lr=0.05, seed=0)
    assert result.final_top1 < 0.45


def test_learns_from_l2_normalised_high_dimensional_features_at_default_settings():
    """Stored features are L2-normalised, so each of their 384 dimensions is tiny: the probe must
    still learn within the demo's 20 epochs at the default learning rate (it standardises them)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, 1000)
    centres = rng.standard_normal((5, 384))
    features = centres[labels] + 4.0 * rng.standard_normal((1000, 384))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    result = train_linear_probe(features[:800], labels[:800], features[800:], labels[800:],
                                num_classes=5, epochs=20, lr=0.01, seed=0)
    assert result.final_top1 >= 0.95, result.history[-1]  # without standardising: 0.44
