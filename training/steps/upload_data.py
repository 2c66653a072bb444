"""upload-data: check an image set (counts per class, unreadable files) and upload it to S3.

    python -m training upload-data --source ~/DeepPhenotype_PBMC_ImageSet_YSeverin --bucket BUCKET
    python -m training upload-data --url https://.../DeepPhenotype.zip --bucket BUCKET
    python -m training upload-data --source DIR --check-only          (no AWS needed)

Meant for the Deep Phenotyping PBMC image set (landing page:
https://www.research-collection.ethz.ch/handle/20.500.11850/343106; pass its archive link with
--url, or a folder you downloaded with --source). Any tree of TIFFs in class folders works.

The objects go to s3://BUCKET/PREFIX/<path relative to the source>. The default prefix lies under
`data/`, which the FSx file system imports (so the images appear under /fsx/data/ on the cluster).
Uploads are parallel (multipart for large files) and resumable: objects already there with the
same size and checksum are skipped, so rerunning after an interruption finishes the job.
Unreadable images are reported and left out (data.on_bad_image=fail stops instead).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tarfile
import threading
import urllib.request
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from training import s3upload
from training.config import Config
from training.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "data/deep_phenotyping"
LANDING_PAGE = "https://www.research-collection.ethz.ch/handle/20.500.11850/343106"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", type=Path, help="local folder of the image set")
    parser.add_argument("--url", default=os.environ.get("SCDINO_DATA_URL", ""),
                        help="archive (.zip/.tar[.gz]) to download instead (env SCDINO_DATA_URL)")
    parser.add_argument("--download-dir", type=Path, default=Path("runs/downloads"),
                        help="where --url is downloaded and unpacked (reused when present)")
    parser.add_argument("--bucket", default=os.environ.get("SCDINO_BUCKET", ""),
                        help="target bucket (the storage stack's data bucket; env SCDINO_BUCKET)")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"key prefix (default {DEFAULT_PREFIX})")
    parser.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (default: AWS)")
    parser.add_argument("--region", default=None, help="bucket region (default: AWS configuration)")
    parser.add_argument("--workers", type=int, default=16, help="parallel uploads")
    parser.add_argument("--multipart-mb", type=int, default=64, help="part size and multipart threshold")
    parser.add_argument("--check-only", action="store_true", help="check the images, upload nothing")


def run(config: Config, layout, args: argparse.Namespace) -> int:
    root = resolve_source(args)
    check = check_images(root, config)
    print_check(root, check)
    if check["bad"] and config.data.on_bad_image == "fail":
        raise UserError(f"{len(check['bad'])} unreadable image(s) under {root} (first: {check['bad'][0]['path']}); "
                        "fix or remove them, or set data.on_bad_image=skip to leave them out")
    if args.check_only:
        return 0
    if not args.bucket:
        raise UserError("no bucket: pass --bucket (the storage stack's data bucket) or set SCDINO_BUCKET")
    summary = upload(root, check, args)
    print(json.dumps({"bucket": args.bucket, "prefix": args.prefix, **summary}))
    return 0


def resolve_source(args: argparse.Namespace) -> Path:
    if args.source:
        if not args.source.is_dir():
            raise UserError(f"--source {args.source} is not a folder")
        return args.source
    if not args.url:
        raise UserError(f"give --source DIR or --url ARCHIVE (the image set's archive link from {LANDING_PAGE})")
    return download_and_unpack(args.url, args.download_dir)


def download_and_unpack(url: str, download_dir: Path) -> Path:
    """Download once (atomically) and unpack once; a rerun reuses both."""
    name = Path(url.split("?", 1)[0]).name or "dataset"
    archive, unpacked = download_dir / name, download_dir / (name.split(".", 1)[0] + "_unpacked")
    if (unpacked / ".complete").exists():
        return unpacked
    download_dir.mkdir(parents=True, exist_ok=True)
    if not archive.exists():
        fetch(url, archive)
    tmp = unpacked.with_name(unpacked.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    unpack(archive, tmp)
    shutil.rmtree(unpacked, ignore_errors=True)
    tmp.rename(unpacked)
    (unpacked / ".complete").touch()
    return unpacked


def fetch(url: str, target: Path) -> None:
    from tqdm import tqdm

    from training.atomic import atomic_path

    try:
        with atomic_path(target) as tmp, urllib.request.urlopen(url, timeout=60) as response, tmp.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {target.name}") as bar:
                while chunk := response.read(s3upload.MB):
                    out.write(chunk)
                    bar.update(len(chunk))
    except OSError as exc:
        raise UserError(f"cannot download {url}: {exc}; check the link (see {LANDING_PAGE})") from None


def unpack(archive: Path, target: Path) -> None:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(target)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            tf.extractall(target, filter="data")
    else:
        raise UserError(f"{archive} is neither a zip nor a tar archive; download it yourself and pass --source")


def check_images(root: Path, config: Config) -> dict:
    """Counts per class, unreadable images, and every file to upload with its checksums."""
    from tqdm import tqdm

    from training.data.folders.index import scan_images
    from training.data.tiff import BadImage, read_image

    index = scan_images(root, config.data.folder_depth_for_labels)
    images = {root / p for p in index.paths}
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    bad, lock = [], threading.Lock()

    def inspect(path: Path) -> s3upload.LocalFile | None:
        if path in images:
            try:
                read_image(path, config.data.channel_axis)
            except BadImage as exc:
                with lock:
                    bad.append({"path": path.relative_to(root).as_posix(), "reason": str(exc)})
                return None
        return s3upload.local_file(path, root, "")

    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        checked = list(tqdm(pool.map(inspect, files), total=len(files), desc="check", unit="file"))
    bad_paths = {b["path"] for b in bad}
    counts = Counter(index.class_names[label] for path, label in zip(index.paths, index.labels)
                     if path not in bad_paths)
    return {"classes": dict(sorted(counts.items())), "images": len(index.paths) - len(bad),
            "bad": sorted(bad, key=lambda b: b["path"]), "files": [f for f in checked if f is not None]}


def print_check(root: Path, check: dict) -> None:
    width = max((len(name) for name in check["classes"]), default=5)
    lines = [f"{name:<{width}}  {count:>8}" for name, count in check["classes"].items()]
    log.info("%s: %d readable images in %d classes\n%s", root, check["images"], len(check["classes"]),
             "\n".join(lines))
    for item in check["bad"]:
        log.warning("unreadable, left out: %s (%s)", item["path"], item["reason"])


def upload(root: Path, check: dict, args: argparse.Namespace) -> dict:
    from tqdm import tqdm

    client = s3upload.make_client(endpoint_url=args.endpoint_url, region=args.region, workers=args.workers)
    s3upload.check_bucket(client, args.bucket)
    prefix = args.prefix.strip("/")
    files = [s3upload.LocalFile(f.path, f"{prefix}/{f.key}" if prefix else f.key, f.size, f.sha256, f.md5)
             for f in check["files"]]
    total = sum(f.size for f in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"s3://{args.bucket}/{prefix}") as bar:
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        summary = s3upload.upload_files(client, args.bucket, prefix, files, workers=args.workers,
                                        multipart_mb=args.multipart_mb, on_bytes=advance)
    log.info("uploaded %d file(s) (%d bytes), skipped %d already there", summary.uploaded,
             summary.bytes_uploaded, summary.skipped)
    return {"uploaded": summary.uploaded, "skipped": summary.skipped, "bytes_uploaded": summary.bytes_uploaded,
            "images": check["images"], "classes": check["classes"], "bad": check["bad"]}
