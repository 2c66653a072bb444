"""What the screen measures need from the dataset, gathered for the `knn` step: each evaluated cell's
imaging batch (labels.json, for not-same-batch kNN) and its well (the per-cell table, for mAP)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from training.config import Config
from training.errors import UserError
from training.eval.retrieval import MapSetup, map_setup
from training.rundir import RunLayout

log = logging.getLogger(__name__)


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


def evaluation_wells(config: Config, labels: dict[str, Any]) -> MapSetup | None:
    """The evaluated cells' wells for retrieval mAP; None (logged) for a dataset without a per-cell
    table (a TIFF folder) or without plate and well columns."""
    from training.data.dataset import open_images

    table = getattr(open_images(config), "table", None)
    if table is None:
        log.info("a TIFF folder has no per-cell table, so no wells: no retrieval mAP")
        return None
    return map_setup(table, config, labels)
