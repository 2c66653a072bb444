"""Training metrics: JSON lines (what plots and the report read), TensorBoard, optional W&B, progress,
and CloudWatch embedded-metric-format (EMF) lines for the cluster's dashboard.

Only rank 0 writes. Each metrics.jsonl line is one object:
{"kind": "step"|"epoch", "epoch", "step", "loss", "lr", "wd", "momentum", "images_per_s",
 "data_wait_s", "step_time_s", "gpu_mem_gb" (GPU only), "cpu_core_s", "gpu_s", "time"}
(the loop that fills them: training/trainer.py `metrics_line`).

With SCDINO_EMF_LOG set (slurm/env.sh sets it on the cluster's compute nodes, from what the node
bootstrap wrote), each "step" record is also appended to that file as one EMF document, which the
CloudWatch agent ships to the cluster's training log group, where CloudWatch Logs turns it into
metrics in the SCDINO_EMF_NAMESPACE namespace: the fields of EMF_FIELDS the record has (the teacher
entropy and centre norm too, where the loop records them), per run and for the whole cluster.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from training.config import Config
from training.rundir import RunLayout

log = logging.getLogger(__name__)

_SCALARS = ("loss", "lr", "wd", "momentum", "images_per_s", "data_wait_s", "step_time_s", "gpu_mem_gb",
            "teacher_entropy", "teacher_batch_entropy", "center_norm")

EMF_LOG_ENV = "SCDINO_EMF_LOG"
EMF_NAMESPACE_ENV = "SCDINO_EMF_NAMESPACE"
EMF_NAMESPACE = "scdino/Training"
"""The namespace when SCDINO_EMF_NAMESPACE is unset (the cluster sets `<cluster name>/Training`)."""
EMF_FIELDS: dict[str, str] = {
    "images_per_s": "Count/Second", "loss": "None", "data_wait_s": "Seconds", "step_time_s": "Seconds",
    "lr": "None", "gpu_mem_gb": "Gigabytes", "teacher_entropy": "None", "teacher_batch_entropy": "None",
    "center_norm": "None", "log_out_dim": "None",
}
"""Record fields published as CloudWatch metrics, with their CloudWatch unit; absent ones are skipped."""
EMF_DIMENSIONS = [["Run"], []]
"""Each metric per run, and once for the whole cluster (no dimension): what the alarms watch."""


def emf_document(record: dict[str, Any], run: str, namespace: str) -> dict[str, Any] | None:
    """One CloudWatch embedded-metric-format document for a metrics record, None when the record has
    none of EMF_FIELDS as a finite number. The metric values and the dimension sit at the root, as the
    EMF specification requires; the timestamp is the record's, in milliseconds."""
    values = {name: float(record[name]) for name in EMF_FIELDS
              if isinstance(record.get(name), (int, float)) and not isinstance(record.get(name), bool)
              and math.isfinite(record[name])}
    if not values:
        return None
    directive = {"Namespace": namespace, "Dimensions": EMF_DIMENSIONS,
                 "Metrics": [{"Name": name, "Unit": EMF_FIELDS[name]} for name in values]}
    return {"_aws": {"Timestamp": int(record["time"] * 1000), "CloudWatchMetrics": [directive]},
            "Run": run, **values, "epoch": record.get("epoch"), "step": record.get("step")}


class EmfWriter:
    """Appends EMF lines to the file the CloudWatch agent follows. Monitoring never stops training:
    a file that cannot be written is reported once and then left alone."""

    def __init__(self, path: Path, run: str, namespace: str) -> None:
        self.path, self.run, self.namespace = path, run, namespace
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._give_up(exc)

    @classmethod
    def from_environment(cls, run: str) -> EmfWriter | None:
        path = os.environ.get(EMF_LOG_ENV, "")
        return cls(Path(path), run, os.environ.get(EMF_NAMESPACE_ENV) or EMF_NAMESPACE) if path else None

    def write(self, record: dict[str, Any]) -> None:
        document = emf_document(record, self.run, self.namespace) if self.path else None
        if document is None:
            return
        try:
            with self.path.open("a") as handle:
                handle.write(json.dumps(document, separators=(",", ":")) + "\n")
        except OSError as exc:
            self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        log.warning("CloudWatch metrics off: cannot write %s (%s); training goes on", self.path, exc)
        self.path = None


class MetricsLogger:
    """Appends metric records; a no-op on ranks other than 0."""

    def __init__(self, layout: RunLayout, config: Config, *, enabled: bool) -> None:
        self.enabled = enabled
        self.path = layout.metrics
        self._tensorboard = None
        self._wandb = None
        self._emf: EmfWriter | None = None
        if not enabled:
            return
        layout.root.mkdir(parents=True, exist_ok=True)
        self._emf = EmfWriter.from_environment(_run_label(config))
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
        if self._emf is not None and record.get("kind") == "step":
            self._emf.write(record)
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


def _run_label(config: Config) -> str:
    """The run's name on the dashboard: run.name, and the model and combination a chain trains."""
    parts = [config.run.name, f"channel_adaptive_{config.run.channel_adaptive}" if config.run.channel_adaptive else "",
             f"channels_{config.run.combination}" if config.run.combination else ""]
    return "/".join(part for part in parts if part)


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
