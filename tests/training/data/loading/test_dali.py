"""The DALI loader in DALI's CPU mode: batch format, the sampler's order across epochs and ranks,
min-max scaling, statistics of the crops against BatchMultiCrop, a short pretraining run, the
missing-DALI error, the benchmark row; and on a CUDA GPU the same batches from DALI's GPU mode."""

import sys

import numpy as np
import pytest
import torch

from tests.support.packing import write_packed
from training.cli import main
from training.config import dump_config
from training.data.dataset import minmax_scale
from training.data.loading.augment import BatchMultiCrop
from training.data.store.read import PackedImages
from training.distributed.groups import DistContext, DistEnv

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install -r requirements-dali.txt)")

from training.benchmarks.data.dali import benchmark_dali  # noqa: E402
from training.data.loading.dali import build_dali_pretrain_loader, require_dali
from training.errors import UserError  # noqa: E402
from training.trainer import train  # noqa: E402

MEAN, STD = [0.3] * 5, [0.2] * 5


@pytest.fixture
def indexed_config(make_config, tmp_path):
    """A config over 30 random 5-channel images labelled 0..29, all of them in the training split."""
    images = np.random.default_rng(0).integers(0, 60000, (30, 5, 40, 40))
    images[:, 3] = 1234  # a constant channel
    write_packed(tmp_path / "indexed", images.astype(np.uint16), [f"{i:02d}" for i in range(30)])
    return make_config({"data.source": str(tmp_path / "indexed"), "data.loader": "dali",
                        "data.holdout_fraction": 0.0, "optim.batch_size_per_gpu": 4})


def labels_of(loader) -> list[list[int]]:
    return [labels.tolist() for _, labels in loader]


def test_batches_have_the_pretrain_format_and_follow_the_sampler_across_epochs(indexed_config):
    loader, sampler = build_dali_pretrain_loader(indexed_config, rank=0, world_size=1, mean=MEAN, std=STD)
    crops, labels = next(iter(loader))
    assert [tuple(c.shape) for c in crops] == [(4, 5, 32, 32)] * 2 + [(4, 5, 16, 16)] * 2
    assert all(c.dtype == torch.float32 and c.device.type == "cpu" for c in crops)
    assert labels.dtype == torch.int64 and len(loader) == 7
    for epoch in (0, 1, 1, 2):  # epoch 1 twice: an abandoned iteration must not shift the next one
        sampler.set_epoch(epoch)
        expected = [indices.tolist() for _, indices in sampler]
        assert labels_of(loader) == expected
    loader.set_epoch(3)
    partial = iter(loader)
    next(partial)
    assert labels_of(loader) == [indices.tolist() for _, indices in sampler]


def test_ranks_get_equal_batch_counts_from_disjoint_shards(indexed_config):
    seen = []
    for rank in range(3):
        loader, _ = build_dali_pretrain_loader(indexed_config, rank=rank, world_size=3, mean=MEAN, std=STD)
        batches = labels_of(loader)
        assert len(batches) == len(loader) == 2
        seen.append({label for batch in batches for label in batch})
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_channels_are_min_max_scaled_per_image(indexed_config):
    loader, _ = build_dali_pretrain_loader(indexed_config, rank=0, world_size=1, mean=MEAN, std=STD)
    crops, _ = next(iter(loader))
    for crop in crops:  # the constant channel scales to 0 and nothing the augmentations do moves it
        torch.testing.assert_close(crop[:, 3], torch.full_like(crop[:, 3], -MEAN[3] / STD[3]))
        assert crop[:, [0, 1, 2, 4]].std() > 0.5
        assert crop.min() >= (-MEAN[0] - 0.3) / STD[0] and crop.max() <= (1 + 0.3 - MEAN[0]) / STD[0]


def view_statistics(views: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """For global 1, global 2 and all local views pooled: per-channel mean and std, and the mean
    absolute step between rows (blur lowers it)."""
    groups = [views[0], views[1], torch.cat(views[2:])]
    return [(v.mean((0, 2, 3)), v.std((0, 2, 3)), float((v[..., 1:, :] - v[..., :-1, :]).abs().mean()))
            for v in groups]


def test_crop_statistics_match_batch_multicrop_on_the_same_images(make_config):
    config = make_config({"data.loader": "dali", "data.holdout_fraction": 0.0, "optim.batch_size_per_gpu": 32,
                          "dino.local_crops_number": 4})
    path = config.run.output_dir + ".yaml"
    dump_config(config, path)
    assert main(["prepare", "--config", path]) == 0
    images = PackedImages(config.run.output_dir + "/packed")
    scaled = minmax_scale(torch.from_numpy(images.read_batch(np.arange(len(images))).astype(np.float32)))
    mean, std = scaled.mean((0, 2, 3)).tolist(), scaled.std((0, 2, 3)).tolist()
    loader, sampler = build_dali_pretrain_loader(config, rank=0, world_size=1, mean=mean, std=std)
    epochs = []
    for epoch in range(2):  # every image twice, as the reference below
        sampler.set_epoch(epoch)
        epochs += [crops for crops, _ in loader]
    dali = view_statistics([torch.cat(view) for view in zip(*epochs)])
    reference = BatchMultiCrop(config.dino, mean, std)(torch.cat([scaled, scaled]), torch.Generator().manual_seed(0))
    for (d_mean, d_std, d_rough), (r_mean, r_std, r_rough) in zip(dali, view_statistics(reference)):
        torch.testing.assert_close(d_mean, r_mean, atol=0.1, rtol=0)
        torch.testing.assert_close(d_std, r_std, atol=0, rtol=0.08)
        assert d_rough == pytest.approx(r_rough, rel=0.1)
    assert dali[0][2] < 0.8 * dali[1][2]  # global 1 is always blurred, global 2 rarely


def test_pretraining_runs_on_the_dali_loader_with_a_step_cap(indexed_config):
    config = indexed_config.replace({"optim.epochs": 2, "train.max_steps_per_epoch": 2})
    cpu = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)

    def dali_factory(config, ctx):
        return build_dali_pretrain_loader(config, rank=ctx.rank, world_size=ctx.world_size, mean=MEAN, std=STD)

    result = train(config, cpu, loader_factory=dali_factory)
    assert result.global_step == 4 and result.epochs_completed == 2
    assert result.last_loss is not None and np.isfinite(result.last_loss)


def test_tiff_folders_are_refused_with_the_fix(make_config):
    for loader in ("dali", "tiff"):
        with pytest.raises(UserError, match="training prepare"):
            build_dali_pretrain_loader(make_config({"data.loader": loader}), rank=0, world_size=1, mean=MEAN, std=STD)


def test_missing_dali_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(UserError, match="requirements-dali.txt"):
        require_dali()


def test_benchmark_row_reports_positive_rates(indexed_config):
    row = benchmark_dali(indexed_config, mean=MEAN, std=STD, batches=3, warmup=1, device="cpu")
    assert row["dali_images_per_s"] > 0 and row["dali_cpu_ms_per_image"] > 0
    assert row["dali_device"] == "cpu" and row["dali_version"]
    with pytest.raises(UserError, match="batches per epoch"):
        benchmark_dali(indexed_config, mean=MEAN, std=STD, batches=7, warmup=1, device="cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_mode_gives_the_same_batches_on_the_device(indexed_config):
    loader, sampler = build_dali_pretrain_loader(indexed_config, rank=0, world_size=1, mean=MEAN, std=STD,
                                                 device="gpu")
    batches = list(loader)
    assert [labels.tolist() for _, labels in batches] == [indices.tolist() for _, indices in sampler]
    crops = batches[0][0]
    assert [tuple(c.shape) for c in crops] == [(4, 5, 32, 32)] * 2 + [(4, 5, 16, 16)] * 2
    assert all(c.device.type == "cuda" for c in crops)
    torch.testing.assert_close(crops[0][:, 3].cpu(), torch.full((4, 32, 32), -MEAN[3] / STD[3]))


def test_config_selects_the_dali_loader(indexed_config):
    from training.data.loading.dali import DaliPretrainLoader
    from training.data.loading.loaders import build_pretrain_loader

    loader, sampler = build_pretrain_loader(indexed_config, rank=0, world_size=1, mean=MEAN, std=STD)
    assert isinstance(loader, DaliPretrainLoader)
    crops, labels = next(iter(loader))
    assert len(crops) == 2 + indexed_config.dino.local_crops_number and len(labels) == len(crops[0])
