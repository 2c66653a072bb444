"""The one factory of pretraining loaders: the torch path or DALI, chosen by data.loader.

    loader, sampler = build_pretrain_loader(config, rank=0, world_size=1, mean=mean, std=std)

Both paths yield `(crops: [global1, global2, local...], labels)` batches, the same number per rank
(under data.gpu_augment the torch path yields `(RawBatch, labels)`: see `crops_on_device`).
"""

from __future__ import annotations

from typing import Any, Sequence

from training.config import Config
from training.data.dataset import open_images
from training.data.loading.sampler import DistributedBatchSampler, pretrain_sampler
from training.data.loading.torch_loader import crops_on_device, torch_pretrain_loader
from training.data.split import load_split

__all__ = ["build_pretrain_loader", "crops_on_device"]


def build_pretrain_loader(config: Config, *, rank: int, world_size: int, mean: Sequence[float],
                          std: Sequence[float], device: str | None = None) -> tuple[Any, DistributedBatchSampler]:
    """(loader, sampler) of this rank's training batches; `device` only matters for DALI.
    Each path checks mean/std against the channels itself (check_stats)."""
    if config.data.loader == "dali":
        from training.data.loading.dali import build_dali_pretrain_loader

        return build_dali_pretrain_loader(config, rank=rank, world_size=world_size, mean=mean, std=std,
                                          device=device)
    sampler = pretrain_sampler(config, load_split(config).train, rank=rank, world_size=world_size)
    return torch_pretrain_loader(config, open_images(config), sampler, mean, std), sampler
