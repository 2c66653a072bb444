"""Which images each rank reads, batch by batch; shared by the torch and the DALI data paths."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from training.config import Config
from training.errors import UserError


class DistributedBatchSampler(Sampler):
    """Per-rank batches of dataset indices, reshuffled each epoch, equal in number on every rank.

    The shuffled indices are padded by repetition to a multiple of the world size (as torch's
    DistributedSampler), then every rank drops its incomplete last batch: all ranks run the same
    number of steps and none waits forever in a collective on uneven data.
    """

    def __init__(self, indices: np.ndarray, batch_size: int, *, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = True, pad: bool = True,
                 groups: np.ndarray | None = None) -> None:
        self.indices = np.asarray(indices, dtype=np.int64)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.shuffle, self.drop_last, self.pad = seed, shuffle, drop_last, pad
        self.groups = None if groups is None else np.asarray(groups)
        """Each index's group (data.balance_column): set, every batch holds each group alike (`_balanced`)."""
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _balanced(self) -> np.ndarray:
        """This rank's epoch with the groups taking turns: each group shuffled, dealt to the ranks, its
        share cycled to the longest share of any group, then interleaved, so that every run of
        len(groups) consecutive indices, and so every batch, holds each group alike; a group smaller
        than the others repeats its cells within the epoch."""
        rng = np.random.default_rng([self.seed, self.epoch])
        members = [rng.permutation(self.indices[self.groups == g]) for g in np.unique(self.groups)]
        per_rank = -(-max(len(m) for m in members) // self.world_size)
        shares = [m[self.rank::self.world_size] if len(m) > self.rank else m for m in members]
        return np.stack([np.resize(share, per_rank) for share in shares]).T.reshape(-1)

    def _shard(self) -> np.ndarray:
        if self.groups is not None:
            return self._balanced()
        order = self.indices
        if self.shuffle:
            order = order[np.random.default_rng([self.seed, self.epoch]).permutation(len(order))]
        if self.pad and len(order) % self.world_size:
            extra = self.world_size - len(order) % self.world_size
            order = np.concatenate([order, np.resize(order, extra)])
        return order[self.rank::self.world_size]

    def __len__(self) -> int:
        if self.groups is not None:
            n = len(np.unique(self.groups)) * -(-max(np.unique(self.groups, return_counts=True)[1]) // self.world_size)
        else:
            n = len(self._shard()) if not self.pad else -(-len(self.indices) // self.world_size)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        shard = self._shard()
        for k in range(len(self)):
            seed = int(np.random.default_rng([self.seed, self.epoch, self.rank, k]).integers(2**62))
            yield seed, shard[k * self.batch_size:(k + 1) * self.batch_size]


def check_stats(mean: Sequence[float], std: Sequence[float], config: Config) -> None:
    """The normalisation must have one mean and std per selected channel."""
    if len(mean) != config.data.in_chans or len(std) != config.data.in_chans:
        raise UserError(f"mean/std have {len(mean)}/{len(std)} values for {config.data.in_chans} channels "
                        f"(data.channels={config.data.channels!r}): re-run `python -m training mean-std`")


def pretrain_sampler(config: Config, train: np.ndarray, *, rank: int, world_size: int) -> DistributedBatchSampler:
    """This rank's shuffled training batches; a split that cannot fill one batch per rank is refused."""
    batch = config.optim.batch_size_per_gpu
    groups = balance_groups(config, train)
    sampler = DistributedBatchSampler(train, batch, rank=rank, world_size=world_size, seed=config.run.seed,
                                      groups=groups)
    if len(sampler) == 0:
        raise UserError(f"{len(train)} training images cannot fill one batch of optim.batch_size_per_gpu={batch} "
                        f"on each of {world_size} ranks: lower the batch size or add images")
    return sampler


def balance_groups(config: Config, train: np.ndarray) -> np.ndarray | None:
    """Each training cell's value of data.balance_column (category codes), or None when it is unset.
    Cells without a value form a group of their own."""
    if not config.data.balance_column:
        return None
    from training.data.dataset import open_images

    table = getattr(open_images(config), "table", None)
    if table is None:
        raise UserError(f"data.balance_column={config.data.balance_column} needs a per-cell table (a dataset made "
                        "by `prepare` or `ingest`); a TIFF folder has none")
    name = table.find(config.data.balance_column, "data.balance_column")
    groups = table.categories(name).codes[np.asarray(train, np.int64)]
    if len(np.unique(groups)) < 2:
        raise UserError(f"data.balance_column={name} has one value among the training cells: there is nothing to "
                        "balance; leave it empty")
    return groups
