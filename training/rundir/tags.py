"""Feature tags: the names of the feature sets under <run>/features, and how people read them.

    final          the weights evaluated as the run's result (the latest checkpoint, or --checkpoint)
    epoch_0005     a numbered checkpoint, by completed epochs
    raw_pixels     baseline: the images themselves, average-pooled (no model)
    random_init    baseline: the architecture with the run's seed, untrained
    cellprofiler   baseline: CellProfiler's measurements of each cell, robustly standardised (a
                   dataset ingested with ingest.cellprofiler; training/eval/cellprofiler.py)
    hybrid         the trained model's features beside CellProfiler's (eval.hybrid_cellprofiler), as
                   labs combine them; composed by `knn` from final and cellprofiler, never on disk

Every table, plot, report and summary names a tag through `label` / `title`, so a tag has one name.
"""

from __future__ import annotations

import re

FINAL = "final"
RAW_PIXELS = "raw_pixels"
RANDOM_INIT = "random_init"
CELLPROFILER = "cellprofiler"
HYBRID = "hybrid"
BASELINES = (RAW_PIXELS, RANDOM_INIT, CELLPROFILER)
HEADLINE = (FINAL, RAW_PIXELS, RANDOM_INIT)
"""The comparison every summary leads with: the trained model against the two baselines every run
has (the CellProfiler baseline, only a dataset ingested with its measurements has, is in every kNN
and linear-probe table and plot instead)."""

LABELS = {FINAL: "trained", RAW_PIXELS: "raw pixels", RANDOM_INIT: "random init", CELLPROFILER: "CellProfiler",
          HYBRID: "trained + CellProfiler"}
LINE_STYLES = {RAW_PIXELS: ":", RANDOM_INIT: "--", CELLPROFILER: "-."}
"""Plot line style of each baseline (trained tags are solid)."""

_EPOCH = re.compile(r"epoch_(\d+)")


def epoch_tag(epoch: int) -> str:
    return f"epoch_{epoch:04d}"


def tag_epoch(tag: str) -> int | None:
    """The epoch of an epoch tag, None for any other tag."""
    match = _EPOCH.fullmatch(tag)
    return int(match.group(1)) if match else None


def is_epoch_tag(tag: str) -> bool:
    return tag_epoch(tag) is not None


def is_tag(name: str) -> bool:
    """Whether `name` is one of the tags a step writes (final, an epoch, a baseline)."""
    return name == FINAL or is_baseline(name) or is_epoch_tag(name)


def is_baseline(tag: str) -> bool:
    return tag in BASELINES


def label(tag: str, epoch: int | None = None) -> str:
    """Human name: 'trained (epoch 10)', 'epoch 5', 'raw pixels', 'random init', 'CellProfiler', or the tag."""
    if tag_epoch(tag) is not None:
        return f"epoch {tag_epoch(tag)}"
    name = LABELS.get(tag, tag)
    if not is_baseline(tag) and epoch is not None:
        return f"{name} (epoch {epoch})"
    return name


def title(tag: str) -> str:
    """Row title in result tables: the tag itself, baselines marked as such."""
    if tag == HYBRID:
        return f"{LABELS[tag]} (hybrid)"
    return f"{LABELS[tag]} (baseline)" if is_baseline(tag) else tag


def sort_key(tag: str) -> tuple[int, str]:
    """Trained features first (final, then epochs in order), then other tags, baselines last."""
    if tag == FINAL:
        return (0, tag)
    if is_epoch_tag(tag):
        return (1, tag)
    if is_baseline(tag):
        return (3, tag)
    return (2, tag)
