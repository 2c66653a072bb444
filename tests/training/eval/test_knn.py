"""Global weighted kNN against a brute-force computation written independently with numpy."""

import numpy as np
import pytest

from training.errors import UserError
from training.eval.knn import (
    DEFAULT_BLOCK_BYTES,
    confusion_matrix,
    knn_classify,
    per_class_accuracy,
    query_batch_size,
    split_reference_query,
)


def _normalised(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(ref, ref_labels, queries, query_labels, k, temperature, num_classes):
    """The DINO vote, one query at a time: full sort, exp(sim/T) weights, stable class ranking."""
    top1 = top2 = 0
    preds = []
    for q, y in zip(queries, query_labels):
        sims = ref.astype(np.float64) @ q.astype(np.float64)
        nearest = np.argsort(-sims, kind="stable")[: min(k, len(ref))]
        votes = np.zeros(num_classes)
        for j in nearest:
            votes[ref_labels[j]] += np.exp(sims[j] / temperature)
        ranked = np.argsort(-votes, kind="stable")
        preds.append(ranked[0])
        top1 += ranked[0] == y
        top2 += y in ranked[: min(2, k, len(ref))]
    return top1 / len(queries), top2 / len(queries), np.array(preds)


@pytest.mark.parametrize("batch_size", [1, 7, 13, 64])
def test_matches_brute_force_across_batch_boundaries(batch_size):
    rng = np.random.default_rng(0)
    ref, queries = _normalised(rng, 40, 8), _normalised(rng, 13, 8)
    ref_labels, query_labels = rng.integers(0, 4, 40), rng.integers(0, 4, 13)
    ks = (1, 3, 5, 20, 40)
    result = knn_classify(
        ref, ref_labels, queries, query_labels, ks=ks, temperature=0.1, num_classes=4, batch_size=batch_size
    )
    for k in ks:
        top1, top2, preds = brute_force(ref, ref_labels, queries, query_labels, k, 0.1, 4)
        assert result.top1[k] == pytest.approx(top1)
        assert result.top2[k] == pytest.approx(top2)
        np.testing.assert_array_equal(result.predictions[k], preds)


def test_k_larger_than_references_is_clipped():
    rng = np.random.default_rng(1)
    ref, queries = _normalised(rng, 6, 5), _normalised(rng, 9, 5)
    ref_labels, query_labels = rng.integers(0, 3, 6), rng.integers(0, 3, 9)
    result = knn_classify(ref, ref_labels, queries, query_labels, ks=(5, 500), temperature=0.1, num_classes=3)
    assert result.effective_k == {5: 5, 500: 6}
    top1, top2, _ = brute_force(ref, ref_labels, queries, query_labels, 6, 0.1, 3)
    assert result.top1[500] == pytest.approx(top1)
    assert result.top2[500] == pytest.approx(top2)


def test_memory_budget_sets_the_query_batch():
    """A budget of one reference row's similarities per query forces one-query batches; same answer."""
    rng = np.random.default_rng(2)
    ref, queries = _normalised(rng, 50, 4), _normalised(rng, 11, 4)
    ref_labels, query_labels = rng.integers(0, 3, 50), rng.integers(0, 3, 11)
    tight = knn_classify(ref, ref_labels, queries, query_labels, ks=(10,), temperature=0.1, num_classes=3,
                         block_bytes=4 * 50)
    loose = knn_classify(ref, ref_labels, queries, query_labels, ks=(10,), temperature=0.1, num_classes=3)
    np.testing.assert_array_equal(tight.predictions[10], loose.predictions[10])


def test_100k_by_384_features_stay_within_a_few_gigabytes():
    """80k references (scDINO's 80/20 split of 100k) take 123 MB; one similarity block stays under 256 MiB."""
    n_reference = 80_000
    batch = query_batch_size(n_reference)
    assert batch * n_reference * 4 <= DEFAULT_BLOCK_BYTES
    assert batch >= 512  # still large blocks: few Python iterations over 20k queries
    features_bytes = 100_000 * 384 * 4
    assert features_bytes + 2 * DEFAULT_BLOCK_BYTES < 2 * 2**30


def test_separable_clusters_score_perfectly_and_best_k_is_reported():
    rng = np.random.default_rng(3)
    centres = np.eye(3, 16, dtype=np.float32)
    labels = np.repeat(np.arange(3), 30)
    x = centres[labels] + 0.05 * rng.standard_normal((90, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ref_rows, query_rows = split_reference_query(labels, 0.8, seed=0)
    result = knn_classify(x[ref_rows], labels[ref_rows], x[query_rows], labels[query_rows],
                          ks=(5, 10), temperature=0.1, num_classes=3)
    assert result.top1 == {5: 1.0, 10: 1.0}
    assert result.best_k == 5


def test_split_is_seeded_stratified_and_disjoint():
    labels = np.array([0] * 10 + [1] * 5 + [2] * 2)
    ref_a, query_a = split_reference_query(labels, 0.8, seed=7)
    ref_b, query_b = split_reference_query(labels, 0.8, seed=7)
    _, query_c = split_reference_query(labels, 0.8, seed=8)
    np.testing.assert_array_equal(ref_a, ref_b)
    np.testing.assert_array_equal(query_a, query_b)
    assert not np.array_equal(query_a, query_c)
    assert set(ref_a).isdisjoint(query_a) and len(ref_a) + len(query_a) == len(labels)
    for cls in range(3):
        assert (labels[ref_a] == cls).any() and (labels[query_a] == cls).any()


def test_split_without_queries_says_what_to_change():
    with pytest.raises(UserError, match="eval.knn_train_fraction"):
        split_reference_query(np.array([0, 1, 2]), 1.0, seed=0)


def test_per_class_accuracy_and_confusion_matrix():
    truth = np.array([0, 0, 1, 1, 1])
    predicted = np.array([0, 1, 1, 1, 0])
    assert per_class_accuracy(truth, predicted, 3) == [0.5, pytest.approx(2 / 3), None]
    np.testing.assert_array_equal(confusion_matrix(truth, predicted, 3), [[1, 1, 0], [1, 2, 0], [0, 0, 0]])


def test_knn_json_scores_every_feature_set_on_one_shared_split():
    """evaluate_feature_sets: each tag's top-1/top-2, per-class accuracy and confusion at the best k
    are the brute-force vote's on the seeded reference/query rows of labels.json."""
    from training.config import EvalConfig
    from training.eval.knn import evaluate_feature_sets
    from training.rundir.features import FeatureSet

    rng = np.random.default_rng(4)
    y = np.repeat(np.arange(3), 12)
    labels = {"class_names": ["a", "b", "c"], "labels": y.tolist()}
    sets = {tag: FeatureSet(features=_normalised(rng, 36, 6),
                            indices=np.arange(36), meta={"epoch": epoch, "kind": "checkpoint"})
            for tag, epoch in (("final", 3), ("raw_pixels", None))}
    settings = EvalConfig(knn_k=(1, 5), knn_temperature=0.1, knn_train_fraction=0.75)
    payload = evaluate_feature_sets(sets, labels, settings, seed=11)
    ref, query = split_reference_query(y, 0.75, seed=11)
    assert (payload["n_reference"], payload["n_query"], payload["ks"]) == (len(ref), len(query), [1, 5])
    assert list(payload["tags"]) == ["final", "raw_pixels"]
    for tag, fs in sets.items():
        entry, x = payload["tags"][tag], fs.features
        scores = {k: brute_force(x[ref], y[ref], x[query], y[query], k, 0.1, 3) for k in (1, 5)}
        assert entry["top1"] == {str(k): pytest.approx(s[0]) for k, s in scores.items()}
        assert entry["top2"] == {str(k): pytest.approx(s[1]) for k, s in scores.items()}
        best = max((1, 5), key=lambda k: (scores[k][0], -k))
        assert entry["best_k"] == best and entry["epoch"] == fs.meta["epoch"] and entry["dim"] == 6
        predicted, truth = scores[best][2], y[query]
        expected_confusion = [[int(np.sum((truth == t) & (predicted == p))) for p in range(3)] for t in range(3)]
        assert entry["confusion"] == expected_confusion
        assert entry["per_class_top1"] == [pytest.approx(np.mean(predicted[truth == c] == c)) for c in range(3)]
