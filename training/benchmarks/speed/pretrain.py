"""Pretraining-loop benchmark:

    python -m training bench pretrain --config run.yaml [--batches 20 --warmup 3 --loader staged|packed --images N]

Runs `pretrain`'s own loop (`training.trainer.train`) for one epoch of `--warmup` + `--batches`
steps in a temporary run directory: each batch fetched and brought to the device, the step, its
flags read one step late, metric lines every train.log_every steps, the progress bar, the
time-based checkpoint check, and at the end the epoch's checkpoint. Then, in the same process and
on the same (already compiled) model, the free-running step of `bench step` for `--batches` steps.
Both figures side by side, so the loop's overhead is measured, not assumed:

- `loop`: images/s, step time and MFU of the timed steps (the device synchronised at the end of
  step `--warmup` and at the end of the last step, nowhere else), and `after_last_step_s`: the epoch's
  checkpoint save and the run's closing, after the last step;
- `step`: the free-running pass's images/s, step time and MFU (`bench step`'s figure);
- `loop_over_step`: the ratio of the two rates; 1.0 means the loop adds nothing.

`--loader staged` (the default) cycles four batches of synthetic crops already on the device, as
`bench step` does, so the difference is the loop's own; `--loader packed` writes `--images`
synthetic 5-channel 50 x 50 TIFFs, packs them and trains from the real pretraining loader
(data.num_workers threads, data.gpu_augment as configured): the whole of `pretrain` but the
first-epoch file reads.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from training.benchmarks.request import PretrainBenchRequest
from training.benchmarks.speed.step import SyntheticCrops, _free_running, model_settings, throughput
from training.config import Config
from training.distributed.groups import DistContext, DistEnv

log = logging.getLogger(__name__)


class StagedCrops:
    """`count` batches of synthetic crops cycled from four made once on `device`: a loader that costs nothing."""

    def __init__(self, config: Config, device: torch.device, count: int) -> None:
        made = SyntheticCrops(config, batches=min(4, count))
        self.batches = [([c.to(device) for c in crops], labels) for crops, labels in made]
        self.count = count

    def __len__(self) -> int:
        return self.count

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self):
        for index in range(self.count):
            yield self.batches[index % len(self.batches)]


class _Clock:
    """`on_step` for `train`: the device-synchronised times at the end of two chosen steps."""

    def __init__(self, device: torch.device, first: int, last: int) -> None:
        self.device, self.first, self.last = device, first, last
        self.marks: dict[int, float] = {}

    def __call__(self, step: int) -> None:
        if step in (self.first, self.last):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.marks[step] = time.perf_counter()


def bench_config(config: Config, request: PretrainBenchRequest, run_dir: Path) -> Config:
    """The configured run, shortened to one epoch of warmup + batches steps in `run_dir`."""
    return config.replace({
        "run.output_dir": str(run_dir), "optim.epochs": 1, "optim.warmup_epochs": 0,
        "train.max_steps_per_epoch": request.warmup + request.steps, "train.wandb": False,
    })


def _packed_loader_factory(config: Config, request: PretrainBenchRequest, scratch: Path):
    """The pretraining loader over synthetic images packed under `scratch` (`request.images`, or one
    batch more than the run trains on), and the settings that point the run at them."""
    from training.benchmarks.data.loader import BENCH_MEAN, BENCH_STD, _tiff_source
    from training.data.folders.index import scan_images
    from training.data.folders.pack import pack_images
    from training.data.loading.loaders import build_pretrain_loader

    images = request.images or (request.warmup + request.steps + 1) * config.optim.batch_size_per_gpu
    source = _tiff_source(config.replace({"data.source": str(scratch / "none")}), images, scratch)
    index = scan_images(source, config.data.folder_depth_for_labels)
    pack_images(source, index, scratch / "packed", channel_axis=config.data.channel_axis, on_bad=lambda bad: None,
                folder_depth_for_labels=config.data.folder_depth_for_labels)
    settings = {"data.packed_dir": str(scratch / "packed"), "data.loader": "packed", "data.holdout_fraction": 0.0,
                "data.source": str(source)}

    def factory(run_config: Config, ctx: DistContext) -> tuple[Any, Any]:
        chans = run_config.data.in_chans
        return build_pretrain_loader(run_config, rank=0, world_size=1, mean=[BENCH_MEAN] * chans,
                                     std=[BENCH_STD] * chans)

    return factory, settings


def run_pretrain_benchmark(config: Config, request: PretrainBenchRequest) -> dict[str, Any]:
    """Time `pretrain`'s loop, then the same model's free-running step; returns the figures."""
    from training.trainer import train

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    ctx = DistContext(env=DistEnv(), device=device, backend=None)
    total = request.warmup + request.steps
    with tempfile.TemporaryDirectory(prefix="bench-pretrain-") as tmp:
        scratch = Path(tmp)
        run_config = bench_config(config, request, scratch / "run")
        if request.loader == "packed":
            factory, settings = _packed_loader_factory(run_config, request, scratch)
            run_config = run_config.replace(settings)
        else:
            staged = StagedCrops(run_config, device, total)
            factory = lambda cfg, ctx: (staged, staged)  # noqa: E731
        clock = _Clock(device, request.warmup, total)
        log.info("bench pretrain: %d warm-up + %d timed steps of the loop on %s (%s loader), then %d free-running",
                 request.warmup, request.steps, device, request.loader, request.steps)
        start = time.perf_counter()
        result = train(run_config, ctx, loader_factory=factory, on_step=clock)
        wall_s = time.perf_counter() - start
    if result.global_step != total or set(clock.marks) != {request.warmup, total}:
        raise RuntimeError(f"the loop ran {result.global_step} of {total} steps")
    loop_s = clock.marks[total] - clock.marks[request.warmup]
    state = result.state
    step_s = _free_running(state, StagedCrops(run_config, device, min(4, request.steps)), device, request.steps)
    loop = throughput(run_config, device, request.steps, loop_s)
    step = throughput(run_config, device, request.steps, step_s)
    return {
        **model_settings(run_config, state.precision.name, device), "benchmark": "pretrain",
        "loader": request.loader, "steps": request.steps, "warmup_steps": request.warmup,
        "gpu_augment": run_config.data.gpu_augment if request.loader == "packed" else None,
        "num_workers": run_config.data.num_workers if request.loader == "packed" else None,
        "log_every": run_config.train.log_every, "torch": torch.__version__,
        "loop": {**loop, "after_last_step_s": round(start + wall_s - clock.marks[total], 3),
                 "wall_s": round(wall_s, 3)},
        "step": step,
        "loop_over_step": round(loop["images_per_s"] / step["images_per_s"], 3) if step["images_per_s"] else None,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if device.type == "cuda" else None,
    }
