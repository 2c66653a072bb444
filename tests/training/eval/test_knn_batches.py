"""Not-same-batch kNN: the exclusion inside the blocked kNN against a brute force written here, one
query at a time over the references outside its batch; and on a screen with a batch effect, plain
kNN scoring above not-same-batch kNN, as the field warns."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.screen_run import screen_run
from tests.support.tiny import run_cli
from training.eval.knn import knn_classify
from training.rundir import RunLayout


def normalised(rng, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def brute_force(ref, ref_labels, ref_batches, queries, query_labels, query_batches, k, temperature, classes):
    """Each query votes with its k nearest references of another batch (exp(sim / T)); a query
    without any such reference is not counted. Returns top-1, top-2 and the predictions (-1 uncounted)."""
    hits1, hits2, predictions = [], [], []
    for q, y, b in zip(queries, query_labels, query_batches):
        allowed = np.flatnonzero(ref_batches != b)
        if len(allowed) == 0:
            predictions.append(-1)
            continue
        sims = ref[allowed].astype(np.float64) @ q.astype(np.float64)
        nearest = allowed[np.argsort(-sims, kind="stable")[:k]]
        votes = np.zeros(classes)
        for j in nearest:
            votes[ref_labels[j]] += np.exp(float(ref[j].astype(np.float64) @ q.astype(np.float64)) / temperature)
        ranked = np.argsort(-votes, kind="stable")
        predictions.append(ranked[0])
        hits1.append(ranked[0] == y)
        hits2.append(y in ranked[:min(2, k, len(ref))])
    return np.mean(hits1), np.mean(hits2), np.array(predictions)


@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_not_same_batch_matches_brute_force(batch_size):
    rng = np.random.default_rng(0)
    ref, queries = normalised(rng, 60, 8), normalised(rng, 23, 8)
    ref_labels, query_labels = rng.integers(0, 4, 60), rng.integers(0, 4, 23)
    ref_batches, query_batches = rng.integers(0, 3, 60), rng.integers(0, 3, 23)
    ks = (1, 3, 10, 45, 60)  # 45 and 60 exceed the references outside some queries' batch
    result = knn_classify(ref, ref_labels, queries, query_labels, ks=ks, temperature=0.1, num_classes=4,
                          batch_size=batch_size, batches=(ref_batches, query_batches))
    plain = knn_classify(ref, ref_labels, queries, query_labels, ks=ks, temperature=0.1, num_classes=4)
    for k in ks:
        top1, top2, predicted = brute_force(ref, ref_labels, ref_batches, queries, query_labels, query_batches,
                                            k, 0.1, 4)
        assert result.top1[k] == pytest.approx(top1)
        assert result.top2[k] == pytest.approx(top2)
        np.testing.assert_array_equal(result.predictions[k], predicted)
    assert any(not np.array_equal(result.predictions[k], plain.predictions[k]) for k in ks)


def test_a_query_with_no_reference_outside_its_batch_is_not_counted():
    rng = np.random.default_rng(1)
    ref, queries = normalised(rng, 30, 6), normalised(rng, 12, 6)
    ref_labels, query_labels = rng.integers(0, 3, 30), rng.integers(0, 3, 12)
    ref_batches = np.zeros(30, np.int64)  # every reference in batch 0
    query_batches = np.array([0, 1] * 6)
    result = knn_classify(ref, ref_labels, queries, query_labels, ks=(5,), temperature=0.1, num_classes=3,
                          batches=(ref_batches, query_batches), block_bytes=4 * 30 * 3)
    np.testing.assert_array_equal(result.counted, query_batches == 1)
    top1, _, predicted = brute_force(ref, ref_labels, ref_batches, queries, query_labels, query_batches, 5, 0.1, 3)
    assert result.top1[5] == pytest.approx(top1)
    np.testing.assert_array_equal(result.predictions[5], predicted)
    assert (result.predictions[5][query_batches == 0] == -1).all()


def knn_of(tmp_path, strength: float) -> dict:
    config = screen_run(tmp_path, batch_strength=strength, cells_per_well=16, **{"eval.knn_train_fraction": 0.5})
    assert run_cli(config, "knn") == 0
    return json.loads(RunLayout.from_config(config).knn_json.read_text())


def test_a_batch_effect_inflates_plain_knn_and_not_same_batch_sees_through_it(tmp_path):
    """Plates in two batches, the layout confounded with them: with a strong batch offset a cell's
    neighbours share its batch, and through the layout often its treatment, so plain kNN scores far
    above not-same-batch kNN; without the offset the two are close. knn.json names both."""
    strong, none = knn_of(tmp_path / "strong", 2.0), knn_of(tmp_path / "none", 0.0)
    assert strong["not_same_batch"] == {"batch_column": "Metadata_Batch", "n_batches": 2}

    def gap(knn: dict) -> float:
        entry = knn["tags"]["final"]
        best = entry["top1"][str(entry["best_k"])]
        other = entry["not_same_batch"]
        return best - other["top1"][str(other["best_k"])]

    assert gap(strong) > 0.2, strong["tags"]["final"]  # measured 0.28 (96 queries)
    assert gap(none) < gap(strong) - 0.12, (gap(none), gap(strong))  # measured 0.07
    for tag in ("final", "raw_pixels", "random_init"):
        entry = strong["tags"][tag]["not_same_batch"]
        assert entry["n_query"] + entry["n_query_left_out"] == strong["n_query"]
        assert sum(map(sum, entry["confusion"])) == entry["n_query"]
