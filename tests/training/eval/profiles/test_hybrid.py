"""The trained features beside CellProfiler's (training/eval/profiles/hybrid.py), against the
definition the module states: each block z-scored per feature over the cells, then scaled by
1 / sqrt(its width), so that each block's squared norm averages 1 whatever its width; a feature
constant over the cells is 0; the cells are matched by table row, not by position."""

from __future__ import annotations

import numpy as np
import pytest

from training.eval.profiles.hybrid import hybrid_set, standardised_block, with_hybrid
from training.rundir import tags
from training.rundir.features import FeatureSet


def test_each_block_weighs_alike_whatever_its_width():
    rng = np.random.default_rng(0)
    narrow = rng.normal(5.0, 30.0, (200, 4))          # few features on a large scale
    wide = rng.normal(-1.0, 0.01, (200, 400))         # many on a tiny scale
    for block in (standardised_block(narrow), standardised_block(wide)):
        assert np.mean(np.sum(block.astype(np.float64) ** 2, axis=1)) == pytest.approx(1.0, rel=1e-4)
        assert np.abs(block.mean(axis=0)).max() < 1e-5


def test_a_constant_feature_is_zero_not_nan():
    x = np.column_stack([np.arange(10.0), np.full(10, 7.0)])
    block = standardised_block(x)
    assert np.isfinite(block).all() and (block[:, 1] == 0).all()
    expected = (np.arange(10.0) - 4.5) / np.std(np.arange(10.0)) / np.sqrt(2)
    np.testing.assert_allclose(block[:, 0], expected, rtol=1e-6)


def test_the_hybrid_pairs_cells_by_table_row():
    rng = np.random.default_rng(1)
    rows = np.array([3, 5, 8, 13])
    trained = FeatureSet(rng.standard_normal((4, 3)).astype(np.float32), rows, {})
    # CellProfiler's set holds more cells (every cell of the table); its row 5 must meet trained's row 5
    every = np.arange(20)
    measured = np.column_stack([every * 1.0, every ** 2.0]).astype(np.float32)
    hybrid = hybrid_set(trained, FeatureSet(measured, every, {}))
    assert hybrid.dim == 5 and np.array_equal(hybrid.indices, rows)
    np.testing.assert_allclose(hybrid.features[:, 3:], standardised_block(measured[rows]), rtol=1e-6)
    np.testing.assert_allclose(hybrid.features[:, :3], standardised_block(trained.features), rtol=1e-6)


def test_with_hybrid_needs_both_sets():
    rows = np.arange(3)
    one = FeatureSet(np.eye(3, dtype=np.float32), rows, {})
    assert tags.HYBRID not in with_hybrid({tags.FINAL: one})
    assert tags.HYBRID in with_hybrid({tags.FINAL: one, tags.CELLPROFILER: one})
