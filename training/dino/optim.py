"""Optimizer pieces of DINO: AdamW groups, per-tensor gradient clipping, last-layer freezing, EMA."""

from __future__ import annotations

import torch
from torch import nn

from training.dino.schedules import Schedules


def build_optimizer(student: nn.Module) -> torch.optim.AdamW:
    """AdamW with weight decay on all but biases and other 1-d parameters (norms), as in DINO.

    The learning rate and weight decay are set every step from the schedules; group 0 is the
    regularised one.
    """
    decay, no_decay = [], []
    for name, param in student.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if name.endswith(".bias") or param.ndim == 1 else decay).append(param)
    return torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}])


def apply_schedules(optimizer: torch.optim.Optimizer, schedules: Schedules, iteration: int) -> None:
    lr, weight_decay, _ = schedules.at(iteration)
    for index, group in enumerate(optimizer.param_groups):
        group["lr"] = lr
        if index == 0:
            group["weight_decay"] = weight_decay


def clip_gradients(model: nn.Module, max_norm: float) -> None:
    """Clip each parameter's gradient to norm `max_norm` separately, as DINO does.

    The norms stay on the device (no host synchronisation per parameter).
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    for grad, norm in zip(grads, torch._foreach_norm(grads)):
        grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))


def cancel_last_layer_gradients(model: nn.Module, epoch: int, freeze_epochs: int) -> None:
    """Keep the head's prototypes fixed for the first epochs; DINO finds it avoids early collapse."""
    if epoch >= freeze_epochs:
        return
    for name, param in model.named_parameters():
        if "last_layer" in name:
            param.grad = None


@torch.no_grad()
def update_teacher(student: nn.Module, teacher: nn.Module, momentum: float) -> None:
    """teacher = momentum * teacher + (1 - momentum) * student, parameter by parameter."""
    student_params = [p.detach() for p in student.parameters()]
    teacher_params = list(teacher.parameters())
    if len(student_params) != len(teacher_params):
        raise RuntimeError("student and teacher have different parameter lists")
    torch._foreach_mul_(teacher_params, momentum)
    torch._foreach_add_(teacher_params, student_params, alpha=1 - momentum)
