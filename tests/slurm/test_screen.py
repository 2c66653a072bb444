"""The synthetic screen through the local Slurm cluster with configs/screen.yaml, as `make screen`
runs it but shrunk to a minute or two: slurm/submit_pipeline.sh starts the chain with ingest
(because the config sets ingest.table) as a 2-task array on both nodes and its merge, then mean-std,
pretrain (1 epoch, a few steps), features, labels and kNN, each after the one before."""

from __future__ import annotations

import csv
import json
import re

import pytest

from tests.support.local_slurm import REPO, log_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CHAIN = ["ingest-parts", "ingest", "mean-std", "pretrain", "features", "labels", "knn"]
SHRINK = {"optim.epochs": 1, "train.max_steps_per_epoch": 4, "optim.batch_size_per_gpu": 16,
          "eval.knn_k": "[5,10]", "eval.batch_size": 64, "data.num_workers": 0, "eval.max_cells": 0}


def test_the_screen_config_runs_from_fields_of_view_to_knn(cluster, tmp_path):
    from training.data.store.read import PackedImages
    from training.data.synthetic.plates import ScreenSpec, write_screen

    screen = tmp_path / "screen"
    write_screen(screen, ScreenSpec(plates=2, batches=2, wells_per_plate=16, sites=1, fov_size=128, cells_per_fov=12))
    run = tmp_path / "run"
    settings = {"run.output_dir": run, "data.source": screen, "ingest.table": screen / "load_data.csv", **SHRINK}
    overrides = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    out = cluster.run(str(REPO / "slurm" / "submit_pipeline.sh"), str(REPO / "configs" / "screen.yaml"),
                      "--ingest-tasks", "2", "--to", "knn", *overrides, cwd=tmp_path)
    jobs = dict(line.split() for line in out.splitlines())
    assert list(jobs) == CHAIN
    infos = {}
    for step in CHAIN:
        infos[step] = cluster.wait(jobs[step], timeout=600)
        assert infos[step]["JobState"] == "COMPLETED", f"{step}: {log_of(tmp_path, infos[step])}"
    for before, after in zip(CHAIN, CHAIN[1:]):
        assert infos[after]["StartTime"] >= infos[before]["EndTime"], (before, after)

    shown = cluster.run("scontrol", "show", "job", "-o", infos["ingest-parts"]["ArrayJobId"])
    tasks = [line for line in shown.splitlines() if "ArrayTaskId=" in line]
    assert len(tasks) == 2 and all("NumCPUs=2" in line for line in tasks), shown
    report = json.loads((run / "ingest_report.json").read_text())
    with open(screen / "truth.csv", newline="") as f:
        cells = sum(1 for _ in csv.DictReader(f))
    assert report["parts"] == 2 and report["fields"] == 2 * 16 * 1 and report["objects"] == cells
    assert report["cut"] + report["skipped_total"] == cells and report["cut"] > 0.5 * cells
    packed = PackedImages(run / "packed", label_column="Metadata_Treatment", batch_column="Metadata_Batch")
    assert len(packed) == report["cut"] and packed.uniform_shape == (5, 40, 40)
    assert not (run / "packed.parts").exists()

    labels = json.loads((run / "labels.json").read_text())
    assert labels["class_names"] == ["DMSO", "granular", "membrane", "nuclear", "polar", "punctate"]
    assert labels["batch_names"] == ["Batch1", "Batch2"]
    knn = json.loads((run / "knn" / "knn.json").read_text())
    assert {"final", "raw_pixels", "random_init"} <= set(knn["tags"])
    assert all(0 <= v <= 100 for entry in knn["tags"].values() for v in entry["top1"].values())
    assert re.search(r"ingest: 32 fields of view \(0 bad", log_of(tmp_path, infos["ingest"]))
