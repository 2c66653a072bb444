"""plots: UMAPs, kNN accuracy versus k and epoch, confusion matrices, training curves, attention.

    python -m training plots --config run.yaml [--no-umap] [--no-attention]

Reads features/, knn/knn.json, metrics.jsonl, labels.json and the final checkpoint; draws what its
inputs allow (naming the step to run for the rest) into <run>/plots/ as PNG and PDF, and lists the
figures in plots/manifest.json for the report.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from training.config import Config
from training.errors import MissingInputError
from training.eval.store import list_tags, read_index
from training.layout import RunLayout

if TYPE_CHECKING:
    from training.plots.figures import PlotEntry

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Switches for the slow figure groups."""
    parser.add_argument("--no-umap", action="store_true", help="skip the UMAPs (slow on large sets)")
    parser.add_argument("--no-attention", action="store_true", help="skip the attention maps")


def final_checkpoint(layout: RunLayout) -> Path:
    """The weights behind features/final (possibly `features --checkpoint`), else the latest checkpoint."""
    index = read_index(layout.features("final"))
    if index and index.get("checkpoint") and Path(index["checkpoint"]).is_file():
        return Path(index["checkpoint"])
    return layout.latest_checkpoint


def _figure_groups(config: Config, layout: RunLayout, args: argparse.Namespace) -> list[tuple]:
    """(name, input present?, missing input, producing step, draw function) per figure group."""
    from training.plots.figures import attention_plots, curve_plots, knn_plots, umap_plots

    out = layout.plots
    features_root = layout.root / "features"
    knn_json = layout.knn / "knn.json"

    checkpoint = final_checkpoint(layout)

    def attention() -> list[PlotEntry]:
        labels = json.loads(layout.labels.read_text())
        return attention_plots(config, labels, checkpoint, out)

    groups: list[tuple[str, bool, object, str, Callable[[], list[PlotEntry]]]] = [
        ("training curves", layout.metrics.is_file(), layout.metrics, "pretrain",
         lambda: curve_plots(config, layout, out)),
        ("kNN plots", knn_json.is_file(), knn_json, "knn",
         lambda: knn_plots(json.loads(knn_json.read_text()), out)),
    ]
    if not args.no_umap:
        groups.append(("UMAPs", bool(list_tags(features_root)), features_root, "features",
                       lambda: umap_plots(config, layout, out)))
    if not args.no_attention:
        ready = checkpoint.is_file() and layout.labels.is_file()
        missing, step = (checkpoint, "pretrain") if not checkpoint.is_file() else (layout.labels, "labels")
        groups.append(("attention maps", ready, missing, step, attention))
    return groups


def run(config: Config, args: argparse.Namespace) -> int:
    """Draw every figure group whose input exists; fail only when none does."""
    from training.plots.figures import write_manifest

    layout = RunLayout.from_config(config)
    entries: list[PlotEntry] = []
    missing: list[MissingInputError] = []
    for name, ready, path, step, draw in _figure_groups(config, layout, args):
        if not ready:
            missing.append(MissingInputError(f"input of the {name}", path, step))
            log.warning("no %s: %s", name, missing[-1])
            continue
        log.info("drawing %s", name)
        entries.extend(draw())
    if not entries:
        raise missing[0] if missing else MissingInputError("run outputs", layout.root, "pretrain")
    write_manifest(layout.plots, entries)
    log.info("wrote %d figures to %s", len(entries), layout.plots)
    return 0
