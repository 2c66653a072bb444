"""A screen run's damaged files and impossible settings, as test_damaged_files.py does it for class folders:
each file a screen run writes or reads damaged one way, on a copy of a finished run, then a step that
reads it through the real command line. Every case ends in one `error:` line naming the file, what is
wrong with it and the step that writes it again (`ingest` for everything of the dataset, whatever
step meets it), with the damaged file left as it was; a setting that cannot work is refused before
`ingest` cuts anything.

The run: a synthetic screen (2 plates in 2 imaging batches, 96 px fields of 6 cells), `ingest`,
`mean-std`, one short epoch of `pretrain`, `features` (the final checkpoint, no baselines), `labels`,
`knn` and `export`, about 15 s on one core; each case then costs a step on ~150 cells.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from tests.support.damaging import copy_run, damage, error_line, garble_column, snapshot
from tests.support.tiny import TINY_RUN, run_cli, tiny_config
from training.cli import main
from training.config import dump_config
from training.data.synthetic.plates import ScreenSpec, write_screen

INGEST, FEATURES, LABELS, EXPORT = (f": rerun `python -m training {s}`" for s in ("ingest", "features", "labels",
                                                                                     "export"))
TAKEN = ": move it away, then rerun `python -m training {}`"
JSON = r"is not valid JSON \(.+\)"
TRUNCATED = r"is truncated \(\d+ of \d+ bytes, as {} records\)"
COLUMN = r"fails its checksum \(column {}: CRC-32 [0-9a-f]{{8}}, the index records [0-9a-f]{{8}}\)"
CHECKSUM = r"fails its checksum \(CRC-32 [0-9a-f]{{8}}, {} records [0-9a-f]{{8}}\)"


def screen_config(base: Path, **overrides):
    values = {**TINY_RUN, "run.output_dir": str(base / "run"), "data.source": str(base / "screen"),
              "data.channels": "01234", "data.label_column": "Metadata_Treatment", "data.batch_column": "Batch",
              "data.control_column": "Metadata_Treatment", "data.control_value": "DMSO", "data.holdout_fraction": 0.5,
              "ingest.table": str(base / "screen" / "load_data.csv"), "ingest.crop_size": 24,
              "train.max_steps_per_epoch": 2, "eval.max_cells": 0, "eval.knn_k": [1, 5], "eval.image_size": 24,
              "eval.perturbation_column": "Metadata_Treatment"}
    return tiny_config({**values, **overrides})


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """(config file, run directory) of the finished screen run."""
    base = tmp_path_factory.mktemp("screen")
    write_screen(base / "screen", ScreenSpec(plates=2, batches=2, wells_per_plate=16, sites=1, fov_size=96,
                                             cells_per_fov=6, seed=3))
    config = screen_config(base)
    for step, *extra in (("ingest",), ("mean-std",), ("pretrain",), ("features", "--epochs", "none", "--no-baselines"),
                         ("labels",), ("knn",), ("export",)):
        assert run_cli(config, step, *extra) == 0, step
    path = base / "run.yaml"
    dump_config(config, path)
    return path, base / "run"


@pytest.fixture
def case(finished, tmp_path):
    """A function (file, how) -> the run directory of a copy with that file damaged, and one
    (step, args...) -> exit status of that step run on the copy."""
    config, source = finished
    run = tmp_path / "run"

    def damaged(rel: str, how: str) -> Path:
        copy_run(source, run, own=(rel,))
        if how.startswith("column:"):
            garble_column(run / rel, how.removeprefix("column:"))
        else:
            damage(run / rel, how)
        return run

    def step(*args: str) -> int:
        return main([args[0], "--config", str(config), "--set", f"run.output_dir={run}", *args[1:]])

    return damaged, step


ERRORS = [
    # (damaged file, how, step and arguments, the error after the file's path)
    ("packed/cells.arrow", "delete", ["features", "--epochs", "none", "--no-baselines", "--force"],
     r"is missing \(index\.json is there\)" + INGEST),
    ("packed/cells.arrow", "truncate", ["labels"], TRUNCATED.format("index.json") + INGEST),
    ("packed/cells.arrow", "column:offset", ["mean-std"], COLUMN.format("offset") + INGEST),
    ("packed/cells.arrow", "column:offset", ["features", "--epochs", "none", "--no-baselines", "--force", "--set",
                                             "data.num_workers=1"], COLUMN.format("offset") + INGEST),  # in a worker
    ("packed/cells.arrow", "column:Metadata_Well", ["knn"], COLUMN.format("Metadata_Well") + INGEST),
    ("packed/cells.arrow", "column:Metadata_Treatment", ["labels"], COLUMN.format("Metadata_Treatment") + INGEST),
    ("packed/cells.arrow", "column:path", ["export"], COLUMN.format("path") + INGEST),
    ("packed/cells.arrow", "garble", ["ingest", "--verify"], CHECKSUM.format("index\\.json") + INGEST),
    ("packed/cells.arrow", "folder", ["mean-std"], "is a folder where a file belongs" + TAKEN.format("ingest")),
    ("packed/images-00000.bin", "truncate", ["pretrain"], TRUNCATED.format("index.json") + INGEST),
    ("packed/images-00000.bin", "delete", ["labels"], r"is missing \(index\.json is there\)" + INGEST),
    ("packed/images-00000.bin", "garble", ["ingest", "--verify"], CHECKSUM.format("index\\.json") + INGEST),
    ("packed/images-00000.bin", "folder", ["mean-std"], "is a folder where a file belongs" + TAKEN.format("ingest")),
    ("packed/index.json", "garble", ["labels"], JSON + INGEST),
    ("packed/index.json", "delete", ["knn"], r"is missing \(cells\.arrow is there\)" + INGEST),
    ("packed/index.json", "folder", ["export"], "is a folder where a file belongs" + TAKEN.format("ingest")),
    ("packed", "file", ["labels"], "is a file where a folder belongs" + TAKEN.format("ingest")),
    ("split.npy", "short", ["features", "--epochs", "none", "--no-baselines", "--force"],
     r"holds uint8 \(\d+,\), one byte per cell of the dataset's \d+ \(split\.json records \d+\)" + INGEST),
    ("split.npy", "garble", ["labels"], CHECKSUM.format("split\\.json") + INGEST),
    ("split.npy", "truncate", ["mean-std"], TRUNCATED.format("its header") + INGEST),
    ("split.npy", "delete", ["export"], r"is missing \(split\.json is there\)" + INGEST),
    ("split.npy", "folder", ["labels"], "is a folder where a file belongs" + TAKEN.format("ingest")),
    ("split.json", "garble", ["labels"], JSON + INGEST),
    ("split.json", "folder", ["pretrain"], "is a folder where a file belongs" + TAKEN.format("ingest")),
    ("bad_images.json", "plant", ["ingest", "--verify"], JSON + INGEST),
    ("ingest_report.json", "garble", ["report"], JSON + INGEST),
    ("ingest_report.json", "folder", ["report"], "is a folder where a file belongs" + TAKEN.format("ingest")),
    ("features/final/rows.npy", "short", ["knn"], r"holds \d+ rows, index\.json records \d+" + FEATURES),
    ("features/final/rows.npy", "garble", ["export"], CHECKSUM.format("index\\.json") + FEATURES),
    ("features/final/rows.npy", "delete", ["export"], r"is missing \(index\.json is there\)" + FEATURES),
    ("features/final/rows.npy", "folder", ["knn"], "is a folder where a file belongs" + TAKEN.format("features")),
    ("features/final/features.npy", "short", ["export"], r"holds \d+ rows, index\.json records \d+" + FEATURES),
    ("features/final/index.json", "garble", ["export"], JSON + FEATURES),
    ("features/final/index.json", "folder", ["knn"], "is a folder where a file belongs" + TAKEN.format("features")),
    ("features/final", "file", ["knn"], "is a file where a folder belongs" + TAKEN.format("features")),
    ("labels.json", "folder", ["knn"], "is a folder where a file belongs" + TAKEN.format("labels")),
    ("profiles", "file", ["export"], "is a file where a folder belongs" + TAKEN.format("export")),
    ("profiles/cells.parquet", "folder", ["export"], "is a folder where a file belongs" + TAKEN.format("export")),
    ("profiles/export.json", "garble", ["report"], JSON + EXPORT),
]


@pytest.mark.parametrize("rel, how, command, expected", ERRORS, ids=[f"{c[0]}-{c[1]}-{c[2][0]}" for c in ERRORS])
def test_a_damaged_screen_file_is_one_line_naming_it_and_the_step_that_writes_it(case, capsys, rel, how, command,
                                                                                  expected):
    damaged, step = case
    run = damaged(rel, how)
    before = snapshot(run / rel)
    assert step(*command) == 2
    line = error_line(capsys)
    assert re.fullmatch(re.escape(str(run / rel)) + " " + expected, line), line
    assert snapshot(run / rel) == before  # left as it was for the user


def test_a_deleted_packed_dataset_says_to_run_ingest_not_prepare(case, capsys):
    """The issue's case: with the packed folder gone the step used to take data.source for a TIFF
    folder and say to run `prepare`."""
    damaged, step = case
    run = damaged("packed", "delete")
    assert step("features", "--epochs", "none", "--no-baselines", "--force") == 2
    assert error_line(capsys) == f"packed dataset not found at {run / 'packed'}: run `python -m training ingest` first"


def test_a_column_is_checked_once_per_process_and_only_when_read(finished, monkeypatch):
    """Opening reads no column; a read checks the columns it reads, once; the whole table checks the
    rest; a worker process (the reader pickled) checks again what it reads."""
    import pickle

    from training.data.store.cells import CellTable
    from training.data.store.read import PackedImages

    _, run = finished
    checked: list[str] = []
    real = CellTable._check
    monkeypatch.setattr(CellTable, "_check", lambda self, name, array: checked.append(name) or real(self, name, array))
    images = PackedImages(run / "packed", label_column="Metadata_Treatment", guess="ingest")
    assert checked == []
    images.read_batch(np.arange(4))
    images.read_batch(np.arange(4, 8))
    assert checked == ["shard", "offset"]
    _ = images.labels, images.labels
    assert checked == ["shard", "offset", "Metadata_Treatment"]
    _ = images.table.table
    assert sorted(checked) == sorted(images.table.columns)
    worker = pickle.loads(pickle.dumps(images))
    worker.read_batch(np.arange(4))
    assert checked[-2:] == ["shard", "offset"]


@pytest.fixture(scope="module")
def parts(finished, tmp_path_factory) -> tuple[Path, Path]:
    """(config file, run directory) of the same screen ingested in two parts, not merged yet."""
    config_path, _ = finished
    base = tmp_path_factory.mktemp("parts")
    run = base / "run"
    for part in ("0", "1"):
        assert main(["ingest", "--config", str(config_path), "--set", f"run.output_dir={run}", "--part", part,
                     "--parts", "2"]) == 0
    return config_path, run


PART = "packed.parts/part-00001-of-00002"
PART_REMEDY = (": rerun `python -m training ingest --part 1 --parts 2` \\(it makes this part again\\), then "
               "`python -m training ingest --merge --parts 2`")


@pytest.mark.parametrize("rel, how, expected", [
    (f"{PART}/images-00000.bin", "truncate", TRUNCATED.format("part\\.json") + PART_REMEDY),
    (f"{PART}/cells-00000.arrow", "garble", CHECKSUM.format("part\\.json") + PART_REMEDY),
    (f"{PART}/part.json", "garble", JSON + PART_REMEDY),
    (f"{PART}/images-00000.bin", "folder", "is a folder where a file belongs: move it away, then " + PART_REMEDY[2:]),
], ids=["pixels-truncate", "table-garble", "part-json-garble", "pixels-folder"])
def test_a_damaged_part_is_named_at_the_merge_and_cut_again_by_its_task(parts, tmp_path, capsys, caplog, rel, how,
                                                                        expected):
    config_path, source = parts
    run = tmp_path / "run"
    copy_run(source, run, own=(rel,))
    damage(run / rel, how)

    def ingest(*args: str) -> int:
        return main(["ingest", "--config", str(config_path), "--set", f"run.output_dir={run}", *args])

    assert ingest("--merge", "--parts", "2") == 2
    line = error_line(capsys)
    assert re.fullmatch(re.escape(str(run / rel)) + " " + expected, line), line
    caplog.set_level(logging.WARNING)
    assert ingest("--part", "1", "--parts", "2") == 0  # the damaged part is cut again, with a warning
    assert f"{run / rel} " in caplog.text and "making the part again" in caplog.text
    assert ingest("--merge", "--parts", "2") == 0


SETTINGS = [
    ({"ingest.crop_size": 120}, r"ingest\.crop_size=120 px is larger than the fields of view \(load_data\.csv row 1: "
                                r"96 x 96 px\), so no cell's window fits in its field \(ingest\.edge=skip\): set "
                                r"ingest\.crop_size to at most 96 .+, or ingest\.edge=pad"),
    ({"ingest.crop_size": 6}, r"ingest\.crop_size=6 px is smaller than one patch of the model \(model\.patch_size=8 "
                              r"px\), the smallest piece of an image the ViT reads: set ingest\.crop_size to 8 px or "
                              r"more .+"),
    ({"data.label_column": "Site"}, r"data\.label_column='Site' holds one value \('1'\) in every row of "
                                    r"load_data\.csv: the classes .+ need two or more; name another column, or leave "
                                    r"data\.label_column empty"),
    ({"data.batch_column": "Metadata_Site"}, r"data\.batch_column='Metadata_Site' holds one value \('1'\) in every row "
                                             r"of load_data\.csv: not-same-batch kNN needs cells of another batch .+"),
    ({"data.control_value": "DMS"}, r"data\.control_value='DMS' is in no row of load_data\.csv's Metadata_Treatment "
                                    r"\(its values: 'DMSO', .+\): set data\.control_value to the controls' value"),
]


@pytest.mark.parametrize("overrides, expected", SETTINGS, ids=[next(iter(s[0])) for s in SETTINGS])
def test_a_setting_that_cannot_work_is_refused_before_any_cell_is_cut(finished, tmp_path, capsys, overrides, expected):
    config = screen_config(Path(finished[0]).parent, **{"run.output_dir": str(tmp_path / "run"), **overrides})
    assert run_cli(config, "ingest") == 2
    assert re.fullmatch(expected, error_line(capsys))
    assert not (tmp_path / "run" / "packed").exists() and not (tmp_path / "run" / "packed.parts").exists()


@pytest.mark.parametrize("how, reason", [
    ("truncate", r"\S+ is not a readable TIFF \(.+\)"),
    ("delete", r"no such file \S+"),
    ("folder", r"\S+ is a folder where a TIFF file belongs"),
])
def test_a_damaged_mask_names_its_row_column_and_file(finished, tmp_path, capsys, how, reason):
    """Masks are the user's input: skipped and counted (data.on_bad_image=skip), or, as here, the step
    stops at the first one in one line that names the load table's row, the column and the file."""
    config_path, _ = finished
    screen = tmp_path / "screen"
    copy_run(Path(config_path).parent / "screen", screen)
    table = screen / "load_data.csv"
    first = table.read_text().splitlines()[1].split(",")
    header = table.read_text().splitlines()[0].split(",")
    damage(screen / first[header.index("ObjectsPathName_Cells")] / first[header.index("ObjectsFileName_Cells")], how)
    config = screen_config(Path(config_path).parent, **{"run.output_dir": str(tmp_path / "run"),
                                                         "ingest.table": str(table), "data.on_bad_image": "fail"})
    assert run_cli(config, "ingest") == 2
    expected = rf"load_data\.csv row 1: ObjectsFileName_Cells: {reason}; fix it, or set data\.on_bad_image=skip .+"
    assert re.fullmatch(expected, error_line(capsys))


def test_the_load_table_replaced_by_a_folder_is_named(finished, tmp_path, capsys):
    config = screen_config(Path(finished[0]).parent, **{"run.output_dir": str(tmp_path / "run"),
                                                         "ingest.table": str(tmp_path)})
    assert run_cli(config, "ingest") == 2
    assert error_line(capsys) == (f"ingest.table={tmp_path} is a folder: give the path of the CSV or Parquet "
                                  "table")


def test_an_index_records_the_step_that_wrote_the_dataset(finished):
    _, run = finished
    index = json.loads((run / "packed" / "index.json").read_text())
    assert index["step"] == "ingest" and set(index["table"]["columns"]) >= {"path", "shard", "offset"}


def test_labels_of_another_length_than_their_neighbours_are_named(finished, tmp_path, capsys):
    config, source = finished
    run = tmp_path / "run"
    copy_run(source, run)
    labels = json.loads((run / "labels.json").read_text())
    n = len(labels["indices"])
    (run / "labels.json").write_text(json.dumps({**labels, "paths": labels["paths"][:-1]}))
    assert main(["knn", "--config", str(config), "--set", f"run.output_dir={run}"]) == 2
    assert error_line(capsys) == (f"{run / 'labels.json'} lists cells of different lengths (labels {n}, indices {n}, "
                                  f"paths {n - 1}, batches {n}): rerun `python -m training labels`")


def test_a_missing_ingest_report_is_one_warning_of_the_report(case, caplog):
    damaged, step = case
    run = damaged("ingest_report.json", "delete")
    caplog.set_level(logging.WARNING)
    assert step("report") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"{run / 'ingest_report.json'} is missing (packed/index.json records that `ingest` made the dataset)" in warnings[0]
    assert warnings[0].endswith("rerun `python -m training ingest` to write it again")
