"""Evaluating an scDINO run as scDINO's only_downstream_analyses.yaml does, and its eval resize.

The round trip: checkpoints in scDINO's format (a dict with the DDP student under `module.backbone.`,
the teacher under `backbone.`, pickled argparse args, the epoch) in a folder, an
only_downstream_analyses-style YAML pointing at it, and our features -> labels -> knn steps. The
reference applies the same backbone directly to the images scDINO's compute_CLS_features would
hold out, prepared its way: tifffile, float64, per-channel min-max, torchvision `Resize(length)`
(bilinear, no antialias as in torchvision 0.9), `Normalize(mean, std)` from its mean/std file,
then the L2-normalised CLS output.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
import torch.nn.functional as F
from torchvision.datasets import ImageFolder
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from training.cli import main
from training.config import Config, ModelConfig
from training.data.loading.augment import resize_shorter_side
from training.data.loading.torch_loader import EvalTransform, eval_batch_size
from training.errors import UserError
from training.eval.feature_plan import final_checkpoint, folder_tags
from training.models import build_backbone, build_model
from training.rundir import RunLayout
from training.rundir.features import load_features

torch.set_num_threads(1)
CLASSES = ("alpha", "beta", "gamma")
MEAN, STD = [0.30, 0.25, 0.20, 0.9], [0.20, 0.15, 0.10, 0.5]  # 4 image channels, channels "012" used


@pytest.mark.parametrize("shape,size", [((3, 50, 80), 32), ((2, 90, 40), 24), ((1, 33, 33), 20), ((2, 24, 30), 24)])
def test_shorter_side_resize_is_torchvisions_resize(shape, size):
    image = torch.rand(shape, generator=torch.Generator().manual_seed(1))
    expected = TF.resize(image, size, interpolation=InterpolationMode.BILINEAR, antialias=False)
    ours = resize_shorter_side(image[None], size)
    assert ours.shape[1:] == expected.shape
    assert torch.allclose(ours[0], expected, atol=1e-6)
    assert resize_shorter_side(image[None], None).shape[1:] == image.shape


def test_images_of_other_aspects_stay_a_list():
    images = [torch.rand(2, 20, 30), torch.rand(2, 30, 20)]
    out = resize_shorter_side(images, 10)
    assert isinstance(out, list) and [tuple(o.shape) for o in out] == [(2, 10, 15), (2, 15, 10)]


@pytest.mark.parametrize("resize,uniform,expected", [
    ("square_bicubic", None, 8), ("shorter_side_bilinear", None, 1), ("none", None, 1),
    ("shorter_side_bilinear", (3, 24, 36), 8),
])
def test_aspect_keeping_resizes_batch_only_images_of_one_shape(resize, uniform, expected):
    images = argparse.Namespace(uniform_shape=uniform)
    config = Config().replace({"eval.resize": resize})
    assert eval_batch_size(config, images, 8) == expected


def test_eval_transform_resizes_a_batch_as_torchvision_then_normalises():
    batch = torch.rand(2, 3, 24, 36, generator=torch.Generator().manual_seed(2))
    transform = EvalTransform(32, MEAN[:3], STD[:3], "shorter_side_bilinear")
    out, _, _ = transform(batch, torch.zeros(2), torch.arange(2), None)
    for image, got in zip(batch, out):
        expected = TF.normalize(TF.resize(image, 32, interpolation=InterpolationMode.BILINEAR, antialias=False),
                                MEAN[:3], STD[:3])
        assert got.shape == (3, 32, 48) and torch.allclose(got, expected, atol=1e-5)


def _images(root: Path) -> None:
    rng = np.random.default_rng(5)
    for cls, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(6):
            image = rng.integers(0, 3000, (24, 36, 4)).astype(np.float64)
            image[6:14, 10:20, cls] += 20000
            tifffile.imwrite(root / name / f"cell{i}.tif", image.astype(np.uint16))


def _scdino_checkpoints(folder: Path) -> dict[tuple[str, str], dict]:
    """checkpoint0.pth (after 1 epoch), checkpoint2.pth and checkpoint.pth (after 3), scDINO-style;
    the student's weights differ from the teacher's. Returns each network's backbone weights."""
    config = Config().replace({"model.arch": "vit_tiny", "model.patch_size": 16, "model.out_dim": 64})
    folder.mkdir(parents=True)
    backbones = {}
    for name, seed, epoch in (("checkpoint0.pth", 1, 1), ("checkpoint2.pth", 2, 3)):
        torch.manual_seed(seed)
        student, teacher = build_model(config, in_chans=3)
        with torch.no_grad():
            for parameter in student.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        state = {"student": {"module." + k: v for k, v in student.state_dict().items()},
                 "teacher": teacher.state_dict(), "optimizer": {}, "epoch": epoch,
                 "args": argparse.Namespace(arch="vit_tiny", patch_size=16, epochs=3), "dino_loss": {}}
        torch.save(state, folder / name)
        for key, network in (("teacher", teacher), ("student", student)):
            backbones[(name, key)] = {k[len("backbone."):]: v for k, v in network.state_dict().items()
                                     if k.startswith("backbone.")}
    (folder / "checkpoint.pth").write_bytes((folder / "checkpoint2.pth").read_bytes())
    return backbones


def _only_downstream_yaml(tmp_path: Path, images: Path, weights: Path, stats: Path, key: str, flags: bool) -> Path:
    text = f"""\
meta:
  name_of_run: "downstream"
  output_dir: "{tmp_path / 'out'}"
  dataset_dir: "{images}"
  folder_depth_for_labels: 0
  test_datasetsplit_fraction: 0.5
  seed: 40
  images_are_RGB: False
  channel_dict: {{0: "a", 1: "b", 2: "c", 3: "d"}}
  selected_channel_combination_per_run: ["012"]
  center_crop: 0
compute_cls_features:
  use_weighted_sampler: False
  normalize: {flags}
  parse_mean_std_from_file: True
  mean_std_file_location: "{stats}"
  num_gpus: 1
  batch_size_per_gpu: 4
  num_workers: 0
  pretrained_weights: "{weights}"
  read_model_arch_dynamically: False
  arch: "vit_tiny"
  patch_size: 16
  use_mean_patch_embedding: False
  checkpoint_key: {key}
  resize: {flags}
  resize_length: 32
kNN:
  global:
    n_neighbors: [1, 3]
    temperature: 0.1
eval:
  raw_pixels_size: 4
"""
    path = tmp_path / "only_downstream_analyses.yaml"
    path.write_text(text)
    return path


def _scdino_features(images: Path, backbone_state: dict, flags: bool = True) -> dict[str, np.ndarray]:
    """compute_CLS_features' held-out set and features, by relative path."""
    dataset = ImageFolder(str(images), loader=lambda p: p)
    indices = list(range(len(dataset)))
    split = int(np.floor(0.5 * len(dataset)))
    np.random.seed(40)
    np.random.shuffle(indices)
    model = build_backbone(ModelConfig(arch="vit_tiny", patch_size=16), in_chans=3, img_size=224)
    model.load_state_dict(backbone_state)
    model.eval()
    out = {}
    for i in indices[:split]:
        path = dataset.samples[i][0]
        image = tifffile.imread(path)[:, :, [0, 1, 2]].astype(float)
        low, high = image.min(axis=(0, 1), keepdims=True), image.max(axis=(0, 1), keepdims=True)
        tensor = torch.from_numpy((image - low) / (high - low)).permute(2, 0, 1)
        if flags:  # resize and normalize
            tensor = TF.resize(tensor, 32, interpolation=InterpolationMode.BILINEAR, antialias=False)
            tensor = TF.normalize(tensor, MEAN[:3], STD[:3])
        with torch.no_grad():
            feature = F.normalize(model(tensor[None].float()), dim=1, p=2)
        out[Path(path).relative_to(images).as_posix()] = feature[0].numpy()
    return out


@pytest.mark.parametrize("key,flags", [("teacher", True), ("student", True), ("teacher", False)])
def test_only_downstream_yaml_evaluates_scdino_checkpoints_as_scdino(tmp_path, key, flags):
    """flags: scDINO's compute_cls_features `resize` and `normalize` (False: native 24 x 36 images)."""
    images, weights, stats = tmp_path / "images", tmp_path / "scDINO_ViTs" / "model_channel_a_b_c", tmp_path / "ms.txt"
    _images(images)
    backbones = _scdino_checkpoints(weights)
    stats.write_text(json.dumps({"mean": MEAN, "std": STD}))
    config = _only_downstream_yaml(tmp_path, images, weights, stats, key, flags)
    for step in ("features", "labels", "knn"):
        assert main([step, "--config", str(config)]) == 0, step
    root = tmp_path / "out" / "downstream"
    assert sorted(p.name for p in (root / "features").iterdir()) == [
        "epoch_0001", "epoch_0003", "final", "random_init", "raw_pixels"]
    labels = json.loads((root / "labels.json").read_text())
    for tag, name in (("epoch_0003", "checkpoint2.pth"), ("final", "checkpoint2.pth"), ("epoch_0001", "checkpoint0.pth")):
        reference = _scdino_features(images, backbones[(name, key)], flags)
        ours = load_features(root / "features" / tag).select(labels["indices"])
        assert sorted(labels["paths"]) == sorted(reference)  # scDINO's held-out images, 9 of 18
        got = dict(zip(labels["paths"], ours.features))
        for path, feature in reference.items():
            np.testing.assert_allclose(got[path], feature, atol=2e-5)
    assert not np.allclose(load_features(root / "features" / "epoch_0001").features,
                           load_features(root / "features" / "final").select(labels["indices"]).features, atol=1e-3)
    assert len(load_features(root / "features" / "final").indices) == 18  # every cell: the profiles
    knn = json.loads((root / "knn" / "knn.json").read_text())
    assert {"final", "epoch_0001", "epoch_0003"} <= set(knn["tags"])


@pytest.mark.slow
def test_plots_and_report_run_on_an_scdino_run(tmp_path):
    images, weights, stats = tmp_path / "images", tmp_path / "scDINO_ViTs" / "m", tmp_path / "ms.txt"
    _images(images)
    _scdino_checkpoints(weights)
    stats.write_text(json.dumps({"mean": MEAN, "std": STD}))
    config = _only_downstream_yaml(tmp_path, images, weights, stats, "teacher", True)
    for step in ("features", "labels", "knn", "plots", "report"):
        assert main([step, "--config", str(config)]) == 0, step
    root = tmp_path / "out" / "downstream"
    plots = {p.name for p in (root / "plots").iterdir()}
    assert {"umap_epoch_0001.png", "umap_epoch_0003.png", "knn_vs_epoch.png"} <= plots
    assert any(name.startswith("attention_") for name in plots)  # drawn from the scDINO checkpoint
    assert (root / "report.html").stat().st_size > 0


def test_checkpoint_folder_tags_and_its_final_file(tmp_path):
    for name, epoch in (("checkpoint0.pth", 1), ("checkpoint4.pth", 5), ("dino vits16.pth", None)):
        torch.save({"epoch": epoch} if epoch else {"weights": torch.zeros(1)}, tmp_path / name)
    listed = {tag: (path.name, epoch) for tag, path, epoch in folder_tags(tmp_path)}
    assert listed == {"epoch_0001": ("checkpoint0.pth", 1), "final": ("checkpoint4.pth", 5),
                      "model_dino_vits16": ("dino vits16.pth", None)}
    config = Config().replace({"eval.checkpoints_dir": str(tmp_path)})
    assert final_checkpoint(config, RunLayout(tmp_path / "run")) == tmp_path / "checkpoint4.pth"
    with pytest.raises(UserError, match="eval.checkpoints_dir=.* holds no checkpoint"):
        folder_tags(tmp_path / "run")
