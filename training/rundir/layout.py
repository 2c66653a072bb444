"""Where every file of a run lives: the one owner of the run directory's paths and file names.

Steps talk to each other only through these files, never through each other's internals. No other
module spells a run file's name; shell scripts ask `python -m training paths` (training/steps/paths.py).
Each path is a property of RunLayout (or a method, for numbered and named ones) whose one-line doc
says which step writes it and what it holds. The tree shows where they lie, each beside the name
that gives it (tests/training/rundir/test_layout.py holds it to the properties, both ways):

    <output_dir>/                               root
      config.yaml                               config
      packed/                                   packed
        cellprofiler.npy                        cellprofiler
        cellprofiler.json                       cellprofiler_index
      packed.parts/                             parts
        part-00003-of-00008/                    part(3, 8)
      split.json                                split
      split.npy                                 split_rows
      bad_images.json                           bad_images
      ingest_report.json                        ingest_report
      mean_std.json                             mean_std
      checkpoints/                              checkpoints
        checkpoint.pth                          latest_checkpoint
        checkpoint_previous.pth                 previous_checkpoint
        checkpoint_0005.pth                     epoch_checkpoint(5)
        PREEMPTED                               preempted_marker
        failures.jsonl                          failure_log
        DETERMINISTIC_FAILURE                   failure_marker
      metrics.jsonl                             metrics
      tensorboard/                              tensorboard
      features/                                 features_root
        final/                                  features("final")
      labels.json                               labels
      knn/                                      knn
        knn.json                                knn_json
        knn.md                                  knn_md
      linear/                                   linear
        linear.json                             linear_json
        linear.md                               linear_md
        finetune.json                           finetune_json
        finetune.md                             finetune_md
        finetune.pth                            finetune_weights
      profiles/                                 profiles
        cells.h5ad                              profiles_h5ad
        cells.parquet                           profiles_cells
        wells.parquet                           profiles_wells
        wells_normalized.parquet                profiles_wells_normalized
        wells_subpopulations.parquet            profiles_wells_subpopulations
        subpopulations.parquet                  profiles_subpopulations
        export.json                             profiles_manifest
      plots/                                    plots
        manifest.json                           plots_manifest
      report.html                               report
      timings.json                              timings
      results.json                              results
      plan.json                                 plan
      profile.yaml                              profile_config
      model_card.json                           model_card
      model_mean_std.json                       model_mean_std
      model_subpopulations.parquet              model_subpopulations
      logs/                                     logs
      comparison.json                           comparison_json
      comparison.md                             comparison_md
      channels_012/                             combination("012")
      channel_adaptive_bag_of_channels/         channel_adaptive("bag_of_channels")
        channels_012/                           evaluation("012")

A combination's run and a channel-adaptive model's hold the files from `pretrain` on and share the
data files (packed/, split, bad images, mean/std: `shared`) with <output_dir>; a channel-adaptive
model's evaluation on one combination reads that model's checkpoints (`trained`).
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

    config = property(lambda self: self.root / "config.yaml",
                      doc="Every step: the resolved configuration it ran with.")
    split = property(lambda self: self.shared / "split.json",
                     doc="`prepare`/`ingest`: the split's settings and the per-cell table it belongs to (data/split.py).")
    split_rows = property(lambda self: self.shared / "split.npy",
                          doc="`prepare`/`ingest`: train (0) or hold-out (1), one byte per row of the per-cell table.")
    bad_images = property(lambda self: self.shared / "bad_images.json",
                          doc="`prepare`/`ingest`: each unreadable image or bad field of view and why (artifacts.py).")
    ingest_report = property(lambda self: self.shared / "ingest_report.json",
                             doc="`ingest`: fields read and bad, objects cut and skipped per reason, the settings.")
    cellprofiler = property(lambda self: self.packed / "cellprofiler.npy",
                            doc="`ingest` (ingest.cellprofiler): measurements, (cells, features) float32, a row a cell.")
    cellprofiler_index = property(lambda self: self.packed / "cellprofiler.json",
                                  doc="`ingest`: the measurements' names, channels, size and CRC-32.")
    parts = property(lambda self: self.packed.with_name(self.packed.name + ".parts"),
                     doc="`prepare`/`ingest` --parts N: the parts until the merge, beside packed/ wherever it is.")
    mean_std = property(lambda self: self.shared / "mean_std.json",
                        doc="`mean-std`: per-channel mean and std of every image channel, and how they were drawn.")
    checkpoints = property(lambda self: self.trained / "checkpoints",
                           doc="`pretrain`: checkpoints, markers and <name>.damaged (a damaged one, set aside).")
    latest_checkpoint = property(lambda self: self.checkpoints / "checkpoint.pth",
                                 doc="`pretrain`: the latest save, which a resume starts from.")
    previous_checkpoint = property(lambda self: self.checkpoints / "checkpoint_previous.pth",
                                   doc="`pretrain`: the save before the latest one.")
    preempted_marker = property(lambda self: self.checkpoints / "PREEMPTED",
                                doc="`pretrain`: while a pre-empted job waits for its requeue (training/trainer.py).")
    failure_log = property(lambda self: self.checkpoints / "failures.jsonl",
                           doc="`pretrain`: one JSON line per failure and per resume after one (training/recovery/).")
    failure_marker = property(lambda self: self.checkpoints / "DETERMINISTIC_FAILURE",
                              doc="`pretrain`: tells the batch script not to retry.")
    metrics = property(lambda self: self.root / "metrics.jsonl",
                       doc="`pretrain`: one JSON object per logged step and epoch (rank 0).")
    tensorboard = property(lambda self: self.root / "tensorboard",
                           doc="`pretrain`: TensorBoard event files.")
    features_root = property(lambda self: self.root / "features",
                             doc="`features`: one feature set per tag (rundir/tags.py; format in rundir/features.py).")
    labels = property(lambda self: self.root / "labels.json",
                      doc="`labels`: the evaluated held-out cells (rows, at most eval.max_cells), classes, batches.")
    knn = property(lambda self: self.root / "knn",
                   doc="`knn`: its results.")
    knn_json = property(lambda self: self.knn / "knn.json",
                        doc="`knn`: accuracy per k and feature tag, confusion matrices, mAP where measured.")
    knn_md = property(lambda self: self.knn / "knn.md",
                      doc="`knn`: the same as tables.")
    linear = property(lambda self: self.root / "linear",
                      doc="`linear`: its results.")
    linear_json = property(lambda self: self.linear / "linear.json",
                           doc="`linear`: linear-probe accuracy per epoch and feature tag.")
    linear_md = property(lambda self: self.linear / "linear.md",
                         doc="`linear`: the same as tables.")
    finetune_json = property(lambda self: self.linear / "finetune.json",
                             doc="`linear --finetune`: accuracy per epoch.")
    finetune_md = property(lambda self: self.linear / "finetune.md",
                           doc="`linear --finetune`: the same as tables.")
    finetune_weights = property(lambda self: self.linear / "finetune.pth",
                                doc="`linear --finetune`: the fine-tuned weights.")
    profiles = property(lambda self: self.root / "profiles",
                        doc="`export`: the profiles (columns: training/eval/profiles/export.py).")
    profiles_h5ad = property(lambda self: self.profiles / "cells.h5ad",
                             doc="`export`: AnnData, a cell an observation, obsm[\"X_scdino\"], obs the metadata.")
    profiles_cells = property(lambda self: self.profiles / "cells.parquet",
                              doc="`export`: per-cell profiles, Metadata_ columns then the features.")
    profiles_wells = property(lambda self: self.profiles / "wells.parquet",
                              doc="`export`: per-well profiles (median or mean of each well's cells).")
    profiles_wells_normalized = property(lambda self: self.profiles / "wells_normalized.parquet",
                                         doc="`export`: the same, normalised (eval.profile_normalization).")
    profiles_wells_subpopulations = property(
        lambda self: self.profiles / "wells_subpopulations.parquet",
        doc="`export`: each well's shares of cells in the subpopulations (eval.profile_subpopulations).")
    profiles_subpopulations = property(
        lambda self: self.profiles / "subpopulations.parquet",
        doc="`export`: the subpopulations those shares count: each one's centre, its cells, how it was fitted.")
    profiles_manifest = property(lambda self: self.profiles / "export.json",
                                 doc="`export`: what was written: counts, columns, the features' provenance.")
    plots = property(lambda self: self.root / "plots",
                     doc="`plots` (and `compare`'s figure): PNG and PDF figures.")
    plots_manifest = property(lambda self: self.plots / "manifest.json",
                              doc="`plots`: the figures, listed for the report.")
    report = property(lambda self: self.root / "report.html",
                      doc="`report`: the run's report.")
    timings = property(lambda self: self.root / "timings.json",
                       doc="Every pipeline step: its wall time, merged into the others' (training/cli.py).")
    results = property(lambda self: self.root / "results.json",
                       doc="`summary`: the headline kNN figures, step times and the bill (training/results.py).")
    plan = property(lambda self: self.root / "plan.json",
                    doc="`plan --save`: the planner's rows for this run, which the bill sets beside its cost.")
    profile_config = property(lambda self: self.root / "profile.yaml",
                              doc="`profile --stage setup`: the screen's config with the model's settings, for every job.")
    model_card = property(lambda self: self.root / "model_card.json",
                          doc="`profile`: the profiling model's card, the channel map, the checks of the screen.")
    model_mean_std = property(lambda self: self.root / "model_mean_std.json",
                              doc="`profile --stage setup`: the model's mean and std at the screen's channels.")
    model_subpopulations = property(
        lambda self: self.root / "model_subpopulations.parquet",
        doc="`profile --stage setup`: the model's run's subpopulation centres, which the new plates' shares count.")
    logs = property(lambda self: self.root / "logs",
                    doc="The Slurm job logs of `make demo`.")
    comparison_json = property(lambda self: self.root / "comparison.json",
                               doc="`compare`: each combination's and channel-adaptive model's kNN, probe and compute.")
    comparison_md = property(lambda self: self.root / "comparison.md",
                             doc="`compare`: the same as tables.")

    def epoch_checkpoint(self, epoch: int) -> Path:
        """`pretrain`: the numbered checkpoint after `epoch` completed epochs (train.saveckp_freq, _rule)."""
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
        """`features`: the feature set of one tag (final, an epoch, a baseline)."""
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
