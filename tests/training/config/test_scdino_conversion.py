"""scDINO's YAMLs: the schedule length, the saved and analysed epochs, every key accounted for.

References are written from scDINO's full_pipeline_snakefile and main_dino.py:
- the Snakefile passes `epochs = config epochs + 1` to main_dino;
- main_dino saves checkpoint{e}.pth after 0-based epoch e when `e % saveckp_freq == 0`;
- the Snakefile analyses `[k * freq for k in range(int(epochs / freq))]` plus `epochs - 1`.
"""

import logging

import pytest
import torch

from training.checkpointing import CheckpointManager
from training.config import load_config
from training.rundir import RunLayout

FULL = """\
meta:
  name_of_run: "run1"
  output_dir: "{out}"
  dataset_dir: "/data"
  train_datasetsplit_fraction: 0.8
  seed: 40
  images_are_RGB: {rgb}
  center_crop: {crop}
train_scDINO:
  epochs: {epochs}
  saveckp_freq: {freq}
downstream_analyses:
  compute_cls_features:
    normalize: {normalize}
    checkpoint_key: {key}
    resize: {resize}
    resize_length: 112
  umap_eval:
    n_neighbors: 30
    spread: 1.1
"""


def _write(tmp_path, **values):
    defaults = dict(out=tmp_path, rgb=False, crop=0, epochs=10, freq=2, normalize=True, key="teacher", resize=True)
    path = tmp_path / "scDINO_full_pipeline.yaml"
    path.write_text(FULL.format(**{**defaults, **values}))
    return path


def _snakefile_epochs(config_epochs: int, freq: int) -> list[int]:
    epochs = int(config_epochs + 1)
    nums = [k * freq for k in range(0, int(epochs / freq))]
    if epochs - 1 not in nums:
        nums.append(epochs - 1)
    return nums


def _main_dino_saved(config_epochs: int, freq: int) -> list[int]:
    return [e for e in range(config_epochs + 1) if freq and e % freq == 0]


def _numbered_after_training(tmp_path, config) -> list[int]:
    """Numbered checkpoints the manager leaves after every epoch of `config` (ours: completed epochs)."""
    layout = RunLayout(tmp_path / "ck")
    manager = CheckpointManager(layout, config.train)
    for completed in range(1, config.optim.epochs + 1):
        manager.write({"epoch": completed, "config": config.to_dict(), "w": torch.zeros(1)})
    return [epoch for epoch, _ in layout.numbered_checkpoints()]


@pytest.mark.parametrize("epochs,freq", [(10, 2), (9, 3), (4, 1), (12, 4)])
def test_schedule_length_and_saved_epochs_are_scdinos(tmp_path, epochs, freq):
    config = load_config(_write(tmp_path, epochs=epochs, freq=freq))
    assert config.optim.epochs == epochs + 1
    assert config.train.keep_last == 0  # nothing an analysis needs is pruned
    analysed = _snakefile_epochs(epochs, freq)
    assert analysed == _main_dino_saved(epochs, freq)  # scDINO's pipeline agrees with itself here
    # scDINO's checkpoint{e}.pth holds e + 1 completed epochs: our epoch_{e+1}
    assert [c - 1 for c in _numbered_after_training(tmp_path, config)] == analysed


def test_epochs_not_a_multiple_of_freq_save_both_sets_and_warn(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="training.config.scdino"):
        config = load_config(_write(tmp_path, epochs=10, freq=3))
    assert any("checkpoint10.pth, which its main_dino never writes" in r.getMessage() for r in caplog.records)
    wanted = sorted(set(_snakefile_epochs(10, 3)) | set(_main_dino_saved(10, 3)))
    assert [c - 1 for c in _numbered_after_training(tmp_path, config)] == wanted


def test_keys_that_change_results_are_converted(tmp_path):
    config = load_config(_write(tmp_path, normalize=False, key="student", resize=False))
    assert config.eval.normalize is False and config.eval.checkpoint_key == "student"
    assert config.eval.resize == "none" and config.eval.image_size == 112
    assert config.data.split_method == "scdino"
    assert config.data.holdout_fraction == 1 - 0.8  # the float scDINO computes, not 0.2
    config = load_config(_write(tmp_path, resize=True))
    assert config.eval.resize == "shorter_side_bilinear"


def test_the_whole_mapping_is_one_info_block(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="training.config.scdino"):
        load_config(_write(tmp_path))
    blocks = [r.getMessage() for r in caplog.records if "scDINO key -> our key = value" in r.getMessage()]
    assert len(blocks) == 1
    for line in ("train_scDINO.epochs -> optim.epochs = 11",
                 "train_scDINO.saveckp_freq -> train.saveckp_freq = 2, train.saveckp_rule = 'scdino', "
                 "train.keep_last = 0",
                 "downstream_analyses.compute_cls_features.checkpoint_key -> eval.checkpoint_key = 'teacher'",
                 "downstream_analyses.compute_cls_features.resize -> eval.resize = 'shorter_side_bilinear'",
                 "downstream_analyses.umap_eval.n_neighbors -> eval.umap_neighbors = 30",
                 "meta.seed -> run.seed = 40"):
        assert line in blocks[0]


@pytest.mark.parametrize("values,key,shown", [
    ({"crop": 64}, "meta.center_crop", "64"),
    ({"rgb": True}, "meta.images_are_RGB", "True"),
    ({}, "downstream_analyses.umap_eval.spread", "1.1"),
])
def test_unimplemented_values_are_warnings_naming_key_and_value(tmp_path, caplog, values, key, shown):
    with caplog.at_level(logging.WARNING, logger="training.config.scdino"):
        load_config(_write(tmp_path, **values))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{key}={shown}" in w for w in warnings), warnings


def test_scdinos_defaults_that_match_ours_are_no_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="training.config.scdino"):
        load_config(_write(tmp_path, crop=0, rgb=False))
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "center_crop" not in warnings and "images_are_RGB" not in warnings
