"""Reading TIFFs of any channel layout, the reasons given for bad images, labels from folders."""

from pathlib import Path

import numpy as np
import pytest

from training.data.folders.index import scan_images
from training.data.synthetic.folders import write_corrupt_files, write_tiff
from training.data.tiff import BadImage, read_image
from training.errors import UserError


@pytest.mark.parametrize("channels", [1, 3, 5])
@pytest.mark.parametrize("layout", ["last", "first"])
def test_read_image_is_channels_first_for_any_layout(tmp_path, channels, layout):
    rng = np.random.default_rng(channels)
    chw = rng.integers(0, 65535, (channels, 40, 36), dtype=np.uint16)
    stored = chw if layout == "first" else np.moveaxis(chw, 0, -1)
    write_tiff(tmp_path / "x.tif", stored.squeeze() if channels == 1 else stored, layout)
    image = read_image(tmp_path / "x.tif", "auto")
    assert image.shape == (channels, 40, 36)
    np.testing.assert_array_equal(image, chw)
    assert image.dtype == np.uint16


def test_explicit_channel_axis_and_8_bit(tmp_path):
    hwc = np.random.default_rng(0).integers(0, 255, (8, 8, 8), dtype=np.uint8)
    write_tiff(tmp_path / "cube.tif", hwc)
    np.testing.assert_array_equal(read_image(tmp_path / "cube.tif", "last"), np.moveaxis(hwc, -1, 0))
    np.testing.assert_array_equal(read_image(tmp_path / "cube.tif", "first"), hwc)


def test_every_kind_of_bad_image_has_a_clear_reason(tmp_path):
    expected = write_corrupt_files(tmp_path, channels=5)
    reasons = {}
    for name in expected:
        try:
            read_image(tmp_path / name)
        except BadImage as bad:
            assert bad.path.endswith(name)
            reasons[name] = bad.reason
    # a 2-channel image is readable on its own; only the dataset-wide check rejects it
    assert set(reasons) == set(expected) - {"corrupt_channels.tif"}
    for name, reason in reasons.items():
        assert expected[name] in reason, (name, reason)


def test_labels_come_from_the_folder_at_the_configured_depth(tmp_path):
    image = np.ones((4, 4, 2), dtype=np.uint16)
    image[0, 0] = 9
    for donor in ("d1", "d2"):
        for cls in ("b_cell", "t_cell"):
            (tmp_path / donor / cls / "plate").mkdir(parents=True)
            write_tiff(tmp_path / donor / cls / "plate" / "img.tif", image)
    index = scan_images(tmp_path, folder_depth_for_labels=1)
    assert index.class_names == ["b_cell", "t_cell"]
    assert index.labels == [0, 1, 0, 1]
    assert index.paths[0] == "d1/b_cell/plate/img.tif"
    assert scan_images(tmp_path, 2).class_names == ["d1", "d2"]
    with pytest.raises(UserError, match="no class folder at data.folder_depth_for_labels=3"):
        scan_images(tmp_path, 3)


def test_missing_or_empty_folders_say_what_to_do(tmp_path):
    with pytest.raises(UserError, match="synth-data"):
        scan_images(tmp_path / "absent", 0)
    with pytest.raises(UserError, match="no .tif/.tiff images"):
        scan_images(tmp_path, 0)


def test_the_listing_is_path_rglobs_without_a_stat_per_image(tmp_path, monkeypatch):
    """scan_images lists what sorted(Path.rglob) of regular .tif/.tiff files lists, in that order
    (component-wise: "a/x" before "a-c/y", unlike string order), without stat-ing each file."""
    root = tmp_path / "images"
    for relative in ("a/x.tif", "a-c/y.TIF", "A/z.tiff", "a/b/w.tif", "a/readme.txt", "real/cls/r.tif"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(b"")
    (root / "a" / "dir.tif").mkdir()  # a folder named like an image
    (root / "a" / "broken.tif").symlink_to("nowhere.tif")
    (root / "a" / "alias.tif").symlink_to(root / "a" / "x.tif")  # a link to a file counts
    (root / "linked").symlink_to(root / "real")  # a link to a folder is not followed, as by rglob
    (root / "real" / "cls" / "up").symlink_to(root)  # nor is a loop
    expected = sorted(p.relative_to(root) for p in root.rglob("*")
                      if p.suffix.lower() in (".tif", ".tiff") and p.is_file())
    assert [p.as_posix() for p in expected] == ["A/z.tiff", "a/alias.tif", "a/b/w.tif", "a/x.tif", "a-c/y.TIF",
                                                "real/cls/r.tif"]
    stat, stated = Path.stat, []

    def counted(self, **kwargs):
        if self.suffix.lower() in (".tif", ".tiff"):
            stated.append(self)
        return stat(self, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "stat", counted)
        index = scan_images(root, folder_depth_for_labels=0)
    assert index.paths == [p.as_posix() for p in expected] and stated == []
    with monkeypatch.context() as patch:  # the same count sees what rglob's is_file costs
        patch.setattr(Path, "stat", counted)
        [p for p in root.rglob("*") if p.suffix.lower() in (".tif", ".tiff") and p.is_file()]
    assert len(stated) >= len(expected)
