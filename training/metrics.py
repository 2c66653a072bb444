"""Training metrics: JSON lines (what plots and the report read), TensorBoard, optional W&B, progress.

Only rank 0 writes. Each metrics.jsonl line is one object:
{"kind": "step"|"epoch", "epoch", "step", "loss", "lr", "wd", "momentum", "images_per_s",
 "data_wait_s", "step_time_s", "gpu_mem_gb" (GPU only), "cpu_core_s", "gpu_s", "time"}
(the loop that fills them: training/trainer.py `record`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import torch
from tqdm import tqdm

from training.config import Config
from training.rundir import RunLayout

log = logging.getLogger(__name__)

_SCALARS = ("loss", "lr", "wd", "momentum", "images_per_s", "data_wait_s", "step_time_s", "gpu_mem_gb")


class MetricsLogger:
    """Appends metric records; a no-op on ranks other than 0."""

    def __init__(self, layout: RunLayout, config: Config, *, enabled: bool) -> None:
        self.enabled = enabled
        self.path = layout.metrics
        self._tensorboard = None
        self._wandb = None
        if not enabled:
            return
        layout.root.mkdir(parents=True, exist_ok=True)
        if config.train.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(layout.tensorboard))
        if config.train.wandb:
            self._wandb = _start_wandb(layout, config)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {**record, "time": round(time.time(), 3)}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        scalars = {k: record[k] for k in _SCALARS if record.get(k) is not None}
        tag = record["kind"]
        if self._tensorboard is not None:
            for key, value in scalars.items():
                self._tensorboard.add_scalar(f"{tag}/{key}", value, record["step"])
        if self._wandb is not None:
            self._wandb.log({f"{tag}/{k}": v for k, v in scalars.items()}, step=record["step"])

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(layout: RunLayout, config: Config) -> Any:
    """W&B offline by default (no network, no account); WANDB_MODE=online opts in."""
    try:
        import wandb
    except ImportError:
        log.warning("train.wandb is true but wandb is not installed (pip install wandb); not logging to W&B")
        return None
    return wandb.init(
        project="scdino", name=config.run.name, dir=str(layout.root), config=config.to_dict(),
        mode=os.environ.get("WANDB_MODE", "offline"),
    )


def gpu_memory_gb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)


def progress(total: int, description: str, *, enabled: bool, initial: int = 0) -> tqdm:
    """A tqdm bar on rank 0 only; it goes to stderr, so Slurm logs stay readable."""
    return tqdm(total=total, initial=initial, desc=description, disable=not enabled, dynamic_ncols=True,
                mininterval=2.0)
