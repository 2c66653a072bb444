"""A screen (a CellProfiler LoadData table, its images and masks) to the data bucket, for
`python -m training upload-data --table load_data.csv --prefix data/screens/NAME`.

The files are the ones `ingest` reads with the same configuration: the image columns ingest.channels
picks (every FileName_ column when it is empty) and the mask column ingest.objects picks, each found
as ingest finds it, so JUMP's s3:// folders and another machine's paths are read from a local copy
through ingest.path_map. Each file goes up once, however many rows name it, to
s3://BUCKET/PREFIX/<its path below the table's folder> (below the files' deepest common folder when
some lie outside it), resumably (training/upload/s3.py). The table goes up beside them, rewritten:
each PathName_ relative to the table, each FileName_ the file's own name, and the location columns
of what was not uploaded left out; a table of centres (ingest.centres) goes up beside it. On the
cluster s3://BUCKET/data/X is /fsx/data/X (the storage stack's data repository association), so
`ingest.table: /fsx/data/.../load_data.csv` reads the same files with no path map; the step prints
those lines.

A file that is not found is named by row, column and path: data.on_bad_image=fail stops at it (so
does a table whose files are all missing), skip uploads the rest and lists it; its row keeps its
values as written, and ingest on the cluster names it again.
"""

from __future__ import annotations

import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from training.config import Config
from training.data.ingest.table import ADDRESS, BadField, ImageColumn, LoadTable, UnmappedPath
from training.errors import UserError
from training.upload import s3

if TYPE_CHECKING:
    from training.upload.image_set import UploadRequest

log = logging.getLogger(__name__)

DATA_PREFIX, FSX_DATA = "data", "/fsx/data"
"""The bucket's prefix the FSx file system imports and where it appears on every node: the storage
stack's data repository association (storage.data_prefix, stacks/shared/constants.py FSX_MOUNT_DIR)."""
LISTED_MISSING = 20
"""How many files not found the log and the summary name one by one (all are counted)."""


@dataclass
class Found:
    """The table's files on this machine: each row's file per column, the distinct files, what is missing."""

    rows: dict[tuple[int, str], Path] = field(default_factory=dict)
    files: dict[Path, None] = field(default_factory=dict)
    missing: list[BadField] = field(default_factory=list)


def upload_screen(config: Config, request: UploadRequest) -> dict[str, Any]:
    """Find the table's files, upload them and the rewritten table under request.prefix; the summary
    (with request.check_only, of what would go up)."""
    prefix = screen_prefix(request.prefix)
    load = LoadTable(config.replace({"ingest.table": str(request.table)}))
    with tempfile.TemporaryDirectory() as scratch:
        files, summary = screen_files(config, load, prefix, Path(scratch), request.bucket or "BUCKET")
        if request.check_only:
            return summary
        if not request.bucket:
            raise UserError("no bucket: pass --bucket (the storage stack's data bucket) or set SCDINO_BUCKET")
        sent = s3.send(files, bucket=request.bucket, prefix=prefix, endpoint_url=request.endpoint_url,
                       region=request.region, workers=request.workers, multipart_mb=request.multipart_mb)
    cluster = summary["cluster"]
    lines = [f"  data:\n    source: {cluster['data.source']}", f"  ingest:\n    table: {cluster['ingest.table']}"]
    lines += [f"    centres: {cluster['ingest.centres']}"] if "ingest.centres" in cluster else []
    print(f"upload-data: on the cluster s3://{request.bucket}/{prefix}/ is {cluster['data.source']}/; in the run's "
          "config:\n" + "\n".join(lines) + "\n(its paths are relative now: no ingest.path_map there)", flush=True)
    return {**summary, "uploaded": sent.uploaded, "skipped": sent.skipped, "bytes_uploaded": sent.bytes_uploaded}


def screen_files(config: Config, load: LoadTable, prefix: str, scratch: Path,
                 bucket: str) -> tuple[list[s3.LocalFile], dict[str, Any]]:
    """Every file to upload with its key (the rewritten table written into `scratch`), and what they are."""
    columns = [*load.images, *([load.objects] if load.objects else [])]
    found = find_files(load, columns)
    stop_on_missing(config, found)
    root = common_root(load.folder.absolute(), list(found.files))
    frame, left_out = rewrite(load, columns, found, root)
    tables = [write_table(frame, scratch / load.name), *([Path(config.ingest.centres)] if config.ingest.centres else [])]
    files = hashed(found, root, prefix)
    taken = {f"{prefix}/{table.name}" for table in tables}
    if any(f.key in taken for f in files):
        raise UserError(f"a file of the screen would take the key of its table ({', '.join(sorted(taken))}): "
                        "rename the table")
    files += [s3.local_file(table, table.parent, prefix) for table in tables]
    summary = {"table": f"s3://{bucket}/{prefix}/{load.name}", "rows": len(load), "files": len(files) - len(tables),
               "bytes": sum(f.size for f in files), "missing": len(found.missing),
               "missing_first": [str(b) for b in found.missing[:LISTED_MISSING]], "left_out_columns": left_out,
               "cluster": cluster_settings(prefix, load.name, config.ingest.centres)}
    log.info("%s: %d rows; %d files and the table (%d bytes in all) for %s, %d not found; columns left out: %s",
             load.name, len(load), summary["files"], summary["bytes"], summary["table"], len(found.missing),
             ", ".join(left_out) or "none")
    return files, summary


def screen_prefix(prefix: str | None) -> str:
    """The key prefix, under data/ so that the cluster sees it."""
    prefix = (prefix or "").strip("/")
    if not prefix:
        raise UserError("--table uploads a screen under a prefix of your choosing: pass --prefix data/screens/NAME")
    if not prefix.startswith(DATA_PREFIX + "/"):
        raise UserError(f"--prefix {prefix} lies outside {DATA_PREFIX}/, which the cluster's file system imports "
                        f"(s3://BUCKET/{DATA_PREFIX}/X is {FSX_DATA}/X): pass --prefix {DATA_PREFIX}/screens/NAME")
    return prefix


def cluster_settings(prefix: str, table_name: str, centres: str = "") -> dict[str, str]:
    """The uploaded screen's folder and tables as the cluster's nodes see them."""
    folder = FSX_DATA + prefix[len(DATA_PREFIX):]
    found = {"data.source": folder, "ingest.table": f"{folder}/{table_name}"}
    return {**found, "ingest.centres": f"{folder}/{Path(centres).name}"} if centres else found


def find_files(load: LoadTable, columns: list[ImageColumn]) -> Found:
    """Every row's file of every column, as ingest resolves it; what is missing, by row and column."""
    found = Found()
    for index in range(len(load)):
        for column in columns:
            try:
                path = load.resolve(index, column)
            except BadField as bad:
                found.missing.append(bad)
                continue
            if not path.exists():
                found.missing.append(BadField(load.name, index + 1, column.file, f"no such file {path}"))
                continue
            found.rows[index, column.file] = path.absolute()
            found.files[path.absolute()] = None
    return found


def stop_on_missing(config: Config, found: Found) -> None:
    """Files not found: stop under data.on_bad_image=fail or when none is found, else name the first few."""
    if not found.missing:
        return
    first, more = found.missing[0], len(found.missing) - 1
    counted = f" (and {more:,} more)" if more else ""
    fix = "" if isinstance(first, UnmappedPath) else ": fix the table, or map its paths with ingest.path_map"
    if not found.files:
        raise UserError(f"no file of the table is on this machine: {first}{counted}{fix}")
    if config.data.on_bad_image == "fail":
        raise UserError(f"{first}{counted}{fix}, or set data.on_bad_image=skip to upload the rest")
    for bad in found.missing[:LISTED_MISSING]:
        log.warning("not found, not uploaded: %s", bad)


def common_root(table_folder: Path, files: list[Path]) -> Path:
    """The folder the keys are relative to: the table's when every file lies below it, else the
    files' deepest common folder."""
    if all(path.is_relative_to(table_folder) for path in files):
        return table_folder
    return Path(os.path.commonpath([path.parent for path in files]))


def rewrite(load: LoadTable, columns: list[ImageColumn], found: Found, root: Path) -> tuple[pd.DataFrame, list[str]]:
    """The table with each uploaded file's PathName_ relative to the table and FileName_ its name (rows
    whose file was not found as written), and every other location column left out (named)."""
    frame = load.frame.copy()
    kept: set[str] = set()
    for column in columns:
        objects = "Objects" if column.file.startswith("Objects") else ""
        path_column = column.path or f"{objects}PathName_{column.name}"
        written = frame[path_column].tolist() if column.path else [None] * len(frame)
        names, folders = frame[column.file].tolist(), written
        for index in range(len(frame)):
            path = found.rows.get((index, column.file))
            if path is not None:
                names[index] = path.name
                folder = Path(os.path.relpath(path.parent, root)).as_posix()
                folders[index] = "" if folder == "." else folder
        frame[column.file] = names
        if path_column not in frame.columns:
            frame.insert(frame.columns.get_loc(column.file) + 1, path_column, folders)
        else:
            frame[path_column] = folders
        kept |= {column.file, path_column, f"{objects}Series_{column.name}", f"{objects}Frame_{column.name}"}
    left_out = [str(c) for c in frame.columns if ADDRESS.match(str(c)) and str(c) not in kept]
    return frame.drop(columns=left_out), left_out


def write_table(frame: pd.DataFrame, path: Path) -> Path:
    """The table in its own format: Parquet for .parquet/.pq, else CSV (missing values empty)."""
    if path.suffix.lower() in (".parquet", ".pq"):
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False)
    return path


def hashed(found: Found, root: Path, prefix: str) -> list[s3.LocalFile]:
    """Every distinct file (an OME-Zarr folder's files one by one) with its key and checksums."""
    from tqdm import tqdm

    paths = [inner for path in found.files
             for inner in (sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])]
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        return list(tqdm(pool.map(lambda path: s3.local_file(path, root, prefix), paths), total=len(paths),
                         desc="check", unit="file"))
