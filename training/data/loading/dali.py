"""DINO multi-crop with NVIDIA DALI, fed from the packed dataset (`data.loader: dali`).

DALI cannot decode 5-channel TIFF (its decoders stop at 4 channels), so the images come from the
packed memory map through `fn.external_source`: the selected channels of each image as an
(H, W, C) array of the packed pixel type (usually uint16). Every later op takes any channel count
in HWC layout, so no channel is split off (checked on 5 channels by tests/training/data/loading/test_dali.py): cast, per-image
per-channel min-max scaling (`fn.reductions` + broadcasting arithmetic), `fn.random_resized_crop`
(bicubic, antialiased), `fn.flip`, per-channel brightness and solarisation (arithmetic),
`fn.gaussian_blur` and `fn.crop_mirror_normalize` (mean/std, HWC -> CHW, and the horizontal flip:
flips commute with the per-pixel ops and the symmetric blur in between).

Per view, as scDINO and training.data.loading.augment.BatchMultiCrop: RandomResizedCrop with the
configured area range and aspect ratio 3/4..4/3 -> flips p=0.5 -> per-channel brightness p=0.8,
factor U(0.5, 1.25) -> Gaussian blur (kernel 5, sigma U(0.1, 1.5); p 1.0 global 1, 0.1 global 2,
0.5 local) -> solarisation (global 2, p=0.2, x > 0.5 becomes 1 - x) -> normalisation. The clamp to
[0, 1] follows the brightness change before the blur, as scDINO (BatchMultiCrop clamps after the
blur). A view that is not blurred gets a vanishing sigma, whose 5-tap kernel is the identity, so
one graph serves every draw. Randomness comes from the pipeline seed (run.seed and the rank): the
crops are random and reproducible for a fixed run, but not tied to a batch seed as
BatchMultiCrop's, so a resumed run sees other crops than an uninterrupted one would.

With `device="gpu"` the images go to the GPU right after the read and every op after that runs
there: a node's CPUs only copy raw pixels. Without a GPU the same graph runs in DALI's CPU mode,
which works per sample and costs more CPU per image than the batched packed loader: it is there
for CI and CPU-only checks, not for speed.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Iterator, Sequence

import numpy as np
import torch

from training.config import Config
from training.data.dataset import open_images
from training.data.loading.augment import (
    BLUR_KERNEL,
    BLUR_SIGMA,
    BRIGHTNESS_RANGE,
    RATIO,
    SOLARIZE_THRESHOLD,
    ViewSpec,
    scdino_views,
)
from training.data.loading.sampler import DistributedBatchSampler, check_stats, pretrain_sampler
from training.data.split import load_split
from training.data.store.read import PackedImages
from training.errors import UserError

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install -r requirements-dali.txt (the nvidia-dali build matching the node's CUDA)"
NO_BLUR_SIGMA = 1e-3
"""Sigma of an unblurred crop: the 5-tap kernel is then exactly the identity, so one graph serves all."""
PREFETCH = 2
"""Batches DALI prepares ahead of the one being consumed."""


def require_dali():
    """The `nvidia.dali` module, or a UserError saying how to install it."""
    try:
        import nvidia.dali as dali
    except ImportError:
        raise UserError(f"data.loader=dali needs NVIDIA DALI, which is not installed: {INSTALL_HINT}, "
                        "or set data.loader=packed") from None
    return dali


def views_of(config: Config) -> list[ViewSpec]:
    """The views of one sample in output order: global 1, global 2, then the local crops."""
    globals_, local = scdino_views(config.dino)
    return globals_ + [local] * config.dino.local_crops_number


class PackedFeed:
    """The pipeline's external source: each call hands DALI the next queued batch of images.

    The loader queues the batches of an epoch; DALI calls ahead of consumption (PREFETCH), so
    past the end of the queue it repeats the last batch, whose output the loader discards.
    """

    def __init__(self, images: PackedImages, channel_indices: Sequence[int]) -> None:
        self.images, self.channel_indices = images, list(channel_indices)
        self.pending: deque[np.ndarray] = deque()
        self.last: np.ndarray | None = None
        self.calls = 0

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if self.pending:
            self.last = self.pending.popleft()
        if self.last is None:
            raise RuntimeError("the DALI feed was called before any batch was queued")
        self.calls += 1
        return self.read(self.last)

    def read(self, indices: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(H, W, C) images of the selected channels (the packed pixel type), and (1,) int64 labels."""
        if self.images.uniform_shape is not None:
            raw = self.images.read_batch(indices)[:, self.channel_indices].transpose(0, 2, 3, 1)
            images = list(np.ascontiguousarray(raw))
        else:
            images = [np.ascontiguousarray(self.images.read(int(i))[self.channel_indices].transpose(1, 2, 0))
                      for i in indices]
        labels = np.asarray(self.images.labels)
        return images, [np.array([labels[int(i)]], np.int64) for i in indices]


def _coin(probability: float, device: str):
    """A per-sample 0.0/1.0 draw, placed where the image data lives."""
    from nvidia.dali import fn, types

    draw = fn.cast(fn.random.coin_flip(probability=probability), dtype=types.FLOAT)
    return draw.gpu() if device == "gpu" else draw


def _minmax(images):
    """Per-image, per-channel min-max scaling of HWC data to [0, 1]; a constant channel becomes 0."""
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    images = fn.cast(images, dtype=types.FLOAT)
    low = fn.reductions.min(images, axes=[0, 1], keep_dims=True)
    high = fn.reductions.max(images, axes=[0, 1], keep_dims=True)
    return (images - low) / dmath.max(high - low, 1e-30)


def _view(images, view: ViewSpec, mean: Sequence[float], std: Sequence[float], device: str):
    """One augmented view of every sample: (C, size, size) float32, normalised."""
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    crop = fn.random_resized_crop(images, size=[view.size, view.size], random_area=list(view.scale),
                                  random_aspect_ratio=list(RATIO), interp_type=types.INTERP_CUBIC,
                                  antialias=True)
    crop = fn.flip(crop, horizontal=0, vertical=fn.random.coin_flip(probability=0.5))
    factor = fn.random.uniform(range=list(BRIGHTNESS_RANGE), shape=[len(mean)])
    bright = _coin(view.brightness_p, "cpu")
    factor, unbounded = factor * bright + (1.0 - bright), (1.0 - bright) * 1e30
    if device == "gpu":
        factor, unbounded = factor.gpu(), unbounded.gpu()
    crop = dmath.clamp(crop * factor, -unbounded, 1.0 + unbounded)  # clamps only brightened crops
    sigma = fn.random.uniform(range=list(BLUR_SIGMA))
    if view.blur_p < 1.0:
        blur = _coin(view.blur_p, "cpu")
        sigma = sigma * blur + (1.0 - blur) * NO_BLUR_SIGMA
    crop = fn.gaussian_blur(crop, window_size=BLUR_KERNEL, sigma=sigma)
    if view.solarize_p > 0.0:
        crop = crop + _coin(view.solarize_p, device) * (crop > SOLARIZE_THRESHOLD) * (1.0 - 2.0 * crop)
    return fn.crop_mirror_normalize(crop, mirror=fn.random.coin_flip(probability=0.5), mean=list(mean),
                                    std=list(std), output_layout="CHW", dtype=types.FLOAT)


def build_pipeline(feed: PackedFeed, views: Sequence[ViewSpec], mean: Sequence[float], std: Sequence[float],
                   *, batch_size: int, device: str, device_id: int | None, num_threads: int, seed: int):
    """The DALI pipeline: outputs one (B, C, size, size) batch per view, then the (B, 1) labels."""
    dali = require_dali()
    from nvidia.dali import fn

    pipe = dali.Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                         prefetch_queue_depth=PREFETCH)
    with pipe:
        raw, labels = fn.external_source(source=feed, num_outputs=2, batch=True, layout=["HWC", ""])
        images = _minmax(raw.gpu() if device == "gpu" else raw)
        crops = [_view(images, view, mean, std, device) for view in views]
        pipe.set_outputs(*crops, labels)
    pipe.build()
    return pipe


class DaliPretrainLoader:
    """Pretraining batches `(crops: [global1, global2, local...], labels)` from a DALI pipeline.

    Same interface as build_pretrain_loader's loader: `len`, iteration over one epoch of the
    sampler's current order (call `set_epoch` on the sampler or here first). DALI runs PREFETCH
    batches ahead; those started past the end of an epoch (or of an abandoned iteration) are
    discarded when the next iteration starts, so every epoch follows its own shuffled order.
    """

    def __init__(self, pipeline, feed: PackedFeed, sampler: DistributedBatchSampler,
                 device: torch.device) -> None:
        self.pipeline, self.feed, self.sampler, self.device = pipeline, feed, sampler, device
        self.consumed = 0

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
        self.feed.pending = deque(indices for _, indices in self.sampler)
        for _ in range(self.feed.calls - self.consumed):
            self._run()
        for _ in range(len(self)):
            yield self._to_torch(self._run())

    def _run(self):
        outputs = self.pipeline.run()
        self.consumed += 1
        return outputs

    def _to_torch(self, outputs) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Copy DALI's buffers (reused for the next batch) into torch tensors on the loader's device."""
        from nvidia.dali.plugin.pytorch import feed_ndarray

        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        crops = []
        for output in outputs[:-1]:
            dense = output.as_tensor()
            crops.append(feed_ndarray(dense, torch.empty(dense.shape(), device=self.device), stream))
        labels = torch.from_numpy(np.array(outputs[-1].as_tensor())).reshape(-1)
        return crops, labels


def resolve_device(device: str | None) -> tuple[str, int | None, torch.device]:
    """("gpu", CUDA index, torch device) where a GPU is visible (or asked for), else DALI's CPU mode."""
    if device is None:
        device = "gpu" if torch.cuda.is_available() else "cpu"
    if device == "gpu":
        if not torch.cuda.is_available():
            raise UserError("the DALI loader was asked to run on the GPU but torch sees no CUDA device")
        index = torch.cuda.current_device()
        return "gpu", index, torch.device("cuda", index)
    if device != "cpu":
        raise ValueError(f"device must be 'cpu', 'gpu' or None, got {device!r}")
    return "cpu", None, torch.device("cpu")


def build_dali_pretrain_loader(config: Config, *, rank: int, world_size: int, mean: Sequence[float],
                               std: Sequence[float], device: str | None = None
                               ) -> tuple[DaliPretrainLoader, DistributedBatchSampler]:
    """The DALI counterpart of the torch loader: same batches per rank, same output format."""
    require_dali()
    check_stats(mean, std, config)
    images = open_images(config)
    if not isinstance(images, PackedImages):
        raise UserError(f"the DALI loader reads a packed dataset, and {config.data.source} is a TIFF folder: "
                        "run `python -m training prepare` first")
    sampler = pretrain_sampler(config, load_split(config).train, rank=rank, world_size=world_size)
    batch = config.optim.batch_size_per_gpu
    kind, device_id, torch_device = resolve_device(device)
    feed, views = PackedFeed(images, config.data.channel_indices), views_of(config)
    seed = int(np.random.default_rng([config.run.seed, rank]).integers(2**31 - 1))
    pipeline = build_pipeline(feed, views, mean, std, batch_size=batch, device=kind, device_id=device_id,
                              num_threads=max(1, config.data.num_workers), seed=seed)
    log.info("DALI %s loader: %d threads, %d batches of %d per rank", kind, max(1, config.data.num_workers),
             len(sampler), batch)
    return DaliPretrainLoader(pipeline, feed, sampler, torch_device), sampler
