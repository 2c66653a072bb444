"""DINO projection head and the multi-crop wrapper (same parameter names as facebookresearch/dino)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class WeightNormLinear(nn.Module):
    """Bias-free linear layer with weight = g * v / ||v|| per output row.

    Written out instead of `torch.nn.utils.weight_norm` (deprecated) or its parametrisation (which
    renames the parameters): this keeps DINO's checkpoint keys `weight_g` and `weight_v`.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_g = nn.Parameter(torch.ones(out_features, 1))
        nn.init.trunc_normal_(self.weight_v, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight_g * self.weight_v / self.weight_v.norm(dim=1, keepdim=True)
        return F.linear(x, weight)


class DINOHead(nn.Module):
    """MLP (3 layers, GELU) -> L2-normalised bottleneck -> weight-normalised prototypes."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        use_bn: bool = False,
        norm_last_layer: bool = True,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        nlayers: int = 3,
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (nlayers - 1)
        layers: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            layers.append(nn.Linear(d_in, d_out))
            if use_bn:
                layers.append(nn.BatchNorm1d(d_out))
            layers.append(nn.GELU())
        layers.append(nn.Linear(dims[-1], bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        self.apply(_init_linear)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim)
        # A fixed norm (g = 1) keeps the prototypes on the sphere; DINO finds it stabler.
        self.last_layer.weight_g.requires_grad = not norm_last_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return self.last_layer(x)


def _init_linear(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class MultiCropWrapper(nn.Module):
    """Runs the backbone once per run of same-sized crops, then the head on all CLS features.

    Input: a list of crop batches (global crops first); output: (n_crops * B, out_dim), crop-major.
    `channels`, for a channel-adaptive backbone only, are the original ids of the crops' channels.
    """

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, crops: list[torch.Tensor] | torch.Tensor,
                channels: tuple[int, ...] | None = None) -> torch.Tensor:
        if isinstance(crops, torch.Tensor):
            crops = [crops]
        extra = {} if channels is None else {"channels": channels}
        features = []
        start = 0
        for end in _same_size_runs(crops):
            features.append(self.backbone(torch.cat(crops[start:end]), **extra))
            start = end
        return self.head(torch.cat(features))


def _same_size_runs(crops: list[torch.Tensor]) -> list[int]:
    """End indices of consecutive crops sharing a spatial size, e.g. [2, 10] for 2 global + 8 local."""
    ends = []
    for i in range(1, len(crops) + 1):
        if i == len(crops) or crops[i].shape[-2:] != crops[i - 1].shape[-2:]:
            ends.append(i)
    return ends
