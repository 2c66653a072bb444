"""scDINO's multi-channel DINO augmentations, computed for a whole batch at once.

Per view, as scDINO: RandomResizedCrop (bicubic) -> horizontal and vertical flips (p=0.5) ->
per-channel brightness (p=0.8, factor U(0.5, 1.25) per channel, clamped to [0, 1]) -> Gaussian
blur (kernel 5, sigma U(0.1, 1.5), reflect borders; p=1.0 global 1, 0.1 global 2, 0.5 local) ->
solarisation (global 2 only, p=0.2, x > 0.5 becomes 1 - x) -> normalisation with the mean/std.
Beyond scDINO, and off unless dino.black_level_p or dino.noise_p is set, an imaging step after the
blur and before the solarisation: a random black level (each channel of a chosen crop x ->
max(x - t, 0) / (1 - t), t ~ U(dino.black_level_min, dino.black_level_max): a level below 0 lifts the
floor onto a pedestal), then Gaussian noise (each channel of a chosen crop its own sigma, U(0,
dino.noise_std)), the crop then clamped to [0, 1].

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
PER_IMAGE_EPS = 1e-7
"""Added to each image channel's variance under data.normalization=per_image (CHAMMI-75's instance
norm uses the same): a constant channel becomes 0 rather than NaN."""


@dataclass(frozen=True)
class ViewSpec:
    """One kind of view: output side, crop area range and the probabilities of blur/solarise/brightness."""

    size: int
    scale: tuple[float, float]
    blur_p: float
    solarize_p: float
    brightness_p: float = BRIGHTNESS_P
    black_level_p: float = 0.0
    black_level_max: float = 0.0
    black_level_min: float = 0.0
    noise_p: float = 0.0
    noise_std: float = 0.0

    @property
    def imaging(self) -> bool:
        """Whether the view draws the imaging step (black level, noise)."""
        return self.black_level_p > 0 or self.noise_p > 0



IMAGING_SETTINGS = ("black_level_p", "black_level_max", "black_level_min", "noise_p", "noise_std")
"""The imaging step's settings, named alike in DinoConfig and ViewSpec."""


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`. From the CPU to a GPU it goes through pinned memory without waiting: a
    copy from pageable memory first waits for all the work queued on the GPU, which would stall the
    training step behind the next batch's augmentation (and spin a core while it waits)."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def scdino_views(dino: DinoConfig) -> tuple[list[ViewSpec], ViewSpec]:
    """scDINO's two global views (blur always / rarely, the second may solarise) and its local view;
    without dino.photometric_augment, crops and flips only (every photometric probability 0).

    The one definition of the views' probabilities: the CPU, device and DALI paths all read it.
    """
    imaging = {name: getattr(dino, name) for name in IMAGING_SETTINGS}
    globals_ = [ViewSpec(dino.global_crop_size, dino.global_crops_scale, 1.0, 0.0, **imaging),
                ViewSpec(dino.global_crop_size, dino.global_crops_scale, 0.1, 0.2, **imaging)]
    local = ViewSpec(dino.local_crop_size, dino.local_crops_scale, 0.5, 0.0, **imaging)
    if not dino.photometric_augment:
        globals_ = [ViewSpec(v.size, v.scale, 0.0, 0.0, 0.0) for v in globals_]
        local = ViewSpec(local.size, local.scale, 0.0, 0.0, 0.0)
    return globals_, local


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


def resize_taps(start: torch.Tensor, length: torch.Tensor, out_size: int,
                flip: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Source positions and weights (B, out_size, taps) that crop [start, start+length) and resize
    it bicubically.

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
    inside = torch.minimum(torch.maximum(j, start), start + length - 1)  # only zero weights move
    return inside.long(), weight.float()


def as_matrices(positions: torch.Tensor, weights: torch.Tensor, in_size: int) -> torch.Tensor:
    """(B, S, in_size) dense matrices from (B, S, taps) source positions and weights."""
    matrix = torch.zeros(*positions.shape[:2], in_size)
    return matrix.scatter_add_(2, positions, weights)


def resize_matrices(start: torch.Tensor, length: torch.Tensor, out_size: int, in_size: int,
                    flip: torch.Tensor | None = None) -> torch.Tensor:
    """(B, out_size, in_size) weights that crop [start, start+length) and resize it bicubically."""
    return as_matrices(*resize_taps(start, length, out_size, flip), in_size)


def blur_taps(positions: torch.Tensor, weights: torch.Tensor, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The taps of (blur matrix of sigma) @ (resize matrix), without forming either matrix: output
    position y takes the resize taps of its 5 (reflected) neighbours, each scaled by its blur weight."""
    size = positions.shape[1]
    t = torch.arange(BLUR_KERNEL, dtype=torch.float32) - BLUR_KERNEL // 2
    kernel = torch.exp(-0.5 * (t[None] / sigma.float()[:, None]) ** 2)
    kernel = kernel / kernel.sum(1, keepdim=True)
    source = torch.arange(size)[:, None] + t.long()[None]
    source = torch.where(source < 0, -source, torch.where(source > size - 1, 2 * (size - 1) - source, source))
    n, _, taps = positions.shape
    neighbours = source.flatten()
    blurred = weights.index_select(1, neighbours).view(n, size, BLUR_KERNEL, taps) * kernel[:, None, :, None]
    return positions.index_select(1, neighbours).view(n, size, -1), blurred.view(n, size, -1)


def crop_resize(images: torch.Tensor, boxes: torch.Tensor, size: int,
                hflip: torch.Tensor | None = None, vflip: torch.Tensor | None = None) -> torch.Tensor:
    """Crop boxes (top, left, h, w) out of (B, C, H, W) images and resize them to (size, size)."""
    _, _, height, width = images.shape
    rows = resize_matrices(boxes[:, 0], boxes[:, 2], size, height, vflip).to(images.device)
    cols = resize_matrices(boxes[:, 1], boxes[:, 3], size, width, hflip).to(images.device)
    return torch.matmul(torch.matmul(rows[:, None], images), cols.transpose(1, 2)[:, None])


def pad_to_batch(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack (C, h, w) images of different sizes into one zero-padded batch, with their sizes."""
    heights, widths = image_sizes(images)
    batch = images[0].new_zeros(len(images), images[0].shape[0], int(heights.max()), int(widths.max()))
    for i, im in enumerate(images):
        batch[i, :, : im.shape[-2], : im.shape[-1]] = im
    return batch, heights, widths


def per_image_stats(batch: torch.Tensor, heights: torch.Tensor, widths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std (B, C) of each channel of each image of a (possibly zero-padded) batch over its
    own pixels only, the std from the biased variance plus PER_IMAGE_EPS (data.normalization=per_image)."""
    if bool((heights == batch.shape[-2]).all() and (widths == batch.shape[-1]).all()):
        var, mean = torch.var_mean(batch, dim=(-2, -1), correction=0)
    else:
        rows = torch.arange(batch.shape[-2], device=batch.device) < to_device(heights, batch.device)[:, None]
        cols = torch.arange(batch.shape[-1], device=batch.device) < to_device(widths, batch.device)[:, None]
        mask = (rows[:, :, None] & cols[:, None, :])[:, None].double()
        count = (heights * widths).to(batch.device, torch.float64)[:, None]
        x = batch.double()
        mean = (x * mask).sum((-2, -1)) / count
        var = ((x - mean[..., None, None]) ** 2 * mask).sum((-2, -1)) / count
    return mean.float(), torch.sqrt(var + PER_IMAGE_EPS).float()


def normalise(resized: torch.Tensor, images: torch.Tensor | Sequence[torch.Tensor], mean: torch.Tensor,
              std: torch.Tensor, per_image: bool) -> torch.Tensor:
    """Whole images `resized` (B, C, h, w) from `images` (their sources, a batch or a list), minus
    the dataset's `mean` over its `std` (broadcastable), or with `per_image` with each source's own
    channel statistics (taken before resizing, as the pretraining crops take them)."""
    if per_image:
        mean, std = (t[:, :, None, None] for t in per_image_stats(*as_batch(images)))
    return (resized - mean) / std


def normalised_constants(mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """0, 1, the solarisation sum 1 (x -> 1 - x) and its threshold, in normalised units."""
    return -mean / std, (1 - mean) / std, (1 - 2 * mean) / std, (SOLARIZE_THRESHOLD - mean) / std


CHUNK_BYTES = 2 << 20
"""On the CPU, crops are finished in chunks of about this many output bytes, so that the
temporaries of a chunk stay in cache and the allocator recycles them instead of faulting in
fresh pages for every batch-sized temporary. On a GPU the whole group is one chunk."""
TILE_ROWS = 32
"""Output rows per tile of the row product: a tile reads only the band of source rows its
bicubic (and blur) weights touch, instead of the whole crop window (see `banded_row_product`)."""


@dataclass(frozen=True)
class CropBuffers:
    """Preallocated outputs of one batch: the global crops (2B, C, G, G) and the local crops
    (L*B, C, l, l), both view-major (all images' first view, then all images' second view...)."""

    globals: torch.Tensor
    locals: torch.Tensor | None

    def views(self, batch: int) -> list[torch.Tensor]:
        """The crops as the list DINO consumes: [global1, global2, local1, ...], each (B, C, S, S)."""
        crops = list(self.globals.split(batch))
        return crops + (list(self.locals.split(batch)) if self.locals is not None else [])


def empty_output(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 tensor for a finished batch; in a DataLoader worker, allocated in shared memory
    so that handing it to the main process does not copy it again."""
    if get_worker_info() is None:
        return torch.empty(shape)
    numel = math.prod(shape)
    return torch.empty(0).set_(torch.UntypedStorage._new_shared(4 * numel), 0, shape)


def row_tiles(size: int) -> int:
    """How many equal tiles the output rows split into: the largest divisor of size <= TILE_ROWS
    sets the tile height (one tile when size has no useful divisor)."""
    height = max((d for d in range(1, min(size, TILE_ROWS) + 1) if size % d == 0), default=size)
    return size // height if height >= 8 else 1


def row_bands(positions: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last source row (K, tiles) that each tile of output rows uses, from the taps
    (K, S, taps) of the matrices: cheaper than scanning the dense matrices for non-zeros."""
    k, size, _ = positions.shape
    tiles = row_tiles(size)
    used = weights != 0
    first = torch.where(used, positions, positions.max() + 1).view(k, tiles, -1).amin(-1)
    last = torch.where(used, positions, -1).view(k, tiles, -1).amax(-1)
    return first, last


def banded_row_product(rows: torch.Tensor, source: torch.Tensor, out: torch.Tensor,
                       bands: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """out[k, c] = rows[k] @ source[k, c] for rows (K, S, h), source (K, C, h, N), out (K, C, S, N).

    The resize-and-blur matrices are banded: a tile of output rows draws on a narrow band of
    source rows (`bands`, from `row_bands`). Each tile multiplies only its band (the band's
    width is the widest over the chunk, so the tiles stay one batched product); the skipped
    weights are exact zeros, so the result is the dense product's.
    """
    k, channels, h, n = source.shape
    size = rows.shape[1]
    tiles, height = row_tiles(size), size // row_tiles(size)
    if bands is None:
        nonzero = rows != 0
        bands = row_bands(torch.arange(h).expand_as(rows), nonzero.float())
    first, last = bands  # on the CPU where the caller has them there: reading `band` then costs no device sync
    band = int((last - first + 1).max())
    if tiles == 1 or band >= h:
        torch.matmul(rows[:, None], source, out=out)
        return
    index = to_device(first.clamp(0, h - band)[..., None] + torch.arange(band, device=first.device), rows.device)
    weights = rows.view(k, tiles, height, h).gather(3, index[:, :, None].expand(-1, -1, height, -1))
    weights = weights[:, None].expand(-1, channels, -1, -1, -1).reshape(k * channels * tiles, height, band)
    planes = torch.arange(k * channels, device=rows.device).view(k, channels, 1, 1) * h
    sources = source.reshape(k * channels * h, n).index_select(0, (planes + index[:, None]).flatten())
    torch.bmm(weights, sources.view(k * channels * tiles, band, n), out=out.view(k * channels * tiles, height, n))


def crop_rows(batch: torch.Tensor, source: torch.Tensor, top: torch.Tensor, height: int) -> torch.Tensor:
    """(K, C, height, W): rows top..top+height of image `source` of `batch` (B, C, H, W), for all
    channels, gathered as whole rows in one index_select."""
    b, c, h, w = batch.shape
    planes = (source[:, None] * c + torch.arange(c, device=batch.device)) * h
    index = planes[:, :, None] + top[:, None, None] + torch.arange(height, device=batch.device)
    return batch.reshape(b * c * h, w).index_select(0, index.flatten()).view(-1, c, height, w)


@dataclass(frozen=True)
class ChunkPlan:
    """One chunk of a group's crops, crops lo..hi: the source rows they read (y0, kh), their row
    matrices over those rows, each row tile's band of them (relative to y0), which are solarised,
    and which go through the imaging step (relative to lo) with each one's noise seed."""

    lo: int
    hi: int
    y0: torch.Tensor
    kh: int
    rows: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor
    solarized: torch.Tensor
    imaged: torch.Tensor
    noise_seeds: torch.Tensor


@dataclass(frozen=True)
class ViewPlan:
    """A group of crops of one size, every choice made (`BatchMultiCrop.plan`), CPU tensors: the
    image of each crop, its brightness draw and factors, its column matrix, its chunks, and each
    crop's black level and noise sigma per channel (zero where it draws none; None where the group
    has no imaging step)."""

    size: int
    source: torch.Tensor
    bright: torch.Tensor
    brightness: torch.Tensor
    cols: torch.Tensor
    chunks: list[ChunkPlan]
    black_level: torch.Tensor | None = None
    noise: torch.Tensor | None = None


class BatchMultiCrop:
    """DINO multi-crop of a batch: `(images (B, C, H, W) in [0, 1]) -> [global1, global2, local...]`.

    Each output is (B, C, size, size), normalised: with the dataset's `mean` and `std`, or with
    `per_image` each crop with the mean and std of its own source image's channels, taken over the
    whole image before cropping (data.normalization=per_image). `images` may also be a list of (C, h, w)
    tensors of different sizes. Randomness comes only from `generator`, so a batch seed makes the
    crops reproducible whatever the number of workers, and the same on any device. With `out`
    (from `allocate`), the crops are written into those buffers and the returned tensors are
    views of them.
    """

    def __init__(self, dino: DinoConfig, mean: Sequence[float], std: Sequence[float], *,
                 per_image: bool = False) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32)[None, :, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[None, :, None, None]
        self.per_image = per_image
        self.global_views, self.local_view = scdino_views(dino)
        self.local_number = dino.local_crops_number
        self.channels = len(mean)

    def allocate(self, batch: int, *, device: torch.device | str = "cpu", pin: bool = False) -> CropBuffers:
        """Output buffers for one batch of `batch` images, optionally in pinned host memory; zeroed,
        so that their pages are mapped now rather than on first use inside a timed batch."""
        g, side, c = self.global_views[0].size, self.local_view.size, self.channels
        make = lambda *shape: torch.zeros(shape, device=device, pin_memory=pin)  # noqa: E731
        locals_ = make(self.local_number * batch, c, side, side) if self.local_number else None
        return CropBuffers(make(2 * batch, c, g, g), locals_)

    def __call__(self, images: torch.Tensor | Sequence[torch.Tensor], generator: torch.Generator | None = None,
                 out: CropBuffers | None = None, plans: list[ViewPlan] | None = None) -> list[torch.Tensor]:
        """The crops of `images`; `plans` (from `plan`, made beforehand for these images' sizes with
        the same generator) skips the CPU work, else it is done here."""
        generator = generator or torch.Generator().manual_seed(int(torch.randint(2**62, (1,))))
        batch, heights, widths = as_batch(images)
        b = batch.shape[0]
        if out is not None and out.globals.shape[0] != 2 * b:
            raise ValueError(f"output buffers hold {out.globals.shape[0] // 2} images, the batch has {b}")
        if plans is None:
            plans = self.plan(heights, widths, generator, chunked=batch.device.type == "cpu")
        elif len(plans[0].source) != len(self.global_views) * b:
            raise ValueError(f"the plan is for {len(plans[0].source) // len(self.global_views)} images, the batch has {b}")
        stats = per_image_stats(batch, heights, widths) if self.per_image else None
        globals_ = self._apply(batch, stats, plans[0], out and out.globals)
        locals_ = self._apply(batch, stats, plans[1], out and out.locals) if self.local_number else None
        return CropBuffers(globals_, locals_).views(b)

    def plan(self, heights: torch.Tensor, widths: torch.Tensor, generator: torch.Generator, *,
             chunked: bool) -> list[ViewPlan]:
        """Every choice and matrix of a batch's crops, on the CPU, before any pixel is read: the global
        views' group, then the local views' (if any). `chunked`: split each group into chunks of about
        CHUNK_BYTES of output, as the CPU finishes them; else one chunk, as a GPU does.

        With data.gpu_augment a loader thread makes the plan, so that the training process only
        copies it to the GPU and launches the products.
        """
        groups = [self.global_views] + ([[self.local_view] * self.local_number] if self.local_number else [])
        b = heights.shape[0]
        source = [torch.arange(b).repeat(len(views)) for views in groups]
        draws = [_draw_view_params(heights[s], widths[s], views, b, self.channels, generator)
                 for s, views in zip(source, groups)]
        for views, group_draws in zip(groups, draws):  # after every other draw: without it, all as before
            group_draws.update(_draw_imaging(views, b, self.channels, generator))
        return [self._plan_views(heights, widths, views, s, d, chunked) for views, s, d in zip(groups, source, draws)]

    def _plan_views(self, heights: torch.Tensor, widths: torch.Tensor, views: list[ViewSpec], source: torch.Tensor,
                    draws: dict[str, torch.Tensor], chunked: bool) -> ViewPlan:
        b, n, size, c = heights.shape[0], len(views), views[0].size, self.channels
        height, width = int(heights.max()), int(widths.max())
        row_taps = self._matrices(draws, draws["boxes"][:, 0], draws["boxes"][:, 2], size, height, "vflip")
        col_taps = self._matrices(draws, draws["boxes"][:, 1], draws["boxes"][:, 3], size, width, "hflip")
        first, last = row_bands(*row_taps)
        rows, boxes = as_matrices(*row_taps, height), draws["boxes"].long()
        step = max(1, CHUNK_BYTES // (4 * c * size * size)) if chunked else n * b
        chunks = []
        for lo in range(0, n * b, step):
            hi = min(lo + step, n * b)
            kh = int(boxes[lo:hi, 2].max())
            y0 = torch.minimum(boxes[lo:hi, 0], torch.tensor(height - kh))
            window = (y0[:, None, None] + torch.arange(kh)).expand(-1, size, -1)
            imaged = torch.nonzero(draws["imaged"][lo:hi])[:, 0]
            chunks.append(ChunkPlan(lo, hi, y0, kh, rows[lo:hi].gather(2, window), first[lo:hi] - y0[:, None],
                                    last[lo:hi] - y0[:, None], torch.nonzero(draws["solarize"][lo:hi])[:, 0],
                                    imaged, draws["noise_seed"][lo:hi][imaged]))
        return ViewPlan(size, source, draws["bright"], draws["brightness"], as_matrices(*col_taps, width), chunks,
                        draws.get("black_level"), draws.get("noise_sigma"))

    def _apply(self, batch: torch.Tensor, stats: tuple[torch.Tensor, torch.Tensor] | None, plan: ViewPlan,
               out: torch.Tensor | None) -> torch.Tensor:
        """All crops of one group, view-major: (len(views) * B, C, S, S), on the batch's device.

        Everything per crop (matrices, affine factors, clamp bounds, bands) comes prepared in the
        plan; the loop over its chunks only slices it. `stats` are the images' own (mean, std)
        (B, C) under per_image, else None for the dataset's.
        """
        device, count = batch.device, plan.source.shape[0]
        source = to_device(plan.source, device)
        if stats is None:
            mean, std = (to_device(t, device).expand(count, -1, -1, -1) for t in (self.mean, self.std))
        else:
            mean, std = (t[source][:, :, None, None] for t in stats)
        low, high, flip_sum, threshold = normalised_constants(mean, std)
        bright = to_device(plan.bright[:, None, None, None], device)
        group = {"source": source, "cols": to_device(plan.cols, device).transpose(1, 2),
                 "scale": to_device(plan.brightness[:, :, None, None], device) / std, "shift": low,
                 "low": torch.where(bright, low, -math.inf), "high": torch.where(bright, high, math.inf),
                 "flip_sum": flip_sum, "threshold": threshold}
        if plan.noise is not None:
            group.update({"black_level": to_device(plan.black_level[:, :, None, None], device),
                          "noise": to_device(plan.noise[:, :, None, None], device), "mean": mean, "std": std})
        shape = (count, batch.shape[1], plan.size, plan.size)
        if out is None:
            out = empty_output(shape) if device.type == "cpu" else torch.empty(shape, device=device)
        for chunk in plan.chunks:
            self._finish(out[chunk.lo:chunk.hi], batch, chunk, {k: v[chunk.lo:chunk.hi] for k, v in group.items()})
        return out

    @staticmethod
    def _matrices(draws: dict[str, torch.Tensor], start: torch.Tensor, length: torch.Tensor, size: int,
                  in_size: int, flip: str) -> torch.Tensor:
        """Resize taps (positions, weights) along one axis, with the blur folded in for the crops that draw it."""
        positions, weights = resize_taps(start, length, size, draws[flip])
        blurred = torch.nonzero(draws["blur"])[:, 0]
        if blurred.numel():
            taps = positions.shape[-1]
            positions = torch.cat([positions, positions[..., :1].expand(-1, -1, (BLUR_KERNEL - 1) * taps)], -1)
            weights = torch.cat([weights, weights.new_zeros(*weights.shape[:2], (BLUR_KERNEL - 1) * taps)], -1)
            positions[blurred], weights[blurred] = blur_taps(positions[blurred, :, :taps],
                                                             weights[blurred, :, :taps], draws["sigma"][blurred])
        return positions, weights

    def _finish(self, out: torch.Tensor, batch: torch.Tensor, chunk: ChunkPlan, group: dict[str, torch.Tensor]) -> None:
        """Crop, resize, flip, blur, brighten, clamp, solarise and normalise one chunk into `out`.

        Only the rows covering the chunk's crops take part in the products. The brightness
        factor and the normalisation are applied to those source rows: resize and blur weights
        sum to 1, so an affine map of the source is the same affine map of the crop; the clamp
        and the solarisation threshold are then mapped into normalised units.
        """
        k, c, size, device = out.shape[0], batch.shape[1], out.shape[-1], batch.device
        rows = to_device(chunk.rows, device)
        window = crop_rows(batch, group["source"], to_device(chunk.y0, device), chunk.kh)
        window.mul_(group["scale"]).add_(group["shift"])
        across = torch.bmm(window.view(k, c * chunk.kh, batch.shape[-1]), group["cols"]).view(k, c, chunk.kh, size)
        banded_row_product(rows, across, out, (chunk.first, chunk.last))
        torch.maximum(out, group["low"], out=out)  # a clamp with tensor bounds is not vectorised: 10x slower
        torch.minimum(out, group["high"], out=out)
        if chunk.imaged.numel():
            imaging_step(out, chunk, group)
        if chunk.solarized.numel():
            solarized = to_device(chunk.solarized, device)
            crops = out[solarized]
            out[solarized] = torch.where(crops > group["threshold"][solarized], group["flip_sum"][solarized] - crops,
                                         crops)


def imaging_step(out: torch.Tensor, chunk: ChunkPlan, group: dict[str, torch.Tensor]) -> None:
    """The imaging step on the chunk's chosen crops of `out` (normalised units), in [0, 1] pixel units:
    each channel's black level t (x -> max(x - t, 0) / (1 - t); t = 0 where none was drawn, below 0 a
    pedestal), then Gaussian noise of its sigma, then the crop clamped to [0, 1]. Every crop's noise
    comes from its own seed, so that how a group is cut into chunks (CPU) or not (GPU) leaves it
    unchanged."""
    index = to_device(chunk.imaged, out.device)
    mean, std = group["mean"][index], group["std"][index]
    level, sigma = group["black_level"][index], group["noise"][index]
    pixels = (out[index] * std + mean - level).clamp_(min=0).div_(1 - level)
    generator = torch.Generator(device=out.device)
    for crop, seed in enumerate(chunk.noise_seeds.tolist()):
        generator.manual_seed(seed)
        noise = torch.randn(pixels.shape[1:], generator=generator, device=out.device)
        pixels[crop].add_(noise.mul_(sigma[crop]))
    out[index] = pixels.clamp_(0, 1).sub_(mean).div_(std)


def _draw_view_params(heights: torch.Tensor, widths: torch.Tensor, views: list[ViewSpec], b: int,
                      channels: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Every random choice for a group of crops but the imaging step's, drawn up front on the CPU in a fixed order."""
    count = heights.shape[0]
    boxes = sample_crop_boxes(heights, widths, views[0].scale, generator)
    flips = torch.rand(count, 2, generator=generator) < 0.5
    low, high = BRIGHTNESS_RANGE
    factor = low + (high - low) * torch.rand(count, channels, generator=generator)
    bright = torch.rand(count, generator=generator) < torch.tensor([v.brightness_p for v in views]).repeat_interleave(b)
    sigma = BLUR_SIGMA[0] + (BLUR_SIGMA[1] - BLUR_SIGMA[0]) * torch.rand(count, generator=generator)
    blur = torch.rand(count, generator=generator) < torch.tensor([v.blur_p for v in views]).repeat_interleave(b)
    solarize = torch.rand(count, generator=generator) < torch.tensor([v.solarize_p for v in views]).repeat_interleave(b)
    return {"boxes": boxes, "hflip": flips[:, 0], "vflip": flips[:, 1], "bright": bright,
            "brightness": torch.where(bright[:, None], factor, torch.ones_like(factor)),
            "sigma": sigma, "blur": blur, "solarize": solarize}


def _draw_imaging(views: list[ViewSpec], b: int, channels: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A group's imaging-step draws: which crops get a black level and each channel's, which get noise
    and each channel's sigma, each crop's noise seed. Nothing is drawn where no view has the step, so
    that the generator then gives every other draw as before."""
    count = len(views) * b
    if not any(v.imaging for v in views):
        return {"imaged": torch.zeros(count, dtype=torch.bool), "noise_seed": torch.zeros(count, dtype=torch.int64)}

    def per_view(key: str) -> torch.Tensor:
        return torch.tensor([getattr(v, key) for v in views]).repeat_interleave(b)

    darkened = torch.rand(count, generator=generator) < per_view("black_level_p")
    low = per_view("black_level_min")[:, None]
    level = low + (per_view("black_level_max")[:, None] - low) * torch.rand(count, channels, generator=generator)
    noisy = torch.rand(count, generator=generator) < per_view("noise_p")
    sigma = per_view("noise_std")[:, None] * torch.rand(count, channels, generator=generator)
    return {"imaged": darkened | noisy, "black_level": torch.where(darkened[:, None], level, 0.0),
            "noise_sigma": torch.where(noisy[:, None], sigma, 0.0),
            "noise_seed": torch.randint(2**62, (count,), generator=generator)}


def image_sizes(images: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image's height and width, from a (B, C, H, W) batch or a list of (C, h, w) images."""
    if isinstance(images, torch.Tensor):
        n = images.shape[0]
        return torch.full((n,), images.shape[-2]), torch.full((n,), images.shape[-1])
    return torch.tensor([im.shape[-2] for im in images]), torch.tensor([im.shape[-1] for im in images])


def as_batch(images: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (B, C, H, W) tensor plus each image's true height and width (lists are zero-padded)."""
    if isinstance(images, torch.Tensor):
        return (images, *image_sizes(images))
    return pad_to_batch(images)


def resize_full(images: torch.Tensor | Sequence[torch.Tensor], size: int) -> torch.Tensor:
    """Resize whole images (batch or list of sizes) to (size, size) with the same bicubic kernel."""
    batch, heights, widths = as_batch(images)
    zeros = torch.zeros_like(heights)
    boxes = torch.stack([zeros, zeros, heights, widths], dim=1).double()
    return crop_resize(batch, boxes, size)


def centre_crop(images: torch.Tensor | Sequence[torch.Tensor], size: int) -> torch.Tensor:
    """The central (size, size) window of each image at its own resolution (DINO's evaluation crop);
    an image whose shorter side is under `size` is first brought to it as `resize_shorter_side` does."""
    crops = []
    for image in (images if isinstance(images, torch.Tensor) else list(images)):
        if min(image.shape[-2:]) < size:
            image = _resize_shorter(image[None], size)[0]
        # torchvision's CenterCrop offsets (DINO's evaluation transform), rounded as it rounds them
        top, left = (int(round((side - size) / 2.0)) for side in image.shape[-2:])
        crops.append(image[..., top:top + size, left:left + size])
    return torch.stack(crops)


def resize_shorter_side(images: torch.Tensor | Sequence[torch.Tensor], size: int | None) -> torch.Tensor | list[torch.Tensor]:
    """scDINO's eval resize, torchvision 0.9's `Resize(size)` on tensors: the shorter side to `size`,
    the longer to int(size * long / short), bilinear without antialias (an image whose shorter side
    is already `size` is unchanged). size=None keeps every image as it is (scDINO's resize: False).
    One tensor when every output has one shape, else a list: images of other aspects cannot batch."""
    if isinstance(images, torch.Tensor):
        return _resize_shorter(images, size)
    resized = [_resize_shorter(im[None], size)[0] for im in images]
    return torch.stack(resized) if resized and len({im.shape for im in resized}) == 1 else resized


def _resize_shorter(batch: torch.Tensor, size: int | None) -> torch.Tensor:
    height, width = batch.shape[-2:]
    short, long = min(height, width), max(height, width)
    if size is None or short == size:
        return batch
    target = (size, int(size * long / short)) if height <= width else (int(size * long / short), size)
    return torch.nn.functional.interpolate(batch, size=target, mode="bilinear", align_corners=False, antialias=False)
