"""One DINO training step, split into forward and update so benchmarks can time each part.

forward: the teacher sees the 2 global crops, the student all crops, the loss compares them.
update: backward (scaled under fp16), per-tensor clipping, last-layer freezing, AdamW with the
scheduled lr / weight decay, then the EMA teacher update with the scheduled momentum.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from training.config import Config, ConfigError
from training.dino.loss import DINOLoss
from training.dino.optim import apply_schedules, cancel_last_layer_gradients, clip_gradients, update_teacher
from training.dino.schedules import Schedules
from training.parallel import ParallelModels


@dataclass(frozen=True)
class Precision:
    name: str
    """fp32, bf16 or fp16 (fp16 uses a gradient scaler)."""
    device_type: str

    @property
    def dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.name]

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """auto: bf16 on GPUs that have it, fp16 on those that do not (T4), fp32 on CPU."""
    if device.type != "cuda":
        if requested == "fp16":
            raise ConfigError("train.precision=fp16 needs a CUDA GPU; use auto, fp32 or bf16 on CPU")
        return Precision("bf16" if requested == "bf16" else "fp32", device.type)
    has_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    if requested == "auto":
        return Precision("bf16" if has_bf16 else "fp16", "cuda")
    if requested == "bf16" and not has_bf16:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(f"train.precision=bf16: {name} has no bf16; use auto or fp16")
    return Precision(requested, "cuda")


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
    with state.precision.autocast():
        with torch.no_grad():
            teacher_out = state.models.teacher(crops[:2])
        student_out = state.models.student_forward(crops)
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
