"""The DINO method: loss with centring, EMA teacher, schedules, optimizer pieces and the step."""

from training.dino.loss import DINOLoss, teacher_temperature_schedule
from training.dino.optim import (
    build_optimizer,
    cancel_last_layer_gradients,
    clip_gradients,
    update_teacher,
)
from training.dino.schedules import Schedules, build_schedules, scaled_lr

__all__ = [
    "DINOLoss",
    "Schedules",
    "build_optimizer",
    "build_schedules",
    "cancel_last_layer_gradients",
    "clip_gradients",
    "scaled_lr",
    "teacher_temperature_schedule",
    "update_teacher",
]
