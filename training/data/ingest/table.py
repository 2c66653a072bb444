"""The load table of `ingest`: one row per field of view, in CellProfiler's LoadData naming.

    FileName_<Channel>, PathName_<Channel>              an image (TIFF, OME-TIFF or OME-Zarr) per channel,
                                                        or one multi-channel file under one name
    ObjectsFileName_<Objects>, ObjectsPathName_<Objects>  the field's label mask (0 background, 1..n)
    anything else                                       metadata, carried to every cell of the field

A PathName_ is resolved from the folder that holds the table unless it is absolute; a missing
PathName_ column means that folder. A URL (JUMP's s3:// folders) or another machine's absolute path
is read where ingest.path_map maps it (paths.py). Metadata columns get the Metadata_ prefix where they lack it
(Plate -> Metadata_Plate); their values are kept as written (a CSV is read as text, so "0001"
stays "0001"; a Parquet file keeps its types). Every problem with a row names the table, the row
(the 1-based data row, header not counted: CellProfiler's ImageNumber), the column and the file:
"load_data.csv row 18: FileName_DNA: no such file images/P1/A01_DNA.tif".

A per-object table of centres (ingest.centres) stands in for the masks: CentresTable.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from training.config import Config
from training.data.ingest.crops import Objects
from training.data.ingest.paths import Location, PathMap, locate, suggested_prefix
from training.data.store.cells import METADATA_PREFIX
from training.errors import UserError

FIELD_COLUMNS = ("Metadata_FieldOfView", "Metadata_ObjectNumber", "Metadata_Center_X", "Metadata_Center_Y",
                 "Metadata_Area")
"""The columns `ingest` adds to every cell: its field's row in the load table (1-based), its label,
its centroid (x column, y row) and its area in pixels (-1 where unknown)."""
ADDRESS = re.compile(r"^(Objects)?(FileName|PathName|URL|Series|Frame)_(.+)$")
"""LoadData's columns that say where an image or mask is, not what it shows."""
KEY_SEPARATOR = "\x1f"
CENTRE_COLUMNS = (("Location_Center_X", "Location_Center_Y"), ("AreaShape_Center_X", "AreaShape_Center_Y"))


class BadField(Exception):
    """A field of view that cannot be used: its row, the column at fault and why."""

    def __init__(self, table: str, row: int, column: str, problem: str) -> None:
        super().__init__(f"{table} row {row}: {column}: {problem}")
        self.table, self.row, self.column, self.problem = table, row, column, problem


class UnmappedPath(BadField):
    """A row's file named by a URL or another machine's absolute path that ingest.path_map does not map."""


def read_user_table(path: Path, setting: str) -> pd.DataFrame:
    """A CSV (every value as text, empty cells missing) or Parquet table; UserError when it cannot be read."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{setting}={path} is a folder: give the path of the CSV or Parquet table")
    if not path.is_file():
        raise UserError(f"{setting}={path}: no such file; give the path of the CSV or Parquet table")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except Exception as exc:  # pandas and pyarrow raise many types for unreadable files
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{setting}={path}: not a readable CSV or Parquet table ({first})") from None


@dataclass(frozen=True)
class ImageColumn:
    name: str
    file: str
    path: str | None


@dataclass(frozen=True)
class FieldSpec:
    """One row of the load table: where its images and mask are, and its metadata."""

    row: int
    name: str
    images: list[tuple[str, Path]]
    mask: tuple[str, Path] | None
    metadata: dict[str, Any]


class LoadTable:
    """The load table read and checked against the configuration (columns only; files are read per field)."""

    def __init__(self, config: Config) -> None:
        settings = config.ingest
        self.path = Path(settings.table)
        self.folder = self.path.parent
        self.name = self.path.name
        self.path_map = PathMap(settings.path_map)
        self.frame = read_user_table(self.path, "ingest.table")
        if not len(self.frame):
            raise UserError(f"ingest.table={self.path} has no rows: it needs one row per field of view")
        columns = [str(c) for c in self.frame.columns]
        self.images = self._image_columns(columns, settings.channels)
        self.objects = self._objects_column(columns, settings.objects, bool(settings.centres))
        self._check_addresses(columns)
        self.metadata = self._metadata_columns(columns)

    def __len__(self) -> int:
        return len(self.frame)

    def _missing(self, column: str, why: str, columns: list[str], kind: str) -> UserError:
        have = [c for c in columns if c.startswith(kind)] or ["none"]
        return UserError(f"{self.name}: no column {column} ({why}); its {kind}* columns: {', '.join(have)}")

    def _image_columns(self, columns: list[str], channels: tuple[str, ...]) -> list[ImageColumn]:
        names = list(channels) or [c[len("FileName_"):] for c in columns if c.startswith("FileName_")]
        if not names:
            raise UserError(f"{self.name}: no FileName_<Channel> column: LoadData names each image file in "
                            "FileName_<Channel> and its folder in PathName_<Channel>")
        found = []
        for name in names:
            if f"FileName_{name}" not in columns:
                raise self._missing(f"FileName_{name}", f"ingest.channels names {name}", columns, "FileName_")
            path = f"PathName_{name}" if f"PathName_{name}" in columns else None
            found.append(ImageColumn(name, f"FileName_{name}", path))
        return found

    def _objects_column(self, columns: list[str], objects: str, centres: bool) -> ImageColumn | None:
        listed = [c[len("ObjectsFileName_"):] for c in columns if c.startswith("ObjectsFileName_")]
        if centres:
            return None
        if not objects:
            if len(listed) != 1:
                found = ", ".join(listed) or "none"
                raise UserError(f"{self.name}: set ingest.objects to the objects whose label masks segment the cells "
                                f"(ObjectsFileName_<Objects> columns: {found}), or ingest.centres to a table of centres")
            objects = listed[0]
        if f"ObjectsFileName_{objects}" not in columns:
            raise self._missing(f"ObjectsFileName_{objects}", f"ingest.objects={objects}", columns, "ObjectsFileName_")
        path = f"ObjectsPathName_{objects}" if f"ObjectsPathName_{objects}" in columns else None
        return ImageColumn(objects, f"ObjectsFileName_{objects}", path)

    def _check_addresses(self, columns: list[str]) -> None:
        """Columns that would pick another plane or file than FileName_/PathName_ say are refused."""
        for column in columns:
            match = ADDRESS.match(column)
            if not match or match.group(2) in ("FileName", "PathName"):
                continue
            values = self.frame[column].dropna().astype(str)
            if match.group(2) == "URL" and f"{match.group(1) or ''}FileName_{match.group(3)}" in columns:
                continue
            if match.group(2) in ("Series", "Frame") and values.isin(["0", "0.0"]).all():
                continue
            raise UserError(f"{self.name}: column {column}: ingest reads whole files named by FileName_ and "
                            "PathName_ (one plane per channel, or one multi-channel file), not LoadData's URL_, "
                            "Series_ or Frame_ addressing: give FileName_/PathName_ columns instead")

    def _metadata_columns(self, columns: list[str]) -> dict[str, str]:
        """Table column -> per-cell column (Metadata_-prefixed), for every column that is not an address."""
        chosen = {c: c if c.startswith(METADATA_PREFIX) else METADATA_PREFIX + c
                  for c in columns if not ADDRESS.match(c)}
        taken: dict[str, str] = {}
        for column, name in chosen.items():
            if name in FIELD_COLUMNS:
                raise UserError(f"{self.name}: column {column} would become {name}, which ingest writes itself "
                                f"(the cell's field, number, centre and area): rename the column")
            if name in taken:
                raise UserError(f"{self.name}: columns {taken[name]} and {column} would both become {name}: "
                                "rename one of them")
            taken[name] = column
        return chosen

    def field(self, index: int) -> FieldSpec:
        """Row `index` (0-based) as a FieldSpec; BadField when a file name is missing. Values are read
        column by column (a row of a Parquet table read whole would turn its integers into floats)."""
        number = index + 1
        images = [(column.file, self.resolve(index, column)) for column in self.images]
        mask = (self.objects.file, self.resolve(index, self.objects)) if self.objects else None
        metadata = {name: _plain(self._values[column][index]) for column, name in self.metadata.items()}
        return FieldSpec(number, self._field_name(images[0][1]), images, mask, metadata)

    @property
    def _values(self) -> dict[str, np.ndarray]:
        if not hasattr(self, "_columns"):
            self._columns = {str(c): self.frame[c].to_numpy() for c in self.frame.columns}
        return self._columns

    def resolve(self, index: int, column: ImageColumn) -> Path:
        """Where the file of row `index` (0-based) and `column` is read from (paths.py): BadField when
        the row names none, or names a URL or another machine's path that ingest.path_map does not map."""
        number, location = index + 1, self.locate(index, column)
        if location.path is None:
            raise UnmappedPath(self.name, number, location.column, f"{location.written} is not a path on this "
                               "machine: map its prefix onto the folder that holds the files with ingest.path_map "
                               f"(e.g. [{suggested_prefix(location.written)}, /fsx/data/...])")
        if location.written.startswith("/") and not location.mapped and not location.path.parent.exists():
            raise UnmappedPath(self.name, number, location.column, f"no such file {location.path}, nor its folder "
                               "(a path of another machine? map its prefix onto the folder that holds the files here "
                               f"with ingest.path_map, e.g. [{suggested_prefix(location.written)}, /fsx/data/...])")
        return location.path

    def locate(self, index: int, column: ImageColumn) -> Location:
        """Row `index`'s file of `column` as written and as mapped; BadField when the row names none."""
        name = _plain(self._values[column.file][index])
        if name is None or not str(name).strip():
            raise BadField(self.name, index + 1, column.file, "no file name")
        folder = _plain(self._values[column.path][index]) if column.path else None
        return locate(self.folder, column.file, str(name), column.path, None if folder is None else str(folder),
                      self.path_map)

    def _field_name(self, path: Path) -> str:
        """The field's name in each cell's path: its first image relative to the table's folder (as
        given when it lies outside that folder)."""
        relative = Path(os.path.relpath(path, self.folder)).as_posix()
        return str(path) if relative.startswith("..") else relative


def _plain(value: Any) -> Any:
    """A table value as a plain Python value (None where missing)."""
    if value is None or (not isinstance(value, (str, bytes)) and pd.isna(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value


class CentresTable:
    """ingest.centres: a per-object table of centres, grouped by the field each row belongs to."""

    def __init__(self, config: Config, load: LoadTable) -> None:
        self.path = Path(config.ingest.centres)
        frame = read_user_table(self.path, "ingest.centres")
        columns = [str(c) for c in frame.columns]
        self.x_column, self.y_column = self._centre_columns(columns, config.ingest.objects)
        self.number_column = _suffixed(columns, "ObjectNumber")
        self.area_column = _suffixed(columns, "AreaShape_Area")
        self.keys = self._keys(columns, load)
        coordinates = frame[[self.x_column, self.y_column]].apply(pd.to_numeric, errors="coerce")
        bad = coordinates.isna().any(axis=1).to_numpy()
        if bad.any():
            first = int(np.flatnonzero(bad)[0]) + 1
            raise UserError(f"{self.path.name} row {first}: {self.x_column}/{self.y_column}: not a number "
                            f"({int(bad.sum())} row(s) so): every object needs a centre")
        self.x = coordinates[self.x_column].to_numpy(np.float64)
        self.y = coordinates[self.y_column].to_numpy(np.float64)
        self.numbers = self._numbers(frame)
        self.area = self._area(frame)
        self.groups = frame.groupby(self._join(frame, [column for column, _ in self.keys]), sort=False).indices
        fields = set(self.field_keys(load))
        self.unmatched = int(sum(len(rows) for key, rows in self.groups.items() if key not in fields))
        """Objects whose field is not in the load table (counted in the report, not silently lost)."""

    def _centre_columns(self, columns: list[str], objects: str) -> tuple[str, str]:
        for x, y in CENTRE_COLUMNS:
            found = (_suffixed(columns, x), _suffixed(columns, y))
            if all(found):
                return found  # type: ignore[return-value]
        raise UserError(f"ingest.centres={self.path}: no centre columns: name them Location_Center_X and "
                        "Location_Center_Y (or AreaShape_Center_X/Y, CellProfiler's names; a prefix such as "
                        f"Cells_ is allowed); its columns: {', '.join(columns[:20])}")

    def _keys(self, columns: list[str], load: LoadTable) -> list[tuple[str, str]]:
        """(centres column, load-table column or "" for the row number) pairs that link an object to its field."""
        if "ImageNumber" in columns:
            return [("ImageNumber", "ImageNumber" if "ImageNumber" in load.metadata else "")]
        by_name = {name: column for column, name in load.metadata.items()}
        shared = [(c, by_name[c]) for c in columns if c.startswith(METADATA_PREFIX) and c in by_name]
        if not shared:
            raise UserError(f"ingest.centres={self.path}: nothing links its objects to the fields of "
                            f"{load.name}: give it an ImageNumber column (the field's 1-based row) or Metadata_ "
                            "columns that the load table has too (e.g. Metadata_Plate, Metadata_Well, Metadata_Site)")
        return shared

    def _join(self, frame: pd.DataFrame, keys: list[str]) -> pd.Series:
        """One text key per row: the linking values joined (missing values as empty text)."""
        parts = [frame[column].astype(object).where(frame[column].notna(), "").astype(str) for column in keys]
        joined = parts[0]
        for part in parts[1:]:
            joined = joined + KEY_SEPARATOR + part
        return joined

    def field_keys(self, load: LoadTable) -> pd.Series:
        """The key of every field of the load table, in row order."""
        frame = load.frame.copy()
        frame[""] = np.arange(1, len(frame) + 1)
        return self._join(frame, [column for _, column in self.keys])

    def _numbers(self, frame: pd.DataFrame) -> np.ndarray:
        if self.number_column is None:
            return np.zeros(len(frame), np.int64)
        numbers = pd.to_numeric(frame[self.number_column], errors="coerce")
        if numbers.isna().any():
            first = int(np.flatnonzero(numbers.isna().to_numpy())[0]) + 1
            raise UserError(f"{self.path.name} row {first}: {self.number_column}: not a number")
        return numbers.to_numpy(np.int64)

    def _area(self, frame: pd.DataFrame) -> np.ndarray:
        if self.area_column is None:
            return np.full(len(frame), -1, np.int64)
        area = pd.to_numeric(frame[self.area_column], errors="coerce")
        return area.fillna(-1).round().to_numpy(np.int64)

    def objects_of(self, key: str) -> Objects:
        """The objects of the field of `key` (field_keys), in table order; numbered 1..n in that order
        when the table has no ObjectNumber."""
        rows = self.groups.get(key, np.zeros(0, np.intp))
        numbers = self.numbers[rows] if self.number_column else np.arange(1, len(rows) + 1, dtype=np.int64)
        return Objects(numbers, self.x[rows], self.y[rows], self.area[rows])


def _suffixed(columns: list[str], name: str) -> str | None:
    """`name`, or the one column ending in _`name` (CellProfiler prefixes object tables' columns, Cells_...)."""
    if name in columns:
        return name
    found = [c for c in columns if c.endswith("_" + name)]
    return found[0] if len(found) == 1 else None
