"""The recipe comparison's arms and its 5-fold kNN (the long runs themselves are docs/performance.md's;
the folds themselves are tested in tests/training/eval/test_knn_folds.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.tiny import tiny_config
from training.benchmarks.quality.recipes import (
    ARMS,
    FAST,
    FOLDS,
    REFERENCE,
    kfold_knn_top1,
    parse_args,
)
from training.config import Config, load_config
from training.costs.flops import train_flops_per_image
from training.eval.knn import fold_of


def test_the_reference_arm_is_scdinos_recipe_and_the_others_cost_at_most_a_quarter_or_say_so():
    base = Config().replace({"model.arch": "vit_tiny", "model.out_dim": 256})
    reference = base.replace(ARMS[REFERENCE].overrides)
    assert (reference.model.patch_size, reference.dino.global_crop_size, reference.dino.local_crop_size,
            reference.dino.local_crops_number) == (16, 224, 96, 8)
    scdino = train_flops_per_image(reference, 5)
    for name, arm in ARMS.items():
        config = base.replace(arm.overrides)
        assert config.eval.image_size == config.dino.global_crop_size, name
        ratio = train_flops_per_image(config, 5) / scdino
        assert (ratio <= 0.25) or name == REFERENCE, (name, ratio)


def weighted_vote_reference(features, labels, fold, k, temperature):
    """scDINO's weighted kNN written out per query: the k most similar rows of the other folds
    each add exp(similarity / T) to their class; ties to the lower class."""
    hits = 0
    for i in range(len(labels)):
        others = np.flatnonzero(fold != fold[i])
        sims = features[others] @ features[i]
        nearest = others[np.argsort(-sims, kind="stable")[:k]]
        votes = np.zeros(labels.max() + 1)
        for j in nearest:
            votes[labels[j]] += np.exp(features[j] @ features[i] / temperature)
        hits += int(np.argmax(votes) == labels[i])
    return hits / len(labels)


def test_kfold_knn_is_the_weighted_vote_with_every_row_a_query_once():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 15)
    centres = rng.normal(size=(4, 8))
    features = centres[labels] + 1.2 * rng.normal(size=(60, 8))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    config = tiny_config({"eval.knn_k": [3, 9], "eval.knn_temperature": 0.1, "run.seed": 2})
    top1, best_k = kfold_knn_top1(features.astype(np.float32), labels, config)
    fold = fold_of(labels, FOLDS, seed=2)
    expected = {k: weighted_vote_reference(features, labels, fold, k, 0.1) for k in (3, 9)}
    assert top1 == pytest.approx(max(expected.values()), abs=1e-9)
    assert expected[best_k] == pytest.approx(top1)
    assert 0.25 < top1 < 1.0, "the example is neither trivial nor chance"


def test_unknown_arms_and_bad_seeds_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--arms", "scdino,bogus"])
    assert "unknown arm(s) bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--seeds", "0,x"])
    assert "--seeds must be integers" in capsys.readouterr().err


def test_configs_fast_is_the_measured_arm_on_scdinos_defaults_at_under_a_quarter_of_their_flops():
    fast = load_config(Path(__file__).parents[4] / "configs" / "fast.yaml")
    default = Config()
    assert default.replace(ARMS[REFERENCE].overrides) == default  # scDINO's recipe stays the default
    assert fast == default.replace({**ARMS[FAST].overrides, "run.name": fast.run.name,
                                    "run.output_dir": fast.run.output_dir, "data.source": fast.data.source})
    ratio = train_flops_per_image(fast, 5) / train_flops_per_image(default, 5)
    assert ratio <= 0.25, ratio
