"""One DINO training step, split into forward and update so benchmarks can time each part.

forward: the teacher sees the 2 global crops, the student all crops, the loss compares them.
update: backward (scaled under fp16), per-tensor clipping, last-layer freezing, AdamW with the
scheduled lr / weight decay, then the EMA teacher update with the scheduled momentum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from training.config import Config
from training.dino.channels import select_channels, step_bag_crops, step_channels
from training.dino.loss import DINOLoss
from training.dino.optim import apply_schedules, cancel_last_layer_gradients, clip_gradients, update_teacher
from training.dino.schedules import Schedules
from training.distributed.parallel import ParallelModels, mark_step_begin
from training.precision import Precision


@dataclass
class TrainState:
    """Everything a step changes; checkpoints save it and resume restores it."""

    config: Config
    models: ParallelModels
    optimizer: torch.optim.Optimizer
    scaler: Any
    loss_fn: DINOLoss
    schedules: Schedules
    precision: Precision
    epoch: int = 0
    """Completed epochs."""
    step_in_epoch: int = 0
    """Steps done in the current epoch."""
    global_step: int = 0
    """Steps done since the start of the run; indexes the schedules."""
    rng_on_resume: dict[str, Any] | None = field(default=None, repr=False)
    """RNG state to restore after skipping the batches already done in an interrupted epoch."""
    epoch_rng: dict[str, Any] | None = field(default=None, repr=False)
    """RNG state captured just before the current epoch's data iterator was created."""


def forward_loss(state: TrainState, crops: list[torch.Tensor], epoch: int) -> torch.Tensor:
    """Teacher on the global crops, student on all; a channel-adaptive model sees this step's
    channel subset, or each image's channels as images of their own (training/dino/channels.py),
    the same for both."""
    channels = step_channels(state.config, state.global_step)
    extra: dict[str, Any] = {}
    if channels is not None:
        crops = select_channels(crops, state.config, channels)
        extra["channels"] = channels
    crops = step_bag_crops(crops, state.config, state.global_step)
    mark_step_begin(state.config)
    with state.precision.autocast():
        with torch.no_grad():
            teacher_out = state.models.teacher(crops[:2], **extra)
        student_out = state.models.student_forward(crops, **extra)
    return state.loss_fn(student_out, teacher_out, epoch)


def backward(state: TrainState, loss: torch.Tensor) -> None:
    apply_schedules(state.optimizer, state.schedules, state.global_step)
    state.optimizer.zero_grad(set_to_none=True)
    state.scaler.scale(loss).backward()


def optimizer_step(state: TrainState, epoch: int) -> None:
    """Clip, freeze the last layer early on, step AdamW, then move the teacher towards the student."""
    optim = state.config.optim
    student = state.models.student
    if optim.clip_grad > 0:
        state.scaler.unscale_(state.optimizer)
        clip_gradients(student, optim.clip_grad)
    cancel_last_layer_gradients(student, epoch, optim.freeze_last_layer)
    state.scaler.step(state.optimizer)
    state.scaler.update()
    _, _, momentum = state.schedules.at(state.global_step)
    update_teacher(student, state.models.teacher, momentum)


def update(state: TrainState, loss: torch.Tensor, epoch: int) -> None:
    backward(state, loss)
    optimizer_step(state, epoch)
