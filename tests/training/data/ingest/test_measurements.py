"""ingest.cellprofiler: CellProfiler's measurements of every cut cell, stored row by row with the
per-cell table, and the "cellprofiler" baseline `features` makes of them.

The stored values are checked against cp_measure's own functions called here on the whole field of
view and its mask (not through the step), across a 2-part ingest and its merge; the baseline against
pycytominer's mad_robustize. The fields: tests/data/real-nuclei (stardist's DSB 2018 image, 125
nuclei labelled up to 183, with gaps) as row 1, the same field turned by 90 degrees as row 2, each
with a second channel of one value (whose intensity features are then constant)."""

from __future__ import annotations

import csv
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tifffile
import torch

from tests.support.tiny import run_cli, tiny_config
from training.config import ConfigError
from training.data.ingest.measurements import PART_FILE
from training.data.store.read import PackedImages
from training.eval.cellprofiler import MAD_SCALE, robust_scale, standardise
from training.rundir import RunLayout, tags
from training.rundir.features import load_features

REAL = Path(__file__).resolve().parents[3] / "data" / "real-nuclei"
BLANK = 1000
"""The second channel's one value."""
SHAPE_FEATURES = 104
"""cp_measure's 78 sizeshape features without the 6 of position, 30 Zernike moments, 2 Feret diameters."""
PER_CHANNEL = 15 + 12 + 52
"""Intensity (without Location_), radial distribution in 4 rings, 13 Haralick features x 4 directions."""


def write_fields(root: Path) -> Path:
    """The load table of the module docstring's two fields, one file per channel."""
    image, mask = tifffile.imread(REAL / "img2d.tif"), tifffile.imread(REAL / "mask2d.tif")
    rows = []
    for site, turns in ((1, 0), (2, 1)):
        tifffile.imwrite(root / f"dna_{site}.tif", np.ascontiguousarray(np.rot90(image, turns)))
        tifffile.imwrite(root / f"blank_{site}.tif", np.full(image.shape, BLANK, np.uint16))
        tifffile.imwrite(root / f"nuclei_{site}.tif", np.ascontiguousarray(np.rot90(mask, turns)))
        rows.append({"Metadata_Site": site, "FileName_DNA": f"dna_{site}.tif", "FileName_Blank": f"blank_{site}.tif",
                     "ObjectsFileName_Nuclei": f"nuclei_{site}.tif"})
    with open(root / "load_data.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return root / "load_data.csv"


def config_for(base: Path, table: Path, **values):
    return tiny_config({"run.output_dir": str(base), "data.channels": "01", "data.holdout_fraction": 0.5,
                        "ingest.table": str(table), "ingest.crop_size": 32, "ingest.min_area": 30,
                        "ingest.cellprofiler": True, "eval.image_size": 32, "eval.normalize": False,
                        "eval.batch_size": 64, **values})


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> dict:
    """The two fields ingested in 2 parts, then merged, and in one process."""
    root = tmp_path_factory.mktemp("cellprofiler")
    if not (REAL / "img2d.tif").is_file():
        pytest.fail(f"the real field of view is missing: {REAL} (tests/data/real-nuclei, committed with the repository)")
    (root / "fields").mkdir()
    table = write_fields(root / "fields")
    parts, whole = config_for(root / "parts", table), config_for(root / "whole", table)
    for extra in (("--part", "1", "--parts", "2"), ("--part", "0", "--parts", "2"), ("--merge", "--parts", "2")):
        assert run_cli(parts, "ingest", *extra) == 0, extra
    assert run_cli(whole, "ingest") == 0
    return {"root": root, "table": table, "parts": parts, "whole": whole}


def stored(config) -> tuple[np.ndarray, dict, PackedImages]:
    layout = RunLayout.from_config(config)
    return np.load(layout.cellprofiler), json.loads(layout.cellprofiler_index.read_text()), PackedImages(layout.packed)


def cp_measure_own(image: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """cp_measure's measurements of one channel (uint16, CellProfiler's 0..1 intensities) of a field,
    by label rank, under the names CellProfiler gives them for a channel named DNA."""
    import cp_measure
    from cp_measure.bulk import get_core_measurements

    core = get_core_measurements()
    cp_measure.set_accelerator("numba")
    texture = get_core_measurements()["texture"]
    cp_measure.set_accelerator(None)
    pixels = image / 65535.0
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        shape = {**core["sizeshape"](mask, None), **core["zernike"](mask, None), **core["feret"](mask, None)}
        intensity = core["intensity"](mask, pixels)
        radial = core["radial_distribution"](mask, pixels)
        haralick = texture(mask, pixels)
    return {"AreaShape_Area": shape["Area"], "AreaShape_Solidity": shape["Solidity"],
            "AreaShape_Zernike_2_0": shape["Zernike_2_0"], "AreaShape_MaxFeretDiameter": shape["MaxFeretDiameter"],
            "AreaShape_HuMoment_1": shape["HuMoment_1"],
            "Intensity_MeanIntensity_DNA": intensity["Intensity_MeanIntensity"],
            "Intensity_MADIntensity_DNA": intensity["Intensity_MADIntensity"],
            "Intensity_MeanIntensityEdge_DNA": intensity["Intensity_MeanIntensityEdge"],
            "RadialDistribution_FracAtD_DNA_2of4": radial["RadialDistribution_FracAtD_2of4"],
            "RadialDistribution_RadialCV_DNA_4of4": radial["RadialDistribution_RadialCV_4of4"],
            "Texture_Contrast_DNA_3_01_256": haralick["Contrast_3_01_256"],
            "Texture_InfoMeas1_DNA_3_03_256": haralick["InfoMeas1_3_03_256"]}


def test_stored_measurements_are_cp_measures_own_row_by_row_across_parts(ingested):
    values, index, packed = stored(ingested["parts"])
    whole_values, whole_index, whole = stored(ingested["whole"])
    assert values.dtype == np.float32 and values.shape == (len(packed), SHAPE_FEATURES + 2 * PER_CHANNEL)
    assert index["n_cells"] == len(packed) == len(whole) and index["channel_names"] == ["DNA", "Blank"]
    np.testing.assert_array_equal(values, whole_values)  # the merge of 2 parts is the one-process result
    assert {k: v for k, v in index.items() if k != "seconds"} == {k: v for k, v in whole_index.items() if k != "seconds"}
    names = index["features"]
    assert names[:2] == ["AreaShape_Area", "AreaShape_BoundingBoxArea"] and names[-1] == "Texture_InfoMeas2_Blank_3_03_256"
    assert not [n for n in names if "Location" in n or "Center" in n or "BoundingBoxM" in n]
    assert index["channels"][:SHAPE_FEATURES] == [None] * SHAPE_FEATURES
    assert index["channels"][names.index("Intensity_MeanIntensity_Blank")] == 1
    numbers = packed.table.numbers("Metadata_ObjectNumber")
    fields = packed.table.numbers("Metadata_FieldOfView")
    assert set(fields.tolist()) == {1, 2} and len(packed) > 150
    image, mask = tifffile.imread(REAL / "img2d.tif"), tifffile.imread(REAL / "mask2d.tif")
    for field, turns in ((1, 0), (2, 1)):
        field_mask = np.ascontiguousarray(np.rot90(mask, turns))
        expected = cp_measure_own(np.ascontiguousarray(np.rot90(image, turns)), field_mask)
        rank = np.searchsorted(np.unique(field_mask)[1:], numbers[fields == field])  # cp_measure's rows: labels 1..N
        for name, own in expected.items():
            np.testing.assert_allclose(values[fields == field, names.index(name)], own[rank].astype(np.float32),
                                       rtol=2e-6, atol=1e-7, equal_nan=True, err_msg=name)
    assert (values[:, names.index("AreaShape_Area")] == packed.table.numbers("Metadata_Area")).all()


def test_texture_of_numba_agrees_with_mahotas_and_undefined_values_are_nan(ingested):
    """Texture comes from cp_measure's numba kernel; its default (mahotas) agrees to 1e-5."""
    from cp_measure.bulk import get_core_measurements

    values, index, packed = stored(ingested["parts"])
    names = index["features"]
    first = packed.table.numbers("Metadata_FieldOfView") == 1
    mask = tifffile.imread(REAL / "mask2d.tif")
    rank = np.searchsorted(np.unique(mask)[1:], packed.table.numbers("Metadata_ObjectNumber")[first])
    mahotas = get_core_measurements()["texture"](mask, tifffile.imread(REAL / "img2d.tif") / 65535.0)
    for key in ("AngularSecondMoment_3_00_256", "Entropy_3_02_256", "Correlation_3_01_256"):
        feature, _, scale = key.partition("_")
        np.testing.assert_allclose(values[first, names.index(f"Texture_{feature}_DNA_{scale}")], mahotas[key][rank],
                                   rtol=1e-4, atol=1e-6, equal_nan=True)
    assert np.isnan(values[:, names.index("AreaShape_NormalizedMoment_0_0")]).all()  # undefined: stored as NaN
    assert np.isfinite(values[np.isfinite(values)]).all()


def test_robust_scale_is_pycytominers_mad_robustize_and_drops_what_it_cannot_scale():
    from pycytominer import feature_select, normalize

    rng = np.random.default_rng(0)
    values = rng.lognormal(size=(200, 8)).astype(np.float32)
    values[:, 1] = 7.0  # constant
    values[:, 2] = np.nan  # defined for no cell
    values[:150, 3] = 1.0  # MAD 0 although it varies
    values[rng.random(200) < 0.1, 4] = np.nan  # undefined for some cells
    values[:, 6] = 1e-18 * rng.random(200)  # a constant, up to rounding (a uniform channel's std)
    values[7, 7] = 1e4  # one cell thousands of MADs away
    names = [f"F{i}" for i in range(8)]
    scale = robust_scale(values, names)
    assert scale.dropped == {"non_finite": ["F2"], "constant": ["F1", "F6"], "mad_zero": ["F3"], "outlier": ["F7"]}
    assert scale.kept.tolist() == [0, 4, 5]
    frame = pd.DataFrame(values.astype(np.float64), columns=names).assign(Metadata_Cell=np.arange(200))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy on the column no cell has
        theirs = normalize(frame, features=names, meta_features=["Metadata_Cell"], method="mad_robustize")
    scalable = ["F0", "F4", "F5", "F7"]
    selected = feature_select(theirs, features=scalable, operation="drop_outliers")
    assert [name for name in scalable if name in selected.columns] == [names[i] for i in scale.kept]
    ours = (values[:, scale.kept].astype(np.float64) - scale.median) / scale.scale
    np.testing.assert_allclose(ours, theirs[[names[i] for i in scale.kept]].to_numpy(), rtol=1e-9, equal_nan=True)
    column = values[:, 4][np.isfinite(values[:, 4])].astype(np.float64)  # the definition, over the defined cells
    assert scale.median[1] == np.median(column)
    assert scale.scale[1] == pytest.approx(MAD_SCALE * np.median(np.abs(column - np.median(column))))
    rows = standardise(values, scale)
    assert rows.dtype == np.float32 and np.isfinite(rows).all()
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-6)
    undefined = np.isnan(values[:, 4])
    expected = np.where(np.isnan(ours), 0.0, ours)
    np.testing.assert_allclose(rows, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert (rows[undefined, 1] == 0).all()


def tiny_checkpoint(path: Path, config) -> Path:
    from training.models import build_backbone

    torch.manual_seed(0)
    torch.save({"teacher": build_backbone(config.model, config.data.in_chans, img_size=32).state_dict()}, path)
    return path


def test_features_writes_the_cellprofiler_baseline_standardised_over_every_cell(ingested, caplog):
    from pycytominer import normalize

    config = ingested["parts"]
    layout = RunLayout.from_config(config)
    checkpoint = tiny_checkpoint(ingested["root"] / "tiny.pth", config)
    assert run_cli(config, "features", "--checkpoint", str(checkpoint), "--epochs", "none") == 0
    baseline = load_features(layout.features(tags.CELLPROFILER))
    raw = load_features(layout.features(tags.RAW_PIXELS))
    np.testing.assert_array_equal(baseline.indices, raw.indices)  # the evaluated held-out cells, as every baseline
    values, index, packed = stored(config)
    names = index["features"]
    frame = pd.DataFrame(values.astype(np.float64), columns=names).assign(Metadata_Row=np.arange(len(values)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        scaled = normalize(frame, features=names, meta_features=["Metadata_Row"], method="mad_robustize")
    meta = baseline.meta
    dropped = {name for found in meta["dropped_features"].values() for name in found}
    kept = [name for name in names if name not in dropped]
    assert meta["features_kept"] == len(kept) == baseline.dim and meta["features_measured"] == len(names)
    assert meta["features_dropped"] == {reason: len(found) for reason, found in meta["dropped_features"].items()}
    assert "Intensity_MeanIntensity_Blank" in meta["dropped_features"]["constant"]  # one value in every cell
    assert np.ptp(values[:, names.index("Intensity_MeanIntensity_Blank")]) == 0
    assert "Intensity_IntegratedIntensity_Blank" in kept  # the same channel, proportional to the area
    expected = scaled[kept].to_numpy()[baseline.indices]
    expected = np.where(np.isfinite(expected), expected, 0.0)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(baseline.features, expected, atol=2e-6)
    assert np.abs(scaled[kept].to_numpy()).max() <= 500  # pycytominer's outlier_cutoff
    assert meta["stats_cells"] == len(packed) and meta["standardization"] == "mad_robustize"
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert run_cli(config, "features", "--checkpoint", str(checkpoint), "--epochs", "none") == 0
    assert "features/cellprofiler is up to date; skipped" in caplog.text
    only_dna = config.replace({"data.channel_combinations": ["01", "0"], "run.combination": "0"})
    checkpoint = tiny_checkpoint(ingested["root"] / "dna.pth", only_dna)
    assert run_cli(only_dna, "features", "--checkpoint", str(checkpoint), "--epochs", "none") == 0
    dna = load_features(RunLayout.from_config(only_dna).features(tags.CELLPROFILER))
    assert dna.meta["features_measured"] == SHAPE_FEATURES + PER_CHANNEL  # data.channels selects the measurements
    assert not [name for found in dna.meta["dropped_features"].values() for name in found if "Blank" in name]


def one_line_error(capsys) -> str:
    """The step's error: one line, last (after any progress bar), and no traceback."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    return err.splitlines()[-1]


def test_damaged_or_missing_measurements_are_named_in_one_line(ingested, tmp_path, capsys):
    import shutil

    config = ingested["whole"].replace({"run.output_dir": str(tmp_path / "run")})
    layout = RunLayout.from_config(config)
    shutil.copytree(RunLayout.from_config(ingested["whole"]).root, layout.root,
                    ignore=shutil.ignore_patterns("features"))
    checkpoint = tiny_checkpoint(tmp_path / "tiny.pth", config)
    features = ("features", "--checkpoint", str(checkpoint), "--epochs", "none")
    data = layout.cellprofiler.read_bytes()
    layout.cellprofiler.write_bytes(data[:-100])
    assert run_cli(config, *features) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: {layout.cellprofiler} is truncated") and "rerun `python -m training ingest`" in err
    middle = len(data) // 2
    layout.cellprofiler.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    assert run_cli(config, *features) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: {layout.cellprofiler} fails its checksum") and "python -m training ingest" in err
    layout.cellprofiler.write_bytes(data)
    layout.cellprofiler_index.write_text("{")
    assert run_cli(config, *features) == 2
    assert one_line_error(capsys).startswith(f"error: {layout.cellprofiler_index} is not valid JSON")
    layout.cellprofiler_index.unlink()
    assert run_cli(config, *features) == 2
    assert one_line_error(capsys) == (f"error: {layout.cellprofiler_index} is missing (cellprofiler.npy is there): "
                                      "rerun `python -m training ingest`")
    layout.cellprofiler.unlink()
    assert run_cli(config, *features) == 2
    assert one_line_error(capsys) == (f"error: CellProfiler's measurements (ingest.cellprofiler) not found at "
                                      f"{layout.cellprofiler}: run `python -m training ingest` first")
    assert run_cli(config.replace({"ingest.cellprofiler": False}), *features) == 0  # without them: no such baseline
    assert not layout.features(tags.CELLPROFILER).exists()


def test_a_part_without_measurements_or_with_damaged_ones_is_named_at_the_merge(ingested, tmp_path, capsys):
    config = config_for(tmp_path / "run", ingested["table"])
    assert run_cli(config.replace({"ingest.cellprofiler": False}), "ingest", "--part", "0", "--parts", "2") == 0
    assert run_cli(config, "ingest", "--part", "1", "--parts", "2") == 0
    assert run_cli(config, "ingest", "--merge", "--parts", "2") == 2
    first = RunLayout.from_config(config).part(0, 2)
    assert one_line_error(capsys) == (f"error: {first} was cut without ingest.cellprofiler: run its task again with "
                                      "it set (--part K --parts N), then merge")
    assert run_cli(config, "ingest", "--part", "0", "--parts", "2") == 0  # another identity: cut again
    raw = first / PART_FILE
    raw.write_bytes(raw.read_bytes()[:-8])
    assert run_cli(config, "ingest", "--merge", "--parts", "2") == 2
    assert one_line_error(capsys).startswith(f"error: {raw} is truncated")
    assert not RunLayout.from_config(config).packed.exists()  # nothing merged half-way


def test_a_table_of_centres_cannot_be_measured(ingested):
    with pytest.raises(ConfigError, match="ingest.cellprofiler measures each cell inside its label mask"):
        ingested["whole"].replace({"ingest.centres": "truth.csv", "ingest.objects": ""})
