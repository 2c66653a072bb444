"""labels: class names, integer labels and paths of the held-out images, from the folder layout.

    python -m training labels --config run.yaml

Writes <run>/labels.json, the reference every later step checks its feature rows against.
"""

from __future__ import annotations

import argparse
import logging

from training.config import Config
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """Write labels.json and log the class counts."""
    from training.data.split import holdout_labels
    from training.writes.atomic import write_json_atomic

    payload = holdout_labels(config)
    write_json_atomic(layout.labels, payload)
    summary = ", ".join(f"{name} {n}" for name, n in payload["counts"].items())
    log.info("wrote %s: %d held-out images (%s)", layout.labels, payload["n_images"], summary)
    return 0
