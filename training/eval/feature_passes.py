"""Feature extraction for the `features` step: plan on rank 0, extract on every rank, write on rank 0.

The cells of each tag (the evaluated held-out cells, or every cell for the final checkpoint: see
training/eval/feature_plan.py) are read once per pass for up to MODELS_PER_PASS encoders
(checkpoints and baselines), each rank taking a disjoint shard; the rows are written as they come,
one feature set per tag (training/eval/extract.py: on several ranks each writes a part and rank 0
merges them), a checkpoint's with its model card in the index. The CellProfiler baseline needs no
pass: rank 0 computes it from the measurements stored with the cells (training/eval/cellprofiler.py).
"""

from __future__ import annotations

import logging

import numpy as np

from training.config import Config
from training.data.dataset import open_images
from training.data.loading.torch_loader import build_eval_loader
from training.data.stats import load_mean_std
from training.distributed.groups import DistContext, broadcast_object
from training.errors import UserError
from training.eval.cellprofiler import cellprofiler_features
from training.eval.extract import SetTarget, extract_sets
from training.eval.feature_plan import (
    ALL_CELLS,
    EVALUATED,
    FeaturesRequest,
    TagPlan,
    build_encoder,
    plan_tags,
    scope_rows,
)
from training.rundir import RunLayout, tags
from training.rundir.features import save_features
from training.writes.diskspace import DiskFullError, room_problem

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
    """Group the tags by their cells, then into passes over those cells, and write each tag on rank 0."""
    mean, std = normalisation(config)
    images = open_images(config)
    for scope in (ALL_CELLS, EVALUATED):  # the final checkpoint first, as the user reads the results
        chosen = [p for p in plans if p.scope == scope]
        if not chosen:
            continue
        rows = scope_rows(config, scope, images)
        needed = room_needed(len(rows), chosen, ctx.world_size)  # every cell's set can be large: fail now
        problem = room_problem(layout.features_root, needed, "the features") if ctx.is_main else None
        if broadcast_object(ctx, problem):
            raise DiskFullError(problem)
        log.info("features of %d %s for %s on %d rank(s)", len(rows),
                 "cells (all)" if scope == ALL_CELLS else "evaluated held-out cells",
                 ", ".join(p.tag for p in chosen), ctx.world_size)
        for plan in [p for p in chosen if p.kind == tags.CELLPROFILER and ctx.is_main]:
            save_features(layout.features(plan.tag),
                          cellprofiler_features(config, images.folder, len(images), rows, dict(plan.meta)))
        encoded = [p for p in chosen if p.kind != tags.CELLPROFILER]
        for start in range(0, len(encoded), MODELS_PER_PASS):
            extract_pass(config, layout, encoded[start:start + MODELS_PER_PASS], rows, (mean, std), ctx)


def extract_pass(config: Config, layout: RunLayout, group: list[TagPlan], rows, stats, ctx: DistContext) -> None:
    """One pass of up to MODELS_PER_PASS encoders over the cells `rows`, each rank its shard."""
    encoders = {p.tag: build_encoder(config, p, config.data.in_chans, ctx.device) for p in group}
    loader = build_eval_loader(config, indices=rows, rank=ctx.rank, world_size=ctx.world_size,
                               mean=stats[0], std=stats[1])
    targets = {p.tag: SetTarget(layout.features(p.tag), p.dim, with_card(p) if ctx.is_main else {}) for p in group}
    extract_sets(encoders, loader, ctx.device, targets, ascending=bool((np.diff(rows) > 0).all()),
                 progress=ctx.is_main)


def room_needed(cells: int, chosen: list[TagPlan], ranks: int) -> int:
    """Bytes the feature sets of `chosen` take (float32 features and an int64 row a cell); on several
    ranks, plus the parts of the largest pass, which lie beside the sets until rank 0 has merged them."""
    sizes = [cells * (p.dim * 4 + 8) for p in chosen]
    encoded = [size for size, p in zip(sizes, chosen) if p.kind != tags.CELLPROFILER]
    passes = [sum(encoded[start:start + MODELS_PER_PASS]) for start in range(0, len(encoded), MODELS_PER_PASS)]
    return sum(sizes) + (max(passes, default=0) if ranks > 1 else 0)


def with_card(plan: TagPlan) -> dict:
    """A checkpoint tag's index records the weights' model card (training/models/card.py) beside what
    the plan fingerprints; the card is left out of the fingerprint, so sets written before it stay
    up to date."""
    from training.models.card import read_card

    card = read_card(plan.checkpoint) if plan.kind == "checkpoint" and plan.checkpoint else None
    return {**plan.meta, "model_card": card.to_dict()} if card is not None else dict(plan.meta)
