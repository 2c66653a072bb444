"""The synthetic screen of `python -m training synth-data --screen`: its files and columns (the
contract with `ingest`), masks that label exactly the cells, phenotypes that follow each treatment's
mixture, determinism, and a batch effect that makes plain kNN on treatments look better than
not-same-batch kNN. Everything is checked from the written files, with measurements of the test's own.

Measured with this file's screen (4 plates in 2 batches, 12 wells, 1 site, 14 cells per 192 px
field: 672 cells; seed 0; eleven treatments), raw-pixel 1-NN on Metadata_Treatment: plain 0.327,
not-same-batch 0.128; with --batch-strength 0: plain 0.241, not-same-batch 0.204.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import tifffile
from scipy import ndimage

from training.cli import main

SCREEN = ["--plates", "4", "--batches", "2", "--wells-per-plate", "12", "--sites", "1", "--fov-size", "192",
          "--cells-per-fov", "14"]
TINY = ["--plates", "2", "--wells-per-plate", "16", "--sites", "1", "--fov-size", "96", "--cells-per-fov", "5"]
CHANNELS = ["mem", "cyto", "dna", "marker", "marker2"]
LOAD_DATA_METADATA = ["Metadata_Plate", "Metadata_Well", "Metadata_Site", "Metadata_Treatment", "Metadata_MOA",
                      "Metadata_Batch"]
TRUTH_COLUMNS = ["Metadata_Plate", "Metadata_Well", "Metadata_Site", "ObjectNumber", "Location_Center_X",
                 "Location_Center_Y", "AreaShape_Area", "Phenotype"]


def synth(out: Path, *options: str, seed: int = 0) -> None:
    names = "[" + ",".join(CHANNELS) + "]"
    assert main(["synth-data", "--screen", "--out", str(out), "--seed", str(seed),
                 "--set", f"data.channel_names={names}", *options]) == 0


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def fov_key(row: dict[str, str]) -> tuple[str, str, str]:
    return row["Metadata_Plate"], row["Metadata_Well"], row["Metadata_Site"]


def fov_image(root: Path, row: dict[str, str]) -> np.ndarray:
    if "FileName_Cell" in row:
        return tifffile.imread(root / row["PathName_Cell"] / row["FileName_Cell"])
    return np.stack([tifffile.imread(root / row[f"PathName_{n}"] / row[f"FileName_{n}"]) for n in CHANNELS])


def fov_mask(root: Path, row: dict[str, str]) -> np.ndarray:
    return tifffile.imread(root / row["ObjectsPathName_Cells"] / row["ObjectsFileName_Cells"])


@pytest.fixture(scope="module")
def screen(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("screen") / "screen"
    synth(out, *SCREEN)
    return out


def test_files_and_columns_are_loaddata_style(screen):
    header, rows = read_csv(screen / "load_data.csv")
    assert header == [*LOAD_DATA_METADATA, "FileName_Cell", "PathName_Cell", "ObjectsFileName_Cells",
                      "ObjectsPathName_Cells"]
    assert len(rows) == 4 * 12 and len({fov_key(r) for r in rows}) == len(rows)
    for row in rows:
        assert row["PathName_Cell"] == f"images/{row['Metadata_Plate']}"
        assert row["FileName_Cell"] == f"{row['Metadata_Well']}_s{row['Metadata_Site']}.tif"
        assert row["ObjectsPathName_Cells"] == f"masks/{row['Metadata_Plate']}"
        assert row["ObjectsFileName_Cells"] == f"{row['Metadata_Well']}_s{row['Metadata_Site']}_cells.tif"
    image, mask = fov_image(screen, rows[0]), fov_mask(screen, rows[0])
    assert image.shape == (5, 192, 192) and image.dtype == np.uint16
    assert mask.shape == (192, 192) and mask.dtype == np.uint16
    assert json.loads((screen / "screen.json").read_text())["seed"] == 0
    header, truth = read_csv(screen / "truth.csv")
    assert header == TRUTH_COLUMNS


def test_the_plate_map_gives_every_treatment_two_batches_and_every_plate_a_control(screen):
    header, wells = read_csv(screen / "platemap.csv")
    assert header == ["Metadata_Plate", "Metadata_Well", "Metadata_Treatment", "Metadata_MOA", "Metadata_Control"]
    assert all(w["Metadata_Control"] == str(w["Metadata_Treatment"] == "DMSO") for w in wells)
    plates = {w["Metadata_Plate"] for w in wells}
    assert len(plates) == 4 and {w["Metadata_Plate"] for w in wells if w["Metadata_Treatment"] == "DMSO"} == plates
    _, rows = read_csv(screen / "load_data.csv")
    treatment = {(w["Metadata_Plate"], w["Metadata_Well"]): w["Metadata_Treatment"] for w in wells}
    assert all(treatment[r["Metadata_Plate"], r["Metadata_Well"]] == r["Metadata_Treatment"] for r in rows)
    batch_of_plate = defaultdict(set)
    for r in rows:
        batch_of_plate[r["Metadata_Plate"]].add(r["Metadata_Batch"])
    assert all(len(b) == 1 for b in batch_of_plate.values()) and len(set.union(*batch_of_plate.values())) == 2
    batches = defaultdict(set)
    for r in rows:
        batches[r["Metadata_Treatment"]].add(r["Metadata_Batch"])
    assert len(batches) == 11 and all(len(b) == 2 for b in batches.values()), batches


def test_compounds_of_a_mechanism_share_its_mixture_and_batches_split_them(screen):
    """Two compounds per mechanism of action (Metadata_MOA, the same in the plate map and the load
    table), each with its mechanism's mixture; where there are two batches, each favours one of them,
    so that a mechanism's wells are spread over both batches about evenly."""
    parameters = json.loads((screen / "screen.json").read_text())["treatments"]
    _, wells = read_csv(screen / "platemap.csv")
    moa = {w["Metadata_Treatment"]: w["Metadata_MOA"] for w in wells}
    assert moa["DMSO"] == "DMSO" and all(parameters[t]["moa"] == m for t, m in moa.items())
    compounds = defaultdict(list)
    for treatment, mechanism in moa.items():
        compounds[mechanism].append(treatment)
    assert sorted(len(c) for m, c in compounds.items() if m != "DMSO") == [2] * 5
    for mechanism, members in compounds.items():
        assert all(parameters[m]["mixture"] == parameters[members[0]]["mixture"] for m in members)
        if mechanism != "DMSO":
            per_batch = Counter()
            for m in members:
                per_batch.update(parameters[m]["wells_per_batch"])
            spread = sorted(per_batch.values())
            assert len(spread) == 2 and spread[1] - spread[0] <= max(1, sum(spread) // 4), (mechanism, per_batch)
    _, rows = read_csv(screen / "load_data.csv")
    assert all(moa[r["Metadata_Treatment"]] == r["Metadata_MOA"] for r in rows)


def test_masks_label_exactly_the_cells(screen):
    _, rows = read_csv(screen / "load_data.csv")
    _, truth = read_csv(screen / "truth.csv")
    cells = defaultdict(list)
    for cell in truth:
        cells[fov_key(cell)].append(cell)
    for row in rows:
        mask, image = fov_mask(screen, row), fov_image(screen, row).astype(np.float64)
        listed = sorted(cells[fov_key(row)], key=lambda c: int(c["ObjectNumber"]))
        assert [int(c["ObjectNumber"]) for c in listed] == list(range(1, mask.max() + 1))
        assert set(np.unique(mask)) == set(range(mask.max() + 1))
        near = ndimage.binary_dilation(mask > 0, iterations=4)
        stain = image[:3].sum(axis=0)  # membrane, cytoplasm and DNA: every cell has them
        background = stain[~near]
        for cell in listed:
            pixels = mask == int(cell["ObjectNumber"])
            assert ndimage.label(pixels)[1] == 1, (row, cell)
            rows_, cols = np.nonzero(pixels)
            assert int(cell["AreaShape_Area"]) == pixels.sum()
            assert float(cell["Location_Center_X"]) == pytest.approx(cols.mean(), abs=1e-3)
            assert float(cell["Location_Center_Y"]) == pytest.approx(rows_.mean(), abs=1e-3)
            assert stain[pixels].mean() > background.mean() + 5 * background.std(), (row, cell)


def test_truth_phenotypes_are_the_cells_drawn(screen):
    """A nuclear cell's marker lies on its DNA, a membrane cell's on its membrane: the Phenotype
    column describes the pixels under each label, not just a count."""
    _, rows = read_csv(screen / "load_data.csv")
    _, truth = read_csv(screen / "truth.csv")
    by_fov = {fov_key(r): r for r in rows}
    correlation = defaultdict(list)
    for cell in truth:
        row = by_fov[fov_key(cell)]
        image = fov_image(screen, row).astype(np.float64)
        pixels = fov_mask(screen, row) == int(cell["ObjectNumber"])
        marker = image[3][pixels]
        correlation[cell["Phenotype"]].append((np.corrcoef(marker, image[2][pixels])[0, 1],
                                               np.corrcoef(marker, image[0][pixels])[0, 1]))
    nuclear, membrane = np.median(correlation["nuclear"], axis=0), np.median(correlation["membrane"], axis=0)
    assert nuclear[0] > 0.6 and membrane[0] < 0.2, (nuclear, membrane)
    assert membrane[1] > 0.6 and nuclear[1] < membrane[1] - 0.3, (nuclear, membrane)


def test_phenotypes_follow_each_treatments_mixture(screen):
    mixtures = {t: v["mixture"] for t, v in json.loads((screen / "screen.json").read_text())["treatments"].items()}
    _, rows = read_csv(screen / "load_data.csv")
    _, truth = read_csv(screen / "truth.csv")
    treatment = {fov_key(r): r["Metadata_Treatment"] for r in rows}
    counts = defaultdict(Counter)
    for cell in truth:
        counts[treatment[fov_key(cell)]][cell["Phenotype"]] += 1
    assert set(counts) == set(mixtures)
    for name, mixture in mixtures.items():
        n = sum(counts[name].values())
        assert set(counts[name]) <= set(mixture), (name, counts[name])
        for phenotype, p in mixture.items():
            tolerance = 4 * np.sqrt(n * p * (1 - p)) + 1
            assert abs(counts[name][phenotype] - n * p) <= tolerance, (name, phenotype, counts[name], n)


def raw_pixel_features(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-channel mean and std of a 32 px window around each cell's centre (cut at the field's
    edge), standardised; with each cell's treatment and batch."""
    _, rows = read_csv(root / "load_data.csv")
    _, truth = read_csv(root / "truth.csv")
    images = {fov_key(r): fov_image(root, r).astype(np.float64) for r in rows}
    meta = {fov_key(r): (r["Metadata_Treatment"], r["Metadata_Batch"]) for r in rows}
    features, treatments, batches = [], [], []
    for cell in truth:
        x, y = round(float(cell["Location_Center_X"])), round(float(cell["Location_Center_Y"]))
        window = images[fov_key(cell)][:, max(y - 16, 0):y + 16, max(x - 16, 0):x + 16]
        features.append(np.concatenate([window.mean(axis=(1, 2)), window.std(axis=(1, 2))]))
        treatments.append(meta[fov_key(cell)][0])
        batches.append(meta[fov_key(cell)][1])
    x = np.array(features)
    return (x - x.mean(axis=0)) / x.std(axis=0), np.array(treatments), np.array(batches)


def one_nn_accuracy(x: np.ndarray, labels: np.ndarray, batches: np.ndarray, not_same_batch: bool) -> float:
    """Leave-one-out 1-NN (Euclidean); not-same-batch: no cell of the query's batch may be its neighbour."""
    distance = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)
    np.fill_diagonal(distance, np.inf)
    if not_same_batch:
        distance[batches[:, None] == batches[None, :]] = np.inf
    return float((labels[distance.argmin(axis=1)] == labels).mean())


def test_the_batch_effect_makes_plain_knn_look_better_than_not_same_batch(screen, tmp_path):
    x, treatments, batches = raw_pixel_features(screen)
    for t in set(treatments):  # not-same-batch is defined for every treatment
        assert len(set(batches[treatments == t])) >= 2
    plain, nsb = one_nn_accuracy(x, treatments, batches, False), one_nn_accuracy(x, treatments, batches, True)
    synth(tmp_path / "flat", *SCREEN, "--batch-strength", "0")
    x0, treatments0, batches0 = raw_pixel_features(tmp_path / "flat")
    plain0, nsb0 = one_nn_accuracy(x0, treatments0, batches0, False), one_nn_accuracy(x0, treatments0, batches0, True)
    print(f"raw-pixel 1-NN on treatments: plain {plain:.3f}, not-same-batch {nsb:.3f}; "
          f"without imaging effects: plain {plain0:.3f}, not-same-batch {nsb0:.3f}")
    assert plain - nsb >= 0.12, (plain, nsb)
    assert (plain - nsb) - (plain0 - nsb0) >= 0.08, (plain, nsb, plain0, nsb0)
    assert plain > plain0 + 0.04, (plain, plain0)


def all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_and_another_seed_another_screen(tmp_path):
    synth(tmp_path / "a", *TINY)
    synth(tmp_path / "b", *TINY)
    synth(tmp_path / "c", *TINY, seed=1)
    a, b, c = all_files(tmp_path / "a"), all_files(tmp_path / "b"), all_files(tmp_path / "c")
    assert len(a) == 32 * 2 + 4 and a == b
    assert a.keys() == c.keys() and a["images/Plate01/A01_s1.tif"] != c["images/Plate01/A01_s1.tif"]


def test_per_channel_files_hold_the_same_pixels(tmp_path):
    synth(tmp_path / "stack", *TINY)
    synth(tmp_path / "planes", *TINY, "--per-channel-files")
    header, rows = read_csv(tmp_path / "planes" / "load_data.csv")
    assert header == [*LOAD_DATA_METADATA, *[f"{kind}_{n}" for n in CHANNELS for kind in ("FileName", "PathName")],
                      "ObjectsFileName_Cells", "ObjectsPathName_Cells"]
    _, stacked = read_csv(tmp_path / "stack" / "load_data.csv")
    assert len(rows) == len(stacked) == 32
    for planes, stack in zip(rows, stacked):
        assert planes["FileName_dna"] == f"{planes['Metadata_Well']}_s{planes['Metadata_Site']}_dna.tif"
        assert tifffile.imread(tmp_path / "planes" / planes["PathName_dna"] / planes["FileName_dna"]).ndim == 2
        np.testing.assert_array_equal(fov_image(tmp_path / "planes", planes), fov_image(tmp_path / "stack", stack))
        np.testing.assert_array_equal(fov_mask(tmp_path / "planes", planes), fov_mask(tmp_path / "stack", stack))


def test_the_stated_range_of_cells_per_field_is_the_true_one(tmp_path, capsys):
    assert main(["synth-data", "--screen", "--out", str(tmp_path / "x"), *TINY[:-2], "--cells-per-fov", "500"]) == 2
    message = capsys.readouterr().err
    found = re.search(r"--cells-per-fov must be between 1 and (\d+)", message)
    assert found and "500" in message, message
    most = int(found.group(1))
    assert main(["synth-data", "--screen", "--out", str(tmp_path / "x"), *TINY[:-2], "--cells-per-fov", str(most)]) == 0
    _, truth = read_csv(tmp_path / "x" / "truth.csv")
    assert len(truth) >= 0.9 * 32 * most


@pytest.mark.parametrize(("options", "named"), [
    (["--plates", "0"], "--plates must be between 2 and"),
    (["--plates", "3", "--batches", "4"], "--batches must be between 2 and 3"),
    (["--wells-per-plate", "1"], "--wells-per-plate must be between"),
    (["--fov-size", "20"], "--fov-size must be between"),
    (["--sites", "0"], "--sites must be between 1 and"),
    (["--size", "64"], "--size applies to class folders"),
])
def test_impossible_screens_are_refused_naming_the_option(tmp_path, capsys, options, named):
    assert main(["synth-data", "--screen", "--out", str(tmp_path / "x"), *options]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_screen_options_need_screen_and_a_foreign_folder_is_kept(tmp_path, capsys):
    assert main(["synth-data", "--out", str(tmp_path / "x"), "--plates", "3"]) == 2
    assert "--plates is a screen option" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(["synth-data", "--screen", "--out", str(tmp_path / "mine"), *TINY]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_a_screen_written_again_in_place_leaves_nothing_of_the_old_one(tmp_path):
    synth(tmp_path / "s", *TINY[2:], "--plates", "3")
    synth(tmp_path / "s", *TINY)
    _, rows = read_csv(tmp_path / "s" / "load_data.csv")
    listed = {f"images/{r['Metadata_Plate']}/{r['FileName_Cell']}" for r in rows} | \
        {f"masks/{r['Metadata_Plate']}/{r['ObjectsFileName_Cells']}" for r in rows}
    assert set(all_files(tmp_path / "s")) == listed | {"load_data.csv", "platemap.csv", "truth.csv", "screen.json"}
