"""`python -m training upload-data` against a real S3-compatible server (moto, server mode, loopback).

The server speaks the S3 HTTP API on 127.0.0.1, so boto3's real code paths (listing, HEAD,
multipart uploads, metadata) run end to end; no AWS account or network is needed.
"""

from __future__ import annotations

import json

import boto3
import numpy as np
import pytest
import tifffile

from training.cli import main

BUCKET = "scdino-data-test"
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3(moto_endpoint, monkeypatch):
    for key, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)


@pytest.fixture
def image_set(tmp_path):
    """Two classes of 5-channel uint16 TIFFs, a corrupt TIFF and a 6 MiB metadata file."""
    root = tmp_path / "pbmc"
    rng = np.random.default_rng(0)
    for name, count in (("B_cell", 3), ("T_cell", 2)):
        (root / name).mkdir(parents=True)
        for i in range(count):
            tifffile.imwrite(root / name / f"img_{i}.tif", rng.integers(0, 4000, (5, 20, 20), dtype=np.uint16))
    (root / "T_cell" / "broken.tif").write_bytes(b"II*\x00 not really a tiff")
    (root / "metadata.bin").write_bytes(rng.bytes(6 * 2**20))
    return root


def upload(root, endpoint, *extra):
    return main(["upload-data", "--source", str(root), "--bucket", BUCKET, "--endpoint-url", endpoint,
                 "--prefix", "data/pbmc", "--multipart-mb", "5", "--workers", "4", *extra])


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def keys(client) -> set[str]:
    return {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])}


def test_upload_checks_counts_and_skips_unreadable(s3, moto_endpoint, image_set, capsys):
    assert upload(image_set, moto_endpoint) == 0
    result = last_json(capsys)
    assert result["classes"] == {"B_cell": 3, "T_cell": 2}
    assert [b["path"] for b in result["bad"]] == ["T_cell/broken.tif"]
    assert result["uploaded"] == 6 and result["skipped"] == 0
    assert keys(s3) == {f"data/pbmc/B_cell/img_{i}.tif" for i in range(3)} | {
        "data/pbmc/T_cell/img_0.tif", "data/pbmc/T_cell/img_1.tif", "data/pbmc/metadata.bin"}
    big = s3.head_object(Bucket=BUCKET, Key="data/pbmc/metadata.bin")
    assert "-" in big["ETag"], "a 6 MiB file with 5 MiB parts should go up as a multipart upload"
    assert len(big["Metadata"]["sha256"]) == 64
    body = s3.get_object(Bucket=BUCKET, Key="data/pbmc/B_cell/img_0.tif")["Body"].read()
    assert body == (image_set / "B_cell" / "img_0.tif").read_bytes()


def test_rerun_skips_identical_objects_and_uploads_changed_ones(s3, moto_endpoint, image_set, capsys):
    upload(image_set, moto_endpoint)
    capsys.readouterr()
    assert upload(image_set, moto_endpoint) == 0
    assert last_json(capsys)["uploaded"] == 0, "identical objects (multipart one included) must be skipped"
    tifffile.imwrite(image_set / "B_cell" / "img_1.tif", np.full((5, 20, 20), 7, dtype=np.uint16) +
                     np.arange(20, dtype=np.uint16))
    assert upload(image_set, moto_endpoint) == 0
    result = last_json(capsys)
    assert (result["uploaded"], result["skipped"]) == (1, 5)


def test_same_size_different_content_is_uploaded_again(s3, moto_endpoint, image_set, capsys):
    upload(image_set, moto_endpoint)
    data = bytearray((image_set / "metadata.bin").read_bytes())
    data[-1] ^= 0xFF
    (image_set / "metadata.bin").write_bytes(bytes(data))
    capsys.readouterr()
    assert upload(image_set, moto_endpoint) == 0
    assert last_json(capsys)["uploaded"] == 1


def test_missing_bucket_is_one_clear_line(s3, moto_endpoint, image_set, capsys):
    code = main(["upload-data", "--source", str(image_set), "--bucket", "no-such-bucket",
                 "--endpoint-url", moto_endpoint])
    assert code == 2
    assert "bucket 'no-such-bucket' does not exist" in capsys.readouterr().err


def test_missing_credentials_is_one_clear_line(moto_endpoint, image_set, capsys, monkeypatch, tmp_path):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    code = main(["upload-data", "--source", str(image_set), "--bucket", BUCKET, "--endpoint-url", moto_endpoint])
    assert code == 2
    assert "no AWS credentials found" in capsys.readouterr().err


def test_check_only_needs_no_bucket_and_fail_mode_stops(image_set, capsys):
    assert main(["upload-data", "--source", str(image_set), "--check-only"]) == 0
    assert main(["upload-data", "--source", str(image_set), "--check-only",
                 "--set", "data.on_bad_image=fail"]) == 2
    assert "unreadable image(s)" in capsys.readouterr().err


def test_neither_source_nor_url_says_where_to_get_the_data(capsys, monkeypatch):
    monkeypatch.delenv("SCDINO_DATA_URL", raising=False)
    assert main(["upload-data", "--bucket", BUCKET]) == 2
    assert "research-collection.ethz.ch" in capsys.readouterr().err


def test_url_source_is_downloaded_unpacked_and_reused(image_set, tmp_path, capsys):
    import shutil

    archive = shutil.make_archive(str(tmp_path / "pbmc_set"), "zip", image_set)
    url = f"file://{archive}"
    downloads = tmp_path / "downloads"
    args = ["upload-data", "--url", url, "--download-dir", str(downloads), "--check-only"]
    assert main(args) == 0
    assert (downloads / "pbmc_set_unpacked" / ".complete").exists()
    (tmp_path / "pbmc_set.zip").unlink()
    assert main(args) == 0, "a second run reuses the unpacked copy without downloading again"


def test_without_a_bucket_the_deployment_record_gives_bucket_and_region(s3, moto_endpoint, image_set, tmp_path, capsys,
                                                                          monkeypatch):
    """The record `python -m stacks.deployment deploy` writes (tests/infra/test_deployment.py) names the bucket."""
    from stacks.deployment import Deployment, resolve, save

    monkeypatch.delenv("SCDINO_BUCKET", raising=False)
    context = {"region": "us-west-2", "network.availability_zone": "us-west-2a"}
    record = tmp_path / "deployment.json"
    save(Deployment.of(resolve(context), context).with_outputs({"scdino-storage": {"BucketName": BUCKET}}), record)
    args = ["upload-data", "--source", str(image_set), "--endpoint-url", moto_endpoint, "--prefix", "data/pbmc",
            "--deployment", str(record)]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert f"bucket {BUCKET} in us-west-2, from the deployment record" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["bucket"] == BUCKET
    assert "data/pbmc/B_cell/img_0.tif" in keys(s3)
    assert main([*args, "--region", "eu-west-1"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "--region eu-west-1" in errors[0] and "in us-west-2" in errors[0]
    assert main(["upload-data", "--source", str(image_set), "--deployment", str(tmp_path / "none.json")]) == 2
    assert "no bucket: pass --bucket" in capsys.readouterr().err
