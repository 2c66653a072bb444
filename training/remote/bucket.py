"""A run folder as the laptop sees it: in the data bucket, where the data repository association exports
whatever the jobs write under the file system's data folder (/fsx/data/<path> is s3://<bucket>/data/<path>).

    folder = RunFolder(s3, bucket, "data", "/fsx/data", "/fsx/data/runs/NAME")
    folder.key_of("/fsx/data/runs/NAME/report.html")      # data/runs/NAME/report.html
    folder.listing()                                       # {relative path: RemoteObject(size, etag)}
    fetch(folder, ["report.html", ...], Path("results"))   # resumable, with progress on large files

Fetching is resumable: a file already here with the object's size and content (its MD5 ETag, or the
sha256 the uploader stored, compared as training/upload/s3.py does) is skipped; a download goes to
<file>.part first and continues from where an interrupted one stopped (an HTTP range request), then is
renamed.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from training.errors import UserError
from training.rundir import RunLayout
from training.upload.s3 import RemoteObject, existing_objects, hash_file

CHUNK = 8 * 2**20
PROGRESS_BYTES = 16 * 2**20
"""Files at least this large get a progress bar of their own."""
_RUN = RunLayout(Path("."))
PARTS = {"report": [_RUN.report], "knn": [_RUN.knn], "profiles": [_RUN.profiles], "plots": [_RUN.plots],
         "results": [_RUN.results], "bill": [_RUN.results, _RUN.timings, _RUN.plan], "logs": [_RUN.logs],
         "linear": [_RUN.linear]}
"""`remote fetch --what` names -> the run's files or folders they stand for (paths relative to the run)."""
DEFAULT_PARTS = ("report", "knn", "profiles", "plots", "results", "bill")


@dataclass(frozen=True)
class RunFolder:
    """The run folder `run` (a path on the cluster, under `cluster_data`) in `bucket` under `prefix`."""

    s3: Any
    bucket: str
    prefix: str
    cluster_data: str
    run: str

    def key_of(self, cluster_path: str) -> str:
        """The object key of a file on the cluster under the data folder."""
        relative = posixpath.relpath(posixpath.normpath(cluster_path), posixpath.normpath(self.cluster_data))
        if relative.startswith(".."):
            raise UserError(f"{cluster_path} is not under {self.cluster_data}, the folder the bucket's "
                            f"{self.prefix}/ is imported to: put the run there (run.output_dir)")
        return f"{self.prefix.strip('/')}/{relative}"

    @property
    def root_key(self) -> str:
        return self.key_of(self.run) + "/"

    def listing(self) -> dict[str, RemoteObject]:
        """Every object of the run folder by its path relative to the run."""
        return {key[len(self.root_key):]: found
                for key, found in existing_objects(self.s3, self.bucket, self.root_key).items()}

    def read(self, relative: str) -> bytes | None:
        """One file of the run (relative to the run), None when the bucket lacks it."""
        return get_bytes(self.s3, self.bucket, self.root_key + relative)

    def read_json(self, relative: str) -> Any | None:
        raw = self.read(relative)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return None

    def tail(self, relative: str, lines: int, max_bytes: int = 64 * 1024) -> list[str]:
        """The last lines of a log, from at most its last max_bytes (a range request)."""
        try:
            answer = self.s3.get_object(Bucket=self.bucket, Key=self.root_key + relative,
                                        Range=f"bytes=-{max_bytes}")
        except self.s3.exceptions.NoSuchKey:
            return []
        text = answer["Body"].read().decode(errors="replace")
        return text.splitlines()[-lines:]


def get_bytes(s3, bucket: str, key: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def exists_in(folder: RunFolder) -> Callable[[Path], bool]:
    """For the planner: whether a file of the run (a path on the cluster) is in the bucket."""
    def exists(path: Path) -> bool:
        try:
            folder.s3.head_object(Bucket=folder.bucket, Key=folder.key_of(str(path)))
            return True
        except folder.s3.exceptions.ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
    return exists


def select(listing: dict[str, RemoteObject], parts: Iterable[str]) -> list[str]:
    """The run's files that the named parts stand for (PARTS), in a stable order."""
    chosen: set[str] = set()
    for part in parts:
        if part not in PARTS:
            raise UserError(f"--what {part}: choose from {', '.join(PARTS)} (comma-separated), or all")
        for wanted in (path.as_posix() for path in PARTS[part]):
            chosen.update(path for path in listing if path == wanted or path.startswith(wanted + "/"))
    return sorted(chosen)


def same_content(path: Path, entry: RemoteObject, stored_sha256: str | None) -> bool:
    """Whether the local file is the object: same size, and its MD5 is a single-part ETag or its SHA-256 is
    the one the uploader stored. A multipart ETag with no stored SHA-256 matches nothing: the file is not read."""
    if not path.is_file() or path.stat().st_size != entry.size:
        return False
    if "-" in entry.etag and stored_sha256 is None:
        return False
    sha256, md5 = hash_file(path)
    return md5 == entry.etag or sha256 == stored_sha256


@dataclass(frozen=True)
class Fetched:
    downloaded: int
    skipped: int
    bytes: int


def fetch(folder: RunFolder, paths: list[str], target: Path, *, listing: dict[str, RemoteObject],
          progress: Callable[[str, int], Any] | None = None) -> Fetched:
    """Download the run's files at `paths` into `target` (the same relative paths), resumably."""
    downloaded = skipped = total = 0
    for relative in paths:
        entry = listing[relative]
        local = target / relative
        key = folder.root_key + relative
        stored = None
        if local.is_file() and local.stat().st_size == entry.size and "-" in entry.etag:
            stored = folder.s3.head_object(Bucket=folder.bucket, Key=key).get("Metadata", {}).get("sha256")
        if same_content(local, entry, stored):
            skipped += 1
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        total += _download(folder, key, entry, local, progress)
        downloaded += 1
    return Fetched(downloaded, skipped, total)


def _download(folder: RunFolder, key: str, entry: RemoteObject, local: Path, progress) -> int:
    """One object into local (through local.part, continued from its length when the object is unchanged)."""
    part = local.with_name(local.name + ".part")
    tag = local.with_name(local.name + ".part-etag")
    offset = part.stat().st_size if part.is_file() and tag.is_file() and tag.read_text() == entry.etag else 0
    if offset > entry.size:
        offset = 0
    tag.write_text(entry.etag)
    bar = progress(str(local), entry.size) if progress and entry.size >= PROGRESS_BYTES else None
    if bar is not None and offset:
        bar.update(offset)
    got = 0
    with part.open("ab" if offset else "wb") as handle:
        if offset < entry.size:
            extra = {"Range": f"bytes={offset}-"} if offset else {}
            body = folder.s3.get_object(Bucket=folder.bucket, Key=key, IfMatch=f'"{entry.etag}"', **extra)["Body"]
            while chunk := body.read(CHUNK):
                handle.write(chunk)
                got += len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    if bar is not None:
        bar.close()
    part.replace(local)
    tag.unlink(missing_ok=True)
    return got
