"""`ingest`: crops cut out of a real field of view with its real segmentation, each equal to the
NumPy slice at its object's centroid as this test computes it (np.nonzero, not the step's
bincount), skipped objects counted per reason; LoadData's per-channel files and multi-channel
files giving the same cells; a table of centres instead of masks; bad fields skipped and reported
(or stopping the step); bad input named in one line; parts kept when their task runs again.

The real field: tests/data/real-nuclei (stardist's DSB 2018 image, 512 x 512, 125 nuclei
labelled up to 183, with gaps; its README gives the source and licence)."""

from __future__ import annotations

import csv
import json
import logging
from html import escape
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.support.tiny import run_cli, tiny_config
from training.data.store.read import PackedImages
from training.data.synthetic.plates import ScreenSpec, write_screen
from training.report.html import build_report
from training.rundir import RunLayout

REAL = Path(__file__).resolve().parents[3] / "data" / "real-nuclei"
SIZE = 32
CROP = 34
"""The screens' crop side: even, as SIZE is not, and wide enough that some cells near the edge are skipped."""


@pytest.fixture(scope="module")
def real() -> tuple[np.ndarray, np.ndarray]:
    if not (REAL / "img2d.tif").is_file():
        pytest.fail(f"the real field of view is missing: {REAL} (tests/data/real-nuclei, committed with the repository)")
    return tifffile.imread(REAL / "img2d.tif"), tifffile.imread(REAL / "mask2d.tif")


def write_table(path: Path, rows: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def config_for(tmp_path: Path, table: Path, **ingest) -> object:
    values = {"run.output_dir": str(tmp_path / "run"), "data.channels": "0", "data.holdout_fraction": 0.25,
              "ingest.table": str(table), "ingest.crop_size": SIZE}
    values.update({f"ingest.{key}": value for key, value in ingest.items()})
    return tiny_config(values)


def cells(config) -> tuple[PackedImages, dict[str, np.ndarray], dict]:
    layout = RunLayout.from_config(config)
    packed = PackedImages(layout.packed, label_column=config.data.label_column)
    columns = {name: packed.table.numbers(name) for name in
               ("Metadata_FieldOfView", "Metadata_ObjectNumber", "Metadata_Center_X", "Metadata_Center_Y",
                "Metadata_Area")}
    return packed, columns, json.loads(layout.ingest_report.read_text())


def expected_objects(mask: np.ndarray) -> dict[int, tuple[float, float, int]]:
    """Each label's centroid (x column, y row) and area, from its pixels' coordinates."""
    found = {}
    for label in np.unique(mask)[1:]:
        rows, cols = np.nonzero(mask == label)
        found[int(label)] = (cols.mean(), rows.mean(), len(rows))
    return found


def window(x: float, y: float) -> tuple[int, int]:
    """The crop's top-left pixel: the centre pixel (nearest the centroid, halves up) at SIZE // 2."""
    return int(np.floor(y + 0.5)) - SIZE // 2, int(np.floor(x + 0.5)) - SIZE // 2


def nuclei_table(tmp_path: Path) -> Path:
    return write_table(tmp_path / "screen" / "load_data.csv", [
        {"Plate": "P1", "Metadata_Well": "A01", "FileName_DNA": "img2d.tif", "PathName_DNA": str(REAL),
         "ObjectsFileName_Nuclei": "mask2d.tif", "ObjectsPathName_Nuclei": str(REAL)}])


def test_every_crop_of_the_real_field_is_the_slice_at_its_centroid(tmp_path, real):
    image, mask = real
    config = config_for(tmp_path, nuclei_table(tmp_path), min_area=150, max_area=600)
    assert run_cli(config, "ingest") == 0
    packed, columns, report = cells(config)
    objects = expected_objects(mask)
    reasons, kept = {"area_below_min": 0, "area_above_max": 0, "window_leaves_field": 0}, []
    for label, (x, y, area) in objects.items():
        top, left = window(x, y)
        if area < 150:
            reasons["area_below_min"] += 1
        elif area > 600:
            reasons["area_above_max"] += 1
        elif top < 0 or left < 0 or top + SIZE > 512 or left + SIZE > 512:
            reasons["window_leaves_field"] += 1
        else:
            kept.append(label)
    assert all(reasons.values()) and len(objects) == 125
    assert report["skipped"] == reasons and report["objects"] == 125 and report["cut"] == len(kept) == len(packed)
    assert sorted(columns["Metadata_ObjectNumber"].tolist()) == kept
    for i, label in enumerate(columns["Metadata_ObjectNumber"].tolist()):
        x, y, area = objects[label]
        top, left = window(x, y)
        np.testing.assert_array_equal(packed.read(i), image[None, top:top + SIZE, left:left + SIZE])
        assert columns["Metadata_Center_X"][i] == pytest.approx(x, abs=1e-9)
        assert columns["Metadata_Center_Y"][i] == pytest.approx(y, abs=1e-9)
        assert columns["Metadata_Area"][i] == area and columns["Metadata_FieldOfView"][i] == 1
        assert packed.paths[i] == f"{REAL / 'img2d.tif'}#{label}"  # outside the table's folder: as given
    assert packed.table.strings("Metadata_Plate")[0] == "P1" and packed.table.strings("Metadata_Well")[0] == "A01"


def test_padded_edges_and_masked_neighbours_on_the_real_field(tmp_path, real):
    image, mask = real
    config = config_for(tmp_path, nuclei_table(tmp_path), edge="pad", mask_other_cells=True)
    assert run_cli(config, "ingest") == 0
    packed, columns, report = cells(config)
    objects = expected_objects(mask)
    assert report["skipped"] == {} and len(packed) == len(objects) == 125
    padded_image = np.pad(image, SIZE)
    padded_mask = np.pad(mask, SIZE)
    edge_cells = 0
    for i, label in enumerate(columns["Metadata_ObjectNumber"].tolist()):
        top, left = (v + SIZE for v in window(*objects[label][:2]))
        crop = padded_image[top:top + SIZE, left:left + SIZE].copy()
        labels = padded_mask[top:top + SIZE, left:left + SIZE]
        crop[(labels != 0) & (labels != label)] = 0
        edge_cells += not (SIZE <= top <= 512 and SIZE <= left <= 512)
        np.testing.assert_array_equal(packed.read(i)[0], crop)
    assert edge_cells > 0


@pytest.fixture(scope="module")
def screens(tmp_path_factory) -> dict[str, Path]:
    """The same small synthetic screen written with one multi-channel file and with one file per channel."""
    root = tmp_path_factory.mktemp("screens")
    spec = dict(plates=2, batches=2, wells_per_plate=16, sites=1, fov_size=96, cells_per_fov=6, seed=3)
    write_screen(root / "stacked", ScreenSpec(**spec))
    write_screen(root / "planes", ScreenSpec(**spec, per_channel_files=True))
    return {"stacked": root / "stacked", "planes": root / "planes"}


def screen_config(tmp_path: Path, table: Path, name: str, **ingest):
    config = config_for(tmp_path / name, table, **ingest)
    return config.replace({"data.channels": "01234", "data.label_column": "Treatment",
                           "data.batch_column": "Metadata_Batch", "ingest.crop_size": CROP})


def test_per_channel_files_give_the_cells_of_one_multichannel_file(tmp_path, screens, monkeypatch):
    """Also: table rows kept in Arrow chunks of 7 (packed.ROW_CHUNK) give the same table as one chunk."""
    import training.data.store.write as packed

    stacked = screen_config(tmp_path, screens["stacked"] / "load_data.csv", "stacked")
    planes = screen_config(tmp_path, screens["planes"] / "load_data.csv", "planes")
    reordered = planes.replace({"ingest.channels": ["Marker2", "Membrane", "Cytoplasm", "DNA", "Marker"]})
    reordered = reordered.replace({"run.output_dir": str(tmp_path / "reordered")})
    assert run_cli(stacked, "ingest") == 0
    monkeypatch.setattr(packed, "ROW_CHUNK", 7)
    for config in (planes, reordered):
        assert run_cli(config, "ingest") == 0
    one, one_columns, one_report = cells(stacked)
    many, many_columns, many_report = cells(planes)
    moved, _, _ = cells(reordered)
    assert len(one) == len(many) > 0 and one_report["skipped"] == many_report["skipped"]
    everything = np.arange(len(one))
    np.testing.assert_array_equal(one.read_batch(everything), many.read_batch(everything))
    np.testing.assert_array_equal(moved.read_batch(everything), one.read_batch(everything)[:, [4, 0, 1, 2, 3]])
    for name in one_columns:
        np.testing.assert_array_equal(one_columns[name], many_columns[name])
    assert one.table.table.drop_columns(["path"]).equals(many.table.table.drop_columns(["path"])) and len(one) > 7
    assert one.class_names == ["DMSO", *[f"cpd{letter}" for letter in "ABCDEFGHIJ"]]
    with open(screens["stacked"] / "load_data.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    treatments = [rows[row - 1]["Metadata_Treatment"] for row in one_columns["Metadata_FieldOfView"]]
    assert [one.class_names[code] for code in one.labels] == treatments


def test_a_table_of_centres_instead_of_masks(tmp_path, screens):
    root = screens["stacked"]
    config = screen_config(tmp_path, root / "load_data.csv", "centres", centres=str(root / "truth.csv"),
                           objects="", min_area=300)
    assert run_cli(config, "ingest") == 0
    packed, columns, report = cells(config)
    with open(root / "load_data.csv", newline="") as f:
        fields = list(csv.DictReader(f))
    with open(root / "truth.csv", newline="") as f:
        truth = list(csv.DictReader(f))
    expected, skipped = {}, {"area_below_min": 0, "window_leaves_field": 0}
    for obj in truth:
        row = next(i for i, f in enumerate(fields, 1) if all(f[k] == obj[k] for k in
                                                               ("Metadata_Plate", "Metadata_Well", "Metadata_Site")))
        x, y, area = float(obj["Location_Center_X"]), float(obj["Location_Center_Y"]), int(obj["AreaShape_Area"])
        top, left = int(np.floor(y + 0.5)) - CROP // 2, int(np.floor(x + 0.5)) - CROP // 2
        if area < 300:
            skipped["area_below_min"] += 1
        elif min(top, left) < 0 or max(top, left) + CROP > 96:
            skipped["window_leaves_field"] += 1
        else:
            expected[(row, int(obj["ObjectNumber"]))] = (fields[row - 1], top, left)
    assert all(skipped.values()) and report["skipped"] == skipped and report["cut"] == len(expected) == len(packed)
    assert report["centres_without_field"] == 0
    for i, key in enumerate(zip(columns["Metadata_FieldOfView"].tolist(), columns["Metadata_ObjectNumber"].tolist())):
        field, top, left = expected[key]
        image = tifffile.imread(root / field["PathName_Cell"] / field["FileName_Cell"])
        np.testing.assert_array_equal(packed.read(i), image[:, top:top + CROP, left:left + CROP])


def copy_screen(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target / "load_data.csv"


def test_bad_fields_are_skipped_and_reported_or_stop_the_step(tmp_path, screens, capsys):
    table = copy_screen(screens["stacked"], tmp_path / "screen")
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    image = table.parent / rows[2]["PathName_Cell"] / rows[2]["FileName_Cell"]
    image.write_bytes(image.read_bytes()[:300])
    (table.parent / rows[6]["ObjectsPathName_Cells"] / rows[6]["ObjectsFileName_Cells"]).unlink()
    small = table.parent / rows[9]["ObjectsPathName_Cells"] / rows[9]["ObjectsFileName_Cells"]
    tifffile.imwrite(small, np.ones((40, 40), np.uint16))
    three = table.parent / rows[11]["PathName_Cell"] / rows[11]["FileName_Cell"]
    tifffile.imwrite(three, tifffile.imread(three)[:3], photometric="minisblack")
    config = screen_config(tmp_path, table, "skip")
    assert run_cli(config, "ingest") == 0
    packed, columns, report = cells(config)
    bad = {entry["row"]: entry for entry in report["bad"]}
    assert sorted(bad) == [3, 7, 10, 12] and report["bad_fields"] == 4 and report["fields"] == 32
    assert bad[12]["reason"] == "load_data.csv row 12: FileName_Cell: 3 channels, the dataset has 5 (as the first " \
                                "readable field)"
    assert bad[3]["reason"].startswith("load_data.csv row 3: FileName_Cell: ") and "not a readable TIFF" in \
        bad[3]["reason"]
    assert bad[7]["reason"].startswith("load_data.csv row 7: ObjectsFileName_Cells: no such file ")
    assert bad[10]["reason"].endswith("is 40 x 40, the field's images 96 x 96")
    assert set(columns["Metadata_FieldOfView"].tolist()) == set(range(1, 33)) - {3, 7, 10, 12}
    listed = json.loads(RunLayout.from_config(config).bad_images.read_text())
    assert listed["step"] == "ingest" and listed["count"] == 4
    assert "4 bad" in capsys.readouterr().out
    page = build_report(RunLayout.from_config(config), "screen")  # the report says where the cells came from
    assert "<h2>Cells cut from fields of view</h2>" in page and "<td>bad fields of view</td><td>4</td>" in page
    assert f"<td>cells cut</td><td>{report['cut']:,}</td>" in page and report["cut"] == len(packed)
    for reason, count in report["skipped"].items():
        assert f"<td>skipped: {escape(reason)}</td><td>{count:,}</td>" in page
    assert all(escape(entry["reason"]) in page for entry in bad.values())
    failing = config.replace({"data.on_bad_image": "fail", "run.output_dir": str(tmp_path / "fail")})
    assert run_cli(failing, "ingest") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: load_data.csv row 3: FileName_Cell: ") and "data.on_bad_image=skip" in err


@pytest.mark.parametrize(("change", "message"), [
    ({"ingest.channels": ["DNA"]}, "load_data.csv: no column FileName_DNA (ingest.channels names DNA); its "
                                   "FileName_* columns: FileName_Cell"),
    ({"ingest.objects": "Nuclei"}, "load_data.csv: no column ObjectsFileName_Nuclei (ingest.objects=Nuclei)"),
    ({"ingest.table": "missing.csv"}, "ingest.table=missing.csv: no such file"),
    ({"ingest.crop_size": 0}, "ingest.crop_size is not set: "),
    ({"ingest.centres": "truth.csv", "ingest.mask_other_cells": True}, "ingest.mask_other_cells needs label masks"),
])
def test_bad_input_is_named_in_one_line(tmp_path, screens, capsys, change, message):
    config = screen_config(tmp_path, screens["stacked"] / "load_data.csv", "bad")
    if "ingest.mask_other_cells" in change:
        with pytest.raises(Exception, match=message):
            config.replace(change)
        return
    assert run_cli(config.replace(change), "ingest") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: {message}"), err
    if change.get("ingest.crop_size") == 0:
        proposed = int(err.split("ingest.crop_size=")[-1].rstrip(")"))
        with open(screens["stacked"] / "truth.csv", newline="") as f:
            areas = [int(row["AreaShape_Area"]) for row in csv.DictReader(f)]
        assert 2 * np.sqrt(np.median(areas) / np.pi) < proposed <= 96


def test_a_label_column_the_table_lacks_stops_before_any_cell_is_cut(tmp_path, screens, capsys):
    config = screen_config(tmp_path, screens["stacked"] / "load_data.csv", "label").replace(
        {"data.label_column": "Compound"})
    assert run_cli(config, "ingest") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: data.label_column='Compound' names no column of load_data.csv") and \
        "Metadata_Treatment" in err
    assert not (Path(config.run.output_dir) / "packed.parts").exists()


def test_a_table_without_images_and_a_column_ingest_writes(tmp_path, capsys):
    table = write_table(tmp_path / "t.csv", [{"Metadata_Plate": "P1", "Image": "a.tif"}])
    assert run_cli(config_for(tmp_path, table), "ingest") == 2
    assert "no FileName_<Channel> column" in capsys.readouterr().err
    table = write_table(tmp_path / "u.csv", [{"Area": 3, "FileName_DNA": "a.tif", "ObjectsFileName_Cells": "m.tif"}])
    assert run_cli(config_for(tmp_path, table), "ingest") == 2
    assert "column Area would become Metadata_Area, which ingest writes itself" in capsys.readouterr().err


def test_finished_parts_are_kept_and_merge_into_the_one_process_result(tmp_path, screens, caplog):
    config = screen_config(tmp_path, screens["stacked"] / "load_data.csv", "parts")
    assert run_cli(config, "ingest", "--part", "1", "--parts", "2") == 0
    assert run_cli(config, "ingest", "--merge", "--parts", "2") == 2  # part 0 missing
    assert run_cli(config, "ingest", "--part", "0", "--parts", "2") == 0
    part_file = next((Path(config.run.output_dir) / "packed.parts").glob("part-00001-*/part.json"))
    written = part_file.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert run_cli(config, "ingest", "--part", "1", "--parts", "2") == 0
    assert part_file.stat().st_mtime_ns == written and "already cut" in caplog.text
    changed = config.replace({"ingest.min_area": 50})
    assert run_cli(changed, "ingest", "--part", "1", "--parts", "2") == 0
    assert part_file.stat().st_mtime_ns != written
    assert run_cli(changed, "ingest", "--part", "0", "--parts", "2") == 0
    assert run_cli(changed, "ingest", "--merge", "--parts", "2") == 0
    whole = changed.replace({"run.output_dir": str(tmp_path / "whole")})
    assert run_cli(whole, "ingest") == 0
    merged, merged_columns, merged_report = cells(changed)
    single, single_columns, single_report = cells(whole)
    assert len(merged.meta["shards"]) == 2 and list(merged.paths) == list(single.paths)
    np.testing.assert_array_equal(merged.read_batch(np.arange(len(single))), single.read_batch(np.arange(len(single))))
    assert {k: v for k, v in merged_report.items() if k != "parts"} == \
        {k: v for k, v in single_report.items() if k != "parts"}
    layout = RunLayout.from_config(changed)
    np.testing.assert_array_equal(np.load(layout.split_rows), np.load(RunLayout.from_config(whole).split_rows))


def test_an_ome_tiff_says_where_its_channels_are(tmp_path):
    """Six channels of 4 x 5 pixels: the smallest-axis rule would take the rows for channels; the
    OME-TIFF's own axes (CYX) say otherwise. An RGB TIFF's samples (YXS) become channels too."""
    from training.data.ingest.fields import read_planes

    stack = np.arange(6 * 4 * 5, dtype=np.uint16).reshape(6, 4, 5)
    tifffile.imwrite(tmp_path / "field.ome.tif", stack, metadata={"axes": "CYX"})
    np.testing.assert_array_equal(read_planes(tmp_path / "field.ome.tif", "t.csv", 1, "FileName_X", "auto"), stack)
    rgb = np.arange(8 * 9 * 3, dtype=np.uint8).reshape(8, 9, 3)
    tifffile.imwrite(tmp_path / "rgb.tif", rgb, photometric="rgb")
    np.testing.assert_array_equal(read_planes(tmp_path / "rgb.tif", "t.csv", 1, "FileName_X", "first"),
                                  np.moveaxis(rgb, -1, 0))


def test_a_table_without_pathname_columns_finds_its_files_beside_it(tmp_path, screens, monkeypatch):
    """LoadData's PathName_ may be left out: the files are then in the table's own folder (here a
    relative one, as a config names it)."""
    root = tmp_path / "flat"
    root.mkdir()
    with open(screens["stacked"] / "load_data.csv", newline="") as f:
        rows = list(csv.DictReader(f))[:2]
    for row in rows:
        for kind in ("", "Objects"):
            source = screens["stacked"] / row[f"{kind}PathName_Cell{'s' if kind else ''}"]
            name = row[f"{kind}FileName_Cell{'s' if kind else ''}"]
            (root / f"{row['Metadata_Plate']}_{name}").write_bytes((source / name).read_bytes())
    write_table(root / "load_data.csv", [
        {"Metadata_Plate": row["Metadata_Plate"], "Metadata_Treatment": row["Metadata_Treatment"],
         "Metadata_Batch": row["Metadata_Batch"], "FileName_Cell": f"{row['Metadata_Plate']}_{row['FileName_Cell']}",
         "ObjectsFileName_Cells": f"{row['Metadata_Plate']}_{row['ObjectsFileName_Cells']}"} for row in rows])
    monkeypatch.chdir(tmp_path)
    config = screen_config(tmp_path, Path("flat/load_data.csv"), "flat").replace({"data.batch_column": ""})  # one batch
    assert run_cli(config, "ingest") == 0
    packed, columns, report = cells(config)
    assert report["fields"] == 2 and report["bad_fields"] == 0 and len(packed) == report["cut"] > 0
    assert packed.paths[0].startswith(f"{rows[0]['Metadata_Plate']}_{rows[0]['FileName_Cell']}#")


def test_a_parquet_load_table_keeps_its_types(tmp_path, screens):
    """The same screen from a Parquet table whose Site column is an integer: the cells are those of the
    CSV table, and Metadata_Site stays an integer (a CSV's values are kept as text)."""
    import pandas as pd

    frame = pd.read_csv(screens["stacked"] / "load_data.csv", dtype=str)
    frame["Metadata_Site"] = frame["Metadata_Site"].astype("int64")
    frame.to_parquet(screens["stacked"] / "load_data.parquet")
    from_csv = screen_config(tmp_path, screens["stacked"] / "load_data.csv", "csv")
    from_parquet = screen_config(tmp_path, screens["stacked"] / "load_data.parquet", "parquet")
    for config in (from_csv, from_parquet):
        assert run_cli(config, "ingest") == 0
    csv_cells, _, _ = cells(from_csv)
    parquet_cells, _, _ = cells(from_parquet)
    everything = np.arange(len(csv_cells))
    np.testing.assert_array_equal(csv_cells.read_batch(everything), parquet_cells.read_batch(everything))
    sites = parquet_cells.table.table.column("Metadata_Site")
    assert str(sites.type) == "int64" and set(sites.to_pylist()) == {1}
    assert set(csv_cells.table.strings("Metadata_Site")) == {"1"}


def test_an_ome_zarr_field_is_cut_like_its_tiff(tmp_path, real, capsys):
    """The real field as an OME-Zarr image (NGFF 0.4: axes c, y, x; a second channel that is the first
    reversed), next to its TIFF mask: every crop is the slice of both channels at its centroid."""
    import zarr

    image, mask = real
    stack = np.stack([image, image[::-1, ::-1]])
    group = zarr.open_group(str(tmp_path / "field.ome.zarr"), mode="w", zarr_format=2)
    group.create_array("0", shape=stack.shape, dtype=stack.dtype, chunks=(1, 128, 128))[:] = stack
    group.attrs["multiscales"] = [{"version": "0.4", "datasets": [{"path": "0"}],
                                   "axes": [{"name": "c", "type": "channel"}, {"name": "y", "type": "space"},
                                            {"name": "x", "type": "space"}]}]
    table = write_table(tmp_path / "load_data.csv", [
        {"Metadata_Well": "A01", "FileName_Both": "field.ome.zarr", "ObjectsFileName_Nuclei": "mask2d.tif",
         "ObjectsPathName_Nuclei": str(REAL)}])
    config = config_for(tmp_path, table).replace({"data.channels": "01"})
    assert run_cli(config, "ingest") == 0
    packed, columns, report = cells(config)
    objects = expected_objects(mask)
    assert len(packed) == report["cut"] > 50
    for i, label in enumerate(columns["Metadata_ObjectNumber"].tolist()):
        top, left = window(*objects[label][:2])
        np.testing.assert_array_equal(packed.read(i), stack[:, top:top + SIZE, left:left + SIZE])
    (tmp_path / "field.ome.zarr" / ".zattrs").write_text("{}")
    failing = config.replace({"data.on_bad_image": "fail", "run.output_dir": str(tmp_path / "fail")})
    assert run_cli(failing, "ingest") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: load_data.csv row 1: FileName_Both: ") and "not a readable OME-Zarr image" in err


def test_the_proposed_crop_size_holds_nearly_every_real_nucleus_whole(tmp_path, real, capsys):
    """--propose-crop-size on the real field: centred on its centroid, the proposed window holds all
    the pixels of at least 95 % of the nuclei (checked pixel by pixel here), and it is a multiple of 8."""
    _, mask = real
    config = config_for(tmp_path, nuclei_table(tmp_path), crop_size=0)
    assert run_cli(config, "ingest", "--propose-crop-size") == 0
    proposal = json.loads(capsys.readouterr().out)
    size = proposal["crop_size"]
    assert size % 8 == 0 and proposal["objects"] == 125
    whole = 0
    for label, (x, y, _) in expected_objects(mask).items():
        rows, cols = np.nonzero(mask == label)
        top, left = int(np.floor(y + 0.5)) - size // 2, int(np.floor(x + 0.5)) - size // 2
        whole += bool((rows >= top).all() and (rows < top + size).all() and (cols >= left).all()
                      and (cols < left + size).all())
    assert whole >= 0.95 * 125
    assert not RunLayout.from_config(config).packed.exists()
