"""Settings of `ingest` that cannot work, refused before any field is cut, each by what it is (a
load table unset or a split it cannot draw, a column named that the cells will not have, a label or
batch column of one value, a control value in no row, paths that point elsewhere and are not mapped,
a crop smaller than one patch or larger than the fields), and the crop size proposed from the
objects' sizes when none is set."""

from __future__ import annotations

from typing import Any

import numpy as np

from training.config import Config
from training.data.ingest.crops import measure_objects, object_extents, propose_crop_size
from training.data.ingest.fields import PROBE_ROWS, first_readable_field, read_field
from training.data.ingest.table import FIELD_COLUMNS, BadField, CentresTable, LoadTable, UnmappedPath
from training.data.store.cells import column_name
from training.errors import UserError


def check_settings(config: Config) -> None:
    if not config.ingest.table:
        raise UserError("ingest.table is not set: name the load table (CSV or Parquet, one row per field of view), "
                        "e.g. --set ingest.table=screen/load_data.csv; class folders of single cells go to `prepare`")
    if config.data.split_method == "scdino":
        raise UserError("data.split_method=scdino draws scDINO's split over a folder of images, and ingest cuts cells "
                        "out of fields of view: set data.split_method=stratified")


def check_columns(config: Config, load: LoadTable) -> None:
    """data.label_column, batch_column and control_column name columns the cells will have, a label
    or batch column of the load table has two values or more, and data.control_value is in a row of
    its column: checked before any cell is cut rather than when the split is drawn or the wells are
    profiled."""
    columns = [*load.metadata.values(), *FIELD_COLUMNS]
    found = {}
    for setting in ("label_column", "batch_column", "control_column"):
        name = getattr(config.data, setting)
        if name:
            try:
                found[setting] = column_name(columns, name, f"data.{setting}")
            except UserError:
                raise UserError(f"data.{setting}={name!r} names no column of {load.name} (its metadata columns, "
                                f"Metadata_-prefixed: {', '.join(load.metadata.values())}): set data.{setting} "
                                "to one of them") from None
    table_column = {cell: column for column, cell in load.metadata.items()}  # ingest's own columns are in none
    for setting, why in (("label_column", "the classes the split, kNN and the probe tell apart need two or more"),
                         ("batch_column", "not-same-batch kNN needs cells of another batch to compare with")):
        if setting in found and found[setting] in table_column:
            values = column_values(load, table_column[found[setting]])
            if len(values) < 2:
                held = f"one value ({values[0]!r})" if values else "no value"
                raise UserError(f"data.{setting}={getattr(config.data, setting)!r} holds {held} in every row of "
                                f"{load.name}: {why}; name another column, or leave data.{setting} empty")
    if "control_column" in found and found["control_column"] in table_column and config.data.control_value:
        values = column_values(load, table_column[found["control_column"]])
        if config.data.control_value not in values:
            shown = ", ".join(map(repr, values[:10])) + (", ..." if len(values) > 10 else "")
            raise UserError(f"data.control_value={config.data.control_value!r} is in no row of {load.name}'s "
                            f"{table_column[found['control_column']]} (its values: {shown}): set data.control_value "
                            "to the controls' value")


def column_values(load: LoadTable, column: str) -> list[str]:
    """The distinct values of a load-table column as text (as the cells' categories read them), sorted."""
    return sorted({str(value) for value in load.frame[column].dropna().tolist()})


def check_paths(load: LoadTable) -> None:
    """Stop before any field is cut when none of the leading rows' files is on this machine because
    their paths point elsewhere (a table from another machine or JUMP's s3:// folders, and no
    ingest.path_map for them): every field would be skipped, one warning each."""
    unmapped = []
    for index in range(min(PROBE_ROWS, len(load))):
        try:
            load.field(index)
        except UnmappedPath as bad:
            unmapped.append(bad)
            continue
        except BadField:
            pass
        return
    if unmapped:
        raise UserError(f"{unmapped[0]}; the first {len(unmapped)} row(s) alike, so ingest stopped before cutting")


def require_crop_size(config: Config, load: LoadTable) -> None:
    """ingest.crop_size must be set; when it is not, the error proposes one."""
    if config.ingest.crop_size:
        return
    proposal = propose(config, load)
    if "crop_size" not in proposal:
        raise UserError("ingest.crop_size is not set, and no object was found to propose one: set it in pixels")
    raise UserError(f"ingest.crop_size is not set: {proposal['objects']:,} objects of {proposal['from']} "
                    f"(median area {proposal['area_median']:.0f} px, 95 % reaching {proposal['reach_p95']} px from "
                    f"their centre) suggest ingest.crop_size: {proposal['crop_size']}; set it (--set "
                    f"ingest.crop_size={proposal['crop_size']})")


def check_crop_size(config: Config, load: LoadTable) -> None:
    """Refuse, before any cell is cut, a crop no model or field can take: smaller than one patch of
    the model (model.patch_size), or, with ingest.edge=skip, larger than the fields of view (the
    first readable one's size), where every object would be skipped."""
    size, patch = config.ingest.crop_size, config.model.patch_size
    if size < patch:
        raise UserError(f"ingest.crop_size={size} px is smaller than one patch of the model (model.patch_size="
                        f"{patch} px), the smallest piece of an image the ViT reads: set ingest.crop_size to {patch} "
                        "px or more (`ingest --propose-crop-size` proposes one from the cells' sizes)")
    found = first_readable_field(load, config.data.channel_axis)
    if found is None or config.ingest.edge != "skip":
        return
    spec, sources, _ = found
    height, width = sources[0].shape[-2:]
    if size > min(height, width):
        raise UserError(f"ingest.crop_size={size} px is larger than the fields of view ({load.name} row {spec.row}: "
                        f"{height} x {width} px), so no cell's window fits in its field (ingest.edge=skip): set "
                        f"ingest.crop_size to at most {min(height, width)} (`ingest --propose-crop-size` proposes one "
                        "from the cells' sizes), or ingest.edge=pad")


PROPOSAL_FIELDS = 16
"""How many leading readable fields the crop-size proposal measures."""


def propose(config: Config, load: LoadTable) -> dict[str, Any]:
    """A crop size from the objects of the first PROPOSAL_FIELDS readable fields (crops.py propose_crop_size);
    with a table of centres, from its AreaShape_Area (as discs), which it then needs."""
    areas, extents, read = [], [], 0
    centres = CentresTable(config, load) if config.ingest.centres else None
    if centres is not None:
        known = centres.area[centres.area > 0]
        if not len(known):
            raise UserError(f"ingest.centres={centres.path} has no AreaShape_Area column, so the objects' sizes are "
                            "unknown: set ingest.crop_size yourself (a little more than the largest cells' diameter)")
        return {**propose_crop_size(known, np.sqrt(known / np.pi)), "from": f"AreaShape_Area of {centres.path.name}"}
    for index in range(len(load)):
        try:
            _, labels = read_field(load, load.field(index), config.data.channel_axis)
        except BadField:
            continue
        objects = measure_objects(labels)
        areas.append(objects.area)
        extents.append(object_extents(labels, objects))
        read += 1
        if read == PROPOSAL_FIELDS:
            break
    areas_all = np.concatenate(areas) if areas else np.zeros(0)
    return {**propose_crop_size(areas_all, np.concatenate(extents) if extents else np.zeros(0)),
            "from": f"the label masks of {read} field(s)"}
