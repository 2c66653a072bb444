"""Resumable, parallel upload of a folder tree to S3 (used by `python -m training upload-data`).

An object counts as uploaded when it has the local file's size and content: for single-part
uploads without KMS the ETag is the MD5 of the content; otherwise the SHA-256 that this module
stores in the object's metadata ("sha256") decides. So an interrupted upload resumes where it
stopped, and a rerun uploads only what changed. Files at or above `multipart_mb` go up in parallel
parts (boto3's TransferConfig); many small files go up in parallel through a thread pool.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from training.errors import UserError

log = logging.getLogger(__name__)

MB = 2**20
HASH_CHUNK = 8 * MB


@dataclass(frozen=True)
class LocalFile:
    path: Path
    key: str
    size: int
    sha256: str
    md5: str


@dataclass(frozen=True)
class RemoteObject:
    size: int
    etag: str


@dataclass(frozen=True)
class UploadSummary:
    uploaded: int
    skipped: int
    bytes_uploaded: int


def hash_file(path: Path) -> tuple[str, str]:
    """(sha256, md5) hex digests of a file, read once."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def local_file(path: Path, root: Path, prefix: str) -> LocalFile:
    sha, md5 = hash_file(path)
    key = "/".join(part for part in (prefix.strip("/"), path.relative_to(root).as_posix()) if part)
    return LocalFile(path, key, path.stat().st_size, sha, md5)


def make_client(*, endpoint_url: str | None = None, region: str | None = None, workers: int = 16):
    """An S3 client whose connection pool is large enough for `workers` threads."""
    import boto3
    from botocore.config import Config as BotoConfig

    config = BotoConfig(
        retries={"max_attempts": 10, "mode": "standard"}, max_pool_connections=max(10, 2 * workers)
    )
    # A fresh session: boto3's default one caches credentials for the life of the process.
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def explain(exc: Exception, bucket: str) -> UserError | None:
    """A one-line, fixable message for the usual failures; None for anything else."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return UserError("no AWS credentials found: run `aws configure` (or set AWS_PROFILE, or the "
                         "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY pair, or use an instance role)")
    if isinstance(exc, EndpointConnectionError):
        return UserError(f"cannot reach S3 ({exc}): check the region, --endpoint-url and the network")
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket"):
            return UserError(f"bucket {bucket!r} does not exist: deploy the storage stack (`cdk deploy`) "
                             "or pass the bucket name it printed (--bucket)")
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return UserError(f"access to bucket {bucket!r} denied ({code}): use credentials allowed to "
                             "write to it (its bucket policy and your IAM policy)")
    return None


def check_bucket(client, bucket: str) -> None:
    """Fail early, with the fix, when credentials are missing or the bucket is absent or forbidden."""
    try:
        client.head_bucket(Bucket=bucket)
    except Exception as exc:  # botocore raises several unrelated types; explain() sorts them
        error = explain(exc, bucket)
        if error is None:
            raise
        raise error from None


def existing_objects(client, bucket: str, prefix: str) -> dict[str, RemoteObject]:
    found: dict[str, RemoteObject] = {}
    prefix = prefix.strip("/")
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
        for item in page.get("Contents", []):
            found[item["Key"]] = RemoteObject(item["Size"], item["ETag"].strip('"'))
    return found


def is_uploaded(client, bucket: str, local: LocalFile, remote: RemoteObject | None) -> bool:
    """Same size and same content (MD5 ETag, else the stored SHA-256)."""
    if remote is None or remote.size != local.size:
        return False
    if remote.etag == local.md5:
        return True
    head = client.head_object(Bucket=bucket, Key=local.key)
    return head.get("Metadata", {}).get("sha256") == local.sha256


def transfer_config(workers: int, multipart_mb: int):
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=multipart_mb * MB, multipart_chunksize=multipart_mb * MB,
        max_concurrency=workers, use_threads=True,
    )


def upload_files(
    client, bucket: str, prefix: str, files: Iterable[LocalFile], *, workers: int = 16,
    multipart_mb: int = 64, on_bytes: Callable[[int], None] = lambda n: None,
) -> UploadSummary:
    """Upload what is missing or different under `prefix`, `workers` files at a time; skip the rest."""
    remote = existing_objects(client, bucket, prefix)
    config = transfer_config(workers, multipart_mb)
    lock = threading.Lock()
    counts = {"uploaded": 0, "skipped": 0, "bytes": 0}

    def one(local: LocalFile) -> None:
        if is_uploaded(client, bucket, local, remote.get(local.key)):
            kind = "skipped"
            on_bytes(local.size)
        else:
            client.upload_file(str(local.path), bucket, local.key, Config=config, Callback=on_bytes,
                               ExtraArgs={"Metadata": {"sha256": local.sha256}})
            kind = "uploaded"
        with lock:
            counts[kind] += 1
            counts["bytes"] += local.size if kind == "uploaded" else 0

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(one, files):
                pass
    except Exception as exc:
        error = explain(exc, bucket)
        if error is None:
            raise
        raise error from None
    return UploadSummary(counts["uploaded"], counts["skipped"], counts["bytes"])


def send(files: list[LocalFile], *, bucket: str, prefix: str, endpoint_url: str | None, region: str | None,
         workers: int, multipart_mb: int) -> UploadSummary:
    """Check the bucket, then upload_files with a progress bar of the bytes (skipped files count as done)."""
    from tqdm import tqdm

    client = make_client(endpoint_url=endpoint_url, region=region, workers=workers)
    check_bucket(client, bucket)
    with tqdm(total=sum(f.size for f in files), unit="B", unit_scale=True, desc=f"s3://{bucket}/{prefix}") as bar:
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        summary = upload_files(client, bucket, prefix, files, workers=workers, multipart_mb=multipart_mb,
                               on_bytes=advance)
    log.info("uploaded %d file(s) (%d bytes), skipped %d already there", summary.uploaded, summary.bytes_uploaded,
             summary.skipped)
    return summary
