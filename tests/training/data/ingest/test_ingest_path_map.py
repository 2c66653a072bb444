"""ingest.path_map: a JUMP-style table whose images sit behind s3://cellpainting-gallery/ folders and
whose masks behind another machine's absolute folder, read from a local copy through the map alone
(no upload): every crop equals the NumPy slice of its source images. What the map does not reach is
one line naming the row, the column and the path, and suggesting ingest.path_map; a bad entry is a
line naming the key. The table and its files: tests/support/jump_screen.py."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest

from tests.support.jump_screen import CHANNELS, FIELDS, GALLERY, expected_crops, write_jump_screen
from tests.support.tiny import run_cli, tiny_config
from training.config import ConfigError
from training.data.ingest.paths import PathMap
from training.data.store.read import PackedImages
from training.rundir import RunLayout

CROP = 32


def jump_config(tmp_path, table, path_map, **more):
    values = {"run.output_dir": str(tmp_path / "run"), "data.channels": "01234", "data.holdout_fraction": 0.25,
              "data.label_column": "Metadata_JCP2022", "data.batch_column": "Metadata_Plate",
              "ingest.table": str(table), "ingest.channels": list(CHANNELS), "ingest.objects": "Cells",
              "ingest.crop_size": CROP, "ingest.path_map": path_map}
    values.update(more)
    return tiny_config(values)


def packed_cells(config) -> tuple[PackedImages, dict]:
    layout = RunLayout.from_config(config)
    return PackedImages(layout.packed, label_column=config.data.label_column), json.loads(
        layout.ingest_report.read_text())


def assert_crops_are_the_slices(packed: PackedImages, images: list[np.ndarray], masks: list[np.ndarray]) -> None:
    """Every field's cut cells are exactly the objects whose window fits, each crop the slice at its centroid."""
    fields = packed.table.numbers("Metadata_FieldOfView").tolist()
    numbers = packed.table.numbers("Metadata_ObjectNumber").tolist()
    for row, (stack, mask) in enumerate(zip(images, masks), start=1):
        expected = expected_crops(stack, mask, CROP)
        cut = {number: i for i, (field, number) in enumerate(zip(fields, numbers)) if field == row}
        assert expected and sorted(cut) == sorted(expected), f"row {row}"
        for number, i in cut.items():
            np.testing.assert_array_equal(packed.read(i), expected[number])


def test_path_map_reads_s3_and_foreign_paths_from_a_local_mirror(tmp_path):
    screen = write_jump_screen(tmp_path / "screen")
    # a shorter, wrong entry listed first: the longest matching prefix must win, whatever the order
    mirror = tmp_path / "screen" / "mirror" / "cellpainting-gallery" / "cpg0016-jump"
    entries = [[GALLERY, str(tmp_path / "nowhere")], [f"{GALLERY}cpg0016-jump", str(mirror)], screen.path_map[1]]
    config = jump_config(tmp_path, screen.table, entries)
    assert run_cli(config, "ingest") == 0
    packed, report = packed_cells(config)
    assert report["fields"] == len(FIELDS) and report["bad_fields"] == 0
    assert_crops_are_the_slices(packed, screen.images, screen.masks)
    plates = packed.table.strings("Metadata_Plate")
    assert set(plates) == {plate for plate, _, _ in FIELDS}
    assert str(tmp_path / "screen" / "mirror" / "cellpainting-gallery") in packed.paths[0]


def test_an_unmapped_s3_table_stops_before_cutting_naming_row_column_and_path(tmp_path, capsys):
    screen = write_jump_screen(tmp_path / "screen")
    config = jump_config(tmp_path, screen.table, [])
    assert run_cli(config, "ingest") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: load_data_with_illum.csv row 1: PathName_OrigDNA: {GALLERY}cpg0016-jump/")
    assert "ingest.path_map" in err[0] and "[s3://cellpainting-gallery/, /fsx/data/...]" in err[0]
    assert not RunLayout.from_config(config).packed.exists()


def test_a_row_whose_foreign_folder_is_not_mapped_is_a_bad_field_in_the_report(tmp_path, caplog):
    screen = write_jump_screen(tmp_path / "screen")
    frame = pd.read_csv(screen.table, dtype=str)
    frame.loc[2, "ObjectsPathName_Cells"] = "/elsewhere/segmentation/BR00117035"
    frame.to_csv(screen.table, index=False)
    config = jump_config(tmp_path, screen.table, screen.path_map)
    with caplog.at_level(logging.WARNING):
        assert run_cli(config, "ingest") == 0
    packed, report = packed_cells(config)
    assert report["bad_fields"] == 1 and report["fields"] == len(FIELDS)
    reason = report["bad"][0]["reason"]
    assert reason.startswith("load_data_with_illum.csv row 3: ObjectsPathName_Cells: no such file "
                             "/elsewhere/segmentation/BR00117035/B02_s1_cells.tiff, nor its folder")
    assert "ingest.path_map, e.g. [/elsewhere/segmentation/, /fsx/data/...]" in reason
    assert set(packed.table.numbers("Metadata_FieldOfView").tolist()) == {1, 2, 4}


def test_the_map_takes_the_longest_prefix_at_folder_boundaries():
    paths = PathMap((("s3://b/x", "/m/x-short"), ("s3://b/x/deep/", "/m/deep/"), ("/lab", "rel/lab")))
    assert paths.apply("s3://b/x/deep/f.tif") == "/m/deep/f.tif"
    assert paths.apply("s3://b/x/other/f.tif") == "/m/x-short/other/f.tif"
    assert paths.apply("s3://b/xy/f.tif") is None, "a prefix ends at a folder boundary"
    assert paths.apply("/lab/a.tif") == "rel/lab/a.tif" and paths.apply("/laboratory/a.tif") is None
    assert paths.apply("s3://b/x") == "/m/x-short"


@pytest.mark.parametrize("entries, message", [
    ([["s3://a/"]], "ingest.path_map[0] must have 2 items, got 1"),
    ([["s3://a/", "s3://b/"]], "ingest.path_map[0] maps s3://a/ onto s3://b/, a URL"),
    ([["/a", "/x"], ["", "/y"]], "ingest.path_map[1] must be [from, to], two non-empty prefixes"),
    ([["/a", "/x"], ["/a/", "/y"]], "ingest.path_map[1]: /a/ is mapped twice"),
    ({"s3://a/": "/m/"}, "ingest.path_map must be a list"),
])
def test_a_bad_path_map_entry_is_one_line_naming_the_key(entries, message):
    with pytest.raises(ConfigError) as raised:
        tiny_config({"ingest.path_map": entries})
    assert message in str(raised.value) and "\n" not in str(raised.value)
