"""The tiny model and run every training test builds on: one definition, overridden per test.

    tiny_config({"optim.batch_size_per_gpu": 4})          ViT-tiny/8 on 32/16 px crops, defaults otherwise
    TINY_RUN                                              plus settings for a whole run in seconds on CPU
    run_config(out_dir)                                   the trainer's two-epoch run, logging and saving each step
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.config import Config

TINY_MODEL: dict[str, Any] = {
    "model.arch": "vit_tiny",
    "model.patch_size": 8,
    "model.out_dim": 256,
    "dino.global_crop_size": 32,
    "dino.local_crop_size": 16,
    "dino.local_crops_number": 2,
    "train.precision": "fp32",
}
"""A DINO model small enough for a CPU step in well under a second, in fp32: train.precision's default,
auto, is bf16 on a CPU with native bf16 (AMX, AVX512-BF16), and the tests that compare two runs of a
step hold them to fp32 tolerances; a test of precision sets its own."""

TINY_RUN: dict[str, Any] = {
    **TINY_MODEL,
    "data.num_workers": 0,
    "optim.epochs": 1,
    "optim.batch_size_per_gpu": 8,
    "optim.warmup_epochs": 0,
    "train.precision": "fp32",
    "train.tensorboard": False,
    "eval.image_size": 32,
    "eval.batch_size": 16,
    "eval.knn_k": [5, 10],
    "eval.linear_epochs": 2,
}
"""A whole pipeline run (pretrain, features, kNN, probe) in seconds on CPU."""


def tiny_config(overrides: dict[str, Any] | None = None, **keywords: Any) -> Config:
    """The tiny model with `overrides` (dotted keys; keywords use "__" for the dot); defaults elsewhere."""
    values = {**TINY_MODEL, **(overrides or {})}
    values.update({key.replace("__", "."): value for key, value in keywords.items()})
    return Config().replace(values)


def run_config(out_dir: Path | str, **overrides: Any) -> Config:
    """Two epochs on channels 012, 4 crops a batch, a log line and a checkpoint every step (the trainer's tests)."""
    return tiny_config({
        "run.output_dir": str(out_dir), "data.channels": "012",
        "optim.batch_size_per_gpu": 4, "optim.epochs": 2, "optim.warmup_epochs": 1, "optim.lr": 0.005,
        "train.log_every": 1, "train.saveckp_freq": 1, "train.tensorboard": False, **overrides,
    })


def run_cli(config: Config, step: str, *extra: str) -> int:
    """Run a step through the real command line, with `config` written as YAML beside its run folder."""
    from training.cli import main
    from training.config import dump_config

    path = Path(config.run.output_dir).parent / f"{step}.yaml"
    dump_config(config, path)
    return main([step, "--config", str(path), *extra])
