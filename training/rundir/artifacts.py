"""Readers of what earlier steps wrote into a run directory.

A later step, the plots, the report and the summary read a run only through these functions, so a
missing or damaged file always gives the same message: what is missing and which step writes it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from training.errors import MissingInputError, UserError
from training.rundir import tags
from training.rundir.features import FeatureSet, list_tags, load_features, read_index
from training.rundir.layout import RunLayout

log = logging.getLogger(__name__)


def read_json(path: Path, what: str, step: str) -> Any:
    """A JSON file an earlier step wrote; MissingInputError names that step when it is absent."""
    if not path.is_file():
        raise MissingInputError(what, path, step)
    return _parse_json(path, f"rerun `python -m training {step}`")


def read_optional_json(path: Path) -> Any:
    """A JSON file, or None when its step has not run (yet). A damaged one is to be deleted: some
    (timings.json, results.json) are read back by the steps that write them, so a rerun alone fails again."""
    return _parse_json(path, "delete it and rerun the step that writes it") if path.is_file() else None


def _parse_json(path: Path, remedy: str) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}): {remedy}") from None


def load_labels(layout: RunLayout) -> dict[str, Any]:
    """labels.json: class names, labels, dataset indices and paths of the held-out images."""
    return read_json(layout.labels, "held-out labels", "labels")


def load_knn(layout: RunLayout) -> dict[str, Any]:
    return read_json(layout.knn_json, "kNN results", "knn")


def load_linear(layout: RunLayout) -> dict[str, Any]:
    return read_json(layout.linear_json, "linear-probe results", "linear")


def checkpoint_world_size(layout: RunLayout) -> int | None:
    """How many ranks wrote the latest checkpoint (its "world_size"), None without a checkpoint.
    Memory-maps the file, so the weights are not read."""
    return checkpoint_progress(layout).get("world_size")


def checkpoint_progress(layout: RunLayout) -> dict[str, Any]:
    """The latest checkpoint's "world_size", "global_step" and "epoch" (absent ones left out; {}
    without a checkpoint). Memory-maps the file, so the weights are not read."""
    import torch

    if not layout.latest_checkpoint.is_file():
        return {}
    saved = torch.load(layout.latest_checkpoint, map_location="cpu", weights_only=False, mmap=True)
    return {key: saved[key] for key in ("world_size", "global_step", "epoch") if saved.get(key) is not None}


def load_tagged_features(layout: RunLayout, labels: dict[str, Any]) -> dict[str, FeatureSet]:
    """Every complete feature set (in tag order), checked to describe exactly the images of labels.json."""
    found = sorted(list_tags(layout.features_root), key=tags.sort_key)
    if not found:
        raise MissingInputError("features", layout.features_root, "features")
    expected = np.asarray(labels["indices"], np.int64)
    sets = {}
    for tag in found:
        feature_set = load_features(layout.features(tag), mmap=True)
        if not np.array_equal(feature_set.indices, expected):
            raise UserError(
                f"{layout.features(tag)} describes other images than {layout.labels} "
                f"({len(feature_set.indices)} vs {len(expected)} rows): rerun "
                "`python -m training features --force` and `labels`"
            )
        sets[tag] = feature_set
    return sets


def final_weights(layout: RunLayout) -> Path:
    """The weights behind features/final (possibly `features --checkpoint`), else the latest checkpoint."""
    index = read_index(layout.features(tags.FINAL))
    if index and index.get("checkpoint") and Path(index["checkpoint"]).is_file():
        return Path(index["checkpoint"])
    return layout.latest_checkpoint


def bad_image_paths(layout: RunLayout) -> set[str]:
    """Paths an earlier step reported as unreadable (bad_images.json), to be left out."""
    if not layout.bad_images.exists():
        return set()
    return {entry["path"] for entry in read_json(layout.bad_images, "bad-image report", "prepare").get("images", [])}


def read_metrics(layout: RunLayout) -> list[dict[str, Any]]:
    """metrics.jsonl as records, skipping a truncated last line (pretraining may still be writing)."""
    records = []
    for number, line in enumerate(layout.metrics.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s:%d is not JSON; skipped", layout.metrics, number)
    return records


def read_timings(layout: RunLayout) -> dict[str, float]:
    return read_optional_json(layout.timings) or {}
