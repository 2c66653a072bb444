"""knn: global weighted kNN on the held-out features, as scDINO evaluates a representation.

    python -m training knn --config run.yaml

For every feature tag (final, each epoch, the raw-pixel and random-init baselines) the held-out
images are split (seeded, stratified) into references and queries, the same split for every tag;
each query votes with exp(cosine / T) of its k nearest references. Writes <run>/knn/knn.json (top-1
and top-2 per k, per-class accuracy and the confusion matrix at the best k) and knn/knn.md, the
table this step also prints.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import numpy as np

from training.config import Config
from training.errors import MissingInputError, UserError
from training.eval.store import FeatureSet, list_tags, load_features, tag_order, write_text_atomic
from training.eval.tables import knn_rows, markdown_table
from training.layout import RunLayout

log = logging.getLogger(__name__)


def load_tagged_features(layout: RunLayout, labels: dict[str, Any]) -> dict[str, FeatureSet]:
    """Every complete feature set, checked to describe exactly the images of labels.json."""
    tags = sorted(list_tags(layout.root / "features"), key=tag_order)
    if not tags:
        raise MissingInputError("features", layout.root / "features", "features")
    expected = np.asarray(labels["indices"], np.int64)
    sets = {}
    for tag in tags:
        feature_set = load_features(layout.features(tag), mmap=True)
        if not np.array_equal(feature_set.indices, expected):
            raise UserError(
                f"features/{tag} describe other images than labels.json ({len(feature_set.indices)} vs "
                f"{len(expected)} rows): rerun `python -m training features --force` and `labels`"
            )
        sets[tag] = feature_set
    return sets


def evaluate_tag(feature_set: FeatureSet, labels: np.ndarray, rows: tuple[np.ndarray, np.ndarray],
                 config: Config, num_classes: int) -> dict[str, Any]:
    """The knn.json entry of one tag."""
    from training.eval.knn import confusion_matrix, knn_classify, per_class_accuracy

    ref, query = rows
    x = feature_set.features
    result = knn_classify(x[ref], labels[ref], x[query], labels[query], ks=config.eval.knn_k,
                          temperature=config.eval.knn_temperature, num_classes=num_classes, progress=True)
    best = result.best_k
    return {
        "epoch": feature_set.meta.get("epoch"),
        "kind": feature_set.meta.get("kind"),
        "checkpoint": feature_set.meta.get("checkpoint"),
        "dim": feature_set.dim,
        "top1": {str(k): v for k, v in result.top1.items()},
        "top2": {str(k): v for k, v in result.top2.items()},
        "effective_k": {str(k): v for k, v in result.effective_k.items()},
        "best_k": best,
        "per_class_top1": per_class_accuracy(labels[query], result.predictions[best], num_classes),
        "confusion": confusion_matrix(labels[query], result.predictions[best], num_classes).tolist(),
    }


def run(config: Config, args: argparse.Namespace) -> int:
    """kNN of every feature tag on one shared split; write knn.json and knn.md, print the table."""
    from training.data.io import write_json_atomic
    from training.eval.knn import split_reference_query
    from training.steps.labels import load_labels

    layout = RunLayout.from_config(config)
    labels = load_labels(layout)
    sets = load_tagged_features(layout, labels)
    y = np.asarray(labels["labels"], np.int64)
    rows = split_reference_query(y, config.eval.knn_train_fraction, config.run.seed)
    num_classes = len(labels["class_names"])
    result = {
        "seed": config.run.seed, "temperature": config.eval.knn_temperature,
        "train_fraction": config.eval.knn_train_fraction, "ks": list(config.eval.knn_k),
        "n_reference": int(len(rows[0])), "n_query": int(len(rows[1])),
        "class_names": labels["class_names"],
        "tags": {tag: evaluate_tag(fs, y, rows, config, num_classes) for tag, fs in sets.items()},
    }
    write_json_atomic(layout.knn / "knn.json", result)
    table = markdown_table(*knn_rows(result))
    text = (f"# Global kNN (top-1 / top-2 accuracy, %)\n\n{result['n_reference']} reference and "
            f"{result['n_query']} query images (seed {config.run.seed}), T={config.eval.knn_temperature}.\n\n"
            f"{table}\n")
    write_text_atomic(layout.knn / "knn.md", text)
    print(table)
    log.info("wrote %s and knn.md", layout.knn / "knn.json")
    return 0
