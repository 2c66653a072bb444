"""The DALI row of `bench loader`: images/s of the DALI multi-crop pipeline on the packed dataset.

    python -m training bench loader --config configs/demo.yaml   (adds this row when DALI is installed)

`benchmark_dali` times the same batches the packed loader would give (same sampler, crops and
batch size) in DALI's CPU mode, or on the GPU where one is visible. DALI runs its work on threads
of this process, so the process CPU time is the whole CPU cost. Without DALI the row says why it
is missing instead of failing the benchmark.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import torch

from training.config import Config
from training.errors import UserError

log = logging.getLogger(__name__)


def benchmark_dali(config: Config, *, mean: Sequence[float], std: Sequence[float], batches: int,
                   warmup: int = 1, device: str | None = None) -> dict:
    """Figures for the DALI loader on config's packed dataset (rank 0 of 1); `dali_skipped` without DALI."""
    from training.data.loading.dali import build_dali_pretrain_loader, require_dali

    try:
        dali = require_dali()
    except UserError as missing:
        return {"dali_images_per_s": None, "dali_skipped": str(missing)}
    loader, _ = build_dali_pretrain_loader(config, rank=0, world_size=1, mean=mean, std=std, device=device)
    if len(loader) < warmup + batches:
        raise UserError(f"the dataset gives {len(loader)} batches per epoch; the DALI benchmark needs "
                        f"warmup + batches = {warmup + batches}: use fewer batches or more images")
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        crops, _labels = next(iterator)
    if loader.device.type == "cuda":
        torch.cuda.synchronize(loader.device)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    images = batches * config.optim.batch_size_per_gpu
    log.info("DALI loader: %.1f images/s over %d batches", images / wall, batches)
    return {
        "dali_images_per_s": round(images / wall, 2),
        "dali_cpu_ms_per_image": round(1000 * cpu / images, 3),
        "dali_device": "gpu" if loader.device.type == "cuda" else "cpu",
        "dali_threads": max(1, config.data.num_workers),
        "dali_version": dali.__version__,
    }
