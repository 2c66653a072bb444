"""Damaged run files, one at a time, on copies of a finished tiny run, each read by a step through the
real command line: every case ends in one `error:` line naming the file, what is wrong with it and the
step that writes it again (exit 2, no traceback, the damaged file left as it was), or in the
documented recovery (exit 0, nothing deleted, at most one checkpoint interval trained again).

The run is eval_tiny_run's (mean-std, 2 epochs of pretraining with a numbered checkpoint each, features,
labels, knn, linear), plus `prepare`. Each case works on a copy whose large files are hard links
(steps replace files by renaming, so the shared run is never changed), but for the damaged file,
which gets its own copy, as do the files that are hard links of it (a numbered checkpoint is a hard
link of checkpoint.pth: damage to one in place is damage to both).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.damaging import copy_run, damage, error_line, snapshot
from tests.support.eval_tiny_run import evaluated_run, run_dir
from training.cli import main
from training.recovery import policy
from training.recovery.failures import read_records


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """(config, run directory) of the finished tiny run, packed by `prepare` too."""
    config = evaluated_run(tmp_path_factory)
    run = tmp_path_factory.mktemp("finished") / "run"
    copy_run(run_dir(config), run)
    assert main(["prepare", "--config", str(config), "--set", f"run.output_dir={run}"]) == 0
    return config, run


@pytest.fixture
def case(finished, tmp_path):
    """A function (damaged file, how) -> the run directory of a copy with that file damaged, and
    one (step, args...) -> exit status of that step run on the copy."""
    config, source = finished
    run = tmp_path / "run"

    def damaged(rel: str, how: str) -> Path:
        copy_run(source, run, own=(rel,))
        damage(run / rel, how)
        return run

    def step(*args: str) -> int:
        return main([args[0], "--config", str(config), "--set", f"run.output_dir={run}", *args[1:]])

    return damaged, step


JSON = r"is not valid JSON \(.+\)"
TRUNCATED = r"is truncated \(\d+ of \d+ bytes, as {} records\)"
PREPARE, MEAN_STD, LABELS, FEATURES = (f": rerun `python -m training {s}`" for s in ("prepare", "mean-std", "labels",
                                                                                   "features"))
LATEST = (r": rerun `python -m training pretrain` \(it sets the file aside and resumes from the newest intact "
          r"checkpoint\), then this step")

ERRORS = [
    # (damaged file, how, step and arguments, the error after the file's path)
    ("checkpoints/checkpoint.pth", "truncate", ["features"],
     r"is truncated or damaged at its end \(its zip directory cannot be read: File is not a zip file\)" + LATEST),
    ("checkpoints/checkpoint.pth", "garble", ["features", "--epochs", "none", "--no-baselines"],
     r"fails its checksum \(record \S+: CRC-32 [0-9a-f]{8}, the archive records [0-9a-f]{8}\)" + LATEST),
    ("checkpoints/checkpoint_0001.pth", "garble", ["features", "--epochs", "1", "--no-baselines"],
     r"fails its checksum \(.+\): rename it to checkpoint_0001\.pth\.damaged and rerun `python -m training "
     r"features` \(the other epochs are evaluated without it\)"),
    ("packed/images-00000.bin", "truncate", ["mean-std"], TRUNCATED.format("index.json") + PREPARE),
    ("packed/images-00000.bin", "garble", ["prepare", "--verify"],
     r"fails its checksum \(CRC-32 [0-9a-f]{8}, index\.json records [0-9a-f]{8}\)" + PREPARE),
    ("packed/images-00000.bin", "delete", ["labels"], r"is missing \(index\.json is there\)" + PREPARE),
    ("packed/cells.arrow", "truncate", ["labels"], TRUNCATED.format("index.json") + PREPARE),
    ("packed/cells.arrow", "garble", ["prepare", "--verify"],
     r"fails its checksum \(CRC-32 [0-9a-f]{8}, index\.json records [0-9a-f]{8}\)" + PREPARE),
    ("packed/index.json", "garble", ["labels"], JSON + PREPARE),
    ("packed/index.json", "truncate", ["pretrain"], JSON + PREPARE),
    ("packed/index.json", "delete", ["mean-std"], r"is missing \(cells\.arrow is there\)" + PREPARE),
    ("split.json", "garble", ["labels"], JSON + PREPARE),
    ("split.npy", "delete", ["labels"], r"is missing \(split\.json is there\)" + PREPARE),
    ("split.npy", "garble", ["mean-std"], r"has no valid \.npy header \(.+\)" + PREPARE),  # 48 cells: the middle is its header
    ("packed/cells.arrow", "folder", ["labels"], r"is a folder where a file belongs: move it away, then rerun "
     r"`python -m training prepare`"),
    ("split.json", "truncate", ["mean-std"], JSON + PREPARE),
    ("bad_images.json", "plant", ["prepare", "--verify"], JSON + PREPARE),
    ("mean_std.json", "truncate", ["pretrain"], JSON + MEAN_STD),
    ("mean_std.json", "garble", ["features", "--force", "--epochs", "none", "--no-baselines"], JSON + MEAN_STD),
    ("labels.json", "garble", ["knn"], JSON + LABELS),
    ("labels.json", "truncate", ["linear"], JSON + LABELS),
    ("features/final/features.npy", "truncate", ["knn"], TRUNCATED.format("its header") + FEATURES),
    ("features/final/features.npy", "garble", ["linear"],
     r"fails its checksum \(CRC-32 [0-9a-f]{8}, index\.json records [0-9a-f]{8}\)" + FEATURES),
    ("features/final/features.npy", "delete", ["knn"], r"is missing \(index\.json is there\)" + FEATURES),
    ("features/final/index.json", "garble", ["knn"], JSON + FEATURES),
    ("features/final/index.json", "delete", ["linear"], r"is missing \(features\.npy is there\)" + FEATURES),
    ("knn/knn.json", "garble", ["report"], JSON + ": rerun `python -m training knn`"),
    ("knn/knn.json", "truncate", ["plots", "--no-umap", "--no-attention"], JSON + ": rerun `python -m training knn`"),
    ("linear/linear.json", "garble", ["report"], JSON + ": rerun `python -m training linear`"),
    ("timings.json", "garble", ["report"],
     JSON + r": rerun any pipeline step \(`python -m training <step>`\), which moves it aside and starts a new one"),
    ("comparison.json", "plant", ["report"], JSON + ": rerun `python -m training compare`"),
    ("plots/manifest.json", "plant", ["report"], JSON + ": rerun `python -m training plots`"),
]
MISSING = [
    ("mean_std.json", ["pretrain"], "mean/std file", "mean-std"),
    ("labels.json", ["knn"], "held-out labels", "labels"),
]


@pytest.mark.parametrize("rel, how, command, expected", ERRORS, ids=[f"{c[0]}-{c[1]}-{c[2][0]}" for c in ERRORS])
def test_a_damaged_file_is_one_line_naming_it_and_the_step_that_writes_it(case, capsys, rel, how, command, expected):
    damaged, step = case
    run = damaged(rel, how)
    before = snapshot(run / rel)
    assert step(*command) == 2
    assert re.fullmatch(re.escape(str(run / rel)) + " " + expected, error_line(capsys))
    assert snapshot(run / rel) == before  # left as it was for the user


@pytest.mark.parametrize("rel, command, what, writer", MISSING, ids=[c[0] for c in MISSING])
def test_a_deleted_input_names_the_step_to_run(case, capsys, rel, command, what, writer):
    damaged, step = case
    run = damaged(rel, "delete")
    assert step(*command) == 2
    assert error_line(capsys) == f"{what} not found at {run / rel}: run `python -m training {writer}` first"


def test_a_damaged_input_of_pretraining_is_a_deterministic_failure_in_one_heal_line(case, capsys):
    """No retry can mend it: recorded as deterministic (the marker stops further tries) and the
    launcher's closing line names the file."""
    damaged, step = case
    run = damaged("packed/images-00000.bin", "truncate")
    assert step("pretrain") == 2
    capsys.readouterr()
    checkpoints = run / "checkpoints"
    [record] = [r for r in read_records(checkpoints / "failures.jsonl") if r["kind"] == "failure"]
    assert record["class"] == "deterministic" and (checkpoints / "DETERMINISTIC_FAILURE").is_file()
    assert policy.main(["--failure-log", str(checkpoints / "failures.jsonl"), "--failure-marker",
                        str(checkpoints / "DETERMINISTIC_FAILURE"), "--exit-code", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "not-retried"
    [line] = err.splitlines()
    assert line.startswith("heal: failure 1: rank 0 on ") and ", deterministic: DamagedFileError: " in line
    assert f"{run / 'packed' / 'images-00000.bin'} is truncated" in line


def checkpoint_files(run: Path) -> list[str]:
    """The checkpoint files (damaged ones set aside included) of a run, by name."""
    return sorted(p.name for p in (run / "checkpoints").iterdir() if ".pth" in p.name)


def checkpoint_epoch(path: Path) -> tuple[int, int]:
    saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return saved["epoch"], saved["global_step"]


@pytest.mark.parametrize("how", ["truncate", pytest.param("garble", marks=pytest.mark.slow)])
def test_a_damaged_latest_checkpoint_is_set_aside_and_training_resumes_from_the_one_before(case, caplog, how):
    """Damaged in place, checkpoint.pth takes its hard link checkpoint_0002.pth with it: both are set
    aside (kept, byte for byte), training resumes from checkpoint_0001.pth and trains epoch 2 again.
    No failure: nothing for the self-healing launcher to record or retry."""
    damaged, step = case
    run = damaged("checkpoints/checkpoint.pth", how)
    checkpoints = run / "checkpoints"
    damaged_bytes = (checkpoints / "checkpoint.pth").stat().st_size
    caplog.set_level(logging.INFO)
    assert step("pretrain") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"damaged checkpoint in {checkpoints}: checkpoint.pth ")
    assert "resuming from checkpoint_0001.pth, the newest intact checkpoint" in warnings[0]
    assert checkpoint_files(run) == [
        "checkpoint.pth", "checkpoint.pth.damaged", "checkpoint_0001.pth", "checkpoint_0002.pth",
        "checkpoint_0002.pth.damaged", "checkpoint_previous.pth"]
    assert (checkpoints / "checkpoint.pth.damaged").stat().st_size == damaged_bytes
    assert checkpoint_epoch(checkpoints / "checkpoint.pth") == checkpoint_epoch(checkpoints / "checkpoint_0002.pth") == (
        2, 4)
    assert "resumed from" in caplog.text and "checkpoint_0001.pth: epoch 1, step 2" in caplog.text
    assert not (checkpoints / "failures.jsonl").exists() and not (checkpoints / "DETERMINISTIC_FAILURE").exists()


def test_a_missing_latest_checkpoint_resumes_from_the_newest_numbered_one(case, caplog):
    damaged, step = case
    run = damaged("checkpoints/checkpoint.pth", "delete")
    caplog.set_level(logging.INFO)
    assert step("pretrain") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"{run / 'checkpoints' / 'checkpoint.pth'} is missing; resuming from checkpoint_0002.pth, "
                        "the newest intact checkpoint (linked as checkpoint.pth)"]
    assert checkpoint_epoch(run / "checkpoints" / "checkpoint.pth") == (2, 4)  # nothing trained again
    assert (run / "checkpoints" / "checkpoint.pth").samefile(run / "checkpoints" / "checkpoint_0002.pth")


def test_no_intact_checkpoint_at_all_is_one_line_and_moves_nothing(case, capsys):
    damaged, step = case
    run = damaged("checkpoints/checkpoint.pth", "truncate")
    for name in ("checkpoint_0001.pth", "checkpoint_previous.pth"):  # hard links: the shared run keeps its own
        damage(run / "checkpoints" / name, "delete")
    listing = checkpoint_files(run)
    assert step("pretrain") == 2
    line = error_line(capsys)
    assert line.startswith(f"no intact checkpoint to resume from in {run / 'checkpoints'} (checkpoint.pth is "
                           "truncated or damaged at its end")
    assert "checkpoint_0002.pth is a hard link to checkpoint.pth" in line
    assert line.endswith("): restore one from a copy, or move the folder away to start again from the first epoch")
    assert checkpoint_files(run) == listing


def test_a_deleted_split_is_computed_again_to_the_same_labels(case):
    damaged, step = case
    run = damaged("split.json", "delete")
    before = json.loads((run / "labels.json").read_text())
    assert step("labels") == 0
    assert json.loads((run / "labels.json").read_text()) == before


def test_a_truncated_feature_set_is_recomputed_by_features(case):
    """`features` takes a damaged set for one to compute (no --force), then knn reads it."""
    damaged, step = case
    run = damaged("features/final/features.npy", "truncate")
    assert step("features", "--epochs", "none", "--no-baselines") == 0
    assert step("knn") == 0
    assert "final" in json.loads((run / "knn" / "knn.json").read_text())["tags"]


def test_garbled_metrics_lines_are_skipped_with_one_warning(case, caplog):
    damaged, step = case
    run = damaged("metrics.jsonl", "garble")
    caplog.set_level(logging.WARNING)
    assert step("plots", "--no-umap", "--no-attention") == 0
    warnings = [r.getMessage() for r in caplog.records if "metrics.jsonl" in r.getMessage()]
    assert len(warnings) == 1 and re.fullmatch(rf"{re.escape(str(run / 'metrics.jsonl'))}: skipped 1 line\(s\) that "
                                               r"are not JSON records \(line \d+\)", warnings[0])
    assert (run / "plots" / "training_curves.png").is_file()


def test_a_damaged_timings_file_is_set_aside_by_the_next_step(case, caplog):
    damaged, step = case
    run = damaged("timings.json", "garble")
    garbled = (run / "timings.json").read_bytes()
    assert step("labels") == 0
    assert (run / "timings.json.damaged").read_bytes() == garbled
    assert list(json.loads((run / "timings.json").read_text())) == ["labels"]
    assert "moved aside to timings.json.damaged; starting a new one" in caplog.text


@pytest.mark.slow
def test_the_command_line_prints_one_error_line_and_no_traceback(finished, case):
    """As a user runs it: `python -m training features` on a truncated checkpoint, in its own process."""
    config, _ = finished
    damaged, _ = case
    run = damaged("checkpoints/checkpoint.pth", "truncate")
    command = [sys.executable, "-m", "training", "features", "--config", str(config), "--set", f"run.output_dir={run}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert line.startswith(f"error: {run / 'checkpoints' / 'checkpoint.pth'} is truncated or damaged at its end")
