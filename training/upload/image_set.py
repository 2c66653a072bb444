"""An image set (a tree of TIFFs in class folders) checked and uploaded to the data bucket, for
`python -m training upload-data`.

The source is a local folder or an archive (.zip/.tar[.gz]) downloaded and unpacked once, reused on
a rerun. The check counts the images per class and reads each one: unreadable images are reported and
left out (data.on_bad_image=fail stops instead). The objects go to s3://BUCKET/PREFIX/<path relative
to the source>, resumably and in parallel (training/upload/s3.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import threading
import urllib.request
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.config import Config
from training.errors import UserError
from training.upload import s3

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "data/deep_phenotyping"
"""Under data/, which the FSx file system imports: the images appear under /fsx/data/ on the cluster."""
LANDING_PAGE = "https://www.research-collection.ethz.ch/handle/20.500.11850/343106"


@dataclass(frozen=True)
class UploadRequest:
    """What `upload-data` is asked to do (its flags)."""

    source: Path | None = None
    """A local folder of the image set; else `url` is downloaded."""
    url: str = ""
    """An archive (.zip/.tar[.gz]) of the image set."""
    download_dir: Path = Path("runs/downloads")
    """Where `url` is downloaded and unpacked (reused when present)."""
    bucket: str = ""
    prefix: str = DEFAULT_PREFIX
    endpoint_url: str | None = None
    """An S3-compatible endpoint (None: AWS)."""
    region: str | None = None
    workers: int = 16
    """Parallel uploads."""
    multipart_mb: int = 64
    """Part size and multipart threshold."""
    check_only: bool = False
    """Check the images, upload nothing (no AWS needed)."""
    table: Path | None = None
    """A screen's LoadData table: upload it, its images and masks instead of an image set (screen_table.py)."""


def upload_image_set(config: Config, request: UploadRequest) -> dict[str, Any] | None:
    """Check the image set and upload it; the upload's summary (None with check_only)."""
    root = resolve_source(request)
    check = check_images(root, config)
    log_check(root, check)
    if check["bad"] and config.data.on_bad_image == "fail":
        raise UserError(f"{len(check['bad'])} unreadable image(s) under {root} (first: {check['bad'][0]['path']}); "
                        "fix or remove them, or set data.on_bad_image=skip to leave them out")
    if request.check_only:
        return None
    if not request.bucket:
        raise UserError("no bucket: pass --bucket (the storage stack's data bucket) or set SCDINO_BUCKET")
    return upload(root, check, request)


def resolve_source(request: UploadRequest) -> Path:
    """The folder of the image set: --source, or --url downloaded and unpacked."""
    if request.source:
        if not request.source.is_dir():
            raise UserError(f"--source {request.source} is not a folder")
        return request.source
    if not request.url:
        raise UserError(f"give --source DIR or --url ARCHIVE (the image set's archive link from {LANDING_PAGE})")
    return download_and_unpack(request.url, request.download_dir)


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

    from training.writes.atomic import atomic_path

    try:
        with atomic_path(target) as tmp, urllib.request.urlopen(url, timeout=60) as response, tmp.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {target.name}") as bar:
                while chunk := response.read(s3.MB):
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

    def inspect(path: Path) -> s3.LocalFile | None:
        if path in images:
            try:
                read_image(path, config.data.channel_axis)
            except BadImage as exc:
                with lock:
                    bad.append({"path": path.relative_to(root).as_posix(), "reason": str(exc)})
                return None
        return s3.local_file(path, root, "")

    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        checked = list(tqdm(pool.map(inspect, files), total=len(files), desc="check", unit="file"))
    bad_paths = {b["path"] for b in bad}
    counts = Counter(index.class_names[label] for path, label in zip(index.paths, index.labels)
                     if path not in bad_paths)
    return {"classes": dict(sorted(counts.items())), "images": len(index.paths) - len(bad),
            "bad": sorted(bad, key=lambda b: b["path"]), "files": [f for f in checked if f is not None]}


def log_check(root: Path, check: dict) -> None:
    """The counts per class, and each unreadable image, in the log."""
    width = max((len(name) for name in check["classes"]), default=5)
    lines = [f"{name:<{width}}  {count:>8}" for name, count in check["classes"].items()]
    log.info("%s: %d readable images in %d classes\n%s", root, check["images"], len(check["classes"]),
             "\n".join(lines))
    for item in check["bad"]:
        log.warning("unreadable, left out: %s (%s)", item["path"], item["reason"])


def upload(root: Path, check: dict, request: UploadRequest) -> dict:
    """Every checked file to s3://bucket/prefix/, with a progress bar; what was uploaded and skipped."""
    prefix = request.prefix.strip("/")
    files = [s3.LocalFile(f.path, f"{prefix}/{f.key}" if prefix else f.key, f.size, f.sha256, f.md5)
             for f in check["files"]]
    summary = s3.send(files, bucket=request.bucket, prefix=prefix, endpoint_url=request.endpoint_url,
                      region=request.region, workers=request.workers, multipart_mb=request.multipart_mb)
    return {"uploaded": summary.uploaded, "skipped": summary.skipped, "bytes_uploaded": summary.bytes_uploaded,
            "images": check["images"], "classes": check["classes"], "bad": check["bad"]}
