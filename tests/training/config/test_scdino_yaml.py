"""A YAML written for scDINO's pipeline loads, with the mapping applied and ignored keys logged."""

import logging

import pytest

from training.config import load_config
from training.errors import UserError

SCDINO_YAML = """\
meta:
  name_of_run: "pbmc"
  output_dir: "/outputdir"
  dataset_dir: "/datasetdir"
  folder_depth_for_labels: 1
  train_datasetsplit_fraction: 0.8
  seed: 40
  images_are_RGB: False
  channel_dict: { 0: "aTub", 1: "BF", 2: "DAPI", 3: "Oct4", 4: "PE" }
  selected_channel_combination_per_run: ["024", "0", "1"]
  center_crop: 0
train_scDINO:
  dino_vit_name: "name_of_model"
  fraction_for_mean_std_calc: 0.2
  epochs: 10
  saveckp_freq: 2
  num_gpus: 2
  batch_size_per_gpu: 30
  num_workers: 8
  dist_url: "env://"
  hyperparameters:
    arch: "vit_small"
    patch_size: 16
    norm_last_layer: True
    momentum_teacher: 0.996
    use_bn_in_head: False
    warmup_teacher_temp: 0.04
    techer_temp: 0.05
    warmup_teacher_temp_epochs: 0
    use_fp16: True
    weight_decay: 0.04
    weight_decay_end: 0.4
    clip_grad: 3
    freeze_last_layer: 1
    lr: 0.0005
    warump_epochs: 5
    min_lr: 0.000001
    optimizer: "adamw"
    drop_path_rate: 0.1
    global_crops_scale: !!python/tuple [0.14, 1.0]
    local_crops_number: 8
    local_crops_scale: !!python/tuple [0.05, 0.14]
downstream_analyses:
  compute_cls_features:
    normalize: True
    batch_size_per_gpu: 24
    resize_length: 224
  kNN:
    global:
      n_neighbors: [5, 10, 50, 100, 200, 500]
      temperature: 0.1
  umap_eval:
    n_neighbors: 30
    min_dist: 0.4
    spread: 1.1
train:
  parallel: fsdp
"""


def test_scdino_pipeline_yaml_is_converted(tmp_path, caplog):
    path = tmp_path / "scDINO_full_pipeline.yaml"
    path.write_text(SCDINO_YAML)
    with caplog.at_level(logging.INFO, logger="training.config.scdino"):
        config = load_config(path)
    assert config.run.output_dir == "/outputdir/pbmc" and config.run.seed == 40
    assert config.data.source == "/datasetdir" and config.data.folder_depth_for_labels == 1
    assert config.data.holdout_fraction == pytest.approx(0.2)
    assert config.data.channels == "024" and config.data.channel_names == ("aTub", "DAPI", "PE")
    assert config.dino.global_crops_scale == (0.14, 1.0) and config.dino.local_crops_scale == (0.05, 0.14)
    assert config.dino.teacher_temp == pytest.approx(0.05) and config.optim.warmup_epochs == 5
    assert config.train.precision == "auto" and config.train.saveckp_freq == 2
    assert config.train.parallel == "fsdp"  # our own sections apply on top
    assert config.eval.batch_size == 24 and config.eval.knn_k == (5, 10, 50, 100, 200, 500)
    assert config.eval.umap_neighbors == 30 and config.eval.umap_min_dist == pytest.approx(0.4)
    mapping = next(r.getMessage() for r in caplog.records if "scDINO key -> our key = value" in r.getMessage())
    for key in ("train_scDINO.num_gpus", "meta.center_crop", "umap_eval.spread", "compute_cls_features.normalize"):
        assert key in mapping
    assert config.data.channel_combinations == ("024", "0", "1")  # one chain each (submit_pipeline.sh)


def test_unsupported_scdino_optimizer_names_the_key(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("train_scDINO:\n  hyperparameters:\n    optimizer: sgd\n")
    with pytest.raises(UserError, match="train_scDINO.hyperparameters.optimizer='sgd'"):
        load_config(path)
