"""linear: linear probe on the frozen held-out features, with validation accuracy per epoch.

    python -m training linear --config run.yaml [--all-tags]

Uses the kNN step's seeded split of the held-out images (references train the probe, queries
validate it) so the two tables compare like with like. By default it probes the final features and
the two baselines; --all-tags adds every epoch. Writes <run>/linear/linear.json and linear.md.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from training.config import Config
from training.eval.store import write_text_atomic
from training.eval.tables import linear_rows, markdown_table
from training.layout import RunLayout

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Which feature tags to probe."""
    parser.add_argument("--all-tags", action="store_true", help="also probe every epoch's features")


def run(config: Config, args: argparse.Namespace) -> int:
    """Probe each tag on the kNN split; write linear.json and linear.md, print the table."""
    from training.data.io import write_json_atomic
    from training.eval.knn import split_reference_query
    from training.eval.linear_probe import train_linear_probe
    from training.steps.knn import load_tagged_features
    from training.steps.labels import load_labels

    layout = RunLayout.from_config(config)
    labels = load_labels(layout)
    sets = load_tagged_features(layout, labels)
    if not getattr(args, "all_tags", False):
        sets = {t: fs for t, fs in sets.items() if not t.startswith("epoch_")} or sets
    y = np.asarray(labels["labels"], np.int64)
    ref, query = split_reference_query(y, config.eval.knn_train_fraction, config.run.seed)
    result = {"seed": config.run.seed, "epochs": config.eval.linear_epochs, "lr": config.eval.linear_lr,
              "n_train": int(len(ref)), "n_val": int(len(query)), "class_names": labels["class_names"], "tags": {}}
    for tag, feature_set in sets.items():
        x = np.asarray(feature_set.features)
        log.info("linear probe on features/%s (%d x %d)", tag, *x.shape)
        probe = train_linear_probe(x[ref], y[ref], x[query], y[query], num_classes=len(labels["class_names"]),
                                   epochs=config.eval.linear_epochs, lr=config.eval.linear_lr,
                                   seed=config.run.seed, progress=True)
        result["tags"][tag] = {"epoch": feature_set.meta.get("epoch"), "history": probe.history,
                               "final_top1": probe.final_top1, "best_top1": probe.best_top1}
    write_json_atomic(layout.linear / "linear.json", result)
    table = markdown_table(*linear_rows(result))
    write_text_atomic(layout.linear / "linear.md", f"# Linear probe (validation top-1, %)\n\n{table}\n")
    print(table)
    return 0
