"""Which feature sets the `features` step must compute, of which cells, and the encoder of each.

Every tag carries a fingerprint of what produced it (checkpoint file size and modification time,
architecture, image size, channels, the cells). A tag whose saved index has the same fingerprint is
up to date and is skipped; anything else, a damaged set included, is recomputed.

The CellProfiler baseline ("cellprofiler") is planned when the packed dataset has CellProfiler's
measurements (ingest.cellprofiler), fingerprinted by their CRC-32, and computed on rank 0 from them
(training/eval/cellprofiler.py) rather than encoded from the images.

The cells: every epoch's checkpoint and the baselines are evaluated on the evaluated held-out cells
(training/data/split.py `evaluated_rows`, at most eval.max_cells), so that each epoch costs the same
at any dataset size; the final checkpoint on every cell of the dataset under eval.embed_all_cells
(the profiles `export` writes), which includes those, and the baselines too under eval.profile_cells:
all (their well profiles are then scored on every cell, as final's).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.config import Config
from training.errors import DamagedFileError, MissingInputError, UserError
from training.eval.extract import Encoder, raw_pixel_encoder
from training.rundir import RunLayout, tags
from training.rundir.features import checked_index

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class FeaturesRequest:
    """What `python -m training features` was asked to compute."""

    epochs: str = "all"
    """Numbered checkpoints besides the final one: "all", "none" or a list such as "5,10"."""
    checkpoint: Path | None = None
    """Weights to evaluate instead of the run's latest checkpoint."""
    tag: str = tags.FINAL
    """Tag of the evaluated weights' features."""
    baselines: bool = True
    """Also compute the baselines: raw pixels, random init and, where measured, CellProfiler."""
    force: bool = False
    """Recompute tags that are up to date."""


EVALUATED, ALL_CELLS = "evaluated", "all_cells"
"""The cells of a tag: the evaluated held-out ones, or every cell of the dataset."""


@dataclass(frozen=True)
class TagPlan:
    """One feature set to compute: `kind` is "checkpoint", "raw_pixels", "random_init" or
    "cellprofiler"; `scope` says of which cells (EVALUATED or ALL_CELLS)."""

    tag: str
    kind: str
    dim: int
    checkpoint: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    scope: str = EVALUATED


def holdout_digest(indices: np.ndarray) -> str:
    """Short digest of a tag's table rows: features of other cells must be recomputed."""
    return hashlib.sha1(np.asarray(indices, np.int64).tobytes()).hexdigest()[:16]


def scope_rows(config: Config, scope: str, images=None) -> np.ndarray:
    """The table rows of a scope; every rank computes the same (the split and sample are seeded)."""
    from training.data.dataset import open_images
    from training.data.split import evaluated_rows

    images = images if images is not None else open_images(config)
    if scope == ALL_CELLS:
        return np.arange(len(images), dtype=np.int64)
    return evaluated_rows(config, images)


def checkpoint_epoch(path: Path) -> int | None:
    """Completed epochs stored in a checkpoint (memory-mapped: the weights are not read)."""
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except (RuntimeError, OSError, ValueError) as exc:
        log.debug("no epoch readable from %s: %s", path, exc)
        return None
    epoch = state.get("epoch") if isinstance(state, dict) else None
    return int(epoch) if isinstance(epoch, int) else None


LEGACY_META = {"normalization": "dataset", "feature": "cls", "tta": "none"}
"""What features written before a key existed were computed with, so that they stay up to date."""


def _common_meta(config: Config, digest: str) -> dict[str, Any]:
    bag = {"bag_combine": config.model.bag_combine} if config.model.kind == "bag_of_channels" else {}
    return {
        **bag,
        "normalization": config.data.normalization,
        "feature": config.eval.feature,
        "tta": "none",
        "arch": config.model.arch,
        "patch_size": config.model.patch_size,
        "image_size": config.eval.image_size,
        "resize": config.eval.resize,
        "normalize": config.eval.normalize,
        "channels": config.data.channels,
        "holdout_digest": digest,
    }


def _checkpoint_plan(config: Config, tag: str, path: Path, epoch: int | None, digest: str) -> TagPlan:
    stat = path.stat()
    meta = {**_common_meta(config, digest), "tag": tag, "kind": "checkpoint", "epoch": epoch,
            "tta": config.eval.tta if tag == tags.FINAL else "none",
            "checkpoint_key": config.eval.checkpoint_key,
            "checkpoint": str(path), "checkpoint_bytes": stat.st_size, "checkpoint_mtime_ns": stat.st_mtime_ns}
    return TagPlan(tag, "checkpoint", encoder_dim(config), path, meta)


def _baseline_plans(config: Config, digest: str) -> list[TagPlan]:
    common = _common_meta(config, digest)
    size = config.eval.raw_pixels_size
    return [
        TagPlan(tags.RAW_PIXELS, tags.RAW_PIXELS, config.data.in_chans * size * size,
                meta={**common, "tag": tags.RAW_PIXELS, "kind": tags.RAW_PIXELS, "epoch": None,
                      "raw_pixels_size": size}),
        TagPlan(tags.RANDOM_INIT, tags.RANDOM_INIT, encoder_dim(config),
                meta={**common, "tag": tags.RANDOM_INIT, "kind": tags.RANDOM_INIT, "epoch": 0,
                      "seed": config.run.seed}),
    ]


def _cellprofiler_plans(config: Config, images, digest: str) -> list[TagPlan]:
    """The CellProfiler baseline when the packed dataset has CellProfiler's measurements (`ingest`
    writes them beside it), checked now so that damage stops the step before any work; a
    MissingInputError names `ingest` when ingest.cellprofiler is set and it has none."""
    from training.data.ingest.measurements import open_measurements
    from training.data.store.read import PackedImages
    from training.eval.cellprofiler import selected_features

    if not isinstance(images, PackedImages):
        return []
    measurements = open_measurements(images.folder, len(images), required=config.ingest.cellprofiler)
    if measurements is None:
        return []
    index = measurements.index
    meta = {"tag": tags.CELLPROFILER, "kind": tags.CELLPROFILER, "epoch": None, "channels": config.data.channels,
            "holdout_digest": digest, "measurements_crc32": index["crc32"], "measurements_cells": index["n_cells"],
            "standardization": "mad_robustize"}
    return [TagPlan(tags.CELLPROFILER, tags.CELLPROFILER, len(selected_features(index["channels"], config)),
                    meta=meta)]


def final_checkpoint(config: Config, layout: RunLayout, checkpoint: Path | None = None) -> Path:
    """The weights evaluated as "final": `checkpoint` when given, else eval.checkpoints_dir's final
    file, else the run's latest checkpoint, else model.pretrained; MissingInputError names
    `pretrain` when there is none."""
    if checkpoint is not None:
        if not Path(checkpoint).is_file():
            raise UserError(f"--checkpoint {checkpoint} does not exist: give a checkpoint file")
        return Path(checkpoint)
    if config.eval.checkpoints_dir:
        return next(path for tag, path, _ in folder_tags(Path(config.eval.checkpoints_dir)) if tag == tags.FINAL)
    if layout.latest_checkpoint.is_file():
        return layout.latest_checkpoint
    if config.model.pretrained:
        log.info("no checkpoint in %s: evaluating model.pretrained=%s", layout.checkpoints, config.model.pretrained)
        return Path(config.model.pretrained)
    raise MissingInputError("checkpoint", layout.latest_checkpoint, "pretrain")


def _epoch_plans(config: Config, layout: RunLayout, request: FeaturesRequest, digest: str) -> list[TagPlan]:
    if request.checkpoint is not None or request.epochs == "none":
        return []
    found = dict(layout.numbered_checkpoints())
    wanted = sorted(found)
    if request.epochs != "all":
        try:
            wanted = sorted({int(e) for e in str(request.epochs).split(",") if e.strip()})
        except ValueError:
            raise UserError(f"--epochs must be all, none or a list such as 5,10; got {request.epochs!r}") from None
        missing = [e for e in wanted if e not in found]
        if missing:
            raise UserError(f"--epochs {request.epochs}: no checkpoint for epoch(s) {missing}; "
                            f"available: {sorted(found) or 'none'}")
    return [_checkpoint_plan(config, tags.epoch_tag(e), found[e], e, digest) for e in wanted]


def folder_tags(folder: Path) -> list[tuple[str, Path, int | None]]:
    """(tag, file, epoch) for each checkpoint of eval.checkpoints_dir (e.g. an scDINO run's
    scDINO_ViTs/<model>): checkpoint.pth is "final", checkpoint<e>.pth holding an epoch is that
    epoch's tag (completed epochs, so scDINO's checkpoint0.pth is epoch_0001), any other file is
    tagged by its name. Without checkpoint.pth the file of the highest epoch is "final"."""
    files = sorted(Path(folder).glob("*.pth")) if Path(folder).is_dir() else []
    if not files:
        raise UserError(f"eval.checkpoints_dir={folder} holds no checkpoint (*.pth): point it at the folder "
                        "of an scDINO run's checkpoints (scDINO_ViTs/<model>)")
    found = [(path, checkpoint_epoch(path)) for path in files]
    latest = RunLayout(Path(folder)).latest_checkpoint.name  # scDINO names its latest checkpoint as we do
    final = next((p for p, _ in found if p.name == latest), None)
    if final is None:
        final = max(found, key=lambda item: (item[1] is not None, item[1] or 0, item[0].name))[0]
    listed = []
    for path, epoch in found:
        if path == final:
            tag = tags.FINAL
        elif epoch is not None and re.fullmatch(r"checkpoint_?\d+", path.stem):
            tag = tags.epoch_tag(epoch)
        else:
            tag = "model_" + re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem)
        listed.append((tag, path, epoch))
    return listed


def plan_tags(config: Config, layout: RunLayout, request: FeaturesRequest) -> list[TagPlan]:
    """The tags to compute now: final, numbered epochs (or eval.checkpoints_dir's files), baselines,
    minus those up to date."""
    from training.data.dataset import open_images

    if config.eval.checkpoints_dir and request.checkpoint is None:
        listed = [item for item in folder_tags(Path(config.eval.checkpoints_dir))
                  if item[0] == tags.FINAL or request.epochs != "none"]
        images = open_images(config)
        digest = holdout_digest(scope_rows(config, EVALUATED, images))
        plans = [_checkpoint_plan(config, tag, path, epoch, digest) for tag, path, epoch in listed]
    else:
        final = final_checkpoint(config, layout, request.checkpoint)
        images = open_images(config)
        digest = holdout_digest(scope_rows(config, EVALUATED, images))
        plans = [_checkpoint_plan(config, request.tag, final, checkpoint_epoch(final), digest)]
        plans += _epoch_plans(config, layout, request, digest)
    if config.eval.embed_all_cells:
        every = holdout_digest(scope_rows(config, ALL_CELLS, images))
        plans = [replace(p, scope=ALL_CELLS, meta={**p.meta, "holdout_digest": every, "cells": ALL_CELLS})
                 if p.tag == tags.FINAL else p for p in plans]
    if request.baselines:
        baselines = _baseline_plans(config, digest) + _cellprofiler_plans(config, images, digest)
        if config.eval.profile_cells == "all":  # their well profiles are scored on every cell, as final's
            every = holdout_digest(scope_rows(config, ALL_CELLS, images))
            baselines = [replace(p, scope=ALL_CELLS, meta={**p.meta, "holdout_digest": every, "cells": ALL_CELLS})
                         for p in baselines]
        plans += baselines
    todo = [p for p in plans if request.force or not _up_to_date(layout.features(p.tag), p)]
    for plan in plans:
        if plan not in todo:
            log.info("features/%s is up to date; skipped", plan.tag)
    return todo


def _up_to_date(directory: Path, plan: TagPlan) -> bool:
    try:
        index = checked_index(directory)
    except DamagedFileError as exc:
        log.warning("features/%s: %s %s; computing it again", plan.tag, exc.path, exc.problem)
        return False
    return index is not None and all(index.get(k, LEGACY_META.get(k)) == v for k, v in plan.meta.items())


def encoder_dim(config: Config) -> int:
    """Width of a model tag's features: the backbone's CLS feature, twice that with the mean of the
    patch tokens beside it (eval.feature: cls_patch_mean)."""
    from training.models import feature_dim

    width = feature_dim(config.model, config.data.in_chans)
    return 2 * width if config.eval.feature == "cls_patch_mean" else width


class ClsAndPatchMean(torch.nn.Module):
    """The final-norm CLS token and the mean of the patch tokens side by side, as DINO's linear
    evaluation pools them (eval.feature: cls_patch_mean)."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.backbone.forward_features(images)
        return torch.cat([tokens[:, 0], tokens[:, 1:].mean(dim=1)], dim=1)


class DihedralMean(torch.nn.Module):
    """The mean of an encoder's features over the 8 orientations of the image (eval.tta: dihedral)."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        total = None
        for mirrored in (images, images.flip(-1)):
            for turns in range(4):
                rows = self.encoder(torch.rot90(mirrored, turns, dims=(-2, -1))).float()
                total = rows if total is None else total + rows
        return total / 8


def build_encoder(config: Config, plan: TagPlan, in_chans: int, device: torch.device) -> Encoder:
    """The function images -> features for one tag, in eval mode on `device`."""
    if plan.kind == tags.RAW_PIXELS:
        return raw_pixel_encoder(config.eval.raw_pixels_size)
    if plan.kind == tags.RANDOM_INIT:
        from training.models import build_backbone

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.run.seed)
            model = build_backbone(config.model, in_chans, img_size=config.eval.image_size,
                                   channel_ids=config.data.channel_indices)
    else:
        from training.models.pretrained import load_backbone

        model = load_backbone(plan.checkpoint, config.model, in_chans, which=config.eval.checkpoint_key,
                              channels=config.data.channel_indices, normalization=config.data.normalization)
    if config.eval.feature == "cls_patch_mean":
        model = ClsAndPatchMean(model)
    if plan.meta.get("tta") == "dihedral":  # the plan says how its tag is read (_checkpoint_plan)
        model = DihedralMean(model)
    return model.to(device).eval()
