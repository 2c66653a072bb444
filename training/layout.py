"""Where each step reads and writes inside a run directory.

Steps talk to each other only through these files, never through each other's internals:

    <output_dir>/
      config.yaml                 resolved configuration (written by every step)
      packed/                     `prepare`: images.bin (flat; each image (C, H, W) in C order, uint8/uint16)
                                  + index.json (format, dtype, channels, paths, labels, class_names,
                                  shapes, offsets, total_elements)
      split.json                  `prepare`: train / hold-out membership by image path (seeded)
      mean_std.json               `mean-std`: {"mean", "std" (all image channels), "n_images", "n_skipped",
                                  "fraction", "seed"}; load_mean_std picks data.channels
      checkpoints/                `pretrain`: checkpoint.pth (latest), checkpoint_0005.pth, ...
      metrics.jsonl               `pretrain`: one JSON object per logged step / epoch (rank 0)
      tensorboard/                `pretrain`: event files
      features/<tag>/             `features`: features.npy (N, D) float32 L2-normalised + index.json;
                                  tag is "final", "epoch_0005", ..., or a baseline "raw_pixels", "random_init"
      labels.json                 `labels`: class names, integer labels and paths of the hold-out images
      knn/knn.json, knn/knn.md    `knn`: accuracies per k, per feature tag, confusion matrices
      linear/linear.json          `linear`: linear-probe accuracy per epoch
      linear/finetune.{json,md,pth}  `linear --finetune` (optional): accuracy per epoch, fine-tuned weights
      plots/*.png, plots/*.pdf    `plots`
      report.html                 `report`
      bad_images.json             any step that met unreadable images: {"step", "count", "images": [{"path", "reason"}]}
      timings.json                wall time of each step, merged by every step
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.config import Config


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def from_config(cls, config: Config) -> "RunLayout":
        return cls(Path(config.run.output_dir))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def packed(self) -> Path:
        return self.root / "packed"

    @property
    def split(self) -> Path:
        return self.root / "split.json"

    @property
    def mean_std(self) -> Path:
        return self.root / "mean_std.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def latest_checkpoint(self) -> Path:
        return self.checkpoints / "checkpoint.pth"

    def epoch_checkpoint(self, epoch: int) -> Path:
        return self.checkpoints / f"checkpoint_{epoch:04d}.pth"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    def features(self, tag: str) -> Path:
        return self.root / "features" / tag

    @property
    def labels(self) -> Path:
        return self.root / "labels.json"

    @property
    def knn(self) -> Path:
        return self.root / "knn"

    @property
    def linear(self) -> Path:
        return self.root / "linear"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def bad_images(self) -> Path:
        return self.root / "bad_images.json"

    @property
    def timings(self) -> Path:
        return self.root / "timings.json"
