"""Where a load table's files are: a row's PathName_ and FileName_ joined, a foreign prefix mapped
(ingest.path_map), then resolved from the table's folder.

Tables travel without their images. JUMP's (the Cell Painting Gallery's load_data.csv) name each
image by an S3 folder and a file,

    PathName_OrigDNA  s3://cellpainting-gallery/cpg0016-jump/source_4/images/<batch>/images/<plate>/Images/
    FileName_OrigDNA  r01c01f01p01-ch5sk1fk1fl1.tiff

and a table written on a lab's workstation names the absolute folders there. ingest.path_map maps
such prefixes onto the folders that hold the files here, the longest prefix first; a prefix ends at a
"/", so s3://b/x maps s3://b/x/y and never s3://b/xy. What no entry maps stays as written: a
relative path is resolved from the table's folder, an absolute one is used as it is, and a URL is
refused (it names a server, not a file of this machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.config.ingest import URL_SCHEME


class PathMap:
    """ingest.path_map: prefix -> prefix, the longest matching prefix winning."""

    def __init__(self, entries: tuple[tuple[str, str], ...] = ()) -> None:
        pairs = [(source.rstrip("/"), target) for source, target in entries]
        self.entries = sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def apply(self, location: str) -> str | None:
        """`location` with its longest mapped prefix replaced; None when no entry maps it."""
        for source, target in self.entries:
            if location == source or location.startswith(source + "/"):
                rest = location[len(source):].lstrip("/")
                return f"{target.rstrip('/')}/{rest}" if rest else target
        return None


@dataclass(frozen=True)
class Location:
    """One file of a row: where the table says it is, and where it is read from."""

    written: str
    """PathName_ and FileName_ joined as the table writes them (an s3:// URL, an absolute or a relative path)."""
    column: str
    """The column that makes it foreign: the PathName_ column when it gives the folder, else the FileName_ one."""
    path: Path | None
    """The file on this machine: mapped, then resolved from the table's folder; None for a URL no entry maps."""
    mapped: bool


def locate(folder: Path, file_column: str, file_name: str, path_column: str | None, path_name: str | None,
           path_map: PathMap) -> Location:
    """Join a row's PathName_ and FileName_ values, map them, and resolve what is relative from `folder`."""
    folder_given = bool(path_name and path_name.strip()) and not _absolute(file_name)
    written = f"{path_name.rstrip('/')}/{file_name}" if folder_given else file_name
    column = path_column if folder_given and path_column else file_column
    mapped = path_map.apply(written)
    if mapped is None and URL_SCHEME.match(written):
        return Location(written, column, None, False)
    return Location(written, column, folder / (mapped if mapped is not None else written), mapped is not None)


def _absolute(name: str) -> bool:
    return name.startswith("/") or bool(URL_SCHEME.match(name))


def suggested_prefix(written: str) -> str:
    """The part of an unmapped location a path_map entry would name: a URL's server and bucket, or an
    absolute path's first two folders."""
    if URL_SCHEME.match(written):
        scheme, _, rest = written.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}/"
    parts = [part for part in written.split("/") if part][:2]
    return "/" + "/".join(parts) + "/"
