"""Feature sets: the on-disk format, the raw-pixel baseline and the sets written across gloo ranks."""

import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from training.errors import DamagedFileError, MissingInputError, UserError
from training.eval.extract import SetTarget, encode_batches, extract_sets, raw_pixel_encoder
from training.rundir.features import FeatureSet, list_tags, load_features, save_features


def _feature_set(n=5, d=3):
    rng = np.random.default_rng(0)
    return FeatureSet(
        features=rng.standard_normal((n, d)).astype(np.float32),
        indices=np.arange(n) * 3,
        meta={"tag": "final", "epoch": 4, "checkpoint": "runs/x/checkpoints/checkpoint.pth"},
    )


def test_round_trip_keeps_rows_and_meta_and_the_index_does_not_grow_with_the_rows(tmp_path):
    original = _feature_set()
    save_features(tmp_path / "final", original)
    loaded = load_features(tmp_path / "final", mmap=True)
    np.testing.assert_array_equal(loaded.features, original.features)
    assert loaded.features.dtype == np.float32
    np.testing.assert_array_equal(loaded.indices, original.indices)
    assert loaded.meta["epoch"] == 4 and loaded.meta["dim"] == 3 and loaded.meta["n_images"] == 5
    assert sorted(p.name for p in (tmp_path / "final").iterdir()) == ["features.npy", "index.json", "rows.npy"]
    small = (tmp_path / "final" / "index.json").stat().st_size
    save_features(tmp_path / "big", _feature_set(n=5000))
    assert (tmp_path / "big" / "index.json").stat().st_size <= small + 8  # only the digits of the count grow


def test_select_picks_table_rows_in_order_and_names_missing_ones(tmp_path):
    original = _feature_set()  # rows 0, 3, 6, 9, 12
    picked = original.select(np.array([9, 0, 12]))
    np.testing.assert_array_equal(picked.features, original.features[[3, 0, 4]])
    np.testing.assert_array_equal(picked.indices, [9, 0, 12])
    with pytest.raises(UserError, match=r"lacks 2 of the 3 cells asked for \(e\.g\. table row 4\): rerun "
                                        r"`python -m training features --force`, then `labels`"):
        original.select(np.array([4, 3, 13]))


def test_a_set_written_before_rows_npy_is_read_from_its_index(tmp_path):
    import json

    directory = tmp_path / "old"
    save_features(directory, _feature_set())
    (directory / "rows.npy").unlink()
    index = json.loads((directory / "index.json").read_text())
    index = {k: v for k, v in index.items() if not k.startswith("rows_")}
    index.update(indices=[0, 3, 6, 9, 12], labels=[0, 1, 0, 1, 0], paths=[f"{i}.tif" for i in range(5)])
    (directory / "index.json").write_text(json.dumps(index))
    np.testing.assert_array_equal(load_features(directory).indices, [0, 3, 6, 9, 12])


def test_incomplete_sets_say_what_is_missing_and_absent_ones_name_the_step(tmp_path):
    """A set with one of its two files (a `features` run stopped between them, or damage) is not
    skipped silently: reading it names the missing file and the step that writes it again."""
    save_features(tmp_path / "final", _feature_set())
    (tmp_path / "epoch_0001").mkdir()
    np.save(tmp_path / "epoch_0001" / "features.npy", np.zeros((2, 2), np.float32))
    (tmp_path / "epoch_0002").mkdir()
    assert list_tags(tmp_path) == ["epoch_0001", "final"]
    with pytest.raises(DamagedFileError, match=r"epoch_0001/index\.json is missing \(features\.npy is there\): "
                                               r"rerun `python -m training features`"):
        load_features(tmp_path / "epoch_0001")
    with pytest.raises(MissingInputError, match="run `python -m training features` first"):
        load_features(tmp_path / "epoch_0002")


def test_raw_pixel_baseline_pools_to_a_modest_dimension():
    images = torch.rand(4, 5, 40, 40)
    ((indices, encoded),) = encode_batches({"raw_pixels": raw_pixel_encoder(8)},
                                           [(images, torch.arange(4), torch.arange(4))], torch.device("cpu"))
    rows = encoded["raw_pixels"]
    np.testing.assert_array_equal(indices, np.arange(4))
    assert rows.shape == (4, 5 * 8 * 8)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)
    # each row: the means of the 5 x 5 pixel blocks, channel by channel, row-major, scaled to unit length
    blocks = images.double().numpy().reshape(4, 5, 8, 5, 8, 5).mean(axis=(3, 5)).reshape(4, -1)
    np.testing.assert_allclose(rows, blocks / np.linalg.norm(blocks, axis=1, keepdims=True), atol=1e-6)


def _images(n=11):
    generator = torch.Generator().manual_seed(0)
    return torch.rand(n, 2, 32, 32, generator=generator), torch.arange(n) % 3


def _encoders():
    """The raw-pixel baseline and a pixel-wise square: each row is computed from its own image alone, so
    the rows are the same bytes however the ranks batch the images (a learned projection's matrix
    product may take another path for another batch size); the writing, not the model, is under test."""
    return {"raw_pixels": raw_pixel_encoder(4), "squares": lambda images: images.flatten(1)[:, ::37] ** 2}


DIMS = {"raw_pixels": 32, "squares": 56}


def _batches(indices, batch_size=3):
    images, labels = _images()
    return [(images[indices[i:i + batch_size]], labels[indices[i:i + batch_size]], indices[i:i + batch_size])
            for i in range(0, len(indices), batch_size)]


def _targets(root):
    return {name: SetTarget(root / name, dim, {"tag": name}) for name, dim in DIMS.items()}


def _rank_main(rank, world_size, port, out_dir):
    from pathlib import Path

    from training.distributed.groups import DistEnv, cleanup, init_distributed

    torch.set_num_threads(1)
    ctx = init_distributed(DistEnv(rank=rank, world_size=world_size, master_port=port, launcher="torchrun"))
    # uneven, interleaved shards: rank 0 gets 6 images, rank 1 gets 5, in scrambled order
    order = torch.tensor([7, 0, 9, 2, 4, 10, 1, 8, 3, 6, 5])
    extract_sets(_encoders(), _batches(order[rank::world_size]), ctx.device, _targets(Path(out_dir)),
                 ascending=False)
    cleanup(ctx)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _set_files(directory):
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.mark.slow
def test_two_gloo_ranks_write_the_single_rank_set_byte_for_byte(tmp_path, monkeypatch):
    """Each rank writes its part beside the set, rank 0 merges them in dataset order and removes them:
    the files are those one rank writes as its batches come, and those of one rank out of order."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    mp.start_processes(_rank_main, args=(2, _free_port(), str(tmp_path / "two")), nprocs=2, start_method="spawn")
    extract_sets(_encoders(), _batches(torch.arange(11)), torch.device("cpu"), _targets(tmp_path / "one"),
                 ascending=True)
    scrambled = torch.tensor([10, 3, 4, 0, 8, 1, 2, 9, 5, 7, 6])
    extract_sets(_encoders(), _batches(scrambled), torch.device("cpu"), _targets(tmp_path / "scrambled"),
                 ascending=False)
    for name in DIMS:
        one = _set_files(tmp_path / "one" / name)
        assert list(one) == ["features.npy", "index.json", "rows.npy"]
        assert _set_files(tmp_path / "two" / name) == one == _set_files(tmp_path / "scrambled" / name), name
        loaded = load_features(tmp_path / "one" / name)
        np.testing.assert_array_equal(loaded.indices, np.arange(11))
        np.testing.assert_allclose(np.linalg.norm(loaded.features, axis=1), 1.0, rtol=1e-5)
    squares = _images()[0].flatten(1)[:, ::37].double() ** 2
    np.testing.assert_allclose(load_features(tmp_path / "two" / "squares").features,
                               (squares / squares.norm(dim=1, keepdim=True)).numpy(), rtol=1e-6)


def test_one_rank_out_of_order_sets_are_merged_not_refused(tmp_path):
    """Batches that do not follow the dataset's order (ascending=False) go through a part and the merge."""
    scrambled = torch.tensor([10, 3, 4, 0, 8, 1, 2, 9, 5, 7, 6])
    extract_sets(_encoders(), _batches(scrambled), torch.device("cpu"), _targets(tmp_path), ascending=False)
    loaded = load_features(tmp_path / "raw_pixels")
    np.testing.assert_array_equal(loaded.indices, np.arange(11))
    assert sorted(p.name for p in (tmp_path / "raw_pixels").iterdir()) == ["features.npy", "index.json", "rows.npy"]
    with pytest.raises(ValueError, match="ascending and distinct"):
        extract_sets(_encoders(), _batches(scrambled), torch.device("cpu"), _targets(tmp_path / "x"), ascending=True)
    assert not (tmp_path / "x" / "raw_pixels" / "index.json").exists()


def test_a_few_rows_of_a_large_set_are_read_without_checksumming_all_of_it(tmp_path, monkeypatch):
    """Each epoch's kNN reads the evaluated rows of features/final, a set of every cell: its CRC-32
    (a read of the whole array) is checked only when every row is read or the set is small."""
    import training.rundir.features as features_module

    save_features(tmp_path / "final", _feature_set(n=50, d=4))  # rows 0, 3, ..., 147
    with open(tmp_path / "final" / "features.npy", "r+b") as handle:
        handle.seek(-8, 2)
        handle.write(b"\x7f" * 8)  # the last row garbled, the size kept
    subset = np.array([0, 3, 6])
    with pytest.raises(DamagedFileError, match="fails its checksum"):
        load_features(tmp_path / "final", rows=subset)  # small: checked
    monkeypatch.setattr(features_module, "CHECKSUM_READ_LIMIT", 100)
    picked = load_features(tmp_path / "final", rows=subset)
    np.testing.assert_array_equal(picked.features, _feature_set(n=50, d=4).features[:3])
    with pytest.raises(DamagedFileError, match="fails its checksum"):
        load_features(tmp_path / "final", rows=np.arange(50) * 3)  # every row: checked whatever the size
    with pytest.raises(DamagedFileError, match="fails its checksum"):
        load_features(tmp_path / "final")


def test_cls_and_patch_mean_puts_the_cls_feature_beside_the_patch_tokens_mean():
    """eval.feature=cls_patch_mean: the first half is exactly the "cls" feature of the same weights,
    the second the mean over the patch tokens (not the CLS token) after the final norm."""
    from training.config import Config
    from training.eval.feature_plan import TagPlan, build_encoder, encoder_dim
    from training.rundir import tags

    base = {"model.arch": "vit_tiny", "model.patch_size": 8, "eval.image_size": 32, "data.channels": "012"}
    cls_config = Config().replace(base)
    both_config = Config().replace({**base, "eval.feature": "cls_patch_mean"})
    plan = TagPlan(tags.RANDOM_INIT, tags.RANDOM_INIT, encoder_dim(cls_config))
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    cls_encoder = build_encoder(cls_config, plan, 3, torch.device("cpu"))
    both_encoder = build_encoder(both_config, plan, 3, torch.device("cpu"))
    with torch.no_grad():
        cls, both = cls_encoder(images), both_encoder(images)
        tokens = cls_encoder.forward_features(images)
    assert encoder_dim(cls_config) == 192 and encoder_dim(both_config) == 384 and both.shape == (4, 384)
    torch.testing.assert_close(both[:, :192], cls)
    torch.testing.assert_close(both[:, 192:], tokens[:, 1:17].mean(dim=1))
    assert not torch.allclose(both[:, 192:], tokens[:, 0])


def test_cls_and_patch_mean_needs_a_plain_vit():
    from training.config import Config, ConfigError

    with pytest.raises(ConfigError, match="eval.feature=cls_patch_mean pools a plain ViT's patch tokens"):
        Config().replace({"eval.feature": "cls_patch_mean", "model.kind": "bag_of_channels"})


def test_dihedral_tta_is_the_mean_over_the_eight_orientations_computed_with_numpy():
    """eval.tta=dihedral: a cell's feature is the mean of the encoder's features of its 4 quarter turns
    and their mirror images. The orientations are made here with numpy's rot90 and flip, apart from
    the wrapper's torch ops, and the encoder is the random-init ViT, which is not itself invariant."""
    from training.config import Config
    from training.eval.feature_plan import TagPlan, build_encoder, encoder_dim
    from training.rundir import tags

    config = Config().replace({"model.arch": "vit_tiny", "model.patch_size": 8, "eval.image_size": 32,
                               "data.channels": "012"})
    plan = TagPlan(tags.RANDOM_INIT, tags.RANDOM_INIT, encoder_dim(config))
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    plain = build_encoder(config, plan, 3, torch.device("cpu"))
    tta = build_encoder(config, TagPlan(plan.tag, plan.kind, plan.dim, meta={"tta": "dihedral"}), 3, torch.device("cpu"))
    pixels = images.numpy()
    views = [np.rot90(p, k, axes=(-2, -1)) for p in (pixels, pixels[..., ::-1]) for k in range(4)]
    with torch.no_grad():
        expected = np.mean([plain(torch.from_numpy(np.ascontiguousarray(v))).numpy() for v in views], axis=0)
        averaged = tta(images).numpy()
        turned = tta(torch.from_numpy(np.ascontiguousarray(np.rot90(pixels, 1, axes=(-2, -1))[..., ::-1]))).numpy()
        single = plain(images).numpy()
    scale = np.abs(expected).max()
    np.testing.assert_allclose(averaged, expected, atol=1e-4 * scale)
    np.testing.assert_allclose(turned, averaged, atol=1e-4 * scale)  # a turned, mirrored cell: the same feature
    assert np.abs(single - averaged).max() > 1e-2 * scale  # the encoder alone is not invariant


def test_tta_reads_the_final_checkpoint_only_and_is_part_of_its_fingerprint(tmp_path):
    """8 forward passes a cell are spent on the features a lab profiles (features/final), not on the
    numbered epochs' curves or the baselines; older sets, written before the key, read as without it."""
    from training.config import Config
    from training.eval.feature_plan import LEGACY_META, _baseline_plans, _checkpoint_plan
    from training.rundir import tags

    weights = tmp_path / "checkpoint.pth"
    weights.write_bytes(b"weights")
    config = Config().replace({"eval.tta": "dihedral"})
    assert _checkpoint_plan(config, tags.FINAL, weights, None, "d").meta["tta"] == "dihedral"
    assert _checkpoint_plan(config, "epoch_0030", weights, 30, "d").meta["tta"] == "none"
    assert {plan.meta["tta"] for plan in _baseline_plans(config, "d")} == {"none"}
    assert _checkpoint_plan(Config(), tags.FINAL, weights, None, "d").meta["tta"] == "none" == LEGACY_META["tta"]
