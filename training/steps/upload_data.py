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
Unreadable images are reported and left out (data.on_bad_image=fail stops instead). The check and the
upload: training/upload/.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from training.config import Config
from training.upload.image_set import DEFAULT_PREFIX


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
    """Check (and unless --check-only, upload) the image set; print the upload's summary as JSON."""
    from training.upload.image_set import UploadRequest, upload_image_set

    request = UploadRequest(source=args.source, url=args.url, download_dir=args.download_dir, bucket=args.bucket,
                            prefix=args.prefix, endpoint_url=args.endpoint_url, region=args.region,
                            workers=args.workers, multipart_mb=args.multipart_mb, check_only=args.check_only)
    summary = upload_image_set(config, request)
    if summary is not None:
        print(json.dumps({"bucket": request.bucket, "prefix": request.prefix, **summary}))
    return 0
