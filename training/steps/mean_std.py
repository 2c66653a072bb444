"""mean-std: per-channel mean and std of min-max scaled training images, for normalisation.

    python -m training mean-std --config run.yaml

Uses a seeded data.mean_std_fraction of the training split; writes <run>/mean_std.json atomically.
"""

from __future__ import annotations

import argparse
import logging

from training.config import Config
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    from training.data.stats import compute_mean_std
    from training.writes.atomic import write_json_atomic

    stats = compute_mean_std(config)
    write_json_atomic(layout.mean_std, stats)
    log.info("mean %s std %s over %d images", [round(m, 4) for m in stats["mean"]],
             [round(s, 4) for s in stats["std"]], stats["n_images"])
    return 0
