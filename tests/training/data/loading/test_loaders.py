"""Loaders: batch shapes, equal batch counts on uneven ranks, disjoint evaluation shards, the same
crops from TIFF and packed data, read-time bad images, and the `bench loader` JSON."""

import json
import shutil

import numpy as np
import pytest
import torch

from training.cli import main
from training.config import dump_config
from training.data.dataset import BadImageError
from training.data.loading.loaders import build_pretrain_loader
from training.data.loading.sampler import DistributedBatchSampler
from training.data.loading.torch_loader import build_eval_loader
from training.data.split import load_split
from training.data.synthetic.folders import write_corrupt_files
from training.errors import UserError

MEAN, STD = [0.3] * 5, [0.2] * 5


def test_pretrain_batches_have_the_contracted_shapes(make_config):
    config = make_config()
    loader, sampler = build_pretrain_loader(config, rank=0, world_size=1, mean=MEAN, std=STD)
    crops, labels = next(iter(loader))
    assert [tuple(c.shape) for c in crops] == [(8, 5, 32, 32)] * 2 + [(8, 5, 16, 16)] * 2
    assert labels.dtype == torch.int64 and labels.shape == (8,)
    train = set(load_split(config).train.tolist())
    assert len(loader) == len(train) // 8
    assert hasattr(sampler, "set_epoch")


def test_pretrain_loader_refuses_stats_of_another_channel_count(make_config):
    with pytest.raises(UserError, match="mean/std have 4/4 values for 5 channels"):
        build_pretrain_loader(make_config(), rank=0, world_size=1, mean=MEAN[:4], std=STD[:4])


def test_uneven_data_gives_every_rank_the_same_number_of_full_batches():
    indices = np.arange(3, 80)  # 77 images
    samplers = [DistributedBatchSampler(indices, 8, rank=r, world_size=2, seed=1) for r in range(2)]
    batches = [list(s) for s in samplers]
    assert len(batches[0]) == len(batches[1]) == len(samplers[0]) == 4
    assert all(len(b) == 8 for rank in batches for _, b in rank)
    seen = np.concatenate([b for rank in batches for _, b in rank])
    assert set(seen) <= set(indices) and len(seen) - len(set(seen)) <= 1
    first = np.concatenate([b for _, b in samplers[0]])
    samplers[0].set_epoch(1)
    assert not np.array_equal(first, np.concatenate([b for _, b in samplers[0]]))
    samplers[0].set_epoch(0)
    np.testing.assert_array_equal(first, np.concatenate([b for _, b in samplers[0]]))


def test_pretrain_loaders_of_two_ranks_agree_on_length(make_config):
    config = make_config({"optim.batch_size_per_gpu": 7})
    lengths = []
    for rank in range(2):
        loader, _ = build_pretrain_loader(config, rank=rank, world_size=2, mean=MEAN, std=STD)
        lengths.append((len(loader), sum(1 for _ in loader)))
    assert lengths[0] == lengths[1] and lengths[0][0] == lengths[0][1] > 0


def test_eval_shards_are_disjoint_and_complete(make_config):
    config = make_config()
    holdout = load_split(config).holdout
    seen = []
    for rank in range(2):
        for images, labels, idx in build_eval_loader(config, indices=holdout, rank=rank, world_size=2,
                                                     mean=MEAN, std=STD, batch_size=5):
            assert images.shape[1:] == (5, 32, 32) and len(labels) == len(idx)
            seen.extend(idx.tolist())
    assert sorted(seen) == sorted(holdout.tolist()) and len(seen) == len(set(seen))


def test_tiff_and_packed_loaders_give_identical_crops(make_config):
    config = make_config()
    tiff_batch = next(iter(build_pretrain_loader(config, rank=0, world_size=1, mean=MEAN, std=STD)[0]))
    path = config.run.output_dir + ".yaml"
    dump_config(config, path)
    assert main(["prepare", "--config", path]) == 0
    packed_batch = next(iter(build_pretrain_loader(config, rank=0, world_size=1, mean=MEAN, std=STD)[0]))
    assert torch.equal(tiff_batch[1], packed_batch[1])
    assert all(torch.equal(a, b) for a, b in zip(tiff_batch[0], packed_batch[0]))


@pytest.fixture
def dirty_root(synth_root, tmp_path):
    root = tmp_path / "dirty"
    shutil.copytree(synth_root, root)
    write_corrupt_files(root / "elongated")
    return root


def test_read_time_bad_images_are_skipped_or_stop_cleanly(make_config, dirty_root):
    skip = make_config({"data.source": str(dirty_root), "data.holdout_fraction": 0.0})
    loader, _ = build_pretrain_loader(skip, rank=0, world_size=1, mean=MEAN, std=STD)
    assert all(labels.shape == (8,) for _, labels in loader)
    fail = make_config({"data.source": str(dirty_root), "data.on_bad_image": "fail", "data.num_workers": 1})
    everything = np.arange(len(load_split(fail).train) + len(load_split(fail).holdout))
    with pytest.raises(BadImageError, match=r"bad image elongated/corrupt_\w+\.tif: .*data.on_bad_image=skip"):
        for _ in build_eval_loader(fail, indices=everything, mean=MEAN, std=STD):
            pass


def test_bench_loader_prints_json(make_config, tmp_path, capsys):
    config = make_config({"data.source": str(tmp_path / "absent"), "optim.batch_size_per_gpu": 4})
    path = tmp_path / "bench.yaml"
    dump_config(config, path)
    assert main(["bench", "loader", "--config", str(path), "--images", "25", "--batches", "2",
                 "--warmup", "1", "--workers", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["benchmark"] == "loader" and result["settings"]["dataset_images"] == 25
    assert result["baseline_scdino_style_images_per_s"] > 0 and result["packed_batched_images_per_s"] > 0
    assert result["ratio"] == pytest.approx(
        result["packed_batched_images_per_s"] / result["baseline_scdino_style_images_per_s"], rel=0.02)


def test_balanced_batches_hold_each_group_alike_on_every_rank():
    """data.balance_column: every batch of every rank has batch/groups cells of each group; the ranks
    share out the larger group's cells without overlap, the smaller group's repeat to keep pace; a
    new epoch reshuffles."""
    from training.data.loading.sampler import DistributedBatchSampler

    indices = np.arange(100, 170)
    groups = np.where(indices < 140, "B1", "B2")  # 40 and 30 cells
    samplers = [DistributedBatchSampler(indices, 6, rank=r, world_size=2, seed=3, groups=groups) for r in (0, 1)]
    seen = []
    for sampler in samplers:
        batches = [batch for _, batch in sampler]
        assert len(batches) == len(sampler) == 2 * 20 // 6
        for batch in batches:
            assert sorted(np.unique(batch < 140, return_counts=True)[1].tolist()) == [3, 3]
        seen.append(np.concatenate(batches))
    larger = np.concatenate([s[s < 140] for s in seen])
    assert len(set(larger)) == len(larger)  # no cell of the larger group twice in an epoch
    smaller = np.concatenate([s[s >= 140] for s in seen])
    assert len(smaller) == len(larger) and set(smaller) == set(range(140, 170))
    first = [list(b) for _, b in samplers[0]]
    samplers[0].set_epoch(1)
    assert [list(b) for _, b in samplers[0]] != first


def test_balancing_takes_the_table_column_and_refuses_a_single_value(tmp_path):
    from tests.support.packing import write_packed
    from tests.support.tiny import tiny_config
    from training.data.loading.sampler import balance_groups

    images = [np.full((1, 4, 4), i, np.uint16) for i in range(6)]
    write_packed(tmp_path / "packed", images, ["c"] * 6,
                 metadata={"Metadata_Batch": ["B2", "B1", "B2", "B1", "B1", "B1"], "Metadata_Plate": ["P1"] * 6})
    config = tiny_config({"data.source": str(tmp_path / "packed"), "data.channels": "0",
                          "data.balance_column": "Batch", "run.output_dir": str(tmp_path / "run")})
    assert balance_groups(config, np.array([0, 1, 4])).tolist() == [1, 0, 0]
    with pytest.raises(UserError, match="data.balance_column=Metadata_Plate has one value among the training cells"):
        balance_groups(config.replace({"data.balance_column": "Metadata_Plate"}), np.arange(6))
