"""`prepare`: the packed array equals the TIFFs, bad images are reported or stop the step, the
split is deterministic; `synth-data` is deterministic; `mean-std` matches a direct computation."""

import json
import shutil
import threading

import numpy as np
import pytest
import tifffile

from tests.support.tiny import run_cli
from training.cli import main
from training.config import Config, ConfigError
from training.data.dataset import open_dataset, open_images, resolve_source
from training.data.split import load_split, make_split
from training.data.stats import load_mean_std, sample_for_stats
from training.data.store.read import PackedImages
from training.data.synthetic.folders import CORRUPT_REASONS, write_corrupt_files, write_dataset, write_tiff
from training.data.tiff import read_image
from training.errors import MissingInputError
from training.rundir import RunLayout


@pytest.fixture
def dirty_root(synth_root, tmp_path):
    root = tmp_path / "dirty"
    shutil.copytree(synth_root, root)
    write_corrupt_files(root / sorted(p.name for p in root.iterdir())[0])
    return root


def test_packed_equals_tiff_and_bad_images_are_reported(make_config, dirty_root):
    config = make_config({"data.source": str(dirty_root)})
    assert run_cli(config, "prepare") == 0
    layout = RunLayout.from_config(config)
    packed = PackedImages(layout.packed)
    assert len(packed) == 4 * 24 and packed.uniform_shape == (5, 50, 50)
    for i, rel in enumerate(packed.paths):
        np.testing.assert_array_equal(packed.read(i), read_image(dirty_root / rel))
    batch = packed.read_batch(np.array([3, 0, 7]))
    np.testing.assert_array_equal(batch[1], read_image(dirty_root / packed.paths[0]))
    report = json.loads(layout.bad_images.read_text())
    assert report["count"] == len(CORRUPT_REASONS)
    for entry in report["images"]:
        assert CORRUPT_REASONS[entry["path"].split("/")[-1]] in entry["reason"]
    split = json.loads(layout.split.read_text())
    assert split["n_train"] + split["n_holdout"] == split["n_cells"] == 96
    member = np.load(layout.split_rows)
    assert member.shape == (96,) and set(member.tolist()) == {0, 1} and member.sum() == split["n_holdout"]


def test_fail_policy_names_the_file(make_config, dirty_root, capsys):
    config = make_config({"data.source": str(dirty_root), "data.on_bad_image": "fail"})
    assert run_cli(config, "prepare") == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("error: bad image ") and "corrupt_blank.tif: blank image" in message
    assert "data.on_bad_image=skip" in message
    assert not RunLayout.from_config(config).packed.exists()


def test_a_stopping_pack_reads_no_further_than_its_read_ahead(tmp_path, monkeypatch):
    """Under the fail policy the first bad image stops `prepare`: the readers stop too, rather than
    reading the rest of a large folder, and images never pile up in memory beyond READ_AHEAD."""
    import training.data.folders.pack as packed
    from training.data.folders.index import scan_images
    from training.data.tiff import BadImage

    root = tmp_path / "images" / "a"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(60):
        write_tiff(root / f"{i:03d}.tif", rng.integers(0, 999, (8, 8, 2), dtype=np.uint16))
    reads = []  # by the reader threads (the format vote reads a few images in the calling thread)
    real_read = packed.read_image

    def counted(path, axis):
        if threading.current_thread() is not threading.main_thread():
            reads.append(path)
        return real_read(path, axis)

    monkeypatch.setattr(packed, "read_image", counted)
    monkeypatch.setattr(packed, "READ_AHEAD", 4)

    def stop(bad):
        raise bad

    index = scan_images(tmp_path / "images", Config().data.folder_depth_for_labels)
    monkeypatch.setattr(packed, "conform", lambda image, *a: (_ for _ in ()).throw(BadImage("x", "stop")))
    with pytest.raises(BadImage):
        packed.pack_images(tmp_path / "images", index, tmp_path / "packed", channel_axis="last", on_bad=stop)
    assert 1 <= len(reads) <= 4 + packed.READ_THREADS, len(reads)
    assert not (tmp_path / "packed").exists() and not (tmp_path / ".packed.part").exists()


def test_tiff_and_packed_datasets_give_identical_tensors(make_config):
    config = make_config()
    tiff = open_dataset(config)
    assert resolve_source(config)[0] == "tiff"
    assert run_cli(config, "prepare") == 0
    assert resolve_source(config)[0] == "packed"
    packed = open_dataset(config)
    assert list(packed.paths) == list(tiff.paths) and packed.class_names == tiff.class_names
    np.testing.assert_array_equal(packed.labels, tiff.labels)
    for i in (0, 50, 95):
        image, label = packed[i]
        same, same_label = tiff[i]
        assert label == same_label and torch_equal(image, same)
        assert image.shape == (5, 50, 50)
        flat = image.reshape(5, -1)
        assert flat.min(1).values.eq(0).all() and flat.max(1).values.eq(1).all()


def torch_equal(a, b):
    return bool((a == b).all())


def test_channel_selection_and_constant_channel(make_config, tmp_path):
    image = np.random.default_rng(0).integers(0, 4000, (20, 20, 3), dtype=np.uint16)
    image[..., 1] = 7
    (tmp_path / "data" / "only").mkdir(parents=True)
    write_tiff(tmp_path / "data" / "only" / "a.tif", image)
    config = make_config({"data.source": str(tmp_path / "data"), "data.channels": "12"})
    selected, _ = open_dataset(config)[0]
    assert selected.shape == (2, 20, 20)
    assert selected[0].eq(0).all()
    expected = (image[..., 2] - image[..., 2].min()) / (image[..., 2].max() - image[..., 2].min())
    np.testing.assert_allclose(selected[1].numpy(), expected, atol=1e-6)


def test_split_is_deterministic_stratified_and_saved(make_config):
    labels = np.repeat(np.arange(4), [10, 20, 5, 45])
    first, again = make_split(labels, 0.2, seed=3), make_split(labels, 0.2, seed=3)
    np.testing.assert_array_equal(first.holdout, again.holdout)
    assert not np.array_equal(first.holdout, make_split(labels, 0.2, seed=4).holdout)
    assert np.bincount(labels[first.holdout]).tolist() == [2, 4, 1, 9]
    np.testing.assert_array_equal(np.sort(np.concatenate([first.train, first.holdout])), np.arange(80))
    config = make_config()
    on_the_fly = load_split(config)
    assert run_cli(config, "prepare") == 0
    saved = load_split(config)
    np.testing.assert_array_equal(saved.holdout, on_the_fly.holdout)


def test_mean_std_matches_numpy(make_config):
    config = make_config({"data.mean_std_fraction": 0.5, "data.channels": "31"})
    with pytest.raises(MissingInputError, match="mean-std"):
        load_mean_std(config)
    assert run_cli(config, "mean-std") == 0
    stats = json.loads(RunLayout.from_config(config).mean_std.read_text())
    images = open_images(config)
    chosen = sample_for_stats(load_split(config).train, 0.5, config.run.seed)
    assert stats["n_images"] == len(chosen) == 38
    stack = np.stack([images.read(int(i)).astype(np.float64) for i in chosen])
    low, high = stack.min(axis=(2, 3), keepdims=True), stack.max(axis=(2, 3), keepdims=True)
    scaled = (stack - low) / (high - low)
    np.testing.assert_allclose(stats["mean"], scaled.mean(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], scaled.std(axis=(0, 2, 3)), rtol=1e-7)
    mean, std = load_mean_std(config)
    assert mean == [stats["mean"][3], stats["mean"][1]] and std == [stats["std"][3], stats["std"][1]]


def test_mean_std_reads_at_most_its_cap_of_images(make_config):
    config = make_config({"data.mean_std_fraction": 0.5, "data.mean_std_max_images": 7})
    assert run_cli(config, "mean-std") == 0
    stats = json.loads(RunLayout.from_config(config).mean_std.read_text())
    train = load_split(config).train
    chosen = sample_for_stats(train, 0.5, config.run.seed, 7)
    assert stats["n_images"] == len(chosen) == len(set(chosen.tolist())) == 7 and set(chosen) <= set(train)
    images = open_images(config)
    stack = np.stack([images.read(int(i)).astype(np.float64) for i in chosen])
    low, high = stack.min(axis=(2, 3), keepdims=True), stack.max(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(stats["mean"], ((stack - low) / (high - low)).mean(axis=(0, 2, 3)), rtol=1e-9)
    assert len(sample_for_stats(train, 0.5, config.run.seed, 0)) == len(sample_for_stats(train, 0.5, config.run.seed))
    with pytest.raises(ConfigError, match="data.mean_std_max_images"):
        config.replace({"data.mean_std_max_images": -1})


def test_images_of_different_sizes_pack_and_read_back(make_config, tmp_path):
    rng = np.random.default_rng(1)
    shapes = [(30, 40), (50, 50), (24, 31)]
    for k, (h, w) in enumerate(shapes):
        (tmp_path / "mixed" / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 60000, (3, h, w), dtype=np.uint16)
        write_tiff(tmp_path / "mixed" / f"c{k % 2}" / f"{k}.tif", pixels, "first")
    config = make_config({"data.source": str(tmp_path / "mixed"), "data.channels": "012"})
    assert run_cli(config, "prepare") == 0
    packed = PackedImages(RunLayout.from_config(config).packed)
    assert packed.uniform_shape is None
    for i, rel in enumerate(packed.paths):
        np.testing.assert_array_equal(packed.read(i), read_image(tmp_path / "mixed" / rel))
    assert open_images(config).class_names == ["c0", "c1"]


def test_synth_data_is_deterministic_and_in_scdino_layout(tmp_path):
    write_dataset(tmp_path / "a", classes=3, per_class=4, channels=5, size=50, seed=5)
    write_dataset(tmp_path / "b", classes=3, per_class=4, channels=5, size=50, seed=5)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.tif"))
    assert len(files) == 12 and len({f.parent for f in files}) == 3
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    image = tifffile.imread(tmp_path / "a" / files[0])
    assert image.shape == (50, 50, 5) and image.dtype == np.uint16
    write_dataset(tmp_path / "c", classes=3, per_class=4, channels=5, size=50, seed=6)
    assert tifffile.imread(tmp_path / "c" / files[0]).tobytes() != image.tobytes()


def test_synth_datarun_cli(tmp_path):
    out = tmp_path / "cli"
    assert main(["synth-data", "--out", str(out), "--classes", "2", "--per-class", "3", "--channels", "7",
                 "--size", "32", "--corrupt"]) == 0
    assert len(list(out.rglob("*.tif"))) == 6 + len(CORRUPT_REASONS)
    assert tifffile.imread(next(out.glob("*/*_00000.tif"))).shape == (32, 32, 7)


def test_synth_data_can_store_the_channels_in_another_order(tmp_path, capsys):
    plain, moved = tmp_path / "plain", tmp_path / "moved"
    base = ["synth-data", "--classes", "2", "--per-class", "2", "--size", "32", "--seed", "3"]
    assert main([*base, "--out", str(plain)]) == 0
    assert main([*base, "--out", str(moved), "--channel-order", "31042"]) == 0
    for path in plain.rglob("*.tif"):
        original = tifffile.imread(path)
        reordered = tifffile.imread(moved / path.relative_to(plain))
        np.testing.assert_array_equal(reordered, original[..., [3, 1, 0, 4, 2]])
    assert main([*base, "--out", str(tmp_path / "bad"), "--channel-order", "3104"]) == 2
    assert "--channel-order must list each of the 5 channels once" in capsys.readouterr().err
