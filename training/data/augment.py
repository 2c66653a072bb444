"""scDINO's multi-channel DINO augmentations, computed for a whole batch at once.

Per view, as scDINO: RandomResizedCrop (bicubic) -> horizontal and vertical flips (p=0.5) ->
per-channel brightness (p=0.8, factor U(0.5, 1.25) per channel, clamped to [0, 1]) -> Gaussian
blur (kernel 5, sigma U(0.1, 1.5), reflect borders; p=1.0 global 1, 0.1 global 2, 0.5 local) ->
solarisation (global 2 only, p=0.2, x > 0.5 becomes 1 - x) -> normalisation with the mean/std.

Why batched: a per-sample torchvision pipeline spends most of its time in Python and in small
kernels. Here crop, resize, flip and blur are all linear maps along rows and columns, so for each
crop they fold into two small matrices and the crop is `Ry @ (f * X) @ Rx^T` (bicubic weights
restricted to the crop window, exactly torchvision's crop-then-resize; the brightness factor f
scales the small source). What remains are a few elementwise passes over the batch. One
deliberate difference from scDINO: the brightness clamp to [0, 1] comes after the blur rather than
before it, which changes only pixels the factor pushed above 1 (and bicubic overshoot) near their
edges. The same code runs on GPU tensors unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch.utils.data import get_worker_info

from training.config import DinoConfig

RATIO = (3 / 4, 4 / 3)
BICUBIC_A = -0.5
"""Keys' cubic coefficient used by PIL and by torch's antialiased bicubic (torchvision's tensor resize)."""
BLUR_KERNEL = 5
BLUR_SIGMA = (0.1, 1.5)
BRIGHTNESS_P = 0.8
BRIGHTNESS_RANGE = (0.5, 1.25)
SOLARIZE_THRESHOLD = 0.5


@dataclass(frozen=True)
class ViewSpec:
    """One kind of view: output side, crop area range and the probabilities of blur/solarise."""

    size: int
    scale: tuple[float, float]
    blur_p: float
    solarize_p: float


def sample_crop_boxes(heights: torch.Tensor, widths: torch.Tensor, scale: tuple[float, float],
                      generator: torch.Generator, attempts: int = 10) -> torch.Tensor:
    """RandomResizedCrop boxes (top, left, h, w) per image, vectorised over the batch.

    Same law as torchvision: up to 10 draws of area and log-aspect ratio; the first draw that fits
    wins; if none fits, a centre crop with the aspect ratio clamped to the allowed range.
    """
    n = heights.shape[0]
    area = (heights * widths).double()
    u = torch.rand(n, attempts, 2, generator=generator, dtype=torch.float64)
    target = area[:, None] * (scale[0] + (scale[1] - scale[0]) * u[..., 0])
    log_r = math.log(RATIO[0]) + (math.log(RATIO[1]) - math.log(RATIO[0])) * u[..., 1]
    ratio = torch.exp(log_r)
    w = torch.round(torch.sqrt(target * ratio))
    h = torch.round(torch.sqrt(target / ratio))
    fits = (w > 0) & (h > 0) & (w <= widths[:, None]) & (h <= heights[:, None])
    first = torch.where(fits.any(1), fits.double().argmax(1), torch.full((n,), -1, dtype=torch.long))
    pick = first.clamp(min=0)
    h, w = h.gather(1, pick[:, None])[:, 0], w.gather(1, pick[:, None])[:, 0]
    offsets = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    top = torch.floor(offsets[:, 0] * (heights - h + 1))
    left = torch.floor(offsets[:, 1] * (widths - w + 1))
    fh, fw, ft, fl = _fallback_boxes(heights.double(), widths.double())
    none = first < 0
    boxes = torch.stack([torch.where(none, ft, top), torch.where(none, fl, left),
                         torch.where(none, fh, h), torch.where(none, fw, w)], dim=1)
    return boxes


def _fallback_boxes(heights: torch.Tensor, widths: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """torchvision's fallback: the whole image if its ratio is allowed, else a clamped centre crop."""
    in_ratio = widths / heights
    w = torch.where(in_ratio > RATIO[1], torch.round(heights * RATIO[1]), widths)
    h = torch.where(in_ratio < RATIO[0], torch.round(widths / RATIO[0]), heights)
    return h, w, torch.floor((heights - h) / 2), torch.floor((widths - w) / 2)


def _cubic(x: torch.Tensor) -> torch.Tensor:
    a, x = BICUBIC_A, x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x <= 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def resize_matrices(start: torch.Tensor, length: torch.Tensor, out_size: int, in_size: int,
                    flip: torch.Tensor | None = None) -> torch.Tensor:
    """(B, out_size, in_size) weights that crop [start, start+length) and resize it bicubically.

    Matches torch's antialiased bicubic: the kernel widens by the scale when shrinking, taps
    outside the crop window are dropped and the rest renormalised. A flip reverses the rows.
    """
    start, length = start.double()[:, None, None], length.double()[:, None, None]
    scale = length / out_size
    support = scale.clamp(min=1.0)
    taps = int(math.ceil(2 * float(support.max()))) * 2 + 1
    position = torch.arange(out_size, dtype=torch.float64)[None, :, None]
    if flip is not None:
        position = torch.where(flip[:, None, None], out_size - 1 - position, position)
    centre = start + (position + 0.5) * scale
    j = torch.floor(centre - 2 * support + 0.5) + torch.arange(taps, dtype=torch.float64)
    weight = _cubic((j + 0.5 - centre) / support) * ((j >= start) & (j < start + length))
    weight = weight / weight.sum(-1, keepdim=True).clamp(min=1e-12)
    matrix = torch.zeros(start.shape[0], out_size, in_size)
    return matrix.scatter_add_(2, j.clamp(0, in_size - 1).long(), weight.float())


def crop_resize(images: torch.Tensor, boxes: torch.Tensor, size: int,
                hflip: torch.Tensor | None = None, vflip: torch.Tensor | None = None) -> torch.Tensor:
    """Crop boxes (top, left, h, w) out of (B, C, H, W) images and resize them to (size, size)."""
    _, _, height, width = images.shape
    rows = resize_matrices(boxes[:, 0], boxes[:, 2], size, height, vflip).to(images.device)
    cols = resize_matrices(boxes[:, 1], boxes[:, 3], size, width, hflip).to(images.device)
    return torch.matmul(torch.matmul(rows[:, None], images), cols.transpose(1, 2)[:, None])


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


def pad_to_batch(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack (C, h, w) images of different sizes into one zero-padded batch, with their sizes."""
    heights = torch.tensor([im.shape[-2] for im in images])
    widths = torch.tensor([im.shape[-1] for im in images])
    batch = images[0].new_zeros(len(images), images[0].shape[0], int(heights.max()), int(widths.max()))
    for i, im in enumerate(images):
        batch[i, :, : im.shape[-2], : im.shape[-1]] = im
    return batch, heights, widths


CHUNK_BYTES = 4 << 20
"""Crops are finished in chunks of about this size: temporaries stay small enough for the
allocator to recycle them, instead of fresh pages (and page faults) for every batch-sized temporary."""


def empty_output(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 tensor for a finished batch; in a DataLoader worker, allocated in shared memory
    so that handing it to the main process does not copy it again."""
    if get_worker_info() is None:
        return torch.empty(shape)
    numel = math.prod(shape)
    return torch.empty(0).set_(torch.UntypedStorage._new_shared(4 * numel), 0, shape)


class BatchMultiCrop:
    """DINO multi-crop of a batch: `(images (B, C, H, W) in [0, 1]) -> [global1, global2, local...]`.

    Each output is (B, C, size, size), normalised. `images` may also be a list of (C, h, w)
    tensors of different sizes. Randomness comes only from `generator`, so a batch seed makes the
    crops reproducible whatever the number of workers.
    """

    def __init__(self, dino: DinoConfig, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32)[None, :, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[None, :, None, None]
        self.global_views = [ViewSpec(dino.global_crop_size, dino.global_crops_scale, 1.0, 0.0),
                             ViewSpec(dino.global_crop_size, dino.global_crops_scale, 0.1, 0.2)]
        self.local_view = ViewSpec(dino.local_crop_size, dino.local_crops_scale, 0.5, 0.0)
        self.local_number = dino.local_crops_number

    def __call__(self, images: torch.Tensor | Sequence[torch.Tensor],
                 generator: torch.Generator | None = None) -> list[torch.Tensor]:
        generator = generator or torch.Generator().manual_seed(int(torch.randint(2**62, (1,))))
        batch, heights, widths = as_batch(images)
        crops = list(self._views(batch, heights, widths, self.global_views, generator).chunk(2))
        if self.local_number:
            views = [self.local_view] * self.local_number
            crops += list(self._views(batch, heights, widths, views, generator).chunk(self.local_number))
        return crops

    def _views(self, batch: torch.Tensor, heights: torch.Tensor, widths: torch.Tensor,
               views: list[ViewSpec], generator: torch.Generator) -> torch.Tensor:
        """All crops of the given views of one size, view-major: (len(views) * B, C, S, S)."""
        b, n, size = batch.shape[0], len(views), views[0].size
        source = torch.arange(b).repeat(n)
        draws = _draw_view_params(heights[source], widths[source], views, b, batch.shape[1], generator)
        rows = resize_matrices(draws["boxes"][:, 0], draws["boxes"][:, 2], size, batch.shape[-2], draws["vflip"])
        cols = resize_matrices(draws["boxes"][:, 1], draws["boxes"][:, 3], size, batch.shape[-1], draws["hflip"])
        blurred = torch.nonzero(draws["blur"])[:, 0]
        if blurred.numel():
            blur = blur_matrices(draws["sigma"][blurred], size)
            rows[blurred] = torch.bmm(blur, rows[blurred])
            cols[blurred] = torch.bmm(blur, cols[blurred])
        draws["source"], draws["rows"], draws["cols"] = source, rows, cols
        shape = (n * b, batch.shape[1], size, size)
        out = empty_output(shape) if batch.device.type == "cpu" else torch.empty(shape, device=batch.device)
        step = max(1, CHUNK_BYTES // (4 * batch.shape[1] * size * size))
        for lo in range(0, n * b, step):
            self._finish(out[lo:lo + step], batch, {k: v[lo:lo + step] for k, v in draws.items()})
        return out

    def _finish(self, out: torch.Tensor, batch: torch.Tensor, draws: dict[str, torch.Tensor]) -> None:
        """Crop, resize, flip, blur, brighten, clamp, solarise and normalise one chunk into `out`.

        Only the window covering the chunk's crops takes part in the products. The brightness
        factor and the normalisation are applied to that small window: resize and blur weights sum
        to 1, so an affine map of the source is the same affine map of the crop; the clamp and
        the solarisation threshold are then mapped into normalised units.
        """
        k, c, size = out.shape[0], batch.shape[1], out.shape[-1]
        boxes = draws["boxes"].long()
        kh, kw = int(boxes[:, 2].max()), int(boxes[:, 3].max())
        y0 = torch.minimum(boxes[:, 0], torch.tensor(batch.shape[-2] - kh))
        x0 = torch.minimum(boxes[:, 1], torch.tensor(batch.shape[-1] - kw))
        window = torch.stack([batch[j, :, y:y + kh, x:x + kw]
                              for j, y, x in zip(draws["source"].tolist(), y0.tolist(), x0.tolist())])
        scale = draws["brightness"].to(batch.device)[:, :, None, None] / self.std.to(batch.device)
        window = torch.addcmul(-self.mean.to(batch.device) / self.std.to(batch.device), window, scale)
        rows = draws["rows"].gather(2, (y0[:, None, None] + torch.arange(kh)).expand(-1, size, -1))
        cols = draws["cols"].gather(2, (x0[:, None, None] + torch.arange(kw)).expand(-1, size, -1))
        down = torch.matmul(rows.to(batch.device)[:, None], window)
        torch.bmm(down.reshape(k, c * size, kw), cols.to(batch.device).transpose(1, 2), out=out.view(k, c * size, size))
        low, high, flip_sum, threshold = (t.to(out.device)[0] for t in self._normalised_constants())
        bounds = list(zip(low.flatten().tolist(), high.flatten().tolist()))
        for i in torch.nonzero(draws["bright"])[:, 0].tolist():
            for channel, (lo, hi) in enumerate(bounds):  # scalar bounds: several times faster than tensors
                out[i, channel].clamp_(lo, hi)
        for i in torch.nonzero(draws["solarize"])[:, 0].tolist():
            torch.where(out[i] > threshold, flip_sum - out[i], out[i], out=out[i])

    def _normalised_constants(self) -> tuple[torch.Tensor, ...]:
        """0, 1, the solarisation sum 1 (x -> 1 - x) and its threshold, in normalised units."""
        mean, std = self.mean, self.std
        return -mean / std, (1 - mean) / std, (1 - 2 * mean) / std, (SOLARIZE_THRESHOLD - mean) / std


def _draw_view_params(heights: torch.Tensor, widths: torch.Tensor, views: list[ViewSpec], b: int,
                      channels: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Every random choice for a group of crops, drawn up front on the CPU in a fixed order."""
    count = heights.shape[0]
    boxes = sample_crop_boxes(heights, widths, views[0].scale, generator)
    flips = torch.rand(count, 2, generator=generator) < 0.5
    low, high = BRIGHTNESS_RANGE
    factor = low + (high - low) * torch.rand(count, channels, generator=generator)
    bright = torch.rand(count, generator=generator) < BRIGHTNESS_P
    sigma = BLUR_SIGMA[0] + (BLUR_SIGMA[1] - BLUR_SIGMA[0]) * torch.rand(count, generator=generator)
    blur = torch.rand(count, generator=generator) < torch.tensor([v.blur_p for v in views]).repeat_interleave(b)
    solarize = torch.rand(count, generator=generator) < torch.tensor([v.solarize_p for v in views]).repeat_interleave(b)
    return {"boxes": boxes, "hflip": flips[:, 0], "vflip": flips[:, 1], "bright": bright,
            "brightness": torch.where(bright[:, None], factor, torch.ones_like(factor)),
            "sigma": sigma, "blur": blur, "solarize": solarize}


def as_batch(images: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (B, C, H, W) tensor plus each image's true height and width (lists are zero-padded)."""
    if isinstance(images, torch.Tensor):
        n = images.shape[0]
        return images, torch.full((n,), images.shape[-2]), torch.full((n,), images.shape[-1])
    return pad_to_batch(images)


def resize_full(images: torch.Tensor | Sequence[torch.Tensor], size: int) -> torch.Tensor:
    """Resize whole images (batch or list of sizes) to (size, size) with the same bicubic kernel."""
    batch, heights, widths = as_batch(images)
    zeros = torch.zeros_like(heights)
    boxes = torch.stack([zeros, zeros, heights, widths], dim=1).double()
    return crop_resize(batch, boxes, size)


class MultiCropAugmentation:
    """Single-image multi-crop (the per-sample CPU path): image (C, H, W) in [0, 1] -> list of crops."""

    def __init__(self, dino: DinoConfig, mean: Sequence[float], std: Sequence[float]) -> None:
        self.batch = BatchMultiCrop(dino, mean, std)

    def __call__(self, image: torch.Tensor, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        return [crop[0] for crop in self.batch(image[None], generator)]
