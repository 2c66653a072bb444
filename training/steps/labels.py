"""labels: class names, integer labels and paths of the held-out images, from the folder layout.

    python -m training labels --config run.yaml

Writes <run>/labels.json, the reference every later step checks its feature rows against.
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from training.config import Config
from training.eval.store import read_json
from training.layout import RunLayout

log = logging.getLogger(__name__)


def holdout_labels(config: Config) -> dict[str, Any]:
    """The labels.json payload: held-out images in dataset order with their classes."""
    from training.data.dataset import open_dataset
    from training.data.split import load_split

    dataset = open_dataset(config)
    holdout = load_split(config).holdout
    labels = [int(dataset.labels[i]) for i in holdout]
    counts = Counter(labels)
    return {
        "class_names": list(dataset.class_names),
        "counts": {name: counts.get(i, 0) for i, name in enumerate(dataset.class_names)},
        "n_images": len(holdout),
        "source": config.data.source,
        "folder_depth_for_labels": config.data.folder_depth_for_labels,
        "seed": config.run.seed,
        "indices": [int(i) for i in holdout],
        "labels": labels,
        "paths": [dataset.paths[i] for i in holdout],
    }


def load_labels(layout: RunLayout) -> dict[str, Any]:
    """labels.json; MissingInputError names the `labels` step when it is absent."""
    return read_json(layout.labels, "held-out labels", "labels")


def run(config: Config, args: argparse.Namespace) -> int:
    """Write labels.json and log the class counts."""
    from training.data.io import write_json_atomic

    layout = RunLayout.from_config(config)
    payload = holdout_labels(config)
    write_json_atomic(layout.labels, payload)
    summary = ", ".join(f"{name} {n}" for name, n in payload["counts"].items())
    log.info("wrote %s: %d held-out images (%s)", Path(layout.labels), payload["n_images"], summary)
    return 0
