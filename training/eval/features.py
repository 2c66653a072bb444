"""Feature extraction for the `features` step: plan on rank 0, extract on every rank, write on rank 0.

The held-out images are read once per pass for up to MODELS_PER_PASS encoders (checkpoints and
baselines), each rank taking a disjoint shard; rank 0 gathers the rows and writes one feature set
per tag (training/rundir/features.py).
"""

from __future__ import annotations

import logging

from training.config import Config
from training.data.dataset import open_dataset
from training.data.split import load_split
from training.data.stats import load_mean_std
from training.data.torch_loader import build_eval_loader
from training.distributed import DistContext, broadcast_object
from training.errors import UserError
from training.eval.extract import extract_shard, gather_shards
from training.eval.plan import FeaturesRequest, TagPlan, build_encoder, plan_tags
from training.rundir import RunLayout
from training.rundir.features import FeatureSet, save_features

log = logging.getLogger(__name__)

MODELS_PER_PASS = 4


def compute_features(config: Config, layout: RunLayout, request: FeaturesRequest, ctx: DistContext) -> None:
    """Every tag the request needs that is not up to date; every rank calls it."""
    plans = shared_plan(config, layout, request, ctx)
    if plans:
        extract_all(config, layout, plans, ctx)
    else:
        log.info("all feature sets are up to date (use --force to recompute)")


def shared_plan(config: Config, layout: RunLayout, request: FeaturesRequest, ctx: DistContext) -> list[TagPlan]:
    """Rank 0 plans and tells the others; a user error stops every rank with the same message."""
    error: UserError | None = None
    plans: list[TagPlan] | str | None = None
    if ctx.is_main:
        try:
            plans = plan_tags(config, layout, request)
        except UserError as exc:
            error, plans = exc, str(exc)
    plans = broadcast_object(ctx, plans)
    if error is not None:
        raise error
    if isinstance(plans, str):
        raise UserError(plans)
    return plans


def normalisation(config: Config) -> tuple[list[float], list[float]]:
    """The dataset's mean and std per channel, or the identity under eval.normalize=false (scDINO's
    `normalize: False` feeds the min-max scaled images; no mean/std file is needed then)."""
    if config.eval.normalize:
        return load_mean_std(config)
    return [0.0] * config.data.in_chans, [1.0] * config.data.in_chans


def extract_all(config: Config, layout: RunLayout, plans: list[TagPlan], ctx: DistContext) -> None:
    """Group the tags into passes over the held-out images and write each tag on rank 0."""
    mean, std = normalisation(config)
    holdout = load_split(config).holdout
    dataset = open_dataset(config)
    log.info("features of %d held-out images for %s on %d rank(s)",
             len(holdout), ", ".join(p.tag for p in plans), ctx.world_size)
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
