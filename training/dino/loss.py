"""The DINO loss: cross-entropy between the centred, sharpened teacher and the student, over crop pairs."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


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

    def forward(self, student_out: torch.Tensor, teacher_out: torch.Tensor, epoch: int) -> torch.Tensor:
        temp = float(self.teacher_temps[min(epoch, len(self.teacher_temps) - 1)])
        student_logp = F.log_softmax(student_out.float() / self.student_temp, dim=-1).chunk(self.n_crops)
        teacher_p = F.softmax((teacher_out.float() - self.center) / temp, dim=-1).detach().chunk(2)
        total, n_terms = student_out.new_zeros((), dtype=torch.float32), 0
        for t_index, target in enumerate(teacher_p):
            for s_index, logp in enumerate(student_logp):
                if s_index == t_index:
                    continue  # the same view on both sides would be trivial
                total = total + torch.sum(-target * logp, dim=-1).mean()
                n_terms += 1
        self.update_center(teacher_out)
        return total / n_terms

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        """EMA of the teacher's mean output over the global batch (all ranks)."""
        batch_sum = teacher_out.float().sum(dim=0, keepdim=True)
        count = torch.tensor([float(len(teacher_out))], device=teacher_out.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch_sum)
            dist.all_reduce(count)
        batch_center = batch_sum / count
        self.center.mul_(self.center_momentum).add_(batch_center * (1 - self.center_momentum))
