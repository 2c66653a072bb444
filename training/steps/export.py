"""export: per-cell and per-well profiles of the trained model, as scanpy and pycytominer read them.

    python -m training export --config run.yaml

Reads features/final (every cell of the dataset under eval.embed_all_cells), the per-cell table and
the split; writes <run>/profiles/: cells.h5ad (AnnData, the embedding in obsm["X_scdino"], the
metadata and split in obs, provenance in uns), cells.parquet (Metadata_ columns, then the features),
wells.parquet (per-well medians or means: eval.profile_aggregation, where the table has plate and well
columns), wells_normalized.parquet (eval.profile_normalization: spherize) and export.json. Columns
and memory: training/eval/profiles/export.py.
"""

from __future__ import annotations

import argparse
import logging

from training.config import Config
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tag", default="final",
                        help="the feature set to export (default: final, the trained model's features of every cell)")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """Write the profiles and export.json; log what was written."""
    from training.eval.profiles.export import export_profiles

    record = export_profiles(config, layout, args.tag)
    wells = record["wells"]
    log.info("wrote %s: %d cells x %d features%s in %.1f s", ", ".join(record["files"]), record["n_cells"],
             record["dim"], f", {wells['n_wells']} wells" if wells else "", record["seconds"])
    return 0
