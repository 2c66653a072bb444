"""The DINO loss: cross-entropy between the centred, sharpened teacher and the student, over crop pairs.

Each call also measures the teacher's target distribution (`teacher_statistics`), which is what
shows a collapse (training/dino/collapse.py): the loss alone does not.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

TEACHER_STATISTICS = ("teacher_entropy", "teacher_batch_entropy", "center_norm")
"""The names of `DINOLoss.teacher_stats`' entries, in order (metrics.jsonl keys)."""


@torch.no_grad()
def teacher_statistics(teacher_p: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
    """[mean entropy of the rows of `teacher_p`, entropy of their mean, L2 norm of `center`], in nats.

    `teacher_p` is the target distribution (batch x out_dim), so a uniform output gives ln(out_dim)
    for both entropies, a healthy one low per-image entropy but a high batch entropy (sharp but
    diverse), and one prototype for every image gives both near 0. `entr` is -p ln p with 0 at p = 0,
    so probabilities that underflow at a sharp temperature add nothing rather than NaN.
    """
    per_image = torch.special.entr(teacher_p).sum(dim=-1).mean()
    of_batch_mean = torch.special.entr(teacher_p.mean(dim=0)).sum()
    return torch.stack([per_image, of_batch_mean, center.float().norm()])


def teacher_temperature_schedule(
    warmup_temp: float, temp: float, warmup_epochs: int, epochs: int
) -> np.ndarray:
    """Per-epoch teacher temperature: linear warm-up, then constant (DINO's recipe)."""
    warmup = np.linspace(warmup_temp, temp, warmup_epochs)
    return np.concatenate((warmup, np.full(max(epochs - warmup_epochs, 0), temp)))


class DINOLoss(nn.Module):
    """Student crops learn to predict the teacher's distribution on the *other* global crop.

    The teacher output is centred (an EMA of its batch mean, over all ranks) and sharpened (a low
    temperature); together they prevent collapse. The centre is a buffer so it is checkpointed.
    After each call `teacher_stats` holds this rank's `teacher_statistics` of the step's target
    (the centre before its update: the one the target used), on the device, not synchronised.
    `collapse_state` is the collapse detector's state (training/dino/collapse.py), kept here so
    that checkpoints carry it without a key of their own.
    """

    def __init__(
        self,
        out_dim: int,
        n_crops: int,
        *,
        teacher_temps: np.ndarray,
        student_temp: float = 0.1,
        center_momentum: float = 0.9,
    ) -> None:
        super().__init__()
        self.n_crops = n_crops
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.teacher_temps = teacher_temps
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_stats: torch.Tensor | None = None
        self.collapse_state: dict[str, Any] = {}
        self.register_load_state_dict_pre_hook(_accept_checkpoints_without_detector_state)

    def forward(self, student_out: torch.Tensor, teacher_out: torch.Tensor, epoch: int) -> torch.Tensor:
        temp = float(self.teacher_temps[min(epoch, len(self.teacher_temps) - 1)])
        student_logp = F.log_softmax(student_out.float() / self.student_temp, dim=-1).chunk(self.n_crops)
        teacher_p = F.softmax((teacher_out.float() - self.center) / temp, dim=-1).detach()
        self.teacher_stats = teacher_statistics(teacher_p, self.center)
        teacher_p = teacher_p.chunk(2)
        total, n_terms = student_out.new_zeros((), dtype=torch.float32), 0
        for t_index, target in enumerate(teacher_p):
            for s_index, logp in enumerate(student_logp):
                if s_index == t_index:
                    continue  # the same view on both sides would be trivial
                total = total + torch.sum(-target * logp, dim=-1).mean()
                n_terms += 1
        self.update_center(teacher_out)
        return total / n_terms

    def get_extra_state(self) -> dict[str, dict[str, Any]]:
        return {"collapse_state": copy.deepcopy(self.collapse_state)}

    def set_extra_state(self, state: dict[str, dict[str, Any]]) -> None:
        self.collapse_state.clear()  # in place: a detector may hold this dict
        self.collapse_state.update(copy.deepcopy(state.get("collapse_state", {})))

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        """EMA of the teacher's mean output over the global batch (all ranks)."""
        batch_sum = teacher_out.float().sum(dim=0, keepdim=True)
        count = batch_sum.new_full((1,), float(len(teacher_out)))  # a fill, not a copy that waits for the GPU
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch_sum)
            dist.all_reduce(count)
        batch_center = batch_sum / count
        self.center.mul_(self.center_momentum).add_(batch_center * (1 - self.center_momentum))


def _accept_checkpoints_without_detector_state(module: nn.Module, state_dict: dict, prefix: str, *args: object) -> None:
    """Checkpoints written before the collapse detector have no extra state: resume them with none.
    Those written under its earlier rule (a count of steps in a row, "collapse_streaks") start its
    window afresh: set_extra_state reads only "collapse_state"."""
    state_dict.setdefault(prefix + "_extra_state", {"collapse_state": {}})
