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
