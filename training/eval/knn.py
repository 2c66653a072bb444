"""Global weighted kNN as scDINO (and DINO before it) evaluates a representation.

Each query image votes with its k most similar reference images (cosine similarity of L2-normalised
features); a neighbour with similarity s adds exp(s / T) to its class. With eval.knn_whiten the
features are whitened first (`whiten`), a rule of our own that scDINO does not apply. The queries
are scDINO's one seeded split of the held-out images, or with eval.knn_folds every held-out image in
turn (`knn_splits`: stratified folds, each scored against the others, the votes pooled). "Not same
batch" (eval.knn_exclude_same_batch with data.batch_column): the same vote with every reference of
the query's own imaging batch masked out of its similarity block before the top k, so the memory
bound below holds unchanged; each feature set's retrieval mAP (training/eval/retrieval.py:
phenotypic activity, and consistency where groups are named) is recorded beside its kNN in knn.json.
Queries are processed in batches sized so that the (batch x references) similarity block stays under
a memory budget: 100k references at 384 dimensions need the 150 MB of features plus a few hundred MB
of working space.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Sequence

import numpy as np
import torch
from tqdm import tqdm

from training.config import Config, EvalConfig
from training.errors import UserError
from training.eval.retrieval import MapSetup, tag_map
from training.rundir import RunLayout
from training.rundir.features import FeatureSet

log = logging.getLogger(__name__)

DEFAULT_BLOCK_BYTES = 256 * 2**20


@dataclass
class KnnResult:
    """Accuracies per requested k; `predictions[k]` is the top-1 class of every query (-1 for a
    query that was not counted: under a batch exclusion, one with no reference outside its batch)."""

    top1: dict[int, float] = field(default_factory=dict)
    top2: dict[int, float] = field(default_factory=dict)
    effective_k: dict[int, int] = field(default_factory=dict)
    predictions: dict[int, np.ndarray] = field(default_factory=dict)
    top2_hits: dict[int, np.ndarray] = field(default_factory=dict)
    """Per k, whether each query's true class is among its two best-voted classes."""
    counted: np.ndarray | None = None
    """Which queries the accuracies count (None: all)."""

    @property
    def best_k(self) -> int:
        """The k with the highest top-1 accuracy (the smallest such k on ties)."""
        return max(sorted(self.top1), key=lambda k: (self.top1[k], -k))


def split_reference_query(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded, class-stratified split of row numbers into kNN references and queries.

    Stratifying keeps every class with two or more images on both sides, so per-class accuracy is
    defined even for rare classes; the result depends only on the labels, fraction and seed.
    """
    labels = np.asarray(labels)
    order = np.random.default_rng(seed).permutation(len(labels))
    reference, query = [], []
    for cls in np.unique(labels):
        members = order[labels[order] == cls]
        n_ref = int(round(fraction * len(members)))
        if len(members) >= 2:
            n_ref = min(max(n_ref, 1), len(members) - 1)
        reference.append(members[:n_ref])
        query.append(members[n_ref:])
    reference_rows = np.sort(np.concatenate(reference)) if reference else np.zeros(0, np.int64)
    query_rows = np.sort(np.concatenate(query)) if query else np.zeros(0, np.int64)
    if len(reference_rows) == 0 or len(query_rows) == 0:
        raise UserError(
            f"the kNN split of {len(labels)} held-out images leaves no "
            f"{'reference' if len(reference_rows) == 0 else 'query'} images: "
            "adjust eval.knn_train_fraction or hold out more images (data.holdout_fraction)"
        )
    return reference_rows, query_rows


def query_batch_size(n_reference: int, block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
    """Queries per block so that their float32 similarities to every reference fit `block_bytes`."""
    return max(1, block_bytes // (4 * max(n_reference, 1)))


def rank_classes(scores: torch.Tensor) -> torch.Tensor:
    """Classes sorted by descending vote; ties go to the lower class id (stable, deterministic)."""
    return torch.sort(scores, dim=1, descending=True, stable=True).indices


def _vote_block(
    sims: torch.Tensor, ref_labels: torch.Tensor, ks: Sequence[int], num_classes: int, temperature: float
) -> dict[int, torch.Tensor]:
    """Class scores of one query block for every k, sharing one top-k search of the largest k."""
    top_sims, top_idx = sims.topk(max(ks), dim=1, largest=True, sorted=True)
    weights = (top_sims / temperature).exp()
    neighbour_labels = ref_labels[top_idx]
    scores = {}
    for k in ks:
        block = torch.zeros(sims.shape[0], num_classes, dtype=weights.dtype)
        block.scatter_add_(1, neighbour_labels[:, :k], weights[:, :k])
        scores[k] = block
    return scores


def knn_classify(
    reference: np.ndarray,
    reference_labels: np.ndarray,
    queries: np.ndarray,
    query_labels: np.ndarray,
    *,
    ks: Sequence[int],
    temperature: float,
    num_classes: int,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    batch_size: int | None = None,
    progress: bool = False,
    batches: tuple[np.ndarray, np.ndarray] | None = None,
) -> KnnResult:
    """Weighted kNN of `queries` against `reference` (both L2-normalised rows), per k.

    A k larger than the number of references is clipped to it (and reported in `effective_k`).
    `batches` (reference batches, query batches): "not same batch", a query's similarity to every
    reference of its own batch is set to -inf inside its block before the top k, so such a reference
    is never a neighbour (a masked slot that still reaches the top k votes with weight exp(-inf) = 0);
    queries with no reference outside their batch are not counted.
    """
    ref = torch.from_numpy(np.ascontiguousarray(reference, dtype=np.float32))
    ref_labels = torch.from_numpy(np.asarray(reference_labels, dtype=np.int64))
    truth = np.asarray(query_labels, dtype=np.int64)
    effective = {int(k): min(int(k), len(ref)) for k in ks}
    batch = batch_size or query_batch_size(len(ref), block_bytes)
    predictions = {k: np.empty(len(queries), np.int64) for k in effective}
    top2_hits = {k: np.zeros(len(queries), bool) for k in effective}
    masks = BatchMask(*batches) if batches is not None else None
    starts = range(0, len(queries), batch)
    for start in tqdm(starts, desc="kNN", unit="batch", disable=not progress):
        block = torch.from_numpy(np.ascontiguousarray(queries[start : start + batch], dtype=np.float32))
        rows = slice(start, start + len(block))
        sims = block @ ref.T
        if masks is not None:
            sims.masked_fill_(masks.same(rows), float("-inf"))
        scores = _vote_block(sims, ref_labels, sorted(set(effective.values())), num_classes, temperature)
        target = torch.from_numpy(truth[rows]).unsqueeze(1)
        for k, k_eff in effective.items():
            ranked = rank_classes(scores[k_eff])
            predictions[k][rows] = ranked[:, 0].numpy()
            top2_hits[k][rows] = (ranked[:, : min(2, k_eff)] == target).any(dim=1).numpy()
    counted = masks.counted if masks is not None else None
    return _result(effective, predictions, top2_hits, truth, counted)


class BatchMask:
    """Which references share each query's imaging batch, a block of queries at a time."""

    def __init__(self, reference_batches: np.ndarray, query_batches: np.ndarray) -> None:
        self.reference = torch.from_numpy(np.asarray(reference_batches, np.int64))
        self.query = torch.from_numpy(np.asarray(query_batches, np.int64))
        names, counts = np.unique(np.asarray(reference_batches), return_counts=True)
        query = np.asarray(query_batches)
        at = np.minimum(np.searchsorted(names, query), max(len(names) - 1, 0))
        own = np.where(names[at] == query, counts[at], 0) if len(names) else np.zeros(len(query), np.int64)
        self.counted = len(reference_batches) - own > 0

    def same(self, rows: slice) -> torch.Tensor:
        return self.query[rows].unsqueeze(1) == self.reference.unsqueeze(0)


def _result(effective: dict[int, int], predictions: dict[int, np.ndarray], top2_hits: dict[int, np.ndarray],
            truth: np.ndarray, counted: np.ndarray | None) -> KnnResult:
    """Accuracies over the counted queries; the others' predictions set to -1."""
    keep = np.ones(len(truth), bool) if counted is None else counted
    result = KnnResult(effective_k=effective, predictions=predictions, top2_hits=top2_hits, counted=counted)
    for k in effective:
        predictions[k][~keep] = -1
        hits = predictions[k][keep] == truth[keep]
        result.top1[k] = float(np.mean(hits)) if keep.any() else float("nan")
        result.top2[k] = float(np.mean(top2_hits[k][keep])) if keep.any() else float("nan")
    return result


def per_class_accuracy(truth: np.ndarray, predicted: np.ndarray, num_classes: int) -> list[float | None]:
    """Accuracy of each class among its queries; None for a class without queries."""
    out: list[float | None] = []
    for cls in range(num_classes):
        mask = truth == cls
        out.append(float(np.mean(predicted[mask] == cls)) if mask.any() else None)
    return out


def fold_of(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Each row's fold, 0 to folds - 1, stratified as `split_reference_query` splits: the rows of a
    class, in the same seeded order, are dealt to the folds in turn, so every fold holds each class's
    share of the rows (give or take one)."""
    labels = np.asarray(labels)
    order = np.random.default_rng(seed).permutation(len(labels))
    fold = np.empty(len(labels), np.int64)
    for cls in np.unique(labels):
        members = order[labels[order] == cls]
        fold[members] = np.arange(len(members)) % folds
    return fold


def knn_splits(labels: np.ndarray, settings: EvalConfig, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The kNN's (reference rows, query rows) splits of the held-out images. eval.knn_folds 1: scDINO's
    one seeded split, eval.knn_train_fraction of them references. n > 1: n stratified folds, each
    fold the queries of one split and the other folds its references, so that every held-out image is
    a query exactly once: 1 / (1 - knn_train_fraction) times the one split's queries."""
    if settings.knn_folds == 1:
        return [split_reference_query(labels, settings.knn_train_fraction, seed)]
    fold = fold_of(labels, settings.knn_folds, seed)
    splits = [(np.flatnonzero(fold != f), np.flatnonzero(fold == f)) for f in range(settings.knn_folds)]
    if any(len(query) == 0 or len(reference) == 0 for reference, query in splits):
        raise UserError(f"eval.knn_folds={settings.knn_folds} folds of {len(labels)} held-out images leave a fold "
                        "empty: use fewer folds or hold out more images (data.holdout_fraction)")
    return splits


def split_views(features: np.ndarray, splits: Sequence[tuple[np.ndarray, np.ndarray]],
                settings: EvalConfig) -> list[np.ndarray]:
    """The features each split's kNN reads: whitened on that split's references alone (eval.knn_whiten),
    so no query takes part in its own whitening; else the features as they are."""
    return [whiten(features, reference) if settings.knn_whiten else features for reference, _ in splits]


def pooled_classify(views: Sequence[np.ndarray], labels: np.ndarray, splits: Sequence[tuple[np.ndarray, np.ndarray]],
                    settings: EvalConfig, num_classes: int, batches: np.ndarray | None = None,
                    progress: bool = False) -> tuple[np.ndarray, KnnResult]:
    """The kNN of every split's queries against its references (in `views`, split_views'), the votes
    pooled: (the query rows in split order, one result over all of them)."""
    parts = [knn_classify(x[reference], labels[reference], x[query], labels[query], ks=settings.knn_k,
                          temperature=settings.knn_temperature, num_classes=num_classes, progress=progress,
                          batches=None if batches is None else (batches[reference], batches[query]))
             for x, (reference, query) in zip(views, splits)]
    queries = np.concatenate([query for _, query in splits])
    if len(parts) == 1:
        return queries, parts[0]
    effective = {k: min(part.effective_k[k] for part in parts) for k in parts[0].effective_k}
    counted = None if batches is None else np.concatenate([part.counted for part in parts])
    return queries, _result(effective, {k: np.concatenate([part.predictions[k] for part in parts]) for k in effective},
                            {k: np.concatenate([part.top2_hits[k] for part in parts]) for k in effective},
                            labels[queries], counted)


def confusion_matrix(truth: np.ndarray, predicted: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts[i, j]: queries of class i predicted as class j."""
    counts = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(counts, (np.asarray(truth), np.asarray(predicted)), 1)
    return counts


def whiten(features: np.ndarray, reference_rows: np.ndarray) -> np.ndarray:
    """Every row whitened by the reference rows' covariance, then L2-normalised again (eval.knn_whiten).

    The covariance is scikit-learn's Ledoit-Wolf estimate (the sample covariance shrunk towards a
    multiple of the identity by the amount that minimises the expected error, so it is invertible
    even with fewer references than dimensions), fitted on the reference rows only: no label and no
    query takes part. Rows become (x - mean) V diag(1 / sqrt(eigenvalues)): directions in which the
    references hardly vary weigh as much in the cosine as those in which they vary most. Features
    without any spread (a collapsed model: every row alike) are returned unchanged.
    """
    from sklearn.covariance import LedoitWolf

    reference = np.asarray(features[reference_rows], np.float64)
    if len(reference) < 2 or not np.ptp(reference, axis=0).any():
        log.warning("kNN whitening skipped: the %d reference features do not vary", len(reference))
        return features
    estimate = LedoitWolf().fit(reference)
    eigenvalues, vectors = np.linalg.eigh(estimate.covariance_)
    eigenvalues = np.maximum(eigenvalues, eigenvalues.max() * 1e-12)
    white = (np.asarray(features, np.float64) - estimate.location_) @ (vectors / np.sqrt(eigenvalues))
    norms = np.linalg.norm(white, axis=1, keepdims=True)
    return (white / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def evaluation_batches(config: Config, labels: dict[str, Any], layout: RunLayout) -> np.ndarray | None:
    """Each evaluated cell's batch code for not-same-batch kNN; None (with the reason logged once)
    without data.batch_column, with eval.knn_exclude_same_batch off, or with a single batch."""
    column = config.data.batch_column
    if not column:
        return None
    if not config.eval.knn_exclude_same_batch:
        log.info("eval.knn_exclude_same_batch is false: plain kNN only, although data.batch_column=%s", column)
        return None
    if "batches" not in labels or labels.get("batch_column") != column:
        raise UserError(f"{layout.labels} holds no batches of data.batch_column={column!r} (it was written with "
                        f"{labels.get('batch_column') or 'no batch column'}): rerun `python -m training labels`")
    batches = np.asarray(labels["batches"], np.int64)
    if (batches < 0).any():
        log.warning("%d evaluated cells have no %s value: they count as one batch of their own",
                    int((batches < 0).sum()), column)
    if len(np.unique(batches)) < 2:
        log.warning("every evaluated cell is in one batch of %s: not-same-batch kNN is undefined, plain kNN only",
                    column)
        return None
    return batches


def reference_query(labels: dict[str, Any], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels of the held-out images (labels.json) and the seeded reference and query rows of them:
    the kNN, the linear probe and fine-tuning all use this one split."""
    y = np.asarray(labels["labels"], np.int64)
    ref, query = split_reference_query(y, fraction, seed)
    return y, ref, query


def accuracy_entry(result: KnnResult, truth: np.ndarray, num_classes: int) -> dict[str, Any]:
    """Accuracy per k, the best k, and per class and confused classes at the best k, over the
    queries the result counted."""
    best = result.best_k
    keep = np.ones(len(truth), bool) if result.counted is None else result.counted
    predicted = result.predictions[best][keep]
    return {
        "top1": {str(k): v for k, v in result.top1.items()},
        "top2": {str(k): v for k, v in result.top2.items()},
        "effective_k": {str(k): v for k, v in result.effective_k.items()},
        "best_k": best,
        "per_class_top1": per_class_accuracy(truth[keep], predicted, num_classes),
        "confusion": confusion_matrix(truth[keep], predicted, num_classes).tolist(),
    }


def evaluate_tag(feature_set: FeatureSet, labels: np.ndarray, splits: Sequence[tuple[np.ndarray, np.ndarray]],
                 settings: EvalConfig, num_classes: int, batches: np.ndarray | None = None) -> dict[str, Any]:
    """The knn.json entry of one feature set over the (reference, query) `splits` (knn_splits'):
    accuracy per k, and per class at the best k; with `batches` (each held-out cell's batch code), the
    same "not_same_batch" as well."""
    run = partial(pooled_classify, split_views(feature_set.features, splits, settings), labels, splits, settings,
                  num_classes, progress=True)
    queries, result = run()
    entry = {"epoch": feature_set.meta.get("epoch"), "kind": feature_set.meta.get("kind"),
             "checkpoint": feature_set.meta.get("checkpoint"), "dim": feature_set.dim,
             **accuracy_entry(result, labels[queries], num_classes)}
    if batches is not None:
        queries, result = run(batches=batches)
        counted = int(result.counted.sum())
        entry["not_same_batch"] = {**accuracy_entry(result, labels[queries], num_classes), "n_query": counted,
                                   "n_query_left_out": int(len(queries) - counted)}
    return entry


def evaluate_feature_sets(sets: dict[str, FeatureSet], labels: dict[str, Any], settings: EvalConfig, seed: int,
                          *, batches: np.ndarray | None = None, retrieval: MapSetup | None = None,
                          profiles: dict[str, tuple[np.ndarray, MapSetup]] | None = None) -> dict[str, Any]:
    """The knn.json payload: every feature set evaluated on the same reference/query splits; with
    `batches`, also not same batch; with `retrieval`, each set's mAP of per-well profiles, read from
    `profiles`' features and wells for the tags it names (retrieval.profiled_features), else from the
    set's own features on `retrieval`'s wells."""
    y = np.asarray(labels["labels"], np.int64)
    splits = knn_splits(y, settings, seed)
    num_classes = len(labels["class_names"])
    payload = {
        "seed": seed, "temperature": settings.knn_temperature, "whitened": settings.knn_whiten,
        "train_fraction": settings.knn_train_fraction, "folds": settings.knn_folds, "ks": list(settings.knn_k),
        "n_reference": int(min(len(reference) for reference, _ in splits)),
        "n_query": int(sum(len(query) for _, query in splits)), "class_names": labels["class_names"],
    }
    if batches is not None:
        payload["not_same_batch"] = {"batch_column": labels.get("batch_column"),
                                     "n_batches": int(len(np.unique(batches)))}
    if retrieval is not None:
        payload["map"] = retrieval.settings
        if retrieval.consistency_settings is not None:
            payload["map_consistency"] = retrieval.consistency_settings
    payload["tags"] = {}
    for tag, feature_set in sets.items():
        entry = evaluate_tag(feature_set, y, splits, settings, num_classes, batches)
        if retrieval is not None:
            features, setup = (profiles or {}).get(tag, (feature_set.features, retrieval))
            entry.update(tag_map(features, setup, seed, feature_set.meta.get("model_card"), f"features/{tag}"))
            entry["map_cells"] = setup.cells
        payload["tags"][tag] = entry
    return payload
