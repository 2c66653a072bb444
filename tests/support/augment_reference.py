"""Test oracles for training/data/loading/augment.py: the blur written as a dense matrix, the obvious way."""

from __future__ import annotations

import torch

from training.data.loading.augment import BLUR_KERNEL


def blur_matrices(sigma: torch.Tensor, size: int) -> torch.Tensor:
    """(B, size, size) matrices applying torchvision's GaussianBlur along one axis (kernel 5, reflect
    borders), one sigma per matrix; `B @ crop @ B^T` is the 2-D blur."""
    t = torch.arange(BLUR_KERNEL, dtype=torch.float32) - BLUR_KERNEL // 2
    kernel = torch.exp(-0.5 * (t[None] / sigma.float()[:, None]) ** 2)
    kernel = kernel / kernel.sum(1, keepdim=True)
    source = torch.arange(size)[:, None] + t.long()[None]
    source = torch.where(source < 0, -source, torch.where(source > size - 1, 2 * (size - 1) - source, source))
    matrix = torch.zeros(sigma.shape[0], size, size)
    weights = kernel[:, None, :].expand(-1, size, -1)
    return matrix.scatter_add_(2, source[None].expand(sigma.shape[0], -1, -1), weights.contiguous())
