"""features: L2-normalised CLS features of the teacher backbone for the held-out images.

    python -m training features --config run.yaml                          # one process
    torchrun --nproc_per_node 4 -m training features --config run.yaml     # one node, 4 ranks
    srun python -m training features --config run.yaml                     # Slurm tasks

Writes <run>/features/<tag>/{features.npy,index.json} for the latest checkpoint ("final"), every
numbered checkpoint ("epoch_0005", ...) and two baselines on the same images: "raw_pixels" and
"random_init" (the architecture with the run's seed, untrained). A tag already computed from the same
checkpoint file and settings is skipped, so the step can be rerun after more epochs. `--checkpoint`
evaluates other weights instead: a DINO/scDINO checkpoint or ImageNet DINO ViT weights.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from training.config import Config
from training.eval.store import FeatureSet, save_features
from training.errors import UserError
from training.layout import RunLayout

if TYPE_CHECKING:
    from training.eval.plan import TagPlan

log = logging.getLogger(__name__)

MODELS_PER_PASS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Which checkpoints and baselines to evaluate, and whether to recompute."""
    parser.add_argument("--epochs", default="all", metavar="all|none|E1,E2",
                        help="numbered checkpoints to evaluate besides the latest (default: all)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="evaluate these weights instead of the run's latest checkpoint")
    parser.add_argument("--tag", default="final", help="tag for --checkpoint's features (default: final)")
    parser.add_argument("--no-baselines", action="store_true", help="skip raw_pixels and random_init")
    parser.add_argument("--force", action="store_true", help="recompute tags that are already present")


def run(config: Config, args: argparse.Namespace) -> int:
    """Plan on rank 0, extract on every rank, write on rank 0."""
    from training.distributed import process_group

    with process_group() as ctx:
        plans = _shared_plan(config, args, ctx)
        if plans:
            _extract_all(config, plans, ctx)
        else:
            log.info("all feature sets are up to date (use --force to recompute)")
    return 0


def _shared_plan(config: Config, args: argparse.Namespace, ctx) -> list[TagPlan]:
    """Rank 0 plans and tells the others; a user error stops every rank with the same message."""
    from training.distributed import broadcast_object
    from training.eval.plan import plan_tags

    error: UserError | None = None
    plans: list[TagPlan] | str | None = None
    if ctx.is_main:
        try:
            plans = plan_tags(config, args)
        except UserError as exc:
            error, plans = exc, str(exc)
    plans = broadcast_object(ctx, plans)
    if error is not None:
        raise error
    if isinstance(plans, str):
        raise UserError(plans)
    return plans


def _extract_all(config: Config, plans: list[TagPlan], ctx) -> None:
    """Group the tags into passes over the held-out images and write each tag on rank 0."""
    from training.data.dataset import open_dataset
    from training.data.loader import build_eval_loader
    from training.data.split import load_split
    from training.data.stats import load_mean_std
    from training.eval.extract import extract_shard, gather_shards
    from training.eval.plan import build_encoder

    mean, std = load_mean_std(config)
    holdout = load_split(config).holdout
    dataset = open_dataset(config)
    log.info("features of %d held-out images for %s on %d rank(s)",
             len(holdout), ", ".join(p.tag for p in plans), ctx.world_size)
    layout = RunLayout.from_config(config)
    for start in range(0, len(plans), MODELS_PER_PASS):
        group = plans[start : start + MODELS_PER_PASS]
        encoders = {p.tag: build_encoder(config, p, dataset.in_chans, ctx.device) for p in group}
        loader = build_eval_loader(config, indices=holdout, rank=ctx.rank, world_size=ctx.world_size,
                                   mean=mean, std=std)
        shard = extract_shard(encoders, loader, ctx.device, progress=ctx.is_main)
        gathered = gather_shards(shard, list(encoders), {p.tag: p.dim for p in group})
        if gathered is None:
            continue
        for plan in group:
            save_features(layout.features(plan.tag), FeatureSet(
                features=gathered.features[plan.tag],
                labels=gathered.labels,
                paths=[dataset.paths[i] for i in gathered.indices],
                indices=gathered.indices,
                meta={**plan.meta, "class_names": list(dataset.class_names)},
            ))
