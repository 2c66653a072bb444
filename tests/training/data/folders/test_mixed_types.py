"""A folder whose images have different pixel types (uint8, uint16, float32) keeps every image in
`prepare`, and each reads back min-max scaled exactly as computed from its original array."""

from pathlib import Path

import numpy as np
import pytest

import training.data.folders.index as vote_module
import training.data.store.write as packed_module
from tests.support.tiny import run_cli
from training.data.dataset import open_dataset
from training.data.store.read import PackedImages
from training.data.synthetic.folders import write_tiff
from training.rundir import RunLayout


def image_of(dtype: str, seed: int) -> np.ndarray:
    """A 5-channel (H, W, C) image spanning a range typical of its type (negative values for float)."""
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.normal(0.0, 50.0, (30, 28, 5)).astype(np.float32)
    return rng.integers(0, np.iinfo(dtype).max, (30, 28, 5), dtype=dtype, endpoint=True)


def write_folder(root: Path, types: list[str]) -> dict[str, np.ndarray]:
    """Images named so that sorting keeps the given order; two class folders."""
    sources = {}
    for i, dtype in enumerate(types):
        rel = f"{'ab'[i * 2 // len(types)]}/{i:02d}_{dtype}.tif"
        sources[rel] = image_of(dtype, seed=i)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        write_tiff(root / rel, sources[rel])
    return sources


def minmax_reference(image: np.ndarray) -> np.ndarray:
    """scDINO's per-channel min-max scaling of an (H, W, C) array, in float64, as (C, H, W)."""
    channels_first = np.moveaxis(image, -1, 0).astype(np.float64)
    low = channels_first.min(axis=(1, 2), keepdims=True)
    high = channels_first.max(axis=(1, 2), keepdims=True)
    return (channels_first - low) / (high - low)


MIXED = ["uint16", "uint16", "uint8", "float32", "uint16", "uint8"]


@pytest.mark.parametrize("vote_sample", [2, 32], ids=["widened-while-packing", "known-from-the-vote"])
def test_mixed_types_are_all_packed_and_scale_as_the_originals(make_config, tmp_path, monkeypatch, caplog,
                                                               vote_sample):
    monkeypatch.setattr(vote_module, "VOTE_SAMPLE", vote_sample)
    caplog.set_level("INFO", logger=packed_module.__name__)
    root = tmp_path / "images"
    sources = write_folder(root, MIXED)
    config = make_config({"data.source": str(root)})
    assert run_cli(config, "prepare") == 0
    layout = RunLayout.from_config(config)
    assert not layout.bad_images.exists()
    # widened once (uint16 -> float32, the uint8 images fit either way), or not at all when the vote saw every type
    assert caplog.text.count("pixel types differ") == (1 if vote_sample == 2 else 0)
    packed = PackedImages(layout.packed)
    assert list(packed.paths) == sorted(sources) and packed.dtype == np.float32
    assert packed.verify()  # the CRC-32 recorded while packing covers the rewritten, wider file
    for i, rel in enumerate(packed.paths):
        np.testing.assert_array_equal(packed.read(i), np.moveaxis(sources[rel], -1, 0))
    dataset = open_dataset(config)
    for i, rel in enumerate(dataset.paths):
        scaled, _ = dataset[i]
        np.testing.assert_allclose(scaled.numpy(), minmax_reference(sources[rel]), rtol=0, atol=1e-6)


def test_integer_types_widen_to_the_smallest_type_that_holds_both(make_config, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(vote_module, "VOTE_SAMPLE", 1)
    caplog.set_level("INFO", logger=packed_module.__name__)
    root = tmp_path / "images"
    sources = write_folder(root, ["uint8", "uint8", "uint16", "uint8"])
    config = make_config({"data.source": str(root)})
    assert run_cli(config, "prepare") == 0
    packed = PackedImages(RunLayout.from_config(config).packed)
    assert packed.dtype == np.uint16 and len(packed) == 4
    assert caplog.text.count("pixel types differ (uint8 and uint16): packing every image as uint16") == 1
    for i, rel in enumerate(packed.paths):
        np.testing.assert_array_equal(packed.read(i), np.moveaxis(sources[rel], -1, 0))


def test_a_single_type_folder_keeps_its_type_and_format(make_config):
    config = make_config()
    assert run_cli(config, "prepare") == 0
    packed = PackedImages(RunLayout.from_config(config).packed)
    assert packed.dtype == np.uint16 and packed.meta["format"] == "scdino-packed-v2"
    [shard] = packed.meta["shards"]
    assert (RunLayout.from_config(config).packed / shard["file"]).stat().st_size == 2 * shard["elements"] == 96 * 5 * 50 * 50 * 2
