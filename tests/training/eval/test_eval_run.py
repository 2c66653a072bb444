"""features, labels, knn and linear on a tiny real run (real pretraining, real loaders, real CLI)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.support.eval_tiny_run import CLASSES, evaluated_run, run_dir, run_step
from training.rundir.features import load_features

pytestmark = pytest.mark.slow

TAGS = ["epoch_0001", "epoch_0002", "final", "random_init", "raw_pixels"]


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return evaluated_run(tmp_path_factory)


def test_features_cover_every_checkpoint_and_both_baselines(config):
    root = run_dir(config)
    labels = json.loads((root / "labels.json").read_text())
    assert sorted(p.name for p in (root / "features").iterdir()) == TAGS
    assert labels["class_names"] == list(CLASSES) and labels["n_images"] == 24
    cells = len(load_features(root / "features" / "final").indices)
    assert cells > 24  # the training images too
    for tag in TAGS:
        fs = load_features(root / "features" / tag)
        rows = cells if tag == "final" else 24  # the final checkpoint: every cell (eval.embed_all_cells)
        assert fs.features.shape == (rows, 3 * 4 * 4 if tag == "raw_pixels" else 192)
        np.testing.assert_allclose(np.linalg.norm(fs.features, axis=1), 1.0, rtol=1e-5)
        expected = np.arange(cells) if tag == "final" else labels["indices"]
        np.testing.assert_array_equal(fs.indices, expected)
    final = load_features(root / "features" / "final")
    assert final.meta["epoch"] == 2 and final.meta["checkpoint"].endswith("checkpoint.pth")
    trained = load_features(root / "features" / "epoch_0002").features
    held_out = final.select(labels["indices"]).features
    np.testing.assert_allclose(held_out, trained, atol=1e-6)  # the same weights, saved twice
    assert not np.allclose(held_out, load_features(root / "features" / "random_init").features)


def test_rerun_skips_what_is_up_to_date_and_force_recomputes(config):
    features = run_dir(config) / "features"
    before = {t: (features / t / "features.npy").stat().st_mtime_ns for t in TAGS}
    assert run_step(config, "features") == 0
    assert {t: (features / t / "features.npy").stat().st_mtime_ns for t in TAGS} == before
    assert run_step(config, "features", "--epochs", "none", "--no-baselines", "--force") == 0
    after = {t: (features / t / "features.npy").stat().st_mtime_ns for t in TAGS}
    assert [t for t in TAGS if after[t] != before[t]] == ["final"]


def test_features_of_the_other_normalisation_are_computed_again(config, caplog):
    """data.normalization is part of what makes features up to date, both ways; files written
    before the key existed count as the dataset normalisation and are kept. Checkpoints trained
    with the dataset's normalisation, read with per-image, get a warning naming the fix."""
    features = run_dir(config) / "features"
    mtimes = lambda: {t: (features / t / "features.npy").stat().st_mtime_ns for t in TAGS}  # noqa: E731
    dataset = load_features(features / "final").features
    assert run_step(config, "features", "--set", "data.normalization=per_image") == 0
    warned = [r.getMessage() for r in caplog.records if "data.normalization=dataset" in r.getMessage()]
    assert len(warned) == 3 and all("set data.normalization=dataset as in its pretraining" in m for m in warned)
    caplog.clear()
    per_image = mtimes()
    assert not np.allclose(load_features(features / "final").features, dataset, atol=1e-3)
    assert run_step(config, "features") == 0
    assert not [r for r in caplog.records if "as in its pretraining" in r.getMessage()]
    restored = mtimes()
    assert all(restored[t] != per_image[t] for t in TAGS)
    np.testing.assert_allclose(load_features(features / "final").features, dataset, atol=1e-6)
    for tag in TAGS:
        index = features / tag / "index.json"
        legacy = json.loads(index.read_text())
        assert legacy.pop("normalization") == "dataset"
        index.write_text(json.dumps(legacy))
    assert run_step(config, "features") == 0
    assert mtimes() == restored


def test_unknown_epoch_is_a_one_line_error(config, capsys):
    assert run_step(config, "features", "--epochs", "7") == 2
    assert "no checkpoint for epoch(s) [7]; available: [1, 2]" in capsys.readouterr().err


def test_torchrun_two_ranks_write_the_single_rank_features(config, tmp_path):
    """An external checkpoint (--checkpoint) evaluated by 2 gloo ranks equals the 1-rank result."""
    root = run_dir(config)
    other = tmp_path / "two_ranks"
    other.mkdir()
    for name in ("mean_std.json", "split.json"):
        if (root / name).exists():
            shutil.copy(root / name, other / name)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "training", "features", "--config", str(config), "--set", f"run.output_dir={other}",
               "--checkpoint", str(root / "checkpoints" / "checkpoint.pth")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for tag in ("final", "raw_pixels", "random_init"):
        two, one = load_features(other / "features" / tag), load_features(root / "features" / tag)
        np.testing.assert_array_equal(two.indices, one.indices)
        np.testing.assert_allclose(two.features, one.features, atol=1e-5)
        # each rank wrote a part beside the set; rank 0 merged them and removed them
        assert sorted(p.name for p in (other / "features" / tag).iterdir()) == ["features.npy", "index.json", "rows.npy"]


def test_knn_table_compares_trained_features_with_baselines(config, capsys):
    root = run_dir(config)
    knn = json.loads((root / "knn" / "knn.json").read_text())
    assert set(knn["tags"]) == set(TAGS)
    assert knn["n_reference"] + knn["n_query"] == 24 and knn["seed"] == 0
    final = knn["tags"]["final"]
    assert final["effective_k"]["200"] == knn["n_reference"]
    assert set(final["top1"]) == {"1", "3", "5", "200"}
    assert all(final["top1"][k] <= final["top2"][k] for k in final["top1"])
    assert np.sum(final["confusion"]) == knn["n_query"] and len(final["per_class_top1"]) == 3
    table = (root / "knn" / "knn.md").read_text()
    assert "raw pixels (baseline)" in table and "random init (baseline)" in table and "| final" in table
    assert run_step(config, "knn") == 0
    assert "random init (baseline)" in capsys.readouterr().out
    assert json.loads((root / "knn" / "knn.json").read_text()) == knn  # deterministic rerun


def test_linear_probe_reports_every_epoch(config):
    linear = json.loads((run_dir(config) / "linear" / "linear.json").read_text())
    assert set(linear["tags"]) == {"final", "raw_pixels", "random_init"}
    for entry in linear["tags"].values():
        assert [h["epoch"] for h in entry["history"]] == [1, 2, 3, 4, 5]
        assert 0.0 <= entry["final_top1"] <= entry["best_top1"] <= 1.0


def test_linear_all_tags_adds_every_epoch(config):
    assert run_step(config, "linear", "--all-tags") == 0
    linear = json.loads((run_dir(config) / "linear" / "linear.json").read_text())
    assert set(linear["tags"]) == set(TAGS)
    assert run_step(config, "linear") == 0  # leave the default table for the report tests
