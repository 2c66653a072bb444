"""features: L2-normalised CLS features of the teacher backbone for the held-out images.

    python -m training features --config run.yaml                          # one process
    torchrun --nproc_per_node 4 -m training features --config run.yaml     # one node, 4 ranks
    srun python -m training features --config run.yaml                     # Slurm tasks

Writes <run>/features/<tag>/{features.npy,index.json} for the latest checkpoint ("final"), every
numbered checkpoint ("epoch_0005", ...) and the baselines on the same images: "raw_pixels",
"random_init" (the architecture with the run's seed, untrained) and, for a dataset ingested with
ingest.cellprofiler, "cellprofiler" (CellProfiler's measurements of each cell). A tag already computed from the same
checkpoint file and settings is skipped, so the step can be rerun after more epochs. `--checkpoint`
evaluates other weights instead: a DINO/scDINO checkpoint or ImageNet DINO ViT weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.config import Config
from training.rundir import RunLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Which checkpoints and baselines to evaluate, and whether to recompute."""
    parser.add_argument("--epochs", default="all", metavar="all|none|E1,E2",
                        help="numbered checkpoints to evaluate besides the latest (default: all)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="evaluate these weights instead of the run's latest checkpoint")
    parser.add_argument("--tag", default="final", help="tag for --checkpoint's features (default: final)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the baselines (raw_pixels, random_init, cellprofiler)")
    parser.add_argument("--force", action="store_true", help="recompute tags that are already present")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """Plan on rank 0, extract on every rank, write on rank 0."""
    from training.distributed.groups import process_group
    from training.eval.feature_passes import compute_features
    from training.eval.feature_plan import FeaturesRequest

    request = FeaturesRequest(epochs=args.epochs, checkpoint=args.checkpoint, tag=args.tag,
                              baselines=not args.no_baselines, force=args.force)
    with process_group() as ctx:
        compute_features(config, layout, request, ctx)
    return 0
