"""Where every file of a run lives: the one owner of the run directory's paths and file names.

Steps talk to each other only through these files, never through each other's internals. No other
module spells a run file's name; shell scripts ask `python -m training paths` (training/steps/paths.py).

    <output_dir>/
      config.yaml                 resolved configuration (written by every step)
      packed/                     `prepare`: the packed dataset (training/data/store/format.py has its format);
                                  data.packed_dir puts it elsewhere (e.g. node-local NVMe)
        cellprofiler.npy          `ingest` with ingest.cellprofiler: CellProfiler's measurements, (cells,
                                  features) float32, row i the cell of row i of the per-cell table
        cellprofiler.json         their names, channels, size and CRC-32 (training/data/ingest/cellprofiler.py)
      packed.parts/               `prepare` and `ingest` in parts (--part K --parts N, one per task of a Slurm
        part-00003-of-00008/      array): part 3 of 8 until the merge, beside packed/ wherever it is
                                  (training/data/store/parts.py)
      split.json, split.npy       `prepare`: train / hold-out membership, one byte per row of the per-cell
                                  table (seeded), and the settings and table it belongs to
      bad_images.json             any step that met unreadable images: {"step", "count", "images": [{"path", "reason"}]}
      ingest_report.json          `ingest`: fields read and bad, objects found, cut and skipped per reason,
                                  the crop settings (training/data/ingest/run.py)
      mean_std.json               `mean-std`: {"mean", "std" (all image channels), "n_images", "n_skipped",
                                  "fraction", "seed"}; data.stats.load_mean_std picks data.channels
      checkpoints/                `pretrain`: checkpoint.pth (latest), checkpoint_previous.pth (the save
                                  before it), checkpoint_0005.pth, ... and the PREEMPTED marker while a
                                  pre-empted job waits for its requeue; <name>.damaged: a damaged
                                  checkpoint the resume set aside (never deleted)
                                  failures.jsonl: one JSON line per failure and per resume after one
                                  (training/heal/failures.py); DETERMINISTIC_FAILURE: the marker that
                                  tells the batch script not to retry
      metrics.jsonl               `pretrain`: one JSON object per logged step / epoch (rank 0)
      tensorboard/                `pretrain`: event files
      features/<tag>/             `features`: one feature set per tag (training/rundir/tags.py; format in
                                  training/rundir/features.py)
      labels.json                 `labels`: the evaluated held-out cells (rows of the per-cell table, at
                                  most eval.max_cells), their classes, paths and imaging batches
      knn/knn.json, knn/knn.md    `knn`: accuracies per k, per feature tag, confusion matrices
      linear/linear.{json,md}     `linear`: linear-probe accuracy per epoch
      linear/finetune.{json,md,pth}  `linear --finetune` (optional): accuracy per epoch, fine-tuned weights
      profiles/                   `export` (training/eval/profiles/export.py has the columns):
        cells.h5ad                AnnData, one observation per cell: obsm["X_scdino"], obs the metadata and split
        cells.parquet             per-cell profiles: Metadata_ columns, then the features
        wells.parquet             per-well profiles (median of each well's cells), with plate and well columns
        wells_normalized.parquet  the same, normalised (eval.profile_normalization: spherize)
        export.json               what was written: counts, columns, the features' provenance
      plots/*.png, *.pdf          `plots`, listed in plots/manifest.json for the report
      report.html                 `report`
      timings.json                wall time of each step, merged by every step
      results.json                `summary`: the headline kNN figures, step times and the bill (training/summary.py)
      plan.json                   `plan --save`: the planner's rows for this run's configuration, which
                                  the bill puts beside what the run cost (training/planning/)
      logs/                       Slurm job logs of `make demo`
      channels_<combination>/     one run per entry of data.channel_combinations (run.combination):
                                  the files above from pretrain on, sharing packed/, split.json,
                                  bad_images.json and mean_std.json with <output_dir>
      channel_adaptive_<kind>/    data.compare_channel_adaptive (run.channel_adaptive=<kind>): one
                                  channel-adaptive model per data.channel_adaptive_kinds entry,
                                  trained on data.channels (pretrain's files)
        channels_<combination>/   that model evaluated on one combination without retraining
                                  (run.combination too): features/, labels.json, knn/, linear/,
                                  reading channel_adaptive_<kind>/checkpoints/
      comparison.json, .md        `compare`: every combination's kNN and linear probe against its
                                  baselines (per model: one per combination, and the channel-adaptive
                                  one where it ran), and the training compute; figure in plots/
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.config import Config

_NUMBERED = re.compile(r"checkpoint_(\d+)\.pth")
_PART = re.compile(r"part-(\d+)-of-(\d+)")
_SET_ASIDE = ".damaged"


@dataclass(frozen=True)
class RunLayout:
    root: Path
    packed: Path | None = None
    """The packed dataset: <run>/packed unless data.packed_dir names another folder."""
    shared: Path | None = None
    """Where the data files every combination shares lie (split, bad images, mean/std): the run
    itself, or for a combination's run (channels_<combination>/) the parent run."""
    trained: Path | None = None
    """The run whose checkpoints these are: the run itself, or for the channel-adaptive model's
    evaluation on one combination (`evaluation`), that model's run."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))
        object.__setattr__(self, "packed", Path(self.packed) if self.packed else self.root / "packed")
        object.__setattr__(self, "shared", Path(self.shared) if self.shared else self.root)
        object.__setattr__(self, "trained", Path(self.trained) if self.trained else self.root)

    @classmethod
    def from_config(cls, config: Config) -> RunLayout:
        """The run's layout; with run.combination set, that combination's run inside it; with
        run.channel_adaptive, the channel-adaptive model's run, or its evaluation on run.combination."""
        layout = cls(Path(config.run.output_dir), Path(config.data.packed_dir) if config.data.packed_dir else None)
        combination = config.run.combination
        if config.run.channel_adaptive:
            adaptive = layout.channel_adaptive(config.run.channel_adaptive)
            return adaptive.evaluation(combination) if combination else adaptive
        return layout.combination(combination) if combination else layout

    def combination(self, combination: str) -> RunLayout:
        """The run of one channel combination: its own directory, this run's data files."""
        return RunLayout(self.root / f"channels_{combination}", self.packed, self.shared)

    def channel_adaptive(self, kind: str) -> RunLayout:
        """The run of the channel-adaptive model of `kind` (data.compare_channel_adaptive): its own
        directory, this run's data files."""
        return RunLayout(self.root / f"channel_adaptive_{kind}", self.packed, self.shared)

    def evaluation(self, combination: str) -> RunLayout:
        """This run's model evaluated on one combination without retraining: its own directory for
        features, labels, kNN and linear probe; this run's checkpoints and data files."""
        return replace(self.combination(combination), trained=self.trained)

    config = property(lambda self: self.root / "config.yaml")
    split = property(lambda self: self.shared / "split.json")
    split_rows = property(lambda self: self.shared / "split.npy")
    bad_images = property(lambda self: self.shared / "bad_images.json")
    ingest_report = property(lambda self: self.shared / "ingest_report.json")
    cellprofiler = property(lambda self: self.packed / "cellprofiler.npy")
    cellprofiler_index = property(lambda self: self.packed / "cellprofiler.json")
    parts = property(lambda self: self.packed.with_name(self.packed.name + ".parts"))
    mean_std = property(lambda self: self.shared / "mean_std.json")
    checkpoints = property(lambda self: self.trained / "checkpoints")
    latest_checkpoint = property(lambda self: self.checkpoints / "checkpoint.pth")
    previous_checkpoint = property(lambda self: self.checkpoints / "checkpoint_previous.pth")
    preempted_marker = property(lambda self: self.checkpoints / "PREEMPTED")
    failure_log = property(lambda self: self.checkpoints / "failures.jsonl")
    failure_marker = property(lambda self: self.checkpoints / "DETERMINISTIC_FAILURE")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    tensorboard = property(lambda self: self.root / "tensorboard")
    features_root = property(lambda self: self.root / "features")
    labels = property(lambda self: self.root / "labels.json")
    knn = property(lambda self: self.root / "knn")
    knn_json = property(lambda self: self.knn / "knn.json")
    knn_md = property(lambda self: self.knn / "knn.md")
    linear = property(lambda self: self.root / "linear")
    linear_json = property(lambda self: self.linear / "linear.json")
    linear_md = property(lambda self: self.linear / "linear.md")
    finetune_json = property(lambda self: self.linear / "finetune.json")
    finetune_md = property(lambda self: self.linear / "finetune.md")
    finetune_weights = property(lambda self: self.linear / "finetune.pth")
    profiles = property(lambda self: self.root / "profiles")
    profiles_h5ad = property(lambda self: self.profiles / "cells.h5ad")
    profiles_cells = property(lambda self: self.profiles / "cells.parquet")
    profiles_wells = property(lambda self: self.profiles / "wells.parquet")
    profiles_wells_normalized = property(lambda self: self.profiles / "wells_normalized.parquet")
    profiles_manifest = property(lambda self: self.profiles / "export.json")
    plots = property(lambda self: self.root / "plots")
    plots_manifest = property(lambda self: self.plots / "manifest.json")
    report = property(lambda self: self.root / "report.html")
    timings = property(lambda self: self.root / "timings.json")
    results = property(lambda self: self.root / "results.json")
    plan = property(lambda self: self.root / "plan.json")
    logs = property(lambda self: self.root / "logs")
    comparison_json = property(lambda self: self.root / "comparison.json")
    comparison_md = property(lambda self: self.root / "comparison.md")

    def epoch_checkpoint(self, epoch: int) -> Path:
        return self.checkpoints / f"checkpoint_{epoch:04d}.pth"

    def numbered_checkpoints(self) -> list[tuple[int, Path]]:
        """(epoch, path) of every numbered checkpoint, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = []
        for path in self.checkpoints.iterdir():
            match = _NUMBERED.fullmatch(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def features(self, tag: str) -> Path:
        return self.features_root / tag

    def part(self, part: int, parts: int) -> Path:
        """The folder of part `part` (0-based) of `parts` of the packed dataset, written by one task of a
        Slurm array (`prepare` or `ingest` --part K --parts N) and removed by the merge."""
        return self.parts / f"part-{part:05d}-of-{parts:05d}"

    def named_paths(self) -> dict[str, Path]:
        """Every fixed path by name, as `python -m training paths` prints them."""
        names = [name for name, value in vars(RunLayout).items() if isinstance(value, property)]
        fixed = {"root": self.root, "packed": self.packed, "shared": self.shared}
        return {**fixed, **{name: getattr(self, name) for name in names}}


def set_aside_path(path: Path) -> Path:
    """Where a damaged file is moved aside, beside itself: <name>.damaged, or <name>.damaged-2, -3, ...
    when that is taken. No reader picks such a name up (checkpoint_0005.pth.damaged is no epoch)."""
    path = Path(path)
    candidate, number = path.with_name(path.name + _SET_ASIDE), 2
    while candidate.exists():
        candidate, number = path.with_name(f"{path.name}{_SET_ASIDE}-{number}"), number + 1
    return candidate


def part_number(folder: Path) -> tuple[int, int] | None:
    """(part, parts) of a part's folder (RunLayout.part), None for any other folder."""
    match = _PART.fullmatch(Path(folder).name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def checkpoint_role(path: Path) -> str | None:
    """"latest" (checkpoint.pth or the save before it) or "numbered" for a checkpoint of one of our
    runs (by its name, in a run's checkpoints folder); None for weights from elsewhere (scDINO's,
    DINO's, --checkpoint files)."""
    path = Path(path)
    run = RunLayout(path.parent.parent)
    if path.parent != run.checkpoints:
        return None
    if path.name in (run.latest_checkpoint.name, run.previous_checkpoint.name):
        return "latest"
    return "numbered" if _NUMBERED.fullmatch(path.name) else None
