"""Feature extraction across ranks: each rank encodes its shard, the feature sets are written as
the rows come, never held whole.

Several encoders (checkpoints of different epochs, the baselines) share one pass over the images,
because reading and resizing the held-out TIFFs costs more than the forward passes on a GPU.
On one rank whose batches follow the dataset's order, each batch's rows go straight to the sets
(training/rundir/features.py, FeatureSetWriter). Otherwise every rank writes its rows, with their
dataset indices, to a part beside each set, and rank 0 merges the parts into the set in dataset
order, a block at a time (merge_parts): the set is identical whatever the number of ranks, and its
size never sits in memory (15 GB of float32 at 10^7 cells of 384 features).
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from training.rundir.features import FeaturePartWriter, FeatureSetWriter, merge_parts

log = logging.getLogger(__name__)

Encoder = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SetTarget:
    """Where an encoder's feature set goes: its folder, its width and what its index records
    (rank 0's; the other ranks write parts only)."""

    directory: Path
    dim: int
    meta: dict[str, Any] = field(default_factory=dict)


def raw_pixel_encoder(size: int) -> Encoder:
    """Baseline: the normalised image average-pooled to size x size per channel, flattened.

    Pooling keeps the dimension modest (5 channels x 16 x 16 = 1280) while retaining the coarse
    intensity layout that a pixel-space kNN can exploit.
    """

    def encode(images: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(images.float(), size).flatten(1)

    return encode


@torch.no_grad()
def encode_batches(encoders: Mapping[str, Encoder], batches: Iterable, device: torch.device, *,
                   progress: bool = False) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Each batch `(images, labels, indices)` encoded by every encoder: its dataset indices and each
    encoder's rows, L2-normalised float32, in the batch's order."""
    for images, _, batch_indices in tqdm(batches, desc="features", unit="batch", disable=not progress):
        images = images.to(device, non_blocking=True)
        rows = {name: F.normalize(encode(images).float(), dim=1).cpu().numpy() for name, encode in encoders.items()}
        yield np.asarray(batch_indices, np.int64), rows


def rank_and_ranks() -> tuple[int, int]:
    """This process's rank and the number of ranks (0 and 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def extract_sets(encoders: Mapping[str, Encoder], batches: Iterable, device: torch.device,
                 targets: Mapping[str, SetTarget], *, ascending: bool, progress: bool = False) -> None:
    """Encode this rank's batches and write each encoder's feature set to its target; every rank
    calls it. `ascending`: the batches follow ascending dataset indices (the eval loader keeps the
    order of the rows it is given); on one rank the rows are then written as they come."""
    rank, ranks = rank_and_ranks()
    if ranks == 1 and ascending:
        with ExitStack() as stack:
            writers = {name: stack.enter_context(FeatureSetWriter(t.directory, t.dim, t.meta))
                       for name, t in targets.items()}
            for indices, rows in encode_batches(encoders, batches, device, progress=progress):
                order = np.argsort(indices, kind="stable")  # a batch's own order: the writer checks the rest
                for name, writer in writers.items():
                    writer.append(indices[order], rows[name][order])
        return
    with ExitStack() as stack:
        parts = {name: stack.enter_context(FeaturePartWriter(t.directory, rank, ranks, t.dim))
                 for name, t in targets.items()}
        for indices, rows in encode_batches(encoders, batches, device, progress=progress):
            for name, part in parts.items():
                part.append(indices, rows[name])
    if ranks > 1:
        dist.barrier()  # every part is written before rank 0 reads them
    if rank == 0:
        for target in targets.values():
            merge_parts(target.directory, ranks, target.dim, target.meta)
