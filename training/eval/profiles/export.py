"""Profiles out: the trained model's features of every cell, as single-cell and profiling tools read them.

    <run>/profiles/cells.h5ad       AnnData (scanpy): one observation per cell of features/final;
                                    obsm["X_scdino"] the (cells, D) float32 embedding, X empty (no
                                    genes); obs every Metadata_ column of the per-cell table
                                    (categoricals, numbers), Metadata_Path, Metadata_TableRow and
                                    Metadata_Split (train / holdout), indexed by the table row;
                                    uns["scdino"] the provenance: checkpoint, epoch, architecture,
                                    channels, image size, the resolved config.yaml, and
                                    uns["scdino"]["model_card"] the weights' model card
                                    (training/models/card.py); the Parquet files carry the card
                                    as JSON in their schema metadata (card.PARQUET_KEY)
    <run>/profiles/cells.parquet    the same cells as pycytominer reads a profile: Metadata_ columns
                                    first, then the features Cells_scDINO_0000 ... (the Cells_
                                    compartment prefix lets pycytominer's features="infer" find them)
    <run>/profiles/wells.parquet    one row per well (plate and well columns: eval.plate_column and
                                    eval.well_column, Metadata_Plate and Metadata_Well by default):
                                    the median (or mean: eval.profile_aggregation) of its cells'
                                    features, every Metadata_ column all its cells share,
                                    Metadata_Object_Count; skipped with one log line for a
                                    dataset without wells (class folders)
    <run>/profiles/wells_normalized.parquet   with eval.profile_normalization: the per-well
                                    profiles after its steps (per-plate mad_robustize and sphering
                                    on the control wells, Harmony: training/eval/profiles/normalization.py)
    <run>/profiles/wells_subpopulations.parquet   with eval.profile_subpopulations (k): each
                                    well's fraction of cells in each of the k subpopulations
                                    (Cells_scDINO_Subpopulation_00 ...), as retrieval mAP sets
                                    them beside the profile before centring on the controls
                                    (training/eval/profiles/subpopulations.py)
    <run>/profiles/subpopulations.parquet   those k subpopulations: a row each (its name, its
                                    cells here, its centre in the features' columns), the model
                                    card and how they were fitted in the schema metadata
                                    (CENTRES_KEY); eval.profile_subpopulation_centres names a
                                    pilot's such file, so that new plates count the pilot's
                                    subpopulations (`profile` sets it)
    <run>/profiles/export.json      what was written: counts, columns, provenance, seconds

Memory stays bounded at any number of cells: features are read from their memory map and the
per-cell table from its own, ROW_GROUP cells at a time for the Parquet row groups and the AnnData
embedding; obs is written one column at a time (a column of 10^7 codes is 40 MB); the per-well
profiles go a block of wells at a time (training/eval/profiles/wells.py).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from training.config import Config
from training.data.store.cells import METADATA_PREFIX, CellTable
from training.eval.profiles.normalization import check_steps, normalize_profiles
from training.eval.profiles.subpopulations import (
    RESTARTS,
    SAMPLE_CELLS,
    against_pilot,
    read_centres,
    shares_of,
    signatures,
    subpopulation_name,
    subpopulations,
    write_centres,
)
from training.eval.profiles.wells import (
    ProfiledWells,
    comparable_values,
    is_numeric,
    perturbation_column,
    profiled_wells,
)
from training.rundir import RunLayout, tags
from training.rundir.features import FeatureSet, load_features
from training.writes.atomic import atomic_path, check_writable, write_json_atomic

log = logging.getLogger(__name__)

EMBEDDING_KEY = "X_scdino"
"""obsm key of the embedding, as scanpy names a representation (X_pca, X_umap)."""
FEATURE_PREFIX = "Cells_scDINO_"
"""Feature columns: the Cells compartment (the whole cell) then the model, pycytominer's naming."""
PILOT_RECORD = ("control_shares", "perturbation_column", "signatures")
"""What a carried centres file's record says of the pilot's wells, kept beside this export's for the comparison."""
ROW_COLUMN, PATH_COLUMN, SPLIT_COLUMN = "Metadata_TableRow", "Metadata_Path", "Metadata_Split"
SPLIT_NAMES = ["holdout", "train"]
"""Metadata_Split's categories, sorted: code 0 held out, 1 trained on."""
ROW_GROUP = 65536
"""Cells per Parquet row group and per block of the AnnData embedding (384 floats: 100 MB)."""


@dataclass
class ExportSource:
    """What the profiles are made of: the features of table `rows`, the table and each row's split."""

    cells: CellTable
    features: FeatureSet
    held_out: np.ndarray
    """1 for a held-out cell, 0 for one pretraining saw, per table row."""
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> np.ndarray:
        return self.features.indices

    @property
    def feature_names(self) -> list[str]:
        return [f"{FEATURE_PREFIX}{i:04d}" for i in range(self.features.dim)]

    def chunks(self) -> range:
        return range(0, len(self.rows), ROW_GROUP)

    def metadata(self, start: int, stop: int) -> dict[str, pa.Array]:
        """The Metadata_ columns of cells start..stop (their own types; the table's map, sliced)."""
        rows = self.rows[start:stop]
        contiguous = len(rows) and rows[-1] - rows[0] == len(rows) - 1
        table = pa.table({name: self.cells.column(name) for name in ["path", *self.cells.metadata_columns]})
        table = table.slice(int(rows[0]), len(rows)) if contiguous else table.take(rows)
        split = pa.DictionaryArray.from_arrays(pa.array(1 - self.held_out[rows].astype(np.int32)),
                                               pa.array(SPLIT_NAMES))
        columns = {ROW_COLUMN: pa.array(rows), PATH_COLUMN: table.column("path").cast(pa.string())}
        columns.update({name: table.column(name) for name in self.cells.metadata_columns})
        columns[SPLIT_COLUMN] = split
        return columns


def open_source(config: Config, layout: RunLayout, tag: str = tags.FINAL) -> ExportSource:
    """The features of `tag` (features/final: every cell under eval.embed_all_cells), memory-mapped,
    the per-cell table and the split."""
    from training.data.dataset import open_images
    from training.data.split import load_split

    images = open_images(config)
    features = load_features(layout.features(tag), mmap=True)
    cells = cell_table(images)
    held_out = np.zeros(len(images), np.uint8)
    held_out[load_split(config, images).holdout] = 1
    if len(features.indices) < len(images):
        log.info("features/%s holds %d of the %d cells (eval.embed_all_cells is false, or `features` ran before it "
                 "was set): exporting those", tag, len(features.indices), len(images))
    return ExportSource(cells, features, held_out, provenance(config, layout, features, tag))


def cell_table(images) -> CellTable:
    """The per-cell table of a packed dataset; for a TIFF folder, one of its paths and class folders."""
    table = getattr(images, "table", None)
    if table is not None:
        return table
    names = np.asarray(images.class_names, dtype=object)
    return CellTable(Path("cells"), table=pa.table({"path": pa.array(list(images.paths), pa.string()),
                                                    "Metadata_Class": pa.array(list(names[images.labels]))}))


def provenance(config: Config, layout: RunLayout, features: FeatureSet, tag: str) -> dict[str, Any]:
    """Where the features came from: the feature set's record (checkpoint, epoch, architecture, ...)
    and the run's resolved configuration."""
    kept = ("kind", "checkpoint", "epoch", "checkpoint_key", "arch", "patch_size", "image_size", "resize",
            "normalize", "normalization", "channels", "cells")
    record = {key: features.meta[key] for key in kept if features.meta.get(key) is not None}
    config_text = layout.config.read_text() if layout.config.is_file() else ""
    return {"run": config.run.name, "tag": tag, "features": record, "dim": features.dim,
            "data_source": config.data.source, "config_yaml": config_text,
            "model_card": features.meta.get("model_card")}


def card_metadata(source: ExportSource) -> dict[bytes, bytes] | None:
    """The Parquet schema metadata that carries the model card, None without one."""
    from training.models.card import PARQUET_KEY

    card = source.provenance.get("model_card")
    return {PARQUET_KEY: json.dumps(card).encode()} if card else None


def metadata_only(table: pa.Table) -> list[str]:
    """The columns Parquet may dictionary-encode: the metadata. Trying it on each float feature
    column made writing 7 times slower and the file 1.5 times larger (65,536 x 384, measured)."""
    return [name for name in table.column_names if name.startswith(METADATA_PREFIX)]


def write_cells_parquet(path: Path, source: ExportSource) -> None:
    """Per-cell profiles, one row group per ROW_GROUP cells."""
    import pyarrow.parquet as pq

    names = source.feature_names
    with atomic_path(path) as tmp:
        writer = None
        for start in source.chunks():
            stop = min(start + ROW_GROUP, len(source.rows))
            block = np.ascontiguousarray(np.asarray(source.features.features[start:stop], np.float32).T)
            columns = {**source.metadata(start, stop), **{n: pa.array(block[i]) for i, n in enumerate(names)}}
            batch = pa.table(columns)
            if writer is None:
                writer = pq.ParquetWriter(tmp, batch.schema.with_metadata(card_metadata(source)),
                                          use_dictionary=metadata_only(batch))
            writer.write_table(batch, row_group_size=ROW_GROUP)
        if writer is not None:
            writer.close()
        else:
            pq.write_table(pa.table({ROW_COLUMN: pa.array([], pa.int64())}), tmp)


def _string_dataset(group, name: str, values) -> None:
    """A string column written ROW_GROUP values at a time (anndata's string-array encoding)."""
    import h5py

    dataset = group.create_dataset(name, shape=(len(values),), dtype=h5py.string_dtype())
    dataset.attrs.update({"encoding-type": "string-array", "encoding-version": "0.2.0"})
    for start in range(0, len(values), ROW_GROUP):
        dataset[start:start + ROW_GROUP] = np.asarray(values[start:start + ROW_GROUP], dtype=object)


def _obs_column(source: ExportSource, name: str):
    """One Metadata_ column of the exported cells: numbers as they are, anything else categorical."""
    import pandas as pd

    if is_numeric(source.cells, name):
        return np.asarray(comparable_values(source.cells, name)[source.rows])
    categories = source.cells.categories(name)
    return pd.Categorical.from_codes(categories.codes[source.rows], categories=categories.names)


def write_obs(file, source: ExportSource) -> None:
    """obs as anndata lays out a DataFrame, one column at a time: index the table row (as text)."""
    import pandas as pd
    from anndata.io import write_elem

    columns = [ROW_COLUMN, PATH_COLUMN, *source.cells.metadata_columns, SPLIT_COLUMN]
    obs = file.create_group("obs")
    obs.attrs.update({"encoding-type": "dataframe", "encoding-version": "0.2.0", "_index": "_index",
                      "column-order": np.asarray(columns, dtype=object)})
    _string_dataset(obs, "_index", _RowNames(source.rows))
    write_elem(obs, ROW_COLUMN, np.asarray(source.rows, np.int64))
    _string_dataset(obs, PATH_COLUMN, _Paths(source))
    for name in source.cells.metadata_columns:
        write_elem(obs, name, _obs_column(source, name))
    split = 1 - source.held_out[source.rows].astype(np.int8)
    write_elem(obs, SPLIT_COLUMN, pd.Categorical.from_codes(split, categories=SPLIT_NAMES))


class _RowNames:
    """Table rows as obs names ("0", "1", ...), made a slice at a time."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, part: slice) -> np.ndarray:
        return self.rows[part].astype(str)


class _Paths(_RowNames):
    """The cells' paths, read from the table a slice at a time."""

    def __init__(self, source: ExportSource) -> None:
        super().__init__(source.rows)
        self.paths = source.cells.strings("path")

    def __getitem__(self, part: slice) -> list[str]:
        return self.paths.take(self.rows[part])


def write_embedding(file, source: ExportSource) -> None:
    """obsm[EMBEDDING_KEY], copied ROW_GROUP rows at a time from the memory-mapped features."""
    obsm = file.create_group("obsm")
    obsm.attrs.update({"encoding-type": "dict", "encoding-version": "0.1.0"})
    n, dim = len(source.rows), source.features.dim
    chunks = (max(1, min(n, 4096)), dim) if n and dim else None
    dataset = obsm.create_dataset(EMBEDDING_KEY, shape=(n, dim), dtype=np.float32, chunks=chunks)
    dataset.attrs.update({"encoding-type": "array", "encoding-version": "0.2.0"})
    for start in source.chunks():
        dataset[start:start + ROW_GROUP] = np.asarray(source.features.features[start:start + ROW_GROUP], np.float32)


def write_h5ad(path: Path, source: ExportSource) -> None:
    """cells.h5ad in anndata's on-disk layout, written piece by piece so memory stays bounded; read
    back whole by anndata.read_h5ad (or lazily with backed="r")."""
    import h5py
    import pandas as pd
    from anndata.io import write_elem

    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as file:
            file.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})
            write_obs(file, source)
            write_elem(file, "var", pd.DataFrame(index=pd.Index([], dtype=object)))
            write_embedding(file, source)
            for empty in ("layers", "obsp", "varm", "varp"):
                write_elem(file, empty, {})
            write_elem(file, "uns", {"scdino": _storable(source.provenance)})


def _storable(value: Any) -> Any:
    """A provenance record as HDF5 attributes hold it: None becomes "" (HDF5 has no null)."""
    if isinstance(value, dict):
        return {key: _storable(item) for key, item in value.items()}
    return "" if value is None else value


def write_wells_parquet(path: Path, wells: ProfiledWells, profiles: np.ndarray, names: list[str],
                        schema_metadata: dict[bytes, bytes] | None = None) -> None:
    import pyarrow.parquet as pq

    features = {name: pa.array(np.ascontiguousarray(profiles[:, i], np.float32)) for i, name in enumerate(names)}
    table = pa.table({**wells.metadata, **features}).replace_schema_metadata(schema_metadata)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, use_dictionary=metadata_only(table))


def export_profiles(config: Config, layout: RunLayout, tag: str = tags.FINAL) -> dict[str, Any]:
    """Write every file of the module docstring; returns export.json's payload."""
    start = time.perf_counter()
    check_steps(config.eval.profile_normalization, controls=bool(config.data.control_column),
                batches=bool(config.data.batch_column), mad_samples=config.eval.mad_robustize_samples)
    check_writable([layout.profiles_h5ad, layout.profiles_cells, layout.profiles_wells,
                    layout.profiles_wells_normalized, layout.profiles_wells_subpopulations,
                    layout.profiles_subpopulations, layout.profiles_manifest])
    source = open_source(config, layout, tag)
    timed, subpopulations_record = Timed(layout), {}
    timed(layout.profiles_h5ad, write_h5ad, source)
    timed(layout.profiles_cells, write_cells_parquet, source)
    wells = profiled_wells(config, source.cells, source.features.features, source.rows)
    if wells is not None:
        timed(layout.profiles_wells, write_wells_parquet, wells, wells.profiles, source.feature_names,
              card_metadata(source))
        if config.eval.profile_normalization:
            normalized, kept = normalize_profiles(wells.profiles, config.eval.profile_normalization,
                                                  wells.context(config))
            names = [source.feature_names[i] for i in kept]
            timed(layout.profiles_wells_normalized, write_wells_parquet, wells, normalized, names,
                  card_metadata(source))
        if config.eval.profile_subpopulations:
            subpopulations_record = export_subpopulations(config, layout, source, wells, timed)
    manifest = export_record(config, layout, source, wells, list(timed.seconds))
    if subpopulations_record:
        manifest["wells"].update(subpopulations_record)
    manifest["seconds"] = round(time.perf_counter() - start, 3)
    manifest["seconds_per_file"] = {path.relative_to(layout.root).as_posix(): s for path, s in timed.seconds.items()}
    write_json_atomic(layout.profiles_manifest, manifest, indent=2)
    return manifest


def export_subpopulations(config: Config, layout: RunLayout, source: ExportSource, wells: ProfiledWells,
                          timed: Timed) -> dict[str, Any]:
    """wells_subpopulations.parquet and subpopulations.parquet; returns what export.json adds: where the
    centres came from and, for a pilot's, how far this screen's control wells lie from the pilot's in
    them (subpopulations.controls_shift)."""
    centres, about = export_centres(config, source, wells)
    shares = shares_of(source.features.features, wells.grouping, centres)
    timed(layout.profiles_wells_subpopulations, write_wells_parquet, wells, shares,
          [subpopulation_name(i) for i in range(len(centres))], card_metadata(source))
    counts = np.rint(shares * wells.grouping.sizes[:, None]).sum(axis=0).astype(np.int64)
    record: dict[str, Any] = {"subpopulation_centres": config.eval.profile_subpopulation_centres or "fitted here"}
    if wells.controls is not None and wells.controls.any():
        name = perturbation_column(source.cells, config)
        perturbations = np.asarray(wells.metadata[name].to_pylist(), dtype=object) if name in wells.metadata \
            else None
        about["control_shares"] = [round(float(v), 6) for v in shares[wells.controls].mean(axis=0)]
        if perturbations is not None:
            about.update(perturbation_column=name, signatures=signatures(shares, perturbations, wells.controls))
        pilot = about.get("pilot", {})
        if "control_shares" in pilot:
            same_column = pilot.get("perturbation_column") == about.get("perturbation_column")
            versus = against_pilot(np.asarray(about["control_shares"]), about.get("signatures", {}),
                                   pilot if same_column else {"control_shares": pilot["control_shares"]})
            about["versus_pilot"] = record["subpopulations_versus_pilot"] = versus
            log.info("subpopulations against the pilot's: the control wells lie %.3f from its controls (total "
                     "variation: 0 the same, 1 disjoint)%s", versus["controls_shift"],
                     f"; of {versus['perturbations']} perturbations in both, {versus['nearest_is_itself']} are "
                     f"nearest their own (cosine {versus['cosine_same']:.2f}, to the others "
                     f"{versus['cosine_others']:.2f})" if "nearest_is_itself" in versus else "")
    timed(layout.profiles_subpopulations, write_centres, centres, source.feature_names, counts,
          source.provenance.get("model_card"), about)
    return record


def export_centres(config: Config, source: ExportSource, wells: ProfiledWells) -> tuple[np.ndarray, dict[str, Any]]:
    """The subpopulations the wells' shares count: eval.profile_subpopulation_centres' (a pilot's,
    checked to be of the same model's features), else k-means on the export's cells; with the record
    subpopulations.parquet keeps of them."""
    k, seed, tag = config.eval.profile_subpopulations, config.run.seed, source.provenance.get("tag")
    if config.eval.profile_subpopulation_centres:
        carried = read_centres(config.eval.profile_subpopulation_centres)
        carried.check(source.provenance.get("model_card"), source.features.dim, k, f"features/{tag}")
        fitted = carried.about.get("fitted", {})
        log.info("subpopulations: the %d of %s (fitted on %s cells of run %s)", carried.k, carried.path,
                 fitted.get("cells", "?"), fitted.get("run", "?"))
        return carried.centres, {"carried_from": str(carried.path), "fitted": fitted,
                                 "pilot": {key: carried.about[key] for key in PILOT_RECORD if key in carried.about}}
    centres = subpopulations(source.features.features, wells.grouping.order, k, seed)
    fitted = {"tag": tag, "run": source.provenance.get("run"), "cells": int(wells.grouping.order.size), "seed": seed,
              "sample": min(int(wells.grouping.order.size), SAMPLE_CELLS), "restarts": RESTARTS,
              "method": "k-means (scikit-learn) on L2-normalised features"}
    return centres, {"fitted": fitted}


class Timed:
    """Writes a file through a function and logs how long it took."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout, self.seconds = layout, {}

    def __call__(self, path: Path, write, *args) -> None:
        start = time.perf_counter()
        write(path, *args)
        self.seconds[path] = round(time.perf_counter() - start, 3)
        log.info("wrote %s (%.1f MB) in %.1f s", path.relative_to(self.layout.root), path.stat().st_size / 1e6,
                 self.seconds[path])


def export_record(config: Config, layout: RunLayout, source: ExportSource, wells: ProfiledWells | None,
                  written: list[Path]) -> dict[str, Any]:
    """export.json: the files, what they hold and where the features came from."""
    meta = source.cells.metadata_columns
    record = {"files": [p.relative_to(layout.root).as_posix() for p in written], "n_cells": int(len(source.rows)),
              "n_held_out": int(source.held_out[source.rows].sum()), "dim": source.features.dim,
              "embedding": f"obsm[{EMBEDDING_KEY!r}]", "feature_columns": f"{FEATURE_PREFIX}0000 .. "
              f"{FEATURE_PREFIX}{source.features.dim - 1:04d}", "metadata_columns": [ROW_COLUMN, PATH_COLUMN, *meta,
                                                                                    SPLIT_COLUMN],
              "provenance": {k: v for k, v in source.provenance.items() if k != "config_yaml"}}
    if wells is None:
        record["wells"] = None
        record["wells_skipped"] = "no plate and well columns"
    else:
        record["wells"] = {"plate_column": wells.columns[0], "well_column": wells.columns[1],
                           "n_wells": int(len(wells.profiles)), "cells_without_well": wells.cells_without_well,
                           "aggregation": config.eval.profile_aggregation,
                           "metadata_columns": [n for n in wells.metadata if n.startswith(METADATA_PREFIX)],
                           "normalization": list(config.eval.profile_normalization) or ["none"],
                           **({"subpopulations": config.eval.profile_subpopulations}
                              if config.eval.profile_subpopulations else {})}
    return record
