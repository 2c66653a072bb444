"""The whole chain on a screen-like dataset, each step through the command line as Slurm runs it:
pretrain, features (the final model on every cell), labels, knn, export, plots, report. What each
step hands the next is checked where it lands: the exported embedding is the features step's,
knn.json holds not-same-batch kNN and mAP for the model and both baselines, the report shows them
and a UMAP coloured by batch."""

from __future__ import annotations

import json

import anndata
import numpy as np
import pytest

from tests.support.screen_run import screen_run
from tests.support.tiny import run_cli
from training.rundir import RunLayout, tags
from training.rundir.features import load_features


@pytest.mark.slow
def test_screen_chain_from_pretraining_to_profiles_and_report(tmp_path):
    config = screen_run(tmp_path, image_size=16, **{"eval.umap_neighbors": 5, "train.max_steps_per_epoch": 4})
    layout = RunLayout.from_config(config)
    for step in ("mean-std", "pretrain", "features", "labels", "knn", "export", "plots", "report"):
        extra = ("--force",) if step == "features" else ()
        assert run_cli(config, step, *extra) == 0, step
    final = load_features(layout.features(tags.FINAL))
    assert len(final.indices) == 192 and final.meta["kind"] == "checkpoint"  # every cell, trained and held out
    adata = anndata.read_h5ad(layout.profiles_h5ad)
    np.testing.assert_array_equal(adata.obsm["X_scdino"], final.features)
    assert adata.uns["scdino"]["features"]["checkpoint"].endswith("checkpoint.pth")
    knn = json.loads(layout.knn_json.read_text())
    for tag in (tags.FINAL, tags.RAW_PIXELS, tags.RANDOM_INIT):
        assert "not_same_batch" in knn["tags"][tag] and knn["tags"][tag]["map"]["n_treatments"] == 3
    manifest = json.loads(layout.plots_manifest.read_text())
    assert {"umap_final_Metadata_Batch.png", "screen_measures.png"} <= {entry["png"] for entry in manifest}
    report = layout.report.read_text()
    assert "UMAP of trained" in report and "by Metadata_Batch" in report and "<h3>Screen measures</h3>" in report
