"""`python -m training upload-data --table`: a JUMP-style screen whose table points elsewhere (s3://
folders of the Cell Painting Gallery, a lab machine's absolute mask folder) goes up to a real
S3-compatible server (moto's, on loopback, as tests/training/upload/test_upload_data.py starts it), and the
uploaded table ingests: every crop equals the NumPy slice of its source images.

The screen: tests/support/jump_screen.py (real nuclei, JUMP's columns, files in the test's folder
reached through ingest.path_map)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.support.jump_screen import CHANNELS, FIELDS, expected_crops, write_jump_screen
from tests.support.tiny import run_cli, tiny_config
from tests.training.upload.test_upload_data import BUCKET, s3  # noqa: F401 (a fixture: a bucket on moto's server)
from training.cli import main
from training.config import dump_config
from training.data.store.read import PackedImages
from training.rundir import RunLayout
from training.upload.screen_table import DATA_PREFIX, FSX_DATA

PREFIX = "data/screens/jump-test"
CROP = 32


def screen_config(tmp_path, table, path_map):
    return tiny_config({"run.output_dir": str(tmp_path / "run"), "data.channels": "01234",
                        "data.holdout_fraction": 0.25, "data.label_column": "Metadata_JCP2022",
                        "ingest.table": str(table), "ingest.channels": list(CHANNELS), "ingest.objects": "Cells",
                        "ingest.crop_size": CROP, "ingest.path_map": path_map})


def upload(config_path, table, *extra):
    return main(["upload-data", "--config", str(config_path), "--table", str(table), "--prefix", PREFIX,
                 "--workers", "4", *extra])


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def download(client, prefix: str, target):
    """Every object under `prefix` into `target`, keys below the prefix as paths."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            path = target / item["Key"][len(prefix) + 1:]
            path.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, item["Key"], str(path))


def test_a_jump_table_with_foreign_paths_ingests_after_upload(s3, moto_endpoint, tmp_path, capsys):  # noqa: F811
    screen = write_jump_screen(tmp_path / "lab")
    config_path = tmp_path / "upload.yaml"
    dump_config(screen_config(tmp_path / "local", screen.table, screen.path_map), config_path)
    assert upload(config_path, screen.table, "--bucket", BUCKET, "--endpoint-url", moto_endpoint) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    files = len(FIELDS) * (len(CHANNELS) + 1)
    assert (result["files"], result["uploaded"], result["missing"]) == (files, files + 1, 0)
    assert result["left_out_columns"] == [f"{kind}_{c.replace('Orig', 'Illum')}" for c in CHANNELS
                                          for kind in ("FileName", "PathName")]
    folder = f"{FSX_DATA}{PREFIX[len(DATA_PREFIX):]}"
    assert result["cluster"] == {"data.source": folder, "ingest.table": f"{folder}/load_data_with_illum.csv"}
    assert f"table: {folder}/load_data_with_illum.csv" in out

    assert upload(config_path, screen.table, "--bucket", BUCKET, "--endpoint-url", moto_endpoint) == 0
    again = last_json(capsys)
    assert (again["uploaded"], again["skipped"]) == (0, files + 1), "a rerun skips what is there"

    # FSx's data repository association (s3://bucket/data/X is /fsx/data/X) cannot run here: the
    # uploaded prefix downloaded into a local folder stands in for it.
    fsx = tmp_path / "fsx" / "screens" / "jump-test"
    download(s3, PREFIX, fsx)
    uploaded = pd.read_csv(fsx / "load_data_with_illum.csv", dtype=str, keep_default_na=False)
    original = pd.read_csv(screen.table, dtype=str, keep_default_na=False)
    metadata = [c for c in original.columns if c.startswith("Metadata_")]
    pd.testing.assert_frame_equal(uploaded[metadata], original[metadata])
    locations = uploaded[[c for c in uploaded.columns if "PathName_" in c]].to_numpy().ravel()
    assert not any(value.startswith(("s3://", "/")) for value in locations), locations

    cluster = screen_config(tmp_path / "cluster", fsx / "load_data_with_illum.csv", [])
    assert run_cli(cluster, "ingest") == 0
    packed = PackedImages(RunLayout.from_config(cluster).packed, label_column="Metadata_JCP2022")
    fields = packed.table.numbers("Metadata_FieldOfView").tolist()
    numbers = packed.table.numbers("Metadata_ObjectNumber").tolist()
    for row, (images, mask) in enumerate(zip(screen.images, screen.masks), start=1):
        expected = expected_crops(images, mask, CROP)
        cut = {number: i for i, (field, number) in enumerate(zip(fields, numbers)) if field == row}
        assert expected and sorted(cut) == sorted(expected), f"row {row}"
        for number, i in cut.items():
            np.testing.assert_array_equal(packed.read(i), expected[number])
    assert set(packed.table.strings("Metadata_Plate")) == {plate for plate, _, _ in FIELDS}


def test_check_only_counts_each_file_once_and_needs_no_bucket(tmp_path, capsys):
    screen = write_jump_screen(tmp_path / "lab")
    frame = pd.read_csv(screen.table, dtype=str)
    pd.concat([frame, frame.iloc[[0]]]).to_csv(screen.table, index=False)  # a row listed twice: its files go up once
    config_path = tmp_path / "upload.yaml"
    dump_config(screen_config(tmp_path, screen.table, screen.path_map), config_path)
    assert upload(config_path, screen.table, "--check-only") == 0
    result = last_json(capsys)
    assert result["rows"] == len(FIELDS) + 1 and result["files"] == len(FIELDS) * (len(CHANNELS) + 1)
    assert "uploaded" not in result


def test_under_skip_a_missing_file_is_named_and_the_rest_goes_up(s3, moto_endpoint, tmp_path, capsys):  # noqa: F811
    """data.on_bad_image=skip (the default): the file not found is counted and named by row and column, every
    other file goes up, and its row keeps the location the table wrote, so that ingest on the cluster names it."""
    screen = write_jump_screen(tmp_path / "lab")
    next((tmp_path / "lab" / "mirror").rglob("r01c01f02p01-ch4sk1fk1fl1.tiff")).unlink()
    config_path = tmp_path / "upload.yaml"
    dump_config(screen_config(tmp_path, screen.table, screen.path_map), config_path)
    assert upload(config_path, screen.table, "--bucket", BUCKET, "--endpoint-url", moto_endpoint) == 0
    result = last_json(capsys)
    files = len(FIELDS) * (len(CHANNELS) + 1) - 1
    assert (result["files"], result["uploaded"], result["missing"]) == (files, files + 1, 1)
    assert result["missing_first"][0].startswith("load_data_with_illum.csv row 2: FileName_OrigER: no such file ")
    download(s3, PREFIX, tmp_path / "fsx")
    uploaded = pd.read_csv(tmp_path / "fsx" / "load_data_with_illum.csv", dtype=str, keep_default_na=False)
    original = pd.read_csv(screen.table, dtype=str, keep_default_na=False)
    row = uploaded.iloc[1]
    assert (row["FileName_OrigER"], row["PathName_OrigER"]) == tuple(original.iloc[1][["FileName_OrigER",
                                                                                        "PathName_OrigER"]])
    assert not row["PathName_OrigDNA"].startswith(("s3://", "/")), "the row's other files were uploaded"


def test_with_a_table_of_centres_the_masks_stay_and_the_centres_go_up(tmp_path, capsys):
    screen = write_jump_screen(tmp_path / "lab")
    centres = tmp_path / "lab" / "cells.csv"
    centres.write_text("ImageNumber,ObjectNumber,Location_Center_X,Location_Center_Y\n1,1,10.0,12.0\n")
    config = tiny_config({"ingest.channels": list(CHANNELS), "ingest.centres": str(centres),
                          "ingest.path_map": screen.path_map})
    dump_config(config, tmp_path / "upload.yaml")
    assert upload(tmp_path / "upload.yaml", screen.table, "--check-only") == 0
    result = last_json(capsys)
    assert result["files"] == len(FIELDS) * len(CHANNELS)
    assert {"ObjectsFileName_Cells", "ObjectsPathName_Cells"} <= set(result["left_out_columns"])
    assert result["cluster"]["ingest.centres"] == f"{FSX_DATA}{PREFIX[len(DATA_PREFIX):]}/cells.csv"


@pytest.mark.parametrize("change, message", [
    ("unmapped", "error: no file of the table is on this machine: load_data_with_illum.csv row 1: PathName_OrigDNA: "
                 "s3://cellpainting-gallery/cpg0016-jump/"),
    ("missing", "error: load_data_with_illum.csv row 2: FileName_OrigER: no such file "),
    ("prefix", "error: --prefix screens/x lies outside data/, which the cluster's file system imports"),
])
def test_bad_input_is_one_line(tmp_path, capsys, change, message):
    screen = write_jump_screen(tmp_path / "lab")
    overrides = ["--set", "data.on_bad_image=fail"]
    path_map = [] if change == "unmapped" else screen.path_map
    if change == "missing":
        next((tmp_path / "lab" / "mirror").rglob("r01c01f02p01-ch4sk1fk1fl1.tiff")).unlink()
    config_path = tmp_path / "upload.yaml"
    dump_config(screen_config(tmp_path, screen.table, path_map), config_path)
    args = ["upload-data", "--config", str(config_path), "--table", str(screen.table), "--check-only", *overrides]
    args += ["--prefix", "screens/x" if change == "prefix" else PREFIX]
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and err[0].startswith(message), err
    if change == "missing":
        assert "ingest.path_map, or set data.on_bad_image=skip to upload the rest" in err[0]


def test_the_cluster_paths_are_the_storage_stacks_association():
    """upload-data prints /fsx/data/... for data/...: the storage stack links the same two."""
    from stacks.shared.constants import FSX_MOUNT_DIR
    from stacks.shared.settings import StorageSettings

    assert (DATA_PREFIX, FSX_DATA) == (StorageSettings().data_prefix, f"{FSX_MOUNT_DIR}/{StorageSettings().data_prefix}")
