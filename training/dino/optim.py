"""Optimizer pieces of DINO: AdamW groups, per-tensor gradient clipping, last-layer freezing, EMA.

Each piece runs as a few multi-tensor kernels rather than a few per parameter tensor (ViT-S has
158): AdamW is PyTorch's fused implementation, the clipping takes every norm in one `_foreach_norm`
and the coefficients as one vector, and the teacher update is one `_foreach_lerp_`. Nothing here
reads a value back to the host, so the step can be queued behind the backward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from training.dino.schedules import Schedules

FUSED_DEVICES = ("cuda", "cpu")
"""Devices whose AdamW has a fused kernel in the torch we pin (one kernel group for all tensors)."""


def build_optimizer(student: nn.Module, *, implementation: str = "auto") -> torch.optim.AdamW:
    """AdamW with weight decay on all but biases and other 1-d parameters (norms), as in DINO.

    The learning rate and weight decay are set every step from the schedules; group 0 is the
    regularised one. `implementation`: "fused" (PyTorch's fused kernel), "foreach" (multi-tensor
    kernels), "for-loop" (one tensor at a time, as DINO's main_dino.py runs it); "auto" is fused
    where every parameter's device has the kernel, else foreach. The three give the same update
    within float32 rounding. A resumed optimizer keeps the implementation it was built with, not the
    one its checkpoint was saved from (`_keep_implementation`).
    """
    decay, no_decay = [], []
    for name, param in student.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if name.endswith(".bias") or param.ndim == 1 else decay).append(param)
    if implementation == "auto":
        fusable = all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in decay + no_decay)
        implementation = "fused" if fusable else "foreach"
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True},
             "for-loop": {"foreach": False, "fused": False}}
    if implementation not in flags:
        raise ValueError(f"implementation must be auto, {', '.join(flags)}; got {implementation!r}")
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                                  **flags[implementation])
    optimizer.register_load_state_dict_post_hook(_keep_implementation(optimizer.param_groups))
    return optimizer


def _keep_implementation(groups: list[dict[str, Any]]):
    """A post-hook for `load_state_dict`, which takes the saved groups' `fused` and `foreach` (a
    checkpoint of an earlier, unfused run would otherwise turn fusing off, while a fused AdamW's
    gradient-scaler handshake stays on): restore the built ones, and keep each `step` counter where
    that implementation wants it (on the parameter's device, as float32, when fused)."""
    built = [(group.get("fused"), group.get("foreach")) for group in groups]

    def hook(optimizer: torch.optim.Optimizer) -> None:
        for group, (fused, foreach) in zip(optimizer.param_groups, built):
            group["fused"], group["foreach"] = fused, foreach
            for param in group["params"]:
                step = optimizer.state.get(param, {}).get("step")
                if isinstance(step, torch.Tensor):
                    device = param.device if fused else torch.device("cpu")
                    optimizer.state[param]["step"] = step.to(device=device, dtype=torch.float32)

    return hook


def apply_schedules(optimizer: torch.optim.Optimizer, schedules: Schedules, iteration: int) -> None:
    lr, weight_decay, _ = schedules.at(iteration)
    for index, group in enumerate(optimizer.param_groups):
        group["lr"] = lr
        if index == 0:
            group["weight_decay"] = weight_decay


def clip_gradients(model: nn.Module, max_norm: float) -> None:
    """Clip each parameter's gradient to norm `max_norm` separately, as DINO does:
    grad *= min(1, max_norm / (norm + 1e-6)).

    All norms in one `_foreach_norm`, the coefficients as one vector, then one `_foreach_mul_`;
    nothing is read back to the host.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    norms = torch.stack(torch._foreach_norm(grads))
    coefficients = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
    torch._foreach_mul_(grads, list(coefficients.to(grads[0].dtype).unbind()))


def cancel_last_layer_gradients(model: nn.Module, epoch: int, freeze_epochs: int) -> None:
    """Keep the head's prototypes fixed for the first epochs; DINO finds it avoids early collapse."""
    if epoch >= freeze_epochs:
        return
    for name, param in model.named_parameters():
        if "last_layer" in name:
            param.grad = None


@torch.no_grad()
def update_teacher(student: nn.Module, teacher: nn.Module, momentum: float) -> None:
    """teacher = momentum * teacher + (1 - momentum) * student, every tensor in one `_foreach_lerp_`
    (teacher + (1 - momentum) * (student - teacher): the same within float32 rounding)."""
    student_params = [p.detach() for p in student.parameters()]
    teacher_params = list(teacher.parameters())
    if len(student_params) != len(teacher_params):
        raise RuntimeError("student and teacher have different parameter lists")
    torch._foreach_lerp_(teacher_params, student_params, 1.0 - momentum)
