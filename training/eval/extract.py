"""Feature extraction across ranks: each rank encodes its shard, rank 0 receives every row.

Several encoders (checkpoints of different epochs, the baselines) share one pass over the images,
because reading and resizing the held-out TIFFs costs more than the forward passes on a GPU.
Rows travel with their dataset index, so the gathered set is sorted back into dataset order and is
identical whatever the number of ranks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

log = logging.getLogger(__name__)

Encoder = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Shard:
    """Rows computed (or gathered) on one rank: dataset indices, labels and one array per encoder."""

    indices: np.ndarray
    labels: np.ndarray
    features: dict[str, np.ndarray]


def raw_pixel_encoder(size: int) -> Encoder:
    """Baseline: the normalised image average-pooled to size x size per channel, flattened.

    Pooling keeps the dimension modest (5 channels x 16 x 16 = 1280) while retaining the coarse
    intensity layout that a pixel-space kNN can exploit.
    """

    def encode(images: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(images.float(), size).flatten(1)

    return encode


@torch.no_grad()
def extract_shard(
    encoders: Mapping[str, Encoder], batches: Iterable, device: torch.device, *, progress: bool = False
) -> Shard:
    """Encode every batch `(images, labels, indices)` with each encoder; rows are L2-normalised."""
    indices, labels = [], []
    features: dict[str, list[np.ndarray]] = {name: [] for name in encoders}
    for images, batch_labels, batch_indices in tqdm(batches, desc="features", unit="batch", disable=not progress):
        images = images.to(device, non_blocking=True)
        for name, encode in encoders.items():
            rows = F.normalize(encode(images).float(), dim=1)
            features[name].append(rows.cpu().numpy())
        indices.append(np.asarray(batch_indices, np.int64))
        labels.append(np.asarray(batch_labels, np.int64))
    return Shard(
        indices=np.concatenate(indices) if indices else np.zeros(0, np.int64),
        labels=np.concatenate(labels) if labels else np.zeros(0, np.int64),
        features={name: np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)
                  for name, rows in features.items()},
    )


def _gather_device() -> torch.device:
    """NCCL moves CUDA tensors only; gloo moves CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_rows(rows: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    """all_gather of tensors whose first dimension differs between ranks (padded, then trimmed)."""
    count = torch.tensor([rows.shape[0]], device=device)
    counts = [torch.zeros_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    longest = int(max(c.item() for c in counts))
    padded = torch.zeros((longest, *rows.shape[1:]), dtype=rows.dtype, device=device)
    padded[: rows.shape[0]] = rows.to(device)
    received = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(received, padded)
    return [r[: int(c.item())].cpu() for r, c in zip(received, counts)]


def gather_shards(shard: Shard, names: list[str], dims: dict[str, int]) -> Shard | None:
    """Every rank's rows, sorted by dataset index, on rank 0 (None elsewhere); a no-op on one rank.

    `dims` gives each encoder's output width so that a rank with an empty shard can still take part.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        order = np.argsort(shard.indices, kind="stable")
        return Shard(shard.indices[order], shard.labels[order], {n: shard.features[n][order] for n in names})
    device = _gather_device()
    ids = torch.from_numpy(np.stack([shard.indices, shard.labels], axis=1))
    all_ids = torch.cat(_all_gather_rows(ids, device)).numpy()
    gathered = {}
    for name in names:
        rows = shard.features[name].reshape(-1, dims[name]).astype(np.float32)
        gathered[name] = torch.cat(_all_gather_rows(torch.from_numpy(rows), device)).numpy()
    if dist.get_rank() != 0:
        return None
    order = np.argsort(all_ids[:, 0], kind="stable")
    if len(np.unique(all_ids[:, 0])) != len(all_ids):
        raise RuntimeError("ranks extracted overlapping shards: the eval loader must not pad or repeat images")
    return Shard(all_ids[order, 0], all_ids[order, 1], {n: gathered[n][order] for n in names})
