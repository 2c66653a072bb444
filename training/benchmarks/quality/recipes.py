"""Recipe comparison: scDINO's pretraining recipe against cheaper ones, at equal data and epochs.

    python -m training.benchmarks.quality.recipes --config configs/demo.yaml --work runs/recipes \
        --seeds 0,1 --set optim.batch_size_per_gpu=32 [--arms scdino,p8_48_24_l8] [--out recipes.json]

For each seed, the embedded synthetic dataset made with that seed (`synth-data --per-class`, written
once under <data-root>/seed<N>/images), and for each arm the pipeline steps prepare, mean-std,
pretrain, features, labels, knn and linear, run one after another as `python -m training <step>`
in <work>/seed<N>/<arm>/ with the arm's settings on top of --config and --set. An arm whose linear
probe exists is not run again (so an interrupted comparison resumes, and pretraining resumes from
its checkpoint). Then, per arm and seed, from the files the steps wrote:
  - train_flops: the analytic training FLOPs (`bench step`'s count per image, times the images
    trained: the checkpoint's global step x the global batch), and their ratio to scDINO's recipe;
  - cpu_core_s: measured compute, the sum of `cpu_core_s` over metrics.jsonl's step lines;
  - knn_top1 at the best k (knn.json, the product's split: eval.knn_train_fraction of the held-out
    images are references, the rest queries), and knn_cv_top1: the same weighted kNN with every
    held-out image a query once (stratified 5-fold over the held-out set, the best k of eval.knn_k),
    five times the queries, for a finer figure;
  - linear_top1: the linear probe's final top-1 on the same queries.
Prints one Markdown table and writes the JSON (--out). Every arm runs in one process: pass the
batch that gives the global batch you want (the demo's is 2 ranks x 16 = 32).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from training.config import Config, load_config
from training.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Arm:
    """One recipe: what it changes from the configuration, in words and as dotted overrides."""

    description: str
    overrides: dict[str, Any]


def crops(patch: int, global_side: int, local_side: int, local_number: int) -> dict[str, Any]:
    """The settings of a recipe; features are taken at the global crop side, as trained."""
    return {"model.patch_size": patch, "dino.global_crop_size": global_side, "dino.local_crop_size": local_side,
            "dino.local_crops_number": local_number, "eval.image_size": global_side}


ARMS: dict[str, Arm] = {
    "scdino": Arm("scDINO's recipe: patch 16, 2 x 224 + 8 x 96 px (50 px cells upsampled 4.5x)", crops(16, 224, 96, 8)),
    "p16_112_48_l8": Arm("scDINO's recipe at half the resolution: patch 16, 2 x 112 + 8 x 48 px", crops(16, 112, 48, 8)),
    "p8_48_24_l8": Arm("patch 8 at the cells' native size: 2 x 48 + 8 x 24 px", crops(8, 48, 24, 8)),
    "p8_56_28_l4": Arm("patch 8, a little above native size, half the local crops: 2 x 56 + 4 x 28 px",
                       crops(8, 56, 28, 4)),
    "p8_64_32_l2": Arm("patch 8, 1.3x upsampled, two local crops: 2 x 64 + 2 x 32 px", crops(8, 64, 32, 2)),
    "p8_32_16_l4": Arm("the demo's recipe: patch 8, 2 x 32 + 4 x 16 px (downsampled)", crops(8, 32, 16, 4)),
}
REFERENCE = "scdino"
"""The arm every other one is measured against."""
FAST = "p8_48_24_l8"
"""The arm configs/fast.yaml is: within 1 kNN point of the reference on both seeds at the demo's size
(docs/performance.md)."""
STEPS = ("prepare", "mean-std", "pretrain", "features", "labels", "knn", "linear")
FOLDS = 5


def arm_config(base: Config, arm: Arm, run_dir: Path, images: Path) -> Config:
    return base.replace({**arm.overrides, "run.output_dir": str(run_dir), "data.source": str(images)})


def run_steps(config_path: Path | None, overrides: Sequence[str], run_dir: Path) -> None:
    """The pipeline steps of one arm, each a `python -m training` process (niced when asked)."""
    settings = [item for pair in overrides for item in ("--set", pair)]
    config = ["--config", str(config_path)] if config_path else []
    for step in STEPS:
        extra = ["--epochs", "none"] if step == "features" else []
        command = [sys.executable, "-m", "training", step, *config, *settings, *extra]
        log.info("%s: %s", run_dir.name, step)
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise UserError(f"{run_dir.name}: `python -m training {step}` failed ({done.returncode}):\n{tail}")


def kfold_knn_top1(features: np.ndarray, labels: np.ndarray, config: Config) -> tuple[float, int]:
    """Top-1 of the weighted kNN with every row a query once (FOLDS stratified folds, the other folds
    as references: the knn step's eval.knn_folds), at the best k of eval.knn_k; returns (top-1, k)."""
    import dataclasses

    from training.eval.knn import knn_splits, pooled_classify

    settings = dataclasses.replace(config.eval, knn_folds=FOLDS, knn_whiten=False)
    splits = knn_splits(labels, settings, config.run.seed)
    _, result = pooled_classify([features] * FOLDS, labels, splits, settings, int(labels.max()) + 1)
    return result.top1[result.best_k], result.best_k


def collect(config: Config) -> dict[str, Any]:
    """One arm's figures, read from the files its steps wrote."""
    from training.costs.flops import train_flops_per_image
    from training.rundir import RunLayout
    from training.rundir.artifacts import (
        checkpoint_progress,
        load_knn,
        load_labels,
        load_linear,
        read_metrics,
        read_timings,
    )
    from training.rundir.features import load_features

    layout = RunLayout.from_config(config)
    progress = checkpoint_progress(layout)
    images = progress["global_step"] * config.optim.batch_size_per_gpu * progress.get("world_size", 1)
    per_image = train_flops_per_image(config, config.data.in_chans)
    knn = load_knn(layout)["tags"]["final"]
    labels = np.asarray(load_labels(layout)["labels"], np.int64)
    cv_top1, cv_k = kfold_knn_top1(np.asarray(load_features(layout.features("final")).features), labels, config)
    steps = [r for r in read_metrics(layout) if r.get("kind") == "step"]
    return {
        "flops_per_image": per_image, "images_trained": images, "train_flops": per_image * images,
        "cpu_core_s": round(sum(r.get("cpu_core_s", 0.0) for r in steps), 1),
        "pretrain_wall_s": read_timings(layout).get("pretrain"),
        "knn_top1": knn["top1"][str(knn["best_k"])], "knn_best_k": knn["best_k"],
        "knn_cv_top1": cv_top1, "knn_cv_best_k": cv_k, "n_heldout": int(len(labels)),
        "linear_top1": load_linear(layout)["tags"]["final"]["final_top1"],
    }


def ensure_dataset(config_path: Path | None, overrides: Sequence[str], images: Path, seed: int, per_class: int) -> None:
    if images.is_dir() and any(images.rglob("*.tif")):
        return
    settings = [item for pair in overrides for item in ("--set", pair)]
    config = ["--config", str(config_path)] if config_path else []
    command = [sys.executable, "-m", "training", "synth-data", *config, *settings, "--out", str(images),
               "--seed", str(seed), "--per-class", str(per_class)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def compare_recipes(args: argparse.Namespace) -> dict[str, Any]:
    from training.rundir import RunLayout

    base = load_config(args.config, args.overrides)
    results: dict[str, Any] = {"arms": {n: {"description": ARMS[n].description, "overrides": ARMS[n].overrides}
                                        for n in args.arms}, "seeds": {}}
    for seed in args.seeds:
        images = args.data_root / f"seed{seed}" / "images"
        ensure_dataset(args.config, args.overrides, images, seed, args.per_class)
        per_arm = {}
        for name in args.arms:
            run_dir = args.work / f"seed{seed}" / name
            config = arm_config(base, ARMS[name], run_dir, images)
            if not RunLayout.from_config(config).linear_json.is_file():
                overrides = [*args.overrides, *(f"{k}={_plain(v)}" for k, v in ARMS[name].overrides.items()),
                             f"run.output_dir={run_dir}", f"data.source={images}"]
                start = time.perf_counter()
                run_steps(args.config, overrides, run_dir)
                log.info("%s, seed %d: %.0f s", name, seed, time.perf_counter() - start)
            per_arm[name] = collect(config)
        reference = per_arm.get(REFERENCE)
        if reference:
            for figures in per_arm.values():
                figures["flops_ratio"] = round(figures["train_flops"] / reference["train_flops"], 4)
        results["seeds"][str(seed)] = per_arm
    return results


def _plain(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def markdown(results: dict[str, Any]) -> str:
    from training.eval.tables import markdown_table

    header = ["seed", "arm", "FLOPs/image (G)", "FLOPs vs scDINO", "core-s", "kNN top-1 (k)", "kNN top-1, 5-fold",
              "linear top-1"]
    rows = []
    for seed, per_arm in results["seeds"].items():
        for name, f in per_arm.items():
            rows.append([seed, name, f"{f['flops_per_image'] / 1e9:.2f}", f"{f.get('flops_ratio', float('nan')):.3f}",
                         f"{f['cpu_core_s']:.0f}", f"{100 * f['knn_top1']:.1f} ({f['knn_best_k']})",
                         f"{100 * f['knn_cv_top1']:.1f}", f"{100 * f['linear_top1']:.1f}"])
    return markdown_table(header, rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.benchmarks.quality.recipes",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="the run YAML every arm starts from (e.g. configs/demo.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every arm, e.g. optim.batch_size_per_gpu=32 (repeatable)")
    parser.add_argument("--work", type=Path, default=Path("runs/recipes"), help="where the arms' runs go")
    parser.add_argument("--data-root", type=Path, help="where the datasets go (default: <work>/data)")
    parser.add_argument("--seeds", default="0", help="dataset seeds, e.g. 0,1")
    parser.add_argument("--per-class", type=int, default=400, help="synthetic images per class (the demo's 400)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"arms to run, from: {', '.join(ARMS)}")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown or not args.arms:
        parser.error(f"unknown arm(s) {', '.join(unknown) or '(none)'}; known: {', '.join(ARMS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be integers such as 0,1; got {args.seeds!r}")
    args.data_root = args.data_root or args.work / "data"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "INFO"), format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    try:
        results = compare_recipes(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
