"""Loader benchmark: a straightforward scDINO-style loader against the packed, batched loader.

    python -m training bench loader --config configs/demo.yaml --batches 10 --workers 2 [--size 48/24]

The baseline does what scDINO's `main_dino.py` does per image: `tifffile.imread`, `.astype(float)`
(float64), channel selection, per-channel min-max in NumPy, then torchvision's per-sample
DataAugmentationDINO (multi-channel branch) and default collation. The packed loader reads the
same images from the memory-mapped array and builds the same multi-crop for a whole batch, in
worker threads writing into reused buffers (training.data.loading.torch_loader.RingLoader); the third figure
hands out raw batches and runs the multi-crop where training would (the GPU when one exists,
else the CPU, in the consuming thread). All run with the same number of workers (processes for
the baseline, threads for ours); images/s counts source images. `--size G/L` sets the crop sides
for all three, e.g. 48/24 for the cells' native resolution. Besides
wall-clock rates, the CPU time per image (main process plus workers) is reported, which stays
comparable when the machine is shared with other work (see "load_average").
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time
from pathlib import Path

import tifffile
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from training.benchmarks.data.dali import benchmark_dali
from training.benchmarks.request import LoaderBenchRequest
from training.config import Config
from training.data.folders.index import scan_images
from training.data.folders.pack import pack_images
from training.data.loading.loaders import build_pretrain_loader
from training.data.loading.torch_loader import crops_on_device
from training.data.store.format import is_packed
from training.data.synthetic.folders import write_dataset
from training.errors import UserError

log = logging.getLogger(__name__)
BENCH_MEAN, BENCH_STD = 0.3, 0.2


class _Brightness:
    """scDINO's AdjustBrightness: p per image, a U(0.5, 1.25) factor drawn per channel."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if random.random() < self.p:
            for channel in range(x.shape[0]):
                x[channel] = TF.adjust_brightness(x[channel], random.uniform(0.5, 1.25))
        return x


class _Blur:
    """scDINO's GaussianBlur_forGreyscaleMultiChan: builds a torchvision blur per call."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if random.random() <= self.p:
            return T.GaussianBlur(kernel_size=(5, 5), sigma=(0.1, 1.5))(x)
        return x


class _Solarize:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if random.random() < 0.2:
            x[x > 0.5] = 1 - x[x > 0.5]
        return x


class ScdinoStyleAugmentation:
    """Per-sample multi-crop with torchvision transforms, composed as scDINO composes them."""

    def __init__(self, config: Config) -> None:
        d, chans = config.dino, config.data.in_chans
        flips = T.Compose([T.RandomHorizontalFlip(), T.RandomVerticalFlip(), _Brightness(0.8)])
        norm = T.Normalize([BENCH_MEAN] * chans, [BENCH_STD] * chans)
        bicubic = T.InterpolationMode.BICUBIC
        crop = T.RandomResizedCrop(d.global_crop_size, scale=d.global_crops_scale, interpolation=bicubic)
        self.global1 = T.Compose([crop, flips, _Blur(1.0), norm])
        self.global2 = T.Compose([crop, flips, _Blur(0.1), _Solarize(), norm])
        local = T.RandomResizedCrop(d.local_crop_size, scale=d.local_crops_scale, interpolation=bicubic)
        self.local = T.Compose([local, flips, _Blur(0.5), norm])
        self.local_number = d.local_crops_number

    def __call__(self, image: torch.Tensor) -> list[torch.Tensor]:
        return [self.global1(image), self.global2(image)] + [self.local(image) for _ in range(self.local_number)]


class ScdinoStyleDataset(Dataset):
    """tifffile per image, float64, min-max per channel in NumPy, per-sample transforms."""

    def __init__(self, root: Path, paths: list[str], labels: list[int], config: Config) -> None:
        self.root, self.paths, self.labels = root, paths, labels
        self.channels = list(config.data.channel_indices)
        self.transform = ScdinoStyleAugmentation(config)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        image = tifffile.imread(self.root / self.paths[i]).astype(float)[:, :, self.channels]
        low, high = image.min(axis=(0, 1), keepdims=True), image.max(axis=(0, 1), keepdims=True)
        image = (image - low) / (high - low)
        tensor = torch.from_numpy(image).float().permute(2, 0, 1)
        return self.transform(tensor), self.labels[i]


def _cpu_seconds(workers: list) -> float:
    """CPU time of this process (all its threads) plus the given worker processes (Linux /proc)."""
    total = time.process_time()
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for worker in workers:
        try:
            fields = Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_batches(loader, warmup: int, batches: int, batch_size: int,
                  device: torch.device | None = None) -> tuple[float, float]:
    """(images per wall second, CPU seconds per image) over `batches` after `warmup` untimed ones.

    With `device`, each batch is also brought to (or, for raw batches, augmented on) that device,
    as the training loop does. CPU seconds count this process and any worker processes, so the
    comparison stays fair on a machine shared with other work, where wall-clock rates depend on
    what else runs.
    """
    iterator = DataLoader.__iter__(loader) if isinstance(loader, DataLoader) else iter(loader)
    workers = getattr(iterator, "_workers", [])  # DataLoader worker processes, to count their CPU time
    consume = (lambda crops: crops_on_device(crops, device)) if device is not None else (lambda crops: crops)
    for _ in range(warmup):
        consume(next(iterator)[0])
    _sync(device or torch.device("cpu"))
    start, cpu = time.perf_counter(), _cpu_seconds(workers)
    for _ in range(batches):
        crops = consume(next(iterator)[0])
        assert crops[0].shape[0] == batch_size
    _sync(device or torch.device("cpu"))
    wall, cpu = time.perf_counter() - start, _cpu_seconds(workers) - cpu
    _stop(iterator)
    return batches * batch_size / wall, cpu / (batches * batch_size)


def _stop(iterator) -> None:
    """End the loader's workers now: prefetching DataLoader workers would otherwise keep burning
    CPU while the next loader is timed."""
    if hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    elif hasattr(iterator, "close"):
        iterator.close()


def _tiff_source(config: Config, images: int, scratch: Path) -> Path:
    """The configured TIFF folder, or `images` synthetic 5-class TIFFs written under scratch."""
    source = Path(config.data.source)
    if source.is_dir() and not is_packed(source):
        return source
    channels = max(5, max(config.data.channel_indices) + 1)
    per_class = max(1, images // 5)
    write_dataset(scratch / "images", 5, per_class, channels, 50, config.run.seed)
    return scratch / "images"


def bench_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def run_loader_benchmark(config: Config, request: LoaderBenchRequest) -> dict:
    """The three loaders over the same images and worker count; returns the figures as a dict."""
    config = config.replace(request.config_overrides())
    workers = config.data.num_workers if request.workers is None else request.workers
    batch = config.optim.batch_size_per_gpu
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        scratch = Path(tmp)
        source = _tiff_source(config, request.images, scratch)
        index = scan_images(source, config.data.folder_depth_for_labels)
        start = time.perf_counter()
        pack_images(source, index, scratch / "packed", channel_axis=config.data.channel_axis,
                    on_bad=lambda bad: None, folder_depth_for_labels=config.data.folder_depth_for_labels)
        prepare_s = time.perf_counter() - start
        bench = config.replace({
            "run.output_dir": str(scratch / "run"), "data.packed_dir": str(scratch / "packed"),
            "data.loader": "packed", "data.holdout_fraction": 0.0, "data.num_workers": workers,
            "data.source": str(source), "data.gpu_augment": False,
        })
        stats = [BENCH_MEAN] * config.data.in_chans, [BENCH_STD] * config.data.in_chans
        baseline = DataLoader(ScdinoStyleDataset(source, index.paths, index.labels, bench), batch_size=batch,
                              sampler=RandomSampler(range(len(index)), replacement=True), num_workers=workers,
                              drop_last=True)
        packed, _ = build_pretrain_loader(bench, rank=0, world_size=1, mean=stats[0], std=stats[1])
        raw, _ = build_pretrain_loader(bench.replace({"data.gpu_augment": True}), rank=0, world_size=1,
                                       mean=stats[0], std=stats[1])
        _check_enough(packed, request)
        rates = {
            "baseline": _time_batches(baseline, request.warmup, request.batches, batch),
            "packed": _time_batches(packed, request.warmup, request.batches, batch),
            "device": _time_device_path(raw, request, batch),
        }
        dali = benchmark_dali(bench, mean=stats[0], std=stats[1], batches=request.batches, warmup=request.warmup)
    return {**_report(config, request, workers, len(index), rates, prepare_s), **dali}


def _time_device_path(loader, request: LoaderBenchRequest, batch: int) -> tuple[float, float]:
    """The raw loader with the multi-crop on the device. On a CPU the crops run in this thread on
    one core: OpenMP teams that spin while the cores are shared cost more than they bring."""
    device = bench_device()
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        return _time_batches(loader, request.warmup, request.batches, batch, device)
    finally:
        torch.set_num_threads(threads)


def _check_enough(loader, request: LoaderBenchRequest) -> None:
    needed = request.warmup + request.batches
    if len(loader) < needed:
        raise UserError(f"the dataset gives {len(loader)} batches per epoch; the benchmark needs "
                        f"--warmup + --batches = {needed}: use fewer batches or more images")


def _report(config: Config, request: LoaderBenchRequest, workers: int, n_images: int,
            rates: dict[str, tuple[float, float]], prepare_s: float) -> dict:
    d = config.dino
    (base_rate, base_cpu), (packed_rate, packed_cpu), (dev_rate, dev_cpu) = (
        rates["baseline"], rates["packed"], rates["device"])
    device = bench_device()
    return {
        "benchmark": "loader",
        "baseline_scdino_style_images_per_s": round(base_rate, 2),
        "packed_batched_images_per_s": round(packed_rate, 2),
        "ratio": round(packed_rate / base_rate, 2),
        "baseline_cpu_ms_per_image": round(1000 * base_cpu, 3),
        "packed_cpu_ms_per_image": round(1000 * packed_cpu, 3),
        "cpu_ratio": round(base_cpu / packed_cpu, 2) if packed_cpu > 0 else None,
        "device_augment": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "images_per_s": round(dev_rate, 2), "ratio": round(dev_rate / base_rate, 2),
            "cpu_ms_per_image": round(1000 * dev_cpu, 3),
        },
        "load_average": round(os.getloadavg()[0], 2),
        "settings": {
            "workers": workers, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "batch_size": config.optim.batch_size_per_gpu, "timed_batches": request.batches,
            "warmup_batches": request.warmup, "dataset_images": n_images, "channels": config.data.channels,
            "crops": f"2x{d.global_crop_size} + {d.local_crops_number}x{d.local_crop_size}",
            "global_crops_scale": list(d.global_crops_scale), "local_crops_scale": list(d.local_crops_scale),
            "prepare_s": round(prepare_s, 2), "torch": torch.__version__,
        },
    }
