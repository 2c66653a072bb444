"""eval.knn_folds: every held-out image a query once. The folds are checked as a partition
(stratified, seeded), and the pooled kNN against a leave-one-fold-out vote written here with numpy,
one query at a time (test_knn.py's brute force), with and without the imaging batch masked out."""

import json

import numpy as np
import pytest

from tests.training.eval.test_knn import _normalised, brute_force
from training.config import ConfigError, EvalConfig
from training.errors import UserError
from training.eval.knn import evaluate_feature_sets, fold_of, knn_splits, whiten
from training.rundir.features import FeatureSet

LABELS = np.repeat(np.arange(3), [13, 8, 5])


def test_the_folds_partition_the_rows_stratified_and_seeded():
    fold = fold_of(LABELS, 4, seed=3)
    assert sorted(set(fold)) == [0, 1, 2, 3]
    for cls in range(3):
        counts = np.bincount(fold[LABELS == cls], minlength=4)
        assert counts.max() - counts.min() <= 1, (cls, counts)  # each fold its share of the class
    np.testing.assert_array_equal(fold, fold_of(LABELS, 4, seed=3))
    assert not np.array_equal(fold, fold_of(LABELS, 4, seed=4))

    splits = knn_splits(LABELS, EvalConfig(knn_folds=4), seed=3)
    queried = np.concatenate([query for _, query in splits])
    assert sorted(queried) == list(range(len(LABELS)))  # each row a query exactly once
    for reference, query in splits:
        assert set(reference).isdisjoint(query) and len(reference) + len(query) == len(LABELS)


def test_one_fold_is_the_single_seeded_split():
    from training.eval.knn import split_reference_query

    [(reference, query)] = knn_splits(LABELS, EvalConfig(knn_folds=1, knn_train_fraction=0.75), seed=5)
    expected = split_reference_query(LABELS, 0.75, seed=5)
    np.testing.assert_array_equal(reference, expected[0])
    np.testing.assert_array_equal(query, expected[1])


def leave_fold_out(x, y, fold, k, batches=None):
    """Each row voted on by the rows of other folds (and, with batches, of other batches only);
    accuracy over the rows that had any such reference."""
    hits, counted = [], []
    for i in range(len(y)):
        keep = fold != fold[i]
        if batches is not None:
            keep &= batches != batches[i]
        if not keep.any():
            counted.append(False)
            continue
        counted.append(True)
        hits.append(brute_force(x[keep], y[keep], x[i:i + 1], y[i:i + 1], k, 0.1, 3)[0])
    return float(np.mean(hits)), int(np.sum(counted))


@pytest.mark.parametrize("whitened", [False, True])
def test_pooled_knn_is_the_leave_one_fold_out_vote(whitened):
    rng = np.random.default_rng(2)
    x = _normalised(rng, len(LABELS), 5)
    batches = np.tile([0, 1, 1], len(LABELS) // 3 + 1)[: len(LABELS)]
    labels = {"class_names": ["a", "b", "c"], "labels": LABELS.tolist()}
    settings = EvalConfig(knn_k=(1, 4), knn_temperature=0.1, knn_folds=4, knn_whiten=whitened)
    payload = evaluate_feature_sets({"final": FeatureSet(x, np.arange(len(x)), {})}, labels, settings, seed=9,
                                    batches=batches)
    assert (payload["folds"], payload["n_query"]) == (4, len(LABELS))
    entry = payload["tags"]["final"]
    fold = fold_of(LABELS, 4, seed=9)
    for k in (1, 4):
        if whitened:  # each fold's rows whitened on the other folds' alone
            views = {f: whiten(x, np.flatnonzero(fold != f)) for f in range(4)}
            expected = np.mean([brute_force(views[fold[i]][fold != fold[i]], LABELS[fold != fold[i]],
                                            views[fold[i]][i:i + 1], LABELS[i:i + 1], k, 0.1, 3)[0]
                                for i in range(len(LABELS))])
            assert entry["top1"][str(k)] == pytest.approx(expected)
            continue
        assert entry["top1"][str(k)] == pytest.approx(leave_fold_out(x, LABELS, fold, k)[0])
        nsb, counted = leave_fold_out(x, LABELS, fold, k, batches)
        assert entry["not_same_batch"]["top1"][str(k)] == pytest.approx(nsb)
        assert entry["not_same_batch"]["n_query"] == counted == len(LABELS)


def test_whitening_a_fold_never_reads_its_own_queries():
    """Changing the rows of one fold leaves every other fold's votes as they were."""
    rng = np.random.default_rng(6)
    x = _normalised(rng, len(LABELS), 4)
    settings = EvalConfig(knn_k=(3,), knn_folds=3, knn_whiten=True)
    fold = fold_of(LABELS, 3, seed=1)
    splits = knn_splits(LABELS, settings, seed=1)
    from training.eval.knn import split_views

    before = split_views(x, splits, settings)
    moved = x.copy()
    moved[fold == 0] = _normalised(rng, int((fold == 0).sum()), 4)
    after = split_views(moved, splits, settings)
    np.testing.assert_array_equal(before[0][fold != 0], after[0][fold != 0])  # fold 0's references only
    assert not np.allclose(before[1], after[1])  # a fold that references fold 0 does change


def test_bad_fold_counts_name_the_key():
    for bad in (0, -2, True, 2.5):
        with pytest.raises(ConfigError, match="eval.knn_folds"):
            EvalConfig(knn_folds=bad)
    with pytest.raises(UserError, match="eval.knn_folds=9"):
        knn_splits(np.arange(4) % 2, EvalConfig(knn_folds=9), seed=0)


def test_bench_screen_rescores_a_knn_json_of_another_protocol(tmp_path):
    """--reuse keeps knn.json only when it was scored as the config says (whitening, folds and, where it
    has an mAP, the well profiles' aggregation and subpopulation shares: a knn.json from before
    eval.profile_aggregation read medians, one from before eval.profile_subpopulations had no shares, one
    without eval.profile_median_beside's block)."""
    from training.benchmarks.quality.screen import step_done
    from training.rundir import RunLayout

    layout = RunLayout(tmp_path)
    layout.knn_json.parent.mkdir(parents=True)
    layout.knn_json.write_text(json.dumps({"whitened": True, "tags": {}}))  # written before folds existed
    assert step_done(layout, "knn", EvalConfig(knn_whiten=True))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=True, knn_folds=5))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=False))
    layout.knn_json.write_text(json.dumps({"whitened": False, "folds": 5, "tags": {}}))
    assert step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5))
    assert step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean"))  # no mAP
    layout.knn_json.write_text(json.dumps({"whitened": False, "folds": 5, "map": {}, "tags": {}}))
    assert step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean"))
    layout.knn_json.write_text(json.dumps({"whitened": False, "folds": 5, "map": {"aggregation": "mean"}, "tags": {}}))
    assert step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean"))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean",
                                                   profile_subpopulations=32))
    shares = {"aggregation": "mean", "subpopulations": 32, "subpopulations_weight": 0.2}
    layout.knn_json.write_text(json.dumps({"whitened": False, "folds": 5, "map": shares, "tags": {}}))
    assert step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean",
                                               profile_subpopulations=32))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean"))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean",
                                                   profile_subpopulations=32, profile_subpopulations_weight=0.5))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean",
                                                   profile_subpopulations=32, profile_median_beside=0.2))
    layout.knn_json.write_text(json.dumps({"whitened": False, "folds": 5, "map": {**shares, "median_beside": 0.2},
                                           "tags": {}}))
    assert step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean",
                                               profile_subpopulations=32, profile_median_beside=0.2))
    assert not step_done(layout, "knn", EvalConfig(knn_whiten=False, knn_folds=5, profile_aggregation="mean",
                                                   profile_subpopulations=32))
