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

from training.config import Config
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """kNN of every feature tag on one shared split; write knn.json and knn.md, print the table."""
    from training.atomic import write_json_atomic, write_text_atomic
    from training.eval.knn import evaluate_feature_sets
    from training.eval.tables import knn_rows, knn_setup, markdown_table
    from training.rundir.artifacts import load_labels, load_tagged_features

    labels = load_labels(layout)
    result = evaluate_feature_sets(load_tagged_features(layout, labels), labels, config.eval, config.run.seed)
    write_json_atomic(layout.knn_json, result)
    table = markdown_table(*knn_rows(result))
    text = f"# Global kNN (top-1 / top-2 accuracy, %)\n\n{knn_setup(result)}\n\n{table}\n"
    write_text_atomic(layout.knn_md, text)
    print(table)
    log.info("wrote %s and %s", layout.knn_json, layout.knn_md.name)
    return 0
