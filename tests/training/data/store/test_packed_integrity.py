"""The packed dataset's integrity: its index records every file's size and CRC-32 and every column's
checksum, opening checks the index and the sizes, a column is checked when first read, `prepare
--verify` every byte; a pack from before the column checksums gets Arrow's own validation and a
bounds check of every read; a v1 pack (before the per-cell table) is converted once, and still opens
where its folder cannot be written."""

import json
import logging
import shutil

import numpy as np
import pytest

from tests.support.damaging import garble_column
from tests.support.packing import write_packed, write_v1_pack
from tests.support.tiny import run_cli
from training.data.dataset import open_images
from training.data.store.cells import column_checksum, one_array
from training.data.store.format import FORMAT
from training.data.store.read import PackedImages
from training.errors import DamagedFileError
from training.rundir import RunLayout


@pytest.fixture
def prepared(make_config):
    config = make_config()
    assert run_cli(config, "prepare") == 0
    return config, RunLayout.from_config(config)


def test_the_index_records_sizes_and_checksums_and_verify_reads_every_byte(prepared, capsys):
    config, layout = prepared
    meta = json.loads((layout.packed / "index.json").read_text())
    [shard] = meta["shards"]
    assert shard["bytes"] == (layout.packed / shard["file"]).stat().st_size == 2 * shard["elements"]
    assert meta["table"]["bytes"] == (layout.packed / "cells.arrow").stat().st_size
    assert len(shard["crc32"]) == len(meta["table"]["crc32"]) == 8 and PackedImages(layout.packed).verify()
    timings = layout.timings.read_text()
    assert run_cli(config, "prepare", "--verify") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"intact: {layout.packed}, 96 images (size and checksum); split saved: ")
    assert layout.timings.read_text() == timings  # a check is no run of the step


def test_an_index_that_parses_but_lists_no_files_is_damaged(prepared):
    _, layout = prepared
    index = layout.packed / "index.json"
    meta = json.loads(index.read_text())
    index.write_text(json.dumps({k: v for k, v in meta.items() if k != "shards"}))
    with pytest.raises(DamagedFileError, match=r"index\.json lacks 'shards': rerun `python -m training prepare`"):
        PackedImages(layout.packed)
    index.write_text(json.dumps({**meta, "n_cells": 95}))
    images = PackedImages(layout.packed)
    with pytest.raises(DamagedFileError, match=r"cells\.arrow has 96 rows, index\.json records 95 cells"):
        images.read(0)


def test_an_index_json_among_the_tiffs_does_not_make_the_source_a_damaged_pack(make_config, synth_root, tmp_path):
    """Only the run's own packed folder must hold its files; data.source is a TIFF folder that may
    hold any other file."""
    source = tmp_path / "images"
    shutil.copytree(synth_root, source)
    (source / "index.json").write_text("{}")
    images = open_images(make_config({"data.source": str(source)}))
    assert len(images) == 96 and not isinstance(images, PackedImages)


def v1_images(n=7):
    rng = np.random.default_rng(3)
    return [rng.integers(0, 60000, (3, 10 + i % 3, 12), dtype=np.uint16) for i in range(n)]


def test_a_v1_pack_is_converted_once_and_reads_the_same(tmp_path, caplog):
    images, labels = v1_images(), [0, 1, 1, 0, 2, 2, 1]
    meta = write_v1_pack(tmp_path / "old", images, labels, ["alpha", "beta", "gamma"])
    caplog.set_level(logging.INFO)
    packed = PackedImages(tmp_path / "old")
    assert "converted the scdino-packed-v1 index (7 cells)" in caplog.text
    assert json.loads((tmp_path / "old" / "index.json").read_text())["format"] == FORMAT
    assert packed.class_names == ["alpha", "beta", "gamma"] and list(packed.labels) == labels
    assert list(packed.paths) == meta["paths"] and packed.uniform_shape is None
    for i, image in enumerate(images):
        np.testing.assert_array_equal(packed.read(i), image)
    assert packed.verify()  # the v1 checksum of images.bin and the new table's
    caplog.clear()
    again = PackedImages(tmp_path / "old")
    assert "converted" not in caplog.text and list(again.labels) == labels


def test_a_v1_pack_without_a_checksum_opens_and_is_checked_by_size(tmp_path):
    write_v1_pack(tmp_path / "old", v1_images(), [0] * 7, ["a"], checksum=False)
    packed = PackedImages(tmp_path / "old")
    assert len(packed) == 7 and packed.verify() is False
    with open(tmp_path / "old" / "images.bin", "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(DamagedFileError, match=r"images\.bin is truncated \(100 of \d+ bytes, as index\.json records\)"):
        PackedImages(tmp_path / "old")


def test_a_read_only_v1_pack_is_read_in_memory_with_a_warning(tmp_path, monkeypatch, caplog):
    import training.data.store.convert as packed_module

    write_v1_pack(tmp_path / "old", v1_images(), [0, 1, 0, 1, 0, 1, 0], ["x", "y"])

    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(packed_module, "write_table", refuse)
    packed = PackedImages(tmp_path / "old")
    assert "in a folder that cannot be written" in caplog.text
    assert list(packed.labels) == [0, 1, 0, 1, 0, 1, 0] and not (tmp_path / "old" / "cells.arrow").exists()
    np.testing.assert_array_equal(packed.read(6), v1_images()[6])
    assert json.loads((tmp_path / "old" / "index.json").read_text())["format"] == "scdino-packed-v1"


def test_an_inconsistent_v1_index_is_damaged(tmp_path):
    meta = write_v1_pack(tmp_path / "old", v1_images(), [0] * 7, ["a"])
    (tmp_path / "old" / "index.json").write_text(json.dumps({**meta, "offsets": meta["offsets"][:-1]}))
    with pytest.raises(DamagedFileError, match=r"index\.json is inconsistent .*: rerun `python -m training prepare`"):
        PackedImages(tmp_path / "old")


def pack_without_column_checksums(folder, n=6):
    """A pack as one written before the table's column checksums were recorded."""
    write_packed(folder, [np.full((2, 3, 3), i, np.uint16) for i in range(n)], ["a", "b"] * (n // 2))
    index = json.loads((folder / "index.json").read_text())
    del index["table"]["columns"]
    (folder / "index.json").write_text(json.dumps(index))


def test_a_pack_without_column_checksums_is_checked_by_arrows_own_validation(tmp_path):
    """Garbled category codes (an index out of bounds) are named where the column is read, not met as
    pyarrow's ArrowIndexError far away; garbled pixel offsets where a batch would read outside its file."""
    pack_without_column_checksums(tmp_path / "p")
    garble_column(tmp_path / "p" / "cells.arrow", "Metadata_Class")
    packed = PackedImages(tmp_path / "p")
    with pytest.raises(DamagedFileError, match=r"cells\.arrow is damaged \(its column Metadata_Class: .*out of bounds"
                                               r".*\): rerun `python -m training prepare`"):
        _ = packed.labels
    pack_without_column_checksums(tmp_path / "q")
    garble_column(tmp_path / "q" / "cells.arrow", "offset")
    packed = PackedImages(tmp_path / "q")
    with pytest.raises(DamagedFileError, match=r"cells\.arrow is damaged \(row 0 points to elements -?\d+\.\.-?\d+ of "
                                               r"pixel file 0, which index\.json does not list as such\)"):
        packed.read_batch(np.arange(3))
    with pytest.raises(DamagedFileError, match=r"row 0 points to elements"):
        packed.read(0)
    np.testing.assert_array_equal(packed.read_batch(np.array([4, 5]))[:, 0, 0, 0], [4, 5])  # intact rows still read


def test_the_column_checksums_are_those_of_the_file_as_read(tmp_path):
    write_packed(tmp_path / "p", [np.zeros((1, 2, 2), np.uint16)] * 3, ["a", "b", "a"], metadata={"Metadata_Dose": [1, 2, 3]})
    index = json.loads((tmp_path / "p" / "index.json").read_text())
    packed = PackedImages(tmp_path / "p")
    assert index["step"] == "prepare" and set(index["table"]["columns"]) == set(packed.table.columns)
    assert {name: column_checksum(one_array(packed.table.table, name)) for name in packed.table.columns} == \
        index["table"]["columns"]
