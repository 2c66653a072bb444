"""data.split_method=scdino holds out exactly the images scDINO holds out.

The reference is scDINO's own recipe, run here on torchvision's ImageFolder (the class its datasets
subclass): indices 0..n-1, `np.random.seed(seed); np.random.shuffle(indices)`, validation split
`float(1 - train_datasetsplit_fraction)`, the first `int(np.floor(split * n))` indices held out.
The folder is built so that ImageFolder's order differs from a plain sorted path list (nested
folders whose names sort differently as strings and as path parts, upper-case suffixes, a PNG that
scDINO lists but we do not read).
"""

from pathlib import Path

import numpy as np
import pytest
import tifffile
from torchvision.datasets import ImageFolder

from training.cli import main
from training.config import load_config
from training.data.folders.index import scan_images
from training.data.split import make_split, split_for
from training.data.store.read import PackedImages

FILES = (
    ["b/img{}.tif".format(i) for i in range(13)]
    + ["a/p/img{}.tif".format(i) for i in range(5)]
    + ["a/p-q/img{}.TIF".format(i) for i in range(4)]
    + ["a/p/r/img{}.tiff".format(i) for i in range(4)]
    + ["a-x/cell_{}.tif".format(i) for i in (1, 10, 2, 20, 3)]
    + ["A/z{}.tif".format(i) for i in range(8)]
    + ["b/notes.png"]
)


def _folder(root: Path, *, real: bool = False) -> Path:
    rng = np.random.default_rng(0)
    for rel in FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if real and not rel.endswith(".png"):
            tifffile.imwrite(path, rng.integers(0, 4000, (12, 12, 2)).astype(np.uint16))
        else:
            path.write_bytes(b"")
    (root / "b" / "readme.txt").write_text("not an image")
    return root


def _scdino_holdout(root: Path, seed: int, train_fraction: float) -> set[str]:
    dataset = ImageFolder(str(root), loader=lambda path: path)
    validation_split = float(1 - train_fraction)
    indices = list(range(len(dataset)))
    split = int(np.floor(validation_split * len(dataset)))
    np.random.seed(seed)
    np.random.shuffle(indices)
    return {Path(dataset.samples[i][0]).relative_to(root).as_posix() for i in indices[:split]}


def _scdino_yaml(tmp_path: Path, root: Path, seed: int, fraction: float) -> Path:
    path = tmp_path / "scDINO_full_pipeline.yaml"
    path.write_text(f"meta:\n  name_of_run: r\n  output_dir: {tmp_path}\n  dataset_dir: {root}\n"
                    f"  seed: {seed}\n  train_datasetsplit_fraction: {fraction}\n"
                    "  selected_channel_combination_per_run: ['01']\n")
    return path


@pytest.mark.parametrize("seed,fraction", [(40, 0.8), (0, 0.8), (7, 0.7), (123, 0.9)])
def test_holdout_is_scdinos_for_its_seed_and_fraction(tmp_path, seed, fraction):
    root = _folder(tmp_path / "images")
    config = load_config(_scdino_yaml(tmp_path, root, seed, fraction))
    assert config.data.split_method == "scdino"
    index = scan_images(root, 0)
    split = split_for(config, index)
    ours = {index.paths[i] for i in split.holdout}
    reference = _scdino_holdout(root, seed, fraction)
    assert ours == reference - {"b/notes.png"}
    assert len(split.train) + len(split.holdout) == len(index)


def test_floor_of_scdinos_float_fraction_not_of_the_rounded_one(tmp_path):
    root = _folder(tmp_path / "images")  # 40 files: 0.2 x 40 = 8, but 1 - 0.8 = 0.19999999999999996
    assert len(FILES) == 40
    config = load_config(_scdino_yaml(tmp_path, root, 40, 0.8))
    assert len(_scdino_holdout(root, 40, 0.8)) == 7
    held = {scan_images(root, 0).paths[i] for i in split_for(config, scan_images(root, 0)).holdout}
    assert held == _scdino_holdout(root, 40, 0.8) - {"b/notes.png"}


def test_prepare_writes_scdinos_split_and_overlap_with_stratified_is_partial(tmp_path):
    root = _folder(tmp_path / "images", real=True)
    yaml_path = _scdino_yaml(tmp_path, root, 40, 0.8)
    assert main(["prepare", "--config", str(yaml_path), "--set", "data.channels=01"]) == 0
    import json

    saved = json.loads((tmp_path / "r" / "split.json").read_text())
    assert saved["method"] == "scdino"
    packed = PackedImages(tmp_path / "r" / "packed")
    member = np.load(tmp_path / "r" / "split.npy")
    held = {packed.paths[i] for i in np.flatnonzero(member)}
    assert held == _scdino_holdout(root, 40, 0.8) - {"b/notes.png"}
    index = scan_images(root, 0)
    stratified = make_split(np.asarray(index.labels), 0.2, 40)
    overlap = held & {index.paths[i] for i in stratified.holdout}
    assert len(overlap) < len(held)  # the default draw is another split
