"""plots: UMAPs, kNN accuracy versus k and epoch, confusion matrices, training curves, attention.

    python -m training plots --config run.yaml [--no-umap] [--no-attention]

Reads features/, knn/knn.json, metrics.jsonl, labels.json and the final checkpoint; draws what its
inputs allow (naming the step to run for the rest) into <run>/plots/ as PNG and PDF, and lists the
figures in plots/manifest.json for the report.
"""

from __future__ import annotations

import argparse

from training.config import Config
from training.rundir import RunLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Switches for the slow figure groups."""
    parser.add_argument("--no-umap", action="store_true", help="skip the UMAPs (slow on large sets)")
    parser.add_argument("--no-attention", action="store_true", help="skip the attention maps")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """Draw every figure group whose input exists; fail only when none does."""
    from training.plots.figures import draw_all

    draw_all(config, layout, umap=not args.no_umap, attention=not args.no_attention)
    return 0
