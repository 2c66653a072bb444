"""`export`: the profiles read back by the libraries their users open them with. AnnData through
anndata, then scanpy's neighbours and UMAP on obsm["X_scdino"]; Parquet through pyarrow and
pycytominer, whose own aggregate (median per well, or mean with eval.profile_aggregation: mean) is the
reference for wells.parquet; every value
checked against the feature set and the per-cell table it came from. Class-folder data: per-cell
files only, the per-well ones skipped with one log line."""

from __future__ import annotations

import json
import logging

import anndata
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import scanpy as sc
from pycytominer import aggregate
from pycytominer.cyto_utils import infer_cp_features

import training.eval.profiles.export as export
from tests.support.packing import write_packed
from tests.support.screen_run import screen_run
from tests.support.tiny import TINY_RUN, run_cli, tiny_config
from training.data.dataset import open_images
from training.data.store.read import PackedImages
from training.eval.profiles.subpopulations import CENTRES_KEY, SUBPOPULATION_PREFIX
from training.rundir import RunLayout, tags
from training.rundir.features import FeatureSet, load_features, save_features

ROW_GROUP = 50
"""Cells per row group in these tests: the 192 cells then take four, so streaming is exercised."""


@pytest.fixture
def exported(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "ROW_GROUP", ROW_GROUP)
    config = screen_run(tmp_path, dim=3, **{"eval.profile_normalization": "spherize"})  # 4 control wells span 3
    assert run_cli(config, "export") == 0
    return config, RunLayout.from_config(config)


def test_the_h5ad_opens_in_anndata_and_scanpy_embeds_it(exported):
    config, layout = exported
    adata = anndata.read_h5ad(layout.profiles_h5ad)
    final = load_features(layout.features(tags.FINAL))
    packed = PackedImages(config.data.source)
    assert adata.n_obs == len(packed) == len(final.indices)
    np.testing.assert_array_equal(adata.obsm["X_scdino"], final.features)
    assert list(adata.obs_names) == [str(i) for i in final.indices]
    table = packed.table.table.to_pandas()
    for name in packed.table.metadata_columns:
        assert list(adata.obs[name].astype(str)) == list(table[name].astype(str)), name
    assert list(adata.obs["Metadata_Path"]) == list(table["path"])
    held = np.load(layout.split_rows)
    assert list(adata.obs["Metadata_Split"]) == ["holdout" if h else "train" for h in held]
    provenance = adata.uns["scdino"]
    assert provenance["tag"] == "final" and provenance["features"]["epoch"] == 3
    assert "label_column: Treatment" in provenance["config_yaml"]
    sc.pp.neighbors(adata, use_rep="X_scdino", n_neighbors=10)
    sc.tl.umap(adata, random_state=0)
    assert adata.obsm["X_umap"].shape == (adata.n_obs, 2) and np.isfinite(adata.obsm["X_umap"]).all()
    sc.tl.leiden(adata)  # as docs/training.md suggests (igraph and leidenalg are pinned for it)
    clusters = adata.obs["leiden"]
    assert clusters.notna().all() and 2 <= clusters.nunique() < adata.n_obs


def test_per_cell_parquet_is_streamed_and_pycytominer_infers_its_columns(exported):
    _, layout = exported
    parquet = pq.ParquetFile(layout.profiles_cells)
    assert parquet.metadata.num_row_groups == -(-192 // ROW_GROUP)
    cells = parquet.read().to_pandas()
    final = load_features(layout.features(tags.FINAL))
    features = infer_cp_features(cells)
    assert features == [f"Cells_scDINO_{i:04d}" for i in range(3)]
    np.testing.assert_array_equal(cells[features].to_numpy(), final.features)
    metadata = infer_cp_features(cells, metadata=True)
    assert set(metadata) | set(features) == set(cells.columns)
    assert {"Metadata_TableRow", "Metadata_Plate", "Metadata_Well", "Metadata_Treatment", "Metadata_Batch",
            "Metadata_Split"} <= set(metadata)
    assert list(cells["Metadata_TableRow"]) == list(final.indices)


def test_per_well_parquet_equals_pycytominers_own_median_aggregate(exported):
    _, layout = exported
    cells = pd.read_parquet(layout.profiles_cells)
    features = infer_cp_features(cells)
    strata = ["Metadata_Plate", "Metadata_Well"]
    reference = aggregate(cells, strata=strata, features=features, operation="median", compute_object_count=True,
                          object_feature="Metadata_TableRow").sort_values(strata)
    wells = pd.read_parquet(layout.profiles_wells)
    assert len(wells) == 24 == len(reference)
    np.testing.assert_allclose(wells[features].to_numpy(), reference[features].to_numpy(), rtol=1e-6)
    assert list(wells["Metadata_Object_Count"]) == list(reference["Metadata_Object_Count"])
    assert {"Metadata_Treatment", "Metadata_Batch"} <= set(wells.columns)
    assert "Metadata_Site" not in wells.columns and "Metadata_Split" not in wells.columns  # differ within a well
    assert infer_cp_features(wells) == features


def test_mean_well_profiles_equal_pycytominers_own_mean_aggregate(tmp_path):
    config = screen_run(tmp_path, dim=3, **{"eval.profile_aggregation": "mean"})
    layout = RunLayout.from_config(config)
    assert run_cli(config, "export") == 0
    cells = pd.read_parquet(layout.profiles_cells)
    features = infer_cp_features(cells)
    strata = ["Metadata_Plate", "Metadata_Well"]
    reference = aggregate(cells, strata=strata, features=features, operation="mean").sort_values(strata)
    wells = pd.read_parquet(layout.profiles_wells)
    np.testing.assert_allclose(wells[features].to_numpy(), reference[features].to_numpy(), rtol=1e-5, atol=1e-7)
    medians = aggregate(cells, strata=strata, features=features, operation="median").sort_values(strata)
    assert np.abs(wells[features].to_numpy() - medians[features].to_numpy()).max() > 1e-3  # not the medians
    assert json.loads(layout.profiles_manifest.read_text())["wells"]["aggregation"] == "mean"


def test_each_wells_subpopulation_shares_are_its_cells_fractions_in_scikit_learns_clusters(tmp_path):
    """wells_subpopulations.parquet: each well's fraction of cells in each k-means cluster of the
    cells' L2-normalised features, recounted here from cells.parquet by pandas over the labels of
    scikit-learn's own KMeans (the same seed and restarts)."""
    from sklearn.cluster import KMeans

    from training.eval.profiles.subpopulations import RESTARTS

    config = screen_run(tmp_path, dim=3, **{"eval.profile_subpopulations": 3})
    layout = RunLayout.from_config(config)
    assert run_cli(config, "export") == 0
    cells = pd.read_parquet(layout.profiles_cells)
    x = cells[infer_cp_features(cells)].to_numpy(np.float32)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    fitted = KMeans(n_clusters=3, n_init=RESTARTS, random_state=config.run.seed).fit(x)
    cells["cluster"] = fitted.labels_
    strata = ["Metadata_Plate", "Metadata_Well"]
    expected = pd.crosstab([cells[s] for s in strata], cells["cluster"], normalize="index").sort_index()
    shares = pd.read_parquet(layout.profiles_wells_subpopulations).set_index(strata).sort_index()
    names = [f"{SUBPOPULATION_PREFIX}{i:02d}" for i in range(3)]
    np.testing.assert_allclose(shares[names].to_numpy(), expected[[0, 1, 2]].to_numpy(), atol=1e-6)
    assert (shares["Metadata_Object_Count"] == cells.groupby(strata).size().sort_index()).all()
    record = json.loads(layout.profiles_manifest.read_text())
    assert record["wells"]["subpopulations"] == 3 and "profiles/wells_subpopulations.parquet" in record["files"]
    assert record["wells"]["subpopulation_centres"] == "fitted here"
    # the centres those shares count, each with its cells, in the features' columns
    centres = pd.read_parquet(layout.profiles_subpopulations)
    assert centres["Metadata_Subpopulation"].tolist() == names
    assert centres["Metadata_Cells"].tolist() == np.bincount(fitted.labels_, minlength=3).tolist()
    np.testing.assert_allclose(centres[infer_cp_features(cells)].to_numpy(), fitted.cluster_centers_, atol=1e-5)
    about = json.loads(pq.read_schema(layout.profiles_subpopulations).metadata[CENTRES_KEY])
    assert about["k"] == 3 and about["fitted"]["cells"] == len(cells) and about["fitted"]["seed"] == config.run.seed
    dmso = shares[shares["Metadata_Treatment"] == "DMSO"][names].to_numpy().mean(axis=0)
    np.testing.assert_allclose(about["control_shares"], dmso, atol=1e-6)  # the controls' mean, for new plates
    assert "controls_shift" not in about  # fitted here: there is no pilot to lie from


def test_export_refuses_centres_it_cannot_tie_to_the_features_model(tmp_path, capsys):
    """eval.profile_subpopulation_centres names a pilot's centres; features without a model card (these
    are made up, not embedded by a checkpoint) cannot be shown to be that model's, so export stops in
    one line before writing shares that would not mean what their columns say."""
    pilot = screen_run(tmp_path / "pilot", dim=3, **{"eval.profile_subpopulations": 3})
    assert run_cli(pilot, "export") == 0
    centres = RunLayout.from_config(pilot).profiles_subpopulations
    config = screen_run(tmp_path / "new", dim=3, **{"eval.profile_subpopulations": 3,
                                                     "eval.profile_subpopulation_centres": str(centres)})
    assert run_cli(config, "export") != 0
    assert "cannot count features/final: the centres or the features carry no model card" in capsys.readouterr().err
    assert not RunLayout.from_config(config).profiles_wells_subpopulations.exists()


def test_normalised_wells_are_white_on_the_controls(exported):
    _, layout = exported
    normalised = pd.read_parquet(layout.profiles_wells_normalized)
    features = infer_cp_features(normalised)
    controls = normalised[normalised["Metadata_Treatment"] == "DMSO"][features].to_numpy()
    assert len(controls) == 4
    # white up to pycytominer's epsilon (1e-6 added to variances of ~0.002 here: 1 - 5e-4 at worst)
    np.testing.assert_allclose(np.cov(controls, rowvar=False), np.eye(3), atol=2e-3)
    raw = pd.read_parquet(layout.profiles_wells)
    before = np.cov(raw[raw["Metadata_Treatment"] == "DMSO"][features].to_numpy(), rowvar=False)
    assert np.abs(before - np.eye(3)).max() > 0.5  # the raw medians were far from white
    record = json.loads(layout.profiles_manifest.read_text())
    assert record["wells"]["n_wells"] == 24 and record["n_cells"] == 192
    assert record["files"] == ["profiles/cells.h5ad", "profiles/cells.parquet", "profiles/wells.parquet",
                               "profiles/wells_normalized.parquet"]


def class_folder_run(tmp_path):
    """Class folders packed (Metadata_Class only), the final features of every cell."""
    rng = np.random.default_rng(0)
    classes = ["a", "b", "c"] * 10
    write_packed(tmp_path / "packed", [rng.integers(0, 9, (2, 4, 4)).astype(np.uint16) for _ in classes], classes)
    config = tiny_config({**TINY_RUN, "run.output_dir": str(tmp_path / "run"), "data.source": str(tmp_path / "packed"),
                          "data.channels": "01", "eval.knn_k": [1, 3], "data.holdout_fraction": 0.5})
    layout = RunLayout.from_config(config)
    features = rng.standard_normal((30, 8)).astype(np.float32)
    save_features(layout.features(tags.FINAL), FeatureSet(features, np.arange(30), {"kind": "checkpoint"}))
    return config, layout


def test_class_folders_export_per_cell_profiles_and_skip_wells(tmp_path, caplog):
    config, layout = class_folder_run(tmp_path)
    with caplog.at_level(logging.INFO):
        assert run_cli(config, "export") == 0
    assert [r.message for r in caplog.records if "per-well profiles skipped" in r.message]
    adata = anndata.read_h5ad(layout.profiles_h5ad)
    assert list(adata.obs["Metadata_Class"]) == ["a", "b", "c"] * 10
    assert pq.read_table(layout.profiles_cells).num_rows == 30
    assert not layout.profiles_wells.exists()
    assert json.loads(layout.profiles_manifest.read_text())["wells"] is None
    assert run_cli(config, "labels") == 0 and run_cli(config, "knn") == 0
    knn = json.loads(layout.knn_json.read_text())
    assert "not_same_batch" not in knn and "map" not in knn
    assert not any("not_same_batch" in e or "map" in e for e in knn["tags"].values())


@pytest.mark.parametrize(("overrides", "message"), [
    ({"eval.plate_column": "Nope"}, "eval.plate_column='Nope' names no column of the per-cell table"),
    ({"eval.profile_normalization": "spherize", "data.control_column": "", "data.control_value": ""},
     "eval.profile_normalization spherize is fitted on the control wells: set data.control_column"),
])
def test_bad_settings_are_one_line_naming_the_fix(tmp_path, capsys, overrides, message):
    config = screen_run(tmp_path, **overrides)
    for step in ("export", "knn"):
        assert run_cli(config, step) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_a_tiff_folder_exports_its_paths_and_class_folders(make_config):
    """data.loader=tiff: no packed table, so the profiles carry each image's path and class folder."""
    config = make_config({"data.loader": "tiff"})
    layout = RunLayout.from_config(config)
    images = open_images(config)
    features = np.random.default_rng(0).standard_normal((len(images), 5)).astype(np.float32)
    save_features(layout.features(tags.FINAL), FeatureSet(features, np.arange(len(images)), {"kind": "checkpoint"}))
    assert run_cli(config, "export") == 0
    cells = pd.read_parquet(layout.profiles_cells)
    names = np.asarray(images.class_names)[images.labels]
    assert list(cells["Metadata_Class"]) == list(names) and list(cells["Metadata_Path"]) == list(images.paths)
    assert all(path.split("/")[0] == name for path, name in zip(cells["Metadata_Path"], names))
    np.testing.assert_array_equal(anndata.read_h5ad(layout.profiles_h5ad).obsm["X_scdino"], features)
