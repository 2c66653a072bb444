"""knn: global weighted kNN on the held-out features, as scDINO evaluates a representation, and the
measures a screen is judged by: not-same-batch kNN and retrieval mAP of per-well profiles.

    python -m training knn --config run.yaml

For every feature tag (final, each epoch, the raw-pixel and random-init baselines) the held-out
images are split (seeded, stratified) into references and queries, the same split for every tag;
each query votes with exp(cosine / T) of its k nearest references. With data.batch_column set (and
eval.knn_exclude_same_batch, the default) the same kNN again "not same batch": a query never votes
with a reference of its own imaging batch. Where the per-cell table has plate and well columns, each
tag's per-well profiles (median of the evaluated cells, or of every cell under eval.profile_cells:
all) are scored by retrieval mAP by treatment (copairs; training/eval/retrieval.py). With
eval.hybrid_cellprofiler, the trained features beside CellProfiler's are scored as one more row,
"hybrid" (training/eval/profiles/hybrid.py). Writes <run>/knn/knn.json (top-1 and top-2 per k, per-class
accuracy and the confusion matrix at the best k, "not_same_batch" and "map" per tag where measured)
and knn/knn.md, whose tables this step also prints.
"""

from __future__ import annotations

import argparse
import logging

from training.config import Config
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """kNN (and mAP) of every feature tag on one shared split; write knn.json and knn.md, print the tables."""
    from training.eval.knn import evaluate_feature_sets, evaluation_batches
    from training.eval.profiles.hybrid import with_hybrid
    from training.eval.retrieval import profiled_features
    from training.eval.tables import knn_markdown
    from training.rundir.artifacts import load_labels, load_tagged_features
    from training.writes.atomic import write_json_atomic, write_text_atomic

    labels = load_labels(layout)
    sets = load_tagged_features(layout, labels)
    if config.eval.hybrid_cellprofiler:
        sets = with_hybrid(sets)
    retrieval, profiles = profiled_features(config, layout, labels, sets)
    result = evaluate_feature_sets(sets, labels, config.eval, config.run.seed,
                                   batches=evaluation_batches(config, labels, layout),
                                   retrieval=retrieval, profiles=profiles)
    write_json_atomic(layout.knn_json, result)
    text = knn_markdown(result)
    write_text_atomic(layout.knn_md, text)
    print(text)
    log.info("wrote %s and %s", layout.knn_json, layout.knn_md.name)
    return 0
