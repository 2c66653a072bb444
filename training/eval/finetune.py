"""Full fine-tuning: the pretrained backbone and a linear head on its CLS token, trained together.

Where the linear probe asks what the frozen features already separate, fine-tuning asks how far the
pretrained weights are from a good classifier. It trains on the images of the kNN reference split
and validates on the query images after every epoch, with the images the `features` step sees
(resized to eval.image_size, normalised with the run's mean and std) and random flips at most.

Every rank runs `finetune`: `training.distributed.parallel.wrap_model` applies DDP or FSDP2. Training batches
come from a seeded sampler that pads each rank's shard to the same length, so every rank takes the
same number of steps; validation shards the query images without repeats and sums the correct
counts over the ranks, so the accuracy covers each query image exactly once whatever the world
size. Under FSDP every forward is collective, so a rank with fewer validation batches runs blank
forwards until the others are done.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from training.config import Config, EvalConfig
from training.cosine_schedule import cosine_schedule
from training.data.dataset import open_images
from training.data.loading.sampler import DistributedBatchSampler
from training.data.loading.torch_loader import (
    BatchDataset,
    CheckedLoader,
    EvalTransform,
    build_eval_loader,
    checked_loader,
    eval_transform,
)
from training.distributed.groups import DistContext, all_reduce_max, all_reduce_sum, ranks_log
from training.distributed.parallel import WrappedModel, wrap_model
from training.errors import UserError
from training.eval.linear_probe import ProbeResult
from training.models.pretrained import load_backbone
from training.precision import Precision, resolve_precision
from training.rundir import RunLayout
from training.writes.atomic import save_torch_atomic, write_json_atomic, write_text_atomic

log = logging.getLogger(__name__)

NO_DECAY = ("cls_token", "pos_embed", "reg_token")
"""Parameters besides biases and norms that weight decay would only pull towards zero."""


class Classifier(nn.Module):
    """A backbone (images -> CLS features) and a linear head (features -> class logits)."""

    def __init__(self, backbone: nn.Module, num_classes: int, *, seed: int) -> None:
        super().__init__()
        self.backbone = backbone
        width = backbone.output_dim(len(backbone.input_channels)) if hasattr(backbone, "output_dim") else backbone.embed_dim
        self.head = nn.Linear(width, num_classes)
        with torch.no_grad():
            self.head.weight.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(seed))
            self.head.bias.zero_()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))


def parallel_mode(config: Config, ctx: DistContext) -> str:
    """How the classifier is spread over the ranks: "ddp", "fsdp", or "single" for one process."""
    return config.train.parallel if ctx.distributed else "single"


@dataclass(frozen=True)
class FinetuneData:
    """Dataset indices to train and validate on, the class names and the run's mean and std."""

    train: np.ndarray
    val: np.ndarray
    class_names: Sequence[str]
    mean: Sequence[float]
    std: Sequence[float]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


@dataclass
class FinetuneResult(ProbeResult):
    """Per-epoch history as the probe's; `state` holds the full weights on rank 0 (empty elsewhere
    under FSDP)."""

    state: dict[str, Any] = field(default_factory=dict)


class RandomFlips:
    """A batch transform followed by left-right and up-down flips, each with probability 1/2 per
    image, drawn from the batch's generator: the same flips for a batch seed whatever the workers."""

    def __init__(self, transform: EvalTransform) -> None:
        self.transform = transform

    def __call__(self, images, labels, idx, generator: torch.Generator):
        images, labels, idx = self.transform(images, labels, idx, generator)
        flips = torch.rand(len(images), 2, generator=generator) < 0.5
        images = torch.where(flips[:, 0, None, None, None], images.flip(-1), images)
        images = torch.where(flips[:, 1, None, None, None], images.flip(-2), images)
        return images, labels, idx


def build_classifier(config: Config, checkpoint: Path, num_classes: int) -> Classifier:
    """The checkpoint's teacher backbone (as the `features` step loads it) and a seeded new head."""
    backbone = load_backbone(checkpoint, config.model, config.data.in_chans, which="teacher",
                             normalization=config.data.normalization)
    return Classifier(backbone, num_classes, seed=config.run.seed)


def build_finetune_optimizer(model: Classifier, settings: EvalConfig) -> torch.optim.AdamW:
    """AdamW: the backbone at finetune_lr x finetune_backbone_lr_scale, the head at finetune_lr;
    weight decay on weight matrices only. Each group keeps its peak rate as "base_lr"."""
    groups = []
    for part, lr in ((model.backbone, settings.finetune_lr * settings.finetune_backbone_lr_scale),
                     (model.head, settings.finetune_lr)):
        decay, rest = [], []
        for name, param in part.named_parameters():
            (rest if param.ndim <= 1 or name in NO_DECAY else decay).append(param)
        groups += [{"params": decay, "weight_decay": settings.finetune_weight_decay, "lr": lr, "base_lr": lr},
                   {"params": rest, "weight_decay": 0.0, "lr": lr, "base_lr": lr}]
    return torch.optim.AdamW([g for g in groups if g["params"]])


def build_train_loader(config: Config, data: FinetuneData,
                       ctx: DistContext) -> tuple[CheckedLoader, DistributedBatchSampler]:
    """This rank's shuffled batches of the training images. Each rank's shard is padded by
    repetition to the same length and no batch is dropped: every rank takes the same steps."""
    settings = config.eval
    sampler = DistributedBatchSampler(data.train, settings.finetune_batch_size, rank=ctx.rank,
                                      world_size=ctx.world_size, seed=config.run.seed, shuffle=True,
                                      drop_last=False, pad=True)
    transform = eval_transform(config, data.mean, data.std, resize="square_bicubic")
    dataset = BatchDataset(open_images(config), config.data.channel_indices, config.data.on_bad_image,
                           RandomFlips(transform) if settings.finetune_flips else transform, substitute=True)
    return checked_loader(dataset, sampler, config), sampler


@dataclass
class FinetuneState:
    """What one fine-tuning step needs; `lr_factor` scales every group's base_lr, one value per step."""

    model: WrappedModel
    optimizer: torch.optim.Optimizer
    precision: Precision
    lr_factor: np.ndarray
    ctx: DistContext
    step: int = 0
    scaler: torch.amp.GradScaler = field(init=False)

    def __post_init__(self) -> None:
        self.scaler = torch.amp.GradScaler(self.ctx.device.type, enabled=self.precision.name == "fp16")


def train_epoch(state: FinetuneState, loader: CheckedLoader, sampler: DistributedBatchSampler,
                epoch: int) -> float:
    """One pass over this rank's batches; the mean cross-entropy over every rank's images."""
    device = state.ctx.device
    sampler.set_epoch(epoch)
    state.model.module.train()
    loss_sum, seen = torch.zeros((), device=device), 0
    for images, labels, _ in loader:
        factor = float(state.lr_factor[min(state.step, len(state.lr_factor) - 1)])
        for group in state.optimizer.param_groups:
            group["lr"] = group["base_lr"] * factor
        labels = labels.to(device, non_blocking=True)
        with state.precision.autocast():
            logits = state.model.forward(images.to(device, non_blocking=True))
        loss = F.cross_entropy(logits.float(), labels)
        state.optimizer.zero_grad(set_to_none=True)
        state.scaler.scale(loss).backward()
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.step += 1
        loss_sum += loss.detach() * len(labels)
        seen += len(labels)
    total, count = all_reduce_sum(state.ctx, torch.stack([loss_sum, torch.tensor(float(seen), device=device)]))
    return total / max(count, 1.0)


@torch.no_grad()
def validate(state: FinetuneState, loader: Any, blank: torch.Tensor) -> tuple[float, int]:
    """Top-1 accuracy on the validation images and how many there were, counted on each rank's
    shard and summed over the ranks.

    Every rank runs as many forwards as the rank with the most batches, because FSDP gathers
    parameters in each forward; `blank` (one zero image) stands in for the batches a rank lacks
    and for batches that lost every image to data.on_bad_image=skip.
    """
    device, model = state.ctx.device, state.model.module
    model.eval()
    counts = torch.zeros(2, device=device)
    batches = iter(loader)
    for _ in range(all_reduce_max(state.ctx, len(loader))):
        images, labels, _ = next(batches, (blank, torch.zeros(0, dtype=torch.int64), None))
        with state.precision.autocast():
            logits = model((images if len(images) else blank).to(device, non_blocking=True))
        predicted = logits.argmax(dim=1)[: len(labels)]
        counts[0] += (predicted == labels.to(device)).sum()
        counts[1] += len(labels)
    correct, total = all_reduce_sum(state.ctx, counts)
    return correct / max(total, 1.0), int(total)


def finetune(config: Config, ctx: DistContext, checkpoint: Path, data: FinetuneData) -> FinetuneResult:
    """Train backbone and head on `data.train`, validate on `data.val` after every epoch; every rank
    calls it. Seeded: the same inputs and world size give the same history."""
    settings = config.eval
    val_loader = build_eval_loader(config, indices=data.val, rank=ctx.rank, world_size=ctx.world_size,
                                   mean=data.mean, std=data.std)
    loader, sampler = build_train_loader(config, data, ctx)
    model = wrap_model(build_classifier(config, checkpoint, data.num_classes), config, ctx)
    state = FinetuneState(model, build_finetune_optimizer(model.module, settings),
                          resolve_precision(config.train.precision, ctx.device),
                          cosine_schedule(1.0, 0.0, settings.finetune_epochs, len(sampler)), ctx)
    blank = torch.zeros(1, config.data.in_chans, settings.image_size, settings.image_size)
    log.info("fine-tuning on %d images, validating on %d, %d rank(s) (%s), %d steps per epoch",
             len(data.train), len(data.val), ctx.world_size, parallel_mode(config, ctx), len(sampler))
    result = FinetuneResult()
    bar = tqdm(range(settings.finetune_epochs), desc="fine-tuning", unit="epoch", disable=not ctx.is_main)
    for epoch in bar:
        train_loss = train_epoch(state, loader, sampler, epoch)
        top1, images = validate(state, val_loader, blank)
        result.history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_top1": top1,
                               "val_images": images})
        bar.set_postfix(loss=f"{train_loss:.4f}", val_top1=f"{top1:.3f}")
        if ctx.is_main:
            log.info("epoch %d: train loss %.4f, validation top-1 %.3f", epoch + 1, train_loss, top1)
    ranks_log.info("rank %d/%d took %d training steps", ctx.rank, ctx.world_size, state.step)
    result.state = model.full_state_dict()
    return result


def finetune_inputs(config: Config, layout: RunLayout) -> tuple[Path, FinetuneData]:
    """The checkpoint to start from (as `features` picks it) and the training and validation images
    (the kNN split of the held-out images); MissingInputError names the step to run first."""
    from training.data.stats import load_mean_std
    from training.eval.feature_plan import final_checkpoint
    from training.eval.knn import reference_query
    from training.rundir.artifacts import load_labels

    checkpoint = final_checkpoint(config, layout)
    labels = load_labels(layout)
    mean, std = load_mean_std(config)
    check_labels_describe_dataset(config, layout, labels)
    _, ref, query = reference_query(labels, config.eval.knn_train_fraction, config.run.seed)
    indices = np.asarray(labels["indices"], np.int64)
    data = FinetuneData(train=indices[ref], val=indices[query], class_names=list(labels["class_names"]),
                        mean=mean, std=std)
    return checkpoint, data


def check_labels_describe_dataset(config: Config, layout: RunLayout, labels: dict[str, Any]) -> None:
    """Fine-tuning reads the images by the held-out labels' dataset indices: they must still be its images."""
    from training.data.dataset import paths_of

    images = open_images(config)
    indices = np.asarray(labels["indices"], np.int64)
    if len(indices) and (indices.max() >= len(images) or paths_of(images, indices) != list(labels["paths"])):
        raise UserError(f"{layout.labels} describes other images than {config.data.source}: "
                        "rerun `python -m training labels`")


def finetune_payload(config: Config, ctx: DistContext, checkpoint: Path, data: FinetuneData,
                     result: FinetuneResult) -> dict[str, Any]:
    """The fine-tuning results but their timing: settings, world size, parallel mode, per-epoch history."""
    from training.eval.feature_plan import checkpoint_epoch

    settings = config.eval
    return {
        "checkpoint": str(checkpoint), "checkpoint_epoch": checkpoint_epoch(checkpoint),
        "seed": config.run.seed, "epochs": settings.finetune_epochs, "lr": settings.finetune_lr,
        "backbone_lr_scale": settings.finetune_backbone_lr_scale, "weight_decay": settings.finetune_weight_decay,
        "batch_size_per_rank": settings.finetune_batch_size, "flips": settings.finetune_flips,
        "image_size": settings.image_size, "world_size": ctx.world_size, "parallel": parallel_mode(config, ctx),
        "precision": resolve_precision(config.train.precision, ctx.device).name,
        "n_train": int(len(data.train)), "n_val": int(len(data.val)), "class_names": list(data.class_names),
        "history": result.history, "final_top1": result.final_top1, "best_top1": result.best_top1,
    }


def write_finetune(config: Config, layout: RunLayout, payload: dict[str, Any], state: dict[str, Any]) -> str:
    """The fine-tuning results (JSON and Markdown) and weights, each written atomically; returns the
    summary table for the caller to show."""
    from training.eval.tables import finetune_history_rows, finetune_rows, markdown_table

    save_torch_atomic({"model": state, "class_names": payload["class_names"], "config": config.to_dict()},
                      layout.finetune_weights)
    write_json_atomic(layout.finetune_json, payload)
    summary = markdown_table(*finetune_rows(payload))
    history = markdown_table(*finetune_history_rows(payload))
    write_text_atomic(layout.finetune_md, f"# Fine-tuned backbone (validation top-1, %)\n\n{summary}\n\n"
                                          f"## Per epoch\n\n{history}\n")
    log.info("wrote %s", layout.finetune_json)
    return summary
