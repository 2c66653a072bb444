"""The checks behind every reader of a run file (training/rundir/integrity.py), on real files: torch's
own checkpoint archives, CRC-32s written while writing, JSON that does not parse."""

import os
import zlib

import pytest
import torch
import torch.serialization

from training.errors import DamagedFileError, UserError
from training.rundir.integrity import (
    Crc32Writer,
    crc32_hex,
    file_crc32,
    load_torch,
    parse_json,
    require_keys,
    zip_problem,
)


def checkpoint(path, **extra):
    torch.save({"weights": torch.arange(40000, dtype=torch.float32), "epoch": 3, **extra}, path)
    return path


def overwrite(path, at, data=b"\xff" * 8):
    with open(path, "r+b") as handle:
        handle.seek(at)
        handle.write(data)


def test_an_intact_checkpoint_has_no_problem_and_loads(tmp_path):
    path = checkpoint(tmp_path / "c.pth")
    assert zip_problem(path) is None
    assert load_torch(path, "remedy")["epoch"] == 3


def test_truncation_and_garbled_bytes_are_found_where_they_are(tmp_path):
    path = checkpoint(tmp_path / "c.pth")
    size = path.stat().st_size
    os.truncate(path, size - 10)
    assert zip_problem(path).startswith("is truncated or damaged at its end (its zip directory cannot be read")

    checkpoint(path)
    overwrite(path, size // 2)  # inside the tensor's bytes
    assert zip_problem(path).startswith("fails its checksum (record data/0: CRC-32 ")
    assert zip_problem(path, full=False) is None  # a memory-mapping reader checks the pickle only
    with pytest.raises(DamagedFileError, match=r"c\.pth fails its checksum .*: restore it"):
        load_torch(path, "restore it")

    checkpoint(path)
    overwrite(path, 100)  # inside the pickle (data.pkl comes first)
    assert zip_problem(path, full=False).startswith("fails its checksum (record data.pkl: ")


def test_an_empty_file_and_a_truncated_legacy_file_are_damaged(tmp_path):
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    with pytest.raises(DamagedFileError, match="empty.pth is empty: fix"):
        load_torch(empty, "fix")
    legacy = tmp_path / "legacy.pth"
    torch.save({"epoch": 1, "w": torch.ones(100)}, legacy, _use_new_zipfile_serialization=False)
    assert load_torch(legacy, "fix")["epoch"] == 1  # pre-zip files load, unchecked
    os.truncate(legacy, legacy.stat().st_size // 2)
    with pytest.raises(DamagedFileError, match=r"legacy\.pth cannot be read by torch\.load \(.+\): fix"):
        load_torch(legacy, "fix")


def test_an_archive_saved_without_crcs_gets_the_structural_checks(tmp_path):
    """torch.serialization.set_crc32_options(False) writes 0 for every CRC: such a checkpoint still
    loads (older runs may have them), and truncation is still found."""
    torch.serialization.set_crc32_options(False)
    try:
        path = checkpoint(tmp_path / "c.pth")
    finally:
        torch.serialization.set_crc32_options(True)
    overwrite(path, path.stat().st_size // 2)
    assert zip_problem(path) is None
    os.truncate(path, path.stat().st_size - 200)
    assert zip_problem(path) is not None


def test_crc32_written_while_writing_equals_the_files(tmp_path):
    path = tmp_path / "data.bin"
    with open(path, "wb") as handle:
        writer = Crc32Writer(handle)
        for chunk in (b"abc", bytearray(b"\x00" * 1000), memoryview(b"xyz" * 7)):
            writer.write(chunk)
    data = path.read_bytes()
    assert (writer.size, writer.crc) == (len(data), zlib.crc32(data)) == (1024, file_crc32(path))
    assert crc32_hex(writer.crc) == f"{zlib.crc32(data):08x}"


def test_json_damage_says_what_and_where(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"mean": [0.1, 0.2], "std": [0.3')
    with pytest.raises(DamagedFileError, match=r"x\.json is not valid JSON \(Expecting .*line 1 column \d+.*\): rerun"):
        parse_json(path, "rerun")
    path.write_bytes(b'{"a": 1\xff}')
    with pytest.raises(DamagedFileError, match=r"x\.json is not valid JSON \(no UTF-8 text at byte 7\): rerun"):
        parse_json(path, "rerun")
    path.write_text("  \n")
    with pytest.raises(DamagedFileError, match=r"x\.json is empty: rerun"):
        parse_json(path, "rerun")
    with pytest.raises(DamagedFileError, match=r"x\.json lacks 'std': rerun"):
        require_keys({"mean": []}, ("mean", "std"), path, "rerun")
    with pytest.raises(DamagedFileError, match=r"x\.json holds a JSON list, not an object: rerun"):
        require_keys([1], ("mean",), path, "rerun")


def test_a_damaged_file_error_is_a_user_error_that_survives_pickling():
    import pickle

    error = DamagedFileError("/run/x.json", "is empty", "rerun")
    assert isinstance(error, UserError) and str(error) == "/run/x.json is empty: rerun"
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
