"""upload-data: check an image set (counts per class, unreadable files) and upload it to S3, or a
screen (a LoadData table, its images and masks).

    python -m training upload-data --source ~/DeepPhenotype_PBMC_ImageSet_YSeverin --bucket BUCKET
    python -m training upload-data --url https://.../DeepPhenotype.zip --bucket BUCKET
    python -m training upload-data --source DIR --check-only          (no AWS needed)
    python -m training upload-data --source DIR      (no --bucket: the deployment record's bucket and region)
    python -m training upload-data --config run.yaml --table load_data.csv --prefix data/screens/NAME --bucket BUCKET

Meant for the Deep Phenotyping PBMC image set (landing page:
https://www.research-collection.ethz.ch/handle/20.500.11850/343106; pass its archive link with
--url, or a folder you downloaded with --source). Any tree of TIFFs in class folders works.

The objects go to s3://BUCKET/PREFIX/<path relative to the source>. The default prefix lies under
`data/`, which the FSx file system imports (so the images appear under /fsx/data/ on the cluster).
Uploads are parallel (multipart for large files) and resumable: objects already there with the
same size and checksum are skipped, so rerunning after an interruption finishes the job.
Unreadable images are reported and left out (data.on_bad_image=fail stops instead). The check and the
upload: training/upload/.

With --table, the files the table names for `ingest` (its image and mask columns as the config's
ingest section picks them, found through ingest.path_map where the table's paths point elsewhere,
e.g. JUMP's s3:// folders) go up once each under PREFIX, with the table rewritten to relative paths
beside them; the step then prints the data.source and ingest.table the cluster reads them by
(training/upload/screen_table.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
    parser.add_argument("--table", type=Path,
                        help="a screen's LoadData table (CSV or Parquet): upload it with its images and masks "
                             "instead of an image set (needs --prefix data/...)")
    parser.add_argument("--prefix", default=None,
                        help=f"key prefix (default {DEFAULT_PREFIX}; a screen's must be given, under data/)")
    parser.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (default: AWS)")
    parser.add_argument("--region", default=None, help="bucket region (default: AWS configuration)")
    parser.add_argument("--deployment", type=Path, metavar="FILE",
                        help="without --bucket: the bucket and region this deployment record names (default: "
                             "the repository's deployment.json, written by `python -m stacks.deployment deploy`)")
    parser.add_argument("--workers", type=int, default=16, help="parallel uploads")
    parser.add_argument("--multipart-mb", type=int, default=64, help="part size and multipart threshold")
    parser.add_argument("--check-only", action="store_true", help="check the images, upload nothing")


def run(config: Config, layout, args: argparse.Namespace) -> int:
    """Check (and unless --check-only, upload) the image set or the screen; print the upload's summary as JSON."""
    from training.errors import UserError
    from training.upload.image_set import UploadRequest, upload_image_set
    from training.upload.screen_table import upload_screen

    if args.table and args.source:
        raise UserError("give --source (an image set's folder) or --table (a screen's LoadData table), not both")
    prefix = args.prefix if args.prefix is not None or args.table else DEFAULT_PREFIX
    if not args.bucket and not args.check_only:
        args.bucket, args.region = recorded_bucket(args.deployment, args.region)
    request = UploadRequest(source=args.source, url=args.url, download_dir=args.download_dir, bucket=args.bucket,
                            prefix=prefix, endpoint_url=args.endpoint_url, region=args.region, workers=args.workers,
                            multipart_mb=args.multipart_mb, check_only=args.check_only, table=args.table)
    summary = upload_screen(config, request) if args.table else upload_image_set(config, request)
    if summary is not None:
        print(json.dumps({"bucket": request.bucket, "prefix": request.prefix, **summary}))
    return 0


def recorded_bucket(record: Path | None, region: str | None) -> tuple[str, str]:
    """The deployment record's bucket and region (stacks/deployment.py reads the record: run from the repository)."""
    from training.errors import UserError

    try:
        from stacks.deployment import DeploymentError, upload_target
    except ImportError:
        raise UserError("no bucket: pass --bucket (the storage stack's BucketName output) or set SCDINO_BUCKET") from None
    try:
        bucket, region = upload_target(record, region)
    except DeploymentError as error:
        raise UserError(str(error)) from None
    print(f"bucket {bucket} in {region}, from the deployment record", file=sys.stderr)
    return bucket, region
