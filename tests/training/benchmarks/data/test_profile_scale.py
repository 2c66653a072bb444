"""bench profile-scale at 10^3 cells: the synthetic screen is laid out as a screen is, its feature set
is the bytes save_features writes, the features step's writing path gives the same set on both its
paths, each step runs through the product's own functions and gives what
they give, and a step measured in its own process reports its memory, time and bytes."""

from __future__ import annotations

import json

import anndata
import numpy as np
import pyarrow.parquet as pq
import pytest

from training.benchmarks.data import profile_scale as bench
from training.benchmarks.request import bench_request
from training.cli import build_parser, main
from training.rundir import RunLayout, tags
from training.rundir.features import FeatureSet, load_features, save_features

SMALL = bench.Screen(3000, plates=2)
"""768 wells of about 4 cells: the per-well steps run in seconds (15,360 wells take ~10 s to normalise)."""


@pytest.fixture(scope="module")
def screen(tmp_path_factory):
    root = tmp_path_factory.mktemp("screen")
    bench.write_screen(root, SMALL)
    bench.run_features(bench.screen_config(root), SMALL)
    return root


def test_the_screen_keeps_each_well_together_with_controls_and_replicates_on_other_plates():
    screen = bench.Screen(20000, plates=10)
    table = screen.table().to_pandas()
    table = table.astype({name: str for name in table.columns if name.startswith("Metadata_")})
    assert len(table) == 20000 and table["path"].is_unique
    wells = table["Metadata_Plate"].astype(str) + "/" + table["Metadata_Well"].astype(str)
    assert wells.nunique() == screen.wells == 3840
    runs = (wells != wells.shift()).sum()
    assert runs == screen.wells  # each well's cells are one run of rows
    per_well = table.groupby(wells.values).first()
    controls = per_well["Metadata_Treatment"] == bench.CONTROL
    assert set(per_well.loc[controls, "Metadata_Well"].str[1:]) == {"01", "24"}
    assert controls.groupby(per_well["Metadata_Plate"]).sum().eq(32).all()
    replicates = per_well.loc[~controls].groupby("Metadata_Treatment")["Metadata_Plate"].agg(["count", "nunique"])
    assert len(replicates) == screen.compounds == 704
    assert (replicates["count"] == bench.REPLICATES).all() and (replicates["nunique"] == bench.REPLICATES).all()
    assert set(table.groupby("Metadata_Plate")["Metadata_Batch"].nunique()) == {1}


def test_the_feature_set_is_what_save_features_writes_and_reads_back_checked(screen, tmp_path):
    written = RunLayout.from_config(bench.screen_config(screen)).features(tags.FINAL)
    expected = bench.SyntheticFeatures(SMALL).all_rows()
    save_features(tmp_path, FeatureSet(expected, np.arange(SMALL.n), bench.feature_meta(bench.screen_config(screen))))
    for name in ("features.npy", "rows.npy", "index.json"):
        assert (written / name).read_bytes() == (tmp_path / name).read_bytes(), name
    loaded = load_features(written)  # every row read: its CRC-32s are checked
    assert loaded.features.shape == (SMALL.n, bench.DIM) and loaded.features.dtype == np.float32
    np.testing.assert_array_equal(loaded.features, expected)
    chunked = np.concatenate([bench.SyntheticFeatures(SMALL).rows(a, min(a + 700, SMALL.n))
                              for a in range(0, SMALL.n, 700)])
    np.testing.assert_array_equal(chunked, expected)  # the same rows whatever the chunks


@pytest.mark.parametrize("ascending", [True, False])
def test_the_features_step_s_path_writes_the_normalised_rows_as_save_features_would(screen, tmp_path, ascending):
    """extract: one rank's rows written as they come; extract_merged: a rank's part, then the merge."""
    config = bench.screen_config(screen)
    rows = bench.SyntheticFeatures(SMALL).all_rows()
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    save_features(tmp_path / "expected", FeatureSet(rows, np.arange(SMALL.n), bench.feature_meta(config)))
    bench.extract_features(tmp_path / "extracted", config, SMALL, ascending=ascending)
    assert sorted(p.name for p in (tmp_path / "extracted").iterdir()) == ["features.npy", "index.json", "rows.npy"]
    extracted = load_features(tmp_path / "extracted")  # every row read: its CRC-32s are checked
    np.testing.assert_allclose(extracted.features, rows, rtol=1e-6, atol=1e-7)  # torch's norm against numpy's
    assert extracted.meta["n_images"] == SMALL.n and extracted.meta["checkpoint"] == "synthetic: bench profile-scale"
    assert (tmp_path / "extracted" / "rows.npy").read_bytes() == (tmp_path / "expected" / "rows.npy").read_bytes()


def test_export_s_files_come_from_the_product_s_writers(screen):
    config = bench.screen_config(screen)
    layout = RunLayout.from_config(config)
    h5ad = bench.run_h5ad(config, SMALL)
    adata = anndata.read_h5ad(layout.profiles_h5ad)
    assert h5ad["bytes"] == layout.profiles_h5ad.stat().st_size
    assert adata.obsm["X_scdino"].shape == (SMALL.n, bench.DIM) and adata.n_obs == SMALL.n
    parquet = bench.run_parquet(config, SMALL)
    assert parquet["bytes"] == layout.profiles_cells.stat().st_size
    assert pq.ParquetFile(layout.profiles_cells).metadata.num_rows == SMALL.n
    wells = bench.run_wells(config, SMALL)
    assert wells["n_wells"] == SMALL.wells and wells["medians_s"] > 0 and wells["normalize_s"] > 0
    assert pq.ParquetFile(layout.profiles_wells_normalized).metadata.num_rows == SMALL.wells
    shares = bench.run_subpopulations(config, SMALL)
    assert shares["n_wells"] == SMALL.wells and shares["k"] == bench.SUBPOPULATIONS and shares["shares_s"] > 0
    written = pq.read_table(layout.profiles_wells_subpopulations).to_pandas()
    columns = [c for c in written.columns if c.startswith("Cells_scDINO_Subpopulation_")]
    assert len(written) == SMALL.wells and len(columns) == bench.SUBPOPULATIONS
    counts = written[columns].to_numpy() * written["Metadata_Object_Count"].to_numpy()[:, None]
    np.testing.assert_allclose(counts, np.round(counts), atol=1e-9)  # whole cells of each well
    assert counts.sum() == pytest.approx(SMALL.n) and (counts.sum(axis=0) > 0).all()  # every cluster holds cells
    bench.drop_outputs(screen)
    assert not layout.profiles.exists()


def test_the_map_finds_the_active_quarter_of_the_compounds(screen):
    result = bench.run_map(bench.screen_config(screen), SMALL)
    assert result["n_wells"] == SMALL.wells and result["n_treatments"] == SMALL.compounds
    # one compound in four moves its cells; with four noisy cells a well, most of those are retrieved
    assert 0.15 <= result["fraction_retrieved"] <= 1 / bench.ACTIVE_EVERY + 0.05


@pytest.mark.slow
def test_each_step_is_measured_in_its_own_process_and_the_scratch_is_removed(tmp_path):
    result = bench.run_profile_scale_benchmark([2000], plates=1, scratch=tmp_path)
    (row,) = result["rows"]
    assert result["wells"] == 384 and row["n_cells"] == 2000 and row["table_bytes"] > 0
    for step in bench.STEPS:
        figures = row[step]
        assert figures["peak_rss_mb"] >= figures["peak_anon_mb"] >= figures["base_anon_mb"] > 0, step
        assert figures["process_cpu_s"] >= figures["cpu_s"] > 0 and figures["process_s"] > figures["seconds"], step
        assert figures["s_per_million"] == pytest.approx(figures["seconds"] / 2000 * 1e6, rel=1e-3)
    assert row["features"]["bytes"] == row["extract"]["bytes"] == row["extract_merged"]["bytes"] > 2000 * bench.DIM * 4
    assert row["h5ad"]["bytes"] > row["features"]["bytes"] and row["map"]["bytes"] == 0
    assert list(tmp_path.iterdir()) == []
    json.dumps(result)


@pytest.mark.parametrize(("args", "message"), [
    (["--plates", "0"], "--plates 0: give a number of plates of 384 wells, e.g. --plates 40"),
    (["--sizes", "10"], "--sizes '10': give cell counts of at least 1000"),
    (["--steps", "map,medians"], "--steps 'map,medians': unknown step medians; give some of extract,"),
    (["--steps", ","], "--steps ',': no step named; give some of extract,"),
])
def test_bad_flags_are_one_line_naming_the_fix(capsys, args, message):
    assert main(["bench", "profile-scale", *args]) == 2
    assert message in capsys.readouterr().err


def test_plates_and_steps_are_refused_by_the_other_benchmarks(capsys):
    assert main(["bench", "scale", "--plates", "3"]) == 2
    assert "--plates: only `bench profile-scale` takes it" in capsys.readouterr().err
    assert main(["bench", "ingest", "--steps", "map"]) == 2
    assert "--steps: only `bench profile-scale` takes it" in capsys.readouterr().err


def test_steps_asked_run_in_the_benchmarks_order_after_the_feature_set_they_read():
    request = bench_request(build_parser().parse_args(["bench", "profile-scale", "--steps", "map,subpopulations"]))
    assert request.steps == ("subpopulations", "map")
    assert bench.steps_to_run(request.steps) == ("features", "subpopulations", "map")
    assert bench.steps_to_run(("extract_merged", "extract")) == ("extract", "extract_merged")
    assert bench.steps_to_run(None) == bench.STEPS
