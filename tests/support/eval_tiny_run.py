"""A tiny but real run directory for the downstream tests, built once per test session.

Real steps all the way: TIFF images in class folders, `mean-std`, 2 epochs of `pretrain` (vit_tiny,
32 px crops, 2 steps per epoch, a checkpoint every epoch), then `features` and `labels`. Three classes
differ by which channel holds a bright blob, so every representation can separate them a little.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tifffile
import yaml

from training.cli import main

CLASSES = ("alpha", "beta", "gamma")
PER_CLASS = 16
_CACHE: dict[str, Path] = {}


def write_images(root: Path, per_class: int = PER_CLASS, size: int = 20, seed: int = 0) -> None:
    """3-channel uint16 TIFFs (H, W, C): class c has a blob at a random place in channel c."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    for cls, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = rng.integers(0, 2000, (size, size, 3)).astype(np.float64)
            cy, cx = rng.uniform(5, size - 5, 2)
            image[..., cls] += 30000 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 8.0)
            tifffile.imwrite(root / name / f"cell_{i:03d}.tif", image.astype(np.uint16))


def tiny_config(base: Path) -> dict:
    return {
        "run": {"name": "tiny", "output_dir": str(base / "run"), "seed": 0},
        "data": {"source": str(base / "images"), "channels": "012", "channel_names": ["dapi", "tubulin", "actin"],
                 "num_workers": 0, "holdout_fraction": 0.5},
        "model": {"arch": "vit_tiny", "patch_size": 16, "out_dim": 128, "drop_path_rate": 0.0},
        "dino": {"global_crop_size": 32, "local_crop_size": 16, "local_crops_number": 2},
        "optim": {"epochs": 2, "batch_size_per_gpu": 8, "warmup_epochs": 0},
        "train": {"saveckp_freq": 1, "keep_last": 5, "log_every": 1, "tensorboard": False,
                  "max_steps_per_epoch": 2, "precision": "fp32"},  # auto is bf16 where the CPU has it natively
        "eval": {"image_size": 48, "batch_size": 8, "knn_k": [1, 3, 5, 200], "linear_epochs": 5,
                 "umap_neighbors": 5, "raw_pixels_size": 4},
    }


def write_config(base: Path, **overrides: dict) -> Path:
    tree = tiny_config(base)
    for section, values in overrides.items():
        tree[section].update(values)
    path = base / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def run_step(config: Path, step: str, *extra: str) -> int:
    return main([step, "--config", str(config), *extra])


def pretrained_run(tmp_path_factory) -> Path:
    """Config path of a run that went through mean-std and 2 epochs of pretraining (cached)."""
    if "pretrained" not in _CACHE:
        base = tmp_path_factory.mktemp("tiny_run")
        write_images(base / "images")
        config = write_config(base)
        for step in ("mean-std", "pretrain"):
            assert run_step(config, step) == 0, step
        _CACHE["pretrained"] = config
    return _CACHE["pretrained"]


def evaluated_run(tmp_path_factory) -> Path:
    """The pretrained run after features, labels, knn and linear (cached)."""
    if "evaluated" not in _CACHE:
        config = pretrained_run(tmp_path_factory)
        for step in ("features", "labels", "knn", "linear"):
            assert run_step(config, step) == 0, step
        _CACHE["evaluated"] = config
    return _CACHE["evaluated"]


def run_dir(config: Path) -> Path:
    return Path(yaml.safe_load(config.read_text())["run"]["output_dir"])


def plotted_run(tmp_path_factory) -> Path:
    """The evaluated run after `plots` (cached)."""
    if "plotted" not in _CACHE:
        config = evaluated_run(tmp_path_factory)
        assert run_step(config, "plots") == 0
        _CACHE["plotted"] = config
    return _CACHE["plotted"]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG header."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
