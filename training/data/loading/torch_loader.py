"""The torch data path: pretraining batches (multi-crop) and evaluation batches (resized whole images).

`training.data.loading.loaders.build_pretrain_loader` chooses between this and DALI (training/data/loading/dali.py).

Each DataLoader item is a whole batch: the sampler yields `(batch_seed, indices)`, a worker reads
those images (one fancy-indexing copy from the packed memory map, or one TIFF each), min-max
scales them and augments the batch at once (training.data.loading.augment). Crops depend only on the
batch seed, so they are the same whatever the number of workers or a resume.

Pretraining batches come from a `RingLoader`: worker threads (torch's kernels release the GIL)
write the crops into a small ring of preallocated (pinned, when a GPU exists) buffers, so no batch
pays for fresh memory or for a copy between processes. Lifetime rule: the tensors of batch i are
valid until the consumer asks for batch i + 1 (`RingLoader.hold` batches in general); a consumer
that keeps crops longer must clone them. With data.gpu_augment the loader hands out `RawBatch`es
(the raw integer pixels and the batch seed) and `crops_on_device` augments them where the model is.

A bad image met at read time is never a crash deep in a worker: under data.on_bad_image=skip it
is logged and replaced; under `fail` the worker hands back a marker and the main process raises
one clear UserError naming the file.
"""

from __future__ import annotations

import ctypes
import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from training.config import Config
from training.data.dataset import BadImageError, minmax_scale, open_images
from training.data.loading.augment import (
    BatchMultiCrop,
    CropBuffers,
    ViewPlan,
    centre_crop,
    image_sizes,
    normalise,
    resize_full,
    resize_shorter_side,
    to_device,
)
from training.data.loading.sampler import DistributedBatchSampler, check_stats
from training.data.store.read import PackedImages
from training.data.tiff import BadImage
from training.errors import UserError

log = logging.getLogger(__name__)
SUBSTITUTE_TRIES = 16


@dataclass(frozen=True)
class FailedBatch:
    """Returned by a worker process instead of a batch when a UserError (a damaged run file) stops
    the step: raised again as itself in the main process, one line, where torch would wrap it in a
    RuntimeError carrying the worker's traceback."""

    error: UserError


@dataclass(frozen=True)
class BadBatch:
    """Returned by a worker instead of a batch when a bad image must stop the run."""

    path: str
    reason: str


class BatchDataset(Dataset):
    """Maps `(seed, indices)` to a finished batch: reads, scales, then applies `transform`."""

    def __init__(self, images, channel_indices: Sequence[int], on_bad_image: str,
                 transform: Callable, *, substitute: bool) -> None:
        self.images, self.channel_indices = images, list(channel_indices)
        self.on_bad_image, self.transform, self.substitute = on_bad_image, transform, substitute
        self._warned: set[str] = set()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, item: tuple[int, np.ndarray]):
        return self.batch(item)

    def batch(self, item: tuple[int, np.ndarray], out: CropBuffers | None = None):
        """The finished batch for `(seed, indices)`, written into `out` when the transform can."""
        seed, indices = item
        raw = getattr(self.transform, "raw", False)
        try:
            images, kept = self._read(np.asarray(indices), scale=not raw)
        except BadImage as bad:
            return BadBatch(bad.path, bad.reason)
        except UserError as exc:
            if torch.utils.data.get_worker_info() is None:
                raise
            return FailedBatch(exc)
        labels = torch.from_numpy(np.asarray(self.images.labels[kept], np.int64))
        if raw:
            return self.transform(images, labels, torch.from_numpy(kept), seed)
        generator = torch.Generator().manual_seed(seed)
        if out is not None:
            return self.transform(images, labels, torch.from_numpy(kept), generator, out=out)
        return self.transform(images, labels, torch.from_numpy(kept), generator)

    def _read(self, indices: np.ndarray, scale: bool = True) -> tuple[torch.Tensor | list[torch.Tensor], np.ndarray]:
        """Selected channels, as float32 min-max scaled (or raw with scale=False): one tensor if
        shapes agree, else a list."""
        prepare = _scaled if scale else _raw
        if isinstance(self.images, PackedImages) and self.images.uniform_shape is not None:
            return prepare(self.images.read_batch(indices)[:, self.channel_indices]), indices
        arrays, kept = [], []
        for i in indices:
            found = self._read_one(int(i))
            if found is not None:
                arrays.append(found[1])
                kept.append(found[0])
        tensors = [prepare(a[self.channel_indices]) for a in arrays]
        if len({t.shape for t in tensors}) == 1:
            tensors = torch.stack(tensors)
        return tensors, np.asarray(kept, dtype=np.int64)

    def _read_one(self, i: int) -> tuple[int, np.ndarray] | None:
        """(index, image) for i, or under `skip` a following good image (or None for eval)."""
        for k in range(SUBSTITUTE_TRIES if self.substitute else 1):
            j = (i + k) % len(self.images)
            try:
                return j, self.images.read(j)
            except BadImage as bad:
                if self.on_bad_image == "fail":
                    raise
                if bad.path not in self._warned:
                    self._warned.add(bad.path)
                    log.warning("skipping bad image %s: %s", bad.path, bad.reason)
        if self.substitute:
            raise BadImage(self.images.paths[i], f"it and the next {SUBSTITUTE_TRIES - 1} images are unreadable")
        return None


class CheckedLoader(DataLoader):
    """A DataLoader that turns a worker's BadBatch or FailedBatch marker into one clear error in the
    main process."""

    def __iter__(self):
        for batch in super().__iter__():
            if isinstance(batch, BadBatch):
                raise BadImageError(BadImage(batch.path, batch.reason))
            if isinstance(batch, FailedBatch):
                raise batch.error
            yield batch


def _scaled(raw: np.ndarray) -> torch.Tensor:
    return minmax_scale(torch.from_numpy(raw.astype(np.float32)))


def _raw(raw: np.ndarray) -> torch.Tensor:
    """Raw pixels as a tensor of their own integer type (uint8/uint16/...), a copy owned by torch."""
    return torch.from_numpy(np.ascontiguousarray(raw).copy())


def _keep(batch):
    return batch


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc mallopt parameters (malloc.h)."""


def retain_freed_memory(mmap_below: int = 32 << 20, trim_above: int = 512 << 20) -> bool:
    """Let glibc keep freed memory for reuse instead of returning it to the kernel.

    The multi-crop frees and re-allocates the same few-megabyte temporaries every batch; by
    default glibc serves them with fresh mmaps (or trims them off its heap), and the page faults
    that follow cost as much CPU time as the crops. Process-wide and harmless elsewhere: up to
    `trim_above` bytes of freed heap stay mapped. Returns False where there is no glibc.
    """
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_below)) and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_above))
    except (OSError, AttributeError):
        return False


def _one_torch_thread() -> None:
    """Each loader thread runs its kernels on one core: the threads are the parallelism, and
    nested OpenMP teams would oversubscribe the cores. (This sets the calling thread's count and
    the default of threads started later; threads already running, the main one included, keep theirs.)"""
    torch.set_num_threads(1)


class RingLoader:
    """Batches from `dataset.batch` computed ahead by worker threads into a ring of reused buffers.

    Threads, not processes: the augmentation is a handful of large torch kernels that release
    the GIL, so threads use every core without pickling batches between processes, and the
    outputs go straight into buffers allocated once (page faults on fresh memory cost as much as
    the crops themselves). Batch i's tensors stay valid until the consumer asks for batch
    i + `hold`. With threads=0 each batch is computed on demand in the caller's thread.
    """

    def __init__(self, dataset: "BatchDataset", sampler: Sampler, *, threads: int,
                 allocate: Callable[[], Any] | None, hold: int = 1) -> None:
        self.dataset, self.sampler, self.threads, self.hold = dataset, sampler, threads, hold
        self.allocate = allocate
        self.ring = threads + hold + 1
        retain_freed_memory()

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        items = list(self.sampler)
        # a ring per iterator: batches kept from a finished iterator are never overwritten by the next
        buffers = [self.allocate() if self.allocate else None for _ in range(self.ring)]
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="loader", initializer=_one_torch_thread) \
            if self.threads else None
        pending: deque[Future] = deque()
        try:
            for i in range(len(items)):
                while pool and len(pending) + i < min(len(items), i + self.ring - self.hold + 1):
                    j = i + len(pending)
                    pending.append(pool.submit(self.dataset.batch, items[j], buffers[j % self.ring]))
                batch = pending.popleft().result() if pool else self.dataset.batch(items[i], buffers[i % self.ring])
                if isinstance(batch, BadBatch):
                    raise BadImageError(BadImage(batch.path, batch.reason))
                yield batch
        finally:
            for future in pending:
                future.cancel()
            if pool:
                pool.shutdown(wait=True)


def checked_loader(dataset: Dataset, sampler: Sampler, config: Config) -> CheckedLoader:
    """A DataLoader of whole batches (the sampler yields each batch's indices) with
    data.num_workers worker processes, pinned memory where a GPU exists."""
    workers = config.data.num_workers
    return CheckedLoader(
        dataset, sampler=sampler, batch_size=None, collate_fn=_keep, num_workers=workers,
        pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
        prefetch_factor=2 if workers else None,
    )


def multicrop_for(config: Config, mean: Sequence[float], std: Sequence[float]) -> BatchMultiCrop:
    """The pretraining multi-crop `config` asks for (dino views, data.normalization)."""
    return BatchMultiCrop(config.dino, mean, std, per_image=config.data.per_image_normalization)


class PretrainTransform:
    """Batch -> (crops, labels): DINO multi-crop, normalised, into `out` buffers when given."""

    raw = False

    def __init__(self, config: Config, mean: Sequence[float], std: Sequence[float]) -> None:
        self.multicrop = multicrop_for(config, mean, std)

    def __call__(self, images, labels, idx, generator, out: CropBuffers | None = None):
        return self.multicrop(images, generator, out=out), labels


@dataclass(frozen=True)
class RawBatch:
    """A batch before augmentation (data.gpu_augment): raw integer pixels, (B, C, H, W) or a list
    of (C, h, w) when sizes differ, and the batch seed that fixes every random choice."""

    images: torch.Tensor | list[torch.Tensor]
    seed: int
    multicrop: BatchMultiCrop
    plans: list[ViewPlan] | None = None
    """Every choice and matrix of the crops, made by the loader thread (`BatchMultiCrop.plan`): the
    process that trains only copies them to the device. None: made when the crops are."""

    def __len__(self) -> int:
        return len(self.images)

    def crops(self, device: torch.device) -> list[torch.Tensor]:
        """Min-max scale and multi-crop on `device`; the same crops as the CPU path for the same seed."""
        if isinstance(self.images, torch.Tensor):
            images = minmax_scale(to_device(self.images, device).to(torch.float32))
        else:
            images = [minmax_scale(to_device(im, device).to(torch.float32)) for im in self.images]
        return self.multicrop(images, torch.Generator().manual_seed(self.seed), plans=self.plans)


class RawTransform:
    """Batch -> (RawBatch, labels): augmentation is left to `crops_on_device`."""

    raw = True

    def __init__(self, config: Config, mean: Sequence[float], std: Sequence[float]) -> None:
        self.multicrop = multicrop_for(config, mean, std)
        # The crops will be made where training runs: on a GPU in one chunk per group, on the CPU
        # in cache-sized chunks. Asked here, in the training process, not in a loader worker.
        self.chunked = not torch.cuda.is_available()

    def __call__(self, images, labels, idx, seed: int):
        plans = self.multicrop.plan(*image_sizes(images), torch.Generator().manual_seed(seed), chunked=self.chunked)
        return RawBatch(images, seed, self.multicrop, plans), labels


def crops_on_device(crops: list[torch.Tensor] | RawBatch, device: torch.device) -> list[torch.Tensor]:
    """A loader's crops on the training device: moved there, or (RawBatch) augmented there."""
    if isinstance(crops, RawBatch):
        return crops.crops(device)
    return [c.to(device, non_blocking=True) for c in crops]


class EvalTransform:
    """Batch -> (images resized as eval.resize says and normalised, labels, dataset indices).

    Normalised with the dataset's `mean` and `std`, or with `per_image` with each image's own
    channels' mean and std, taken before resizing as the pretraining crops take them."""

    def __init__(self, size: int, mean: Sequence[float], std: Sequence[float], resize: str = "square_bicubic",
                 *, per_image: bool = False) -> None:
        self.size, self.resize, self.per_image = size, resize, per_image
        self.mean = torch.tensor(mean, dtype=torch.float32)[None, :, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[None, :, None, None]

    def __call__(self, images, labels, idx, generator):
        if isinstance(images, list) and not images:
            return torch.zeros(0, self.mean.shape[1], self.size, self.size), labels, idx
        if self.resize == "square_bicubic":
            resized = resize_full(images, self.size)
        elif self.resize == "centre_crop":
            resized = centre_crop(images, self.size)
        else:
            resized = resize_shorter_side(images, self.size if self.resize == "shorter_side_bilinear" else None)
            if not isinstance(resized, torch.Tensor):
                raise UserError("images of different shapes met in one evaluation batch under eval.resize="
                                f"{self.resize}: use eval.resize=square_bicubic or one image per batch")
        return normalise(resized, images, self.mean, self.std, self.per_image), labels, idx


def eval_transform(config: Config, mean: Sequence[float], std: Sequence[float],
                   resize: str | None = None) -> EvalTransform:
    """The evaluation transform `config` asks for (eval.image_size, eval.resize unless `resize`
    says otherwise, data.normalization)."""
    return EvalTransform(config.eval.image_size, mean, std, resize or config.eval.resize,
                         per_image=config.data.per_image_normalization)


def torch_pretrain_loader(config: Config, images, sampler: Sampler, mean: Sequence[float],
                      std: Sequence[float]) -> RingLoader:
    """The ring loader over this rank's batches: finished crops, or raw batches under gpu_augment."""
    check_stats(mean, std, config)
    raw = config.data.gpu_augment
    transform = (RawTransform if raw else PretrainTransform)(config, mean, std)
    dataset = BatchDataset(images, config.data.channel_indices, config.data.on_bad_image, transform,
                           substitute=True)
    allocate = None
    if not raw:
        batch, pin = config.optim.batch_size_per_gpu, torch.cuda.is_available()
        allocate = lambda: transform.multicrop.allocate(batch, pin=pin)  # noqa: E731
    return RingLoader(dataset, sampler, threads=config.data.num_workers, allocate=allocate)


def build_eval_loader(config: Config, *, indices: Sequence[int], rank: int = 0, world_size: int = 1,
                      mean: Sequence[float], std: Sequence[float], batch_size: int | None = None) -> DataLoader:
    """Batches `(images, labels, idx)` over this rank's disjoint shard of `indices` (no padding)."""
    check_stats(mean, std, config)
    images = open_images(config)
    batch_size = eval_batch_size(config, images, batch_size or config.eval.batch_size)
    sampler = DistributedBatchSampler(np.asarray(indices), batch_size, rank=rank,
                                      world_size=world_size, seed=config.run.seed, shuffle=False,
                                      drop_last=False, pad=False)
    transform = eval_transform(config, mean, std)
    dataset = BatchDataset(images, config.data.channel_indices, config.data.on_bad_image, transform, substitute=False)
    return checked_loader(dataset, sampler, config)


def eval_batch_size(config: Config, images, wanted: int) -> int:
    """`wanted`, or 1 when eval.resize keeps the aspect (its output is not square) and the images are
    not known to share one shape: such images cannot form one tensor (scDINO's loader cannot batch
    them at all)."""
    if config.eval.resize in ("square_bicubic", "centre_crop") or getattr(images, "uniform_shape", None) is not None:
        return wanted
    log.info("eval.resize=%s and images of unknown or differing shapes: one image per forward pass",
             config.eval.resize)
    return 1
