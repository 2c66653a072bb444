"""The packed dataset's integrity: its index records the data file's size and CRC-32, opening checks
the index and the size, `prepare --verify` every byte; packs from before the checksum still open."""

import json
import shutil

import pytest
from tiny import run_cli

from training.data.dataset import open_images
from training.data.packed import PackedImages
from training.errors import DamagedFileError
from training.rundir import RunLayout


@pytest.fixture
def prepared(make_config):
    config = make_config()
    assert run_cli(config, "prepare") == 0
    return config, RunLayout.from_config(config)


def test_the_index_records_size_and_checksum_and_verify_reads_every_byte(prepared, capsys):
    config, layout = prepared
    meta = json.loads((layout.packed / "index.json").read_text())
    assert meta["data_bytes"] == (layout.packed / "images.bin").stat().st_size == 2 * meta["total_elements"]
    assert len(meta["data_crc32"]) == 8 and PackedImages(layout.packed).verify()
    timings = layout.timings.read_text()
    assert run_cli(config, "prepare", "--verify") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"intact: {layout.packed}, 96 images (size and checksum); split saved: ")
    assert layout.timings.read_text() == timings  # a check is no run of the step


def test_a_pack_from_before_the_checksum_opens_and_verifies_by_size(prepared, capsys, caplog):
    config, layout = prepared
    index = layout.packed / "index.json"
    meta = json.loads(index.read_text())
    index.write_text(json.dumps({k: v for k, v in meta.items() if not k.startswith("data_")}))
    images = PackedImages(layout.packed)
    assert len(images) == 96 and images.verify() is False
    assert run_cli(config, "prepare", "--verify") == 0
    assert "(size only: no checksum recorded)" in capsys.readouterr().out
    assert "was packed before checksums were recorded: only its size was checked" in caplog.text
    with open(layout.packed / "images.bin", "r+b") as handle:
        handle.truncate(meta["data_bytes"] - 2)
    with pytest.raises(DamagedFileError, match=r"images\.bin is truncated \(\d+ of \d+ bytes, as index\.json records\)"):
        PackedImages(layout.packed)


def test_an_index_that_parses_but_does_not_fit_its_data_is_damaged(prepared):
    _, layout = prepared
    index = layout.packed / "index.json"
    meta = json.loads(index.read_text())
    index.write_text(json.dumps({**meta, "offsets": [*meta["offsets"][:-1], meta["total_elements"]]}))
    with pytest.raises(DamagedFileError, match=r"index\.json is inconsistent .*: rerun `python -m training prepare`"):
        PackedImages(layout.packed)
    index.write_text(json.dumps({k: v for k, v in meta.items() if k != "shapes"}))
    with pytest.raises(DamagedFileError, match=r"index\.json lacks 'shapes': rerun `python -m training prepare`"):
        PackedImages(layout.packed)


def test_an_index_json_among_the_tiffs_does_not_make_the_source_a_damaged_pack(make_config, synth_root, tmp_path):
    """Only the run's own packed folder must hold both files; data.source is a TIFF folder that may
    hold any other file."""
    source = tmp_path / "images"
    shutil.copytree(synth_root, source)
    (source / "index.json").write_text("{}")
    images = open_images(make_config({"data.source": str(source)}))
    assert len(images) == 96 and not isinstance(images, PackedImages)
