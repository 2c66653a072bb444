"""The whole pipeline as Slurm jobs on the local cluster (submitted once per session by the
`pipeline` fixture, tests/slurm/conftest.py): the chain, its dependencies, pretraining across both
nodes, and every step's outputs. Recovery from failures is tests/slurm/test_recovery.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.local_slurm import PIPELINE_STEPS as STEPS
from tests.support.local_slurm import log_of

pytestmark = pytest.mark.slurm


@pytest.fixture
def workdir(pipeline_workdir: Path) -> Path:
    return pipeline_workdir


def test_submitter_prints_one_job_per_step_in_order(pipeline):
    ids = [int(pipeline[step]["JobId"]) for step in STEPS]
    assert ids == sorted(ids)
    assert [pipeline[step]["JobName"] for step in STEPS] == [f"scdino-{step}" for step in STEPS]


def test_each_step_waited_for_the_previous_one(pipeline):
    for before, after in zip(STEPS, STEPS[1:]):
        assert pipeline[after]["StartTime"] >= pipeline[before]["EndTime"], (before, after)
        assert pipeline[after]["Dependency"] in ("(null)", ""), "afterok satisfied"


def test_prepare_packed_one_slice_per_node_and_merged_them_into_the_one_prepare_makes(pipeline, cluster, workdir,
                                                                                      tmp_path):
    """The array's two tasks ran on both nodes, each packing half the images into a part; the merge
    linked the parts' pixel files into one dataset equal, cell for cell, to a one-process prepare."""
    import numpy as np

    from training.data.store.read import PackedImages

    parts = pipeline["prepare-parts"]
    assert parts["JobState"] == "COMPLETED" and pipeline["prepare"]["StartTime"] >= parts["EndTime"]
    shown = cluster.run("scontrol", "show", "job", "-o", parts["ArrayJobId"])
    nodes = sorted(re.search(r" NodeList=(\S+)", line).group(1) for line in shown.splitlines() if "ArrayTaskId=" in line)
    assert nodes == ["node1", "node2"], shown
    merged = PackedImages(workdir / "run" / "packed")
    assert len(merged.meta["shards"]) == 2 and not (workdir / "run" / "packed.parts").exists()
    single = tmp_path / "single"
    done = subprocess.run([sys.executable, "-m", "training", "prepare", "--config", str(workdir / "run.yaml"),
                           "--set", f"run.output_dir={single}"], capture_output=True, text=True, cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    one = PackedImages(single / "packed")
    assert list(merged.paths) == list(one.paths) and list(merged.labels) == list(one.labels)
    np.testing.assert_array_equal(merged.read_batch(np.arange(len(one))), one.read_batch(np.arange(len(one))))
    np.testing.assert_array_equal(np.load(workdir / "run" / "split.npy"), np.load(single / "split.npy"))


def test_pretraining_ran_across_both_nodes(pipeline, workdir):
    info = pipeline["pretrain"]
    assert info["NumNodes"] == "2" and info["NodeList"] in ("node[1-2]", "node1,node2")
    log = log_of(workdir, info)
    assert "2 node(s) x 1 process(es)" in log
    assert re.search(r"rank 1/2 joined \(gloo", log), log[-2000:]


def test_every_step_left_its_outputs(pipeline, workdir):
    run = workdir / "run"
    for relative in ("packed", "split.json", "mean_std.json", "checkpoints/checkpoint.pth", "metrics.jsonl",
                     "features/final", "features/raw_pixels", "features/random_init", "labels.json",
                     "knn/knn.json", "knn/knn.md", "linear/linear.json", "report.html"):
        assert (run / relative).exists(), relative
    assert list((run / "plots").glob("*.png"))
    timings = json.loads((run / "timings.json").read_text())
    assert set(STEPS) <= set(timings)
    epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "epoch"]
    assert epochs == [0, 1]


def test_knn_result_has_the_model_and_both_baselines(pipeline, workdir):
    knn = json.loads((workdir / "run" / "knn" / "knn.json").read_text())
    assert {"final", "raw_pixels", "random_init"} <= set(knn["tags"])
    for entry in knn["tags"].values():
        assert set(entry["top1"]) == {"5", "10"}
        assert all(0 <= value <= 100 for value in entry["top1"].values())

