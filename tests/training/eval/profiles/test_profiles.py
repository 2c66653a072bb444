"""Per-well profiles (training/eval/profiles/wells.py): medians and means against pandas' groupby, block by
block from a memory map, in any storage order; the metadata a well keeps; control settings that match nothing named. Their
normalisation: test_profile_normalization.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from training.config import Config
from training.data.store.cells import CellTable, storage_table
from training.errors import UserError
from training.eval.profiles.wells import (
    OBJECT_COUNT,
    cell_wells,
    control_wells,
    group_wells,
    well_aggregates,
    well_metadata,
)


@pytest.mark.parametrize("how", ["median", "mean"])
def test_profiles_per_well_match_pandas_groupby_across_blocks(tmp_path, how):
    rng = np.random.default_rng(0)
    n = 500
    plates, wells = rng.integers(0, 3, n), rng.integers(0, 7, n)  # cells in no well order: gathered, not sliced
    plates[:5] = -1  # no plate value: in no well
    features = (rng.standard_normal((n, 6)) * 100 + 1000).astype(np.float32)  # far from 0: rtol is meaningful
    stored = np.lib.format.open_memmap(tmp_path / "f.npy", mode="w+", dtype=np.float32, shape=features.shape)
    stored[:] = features
    grouped = group_wells(plates, wells)
    frame = pd.DataFrame(features.astype(np.float64)).assign(plate=plates, well=wells)[plates >= 0]
    expected = getattr(frame.groupby(["plate", "well"]), how)()
    for block in (1, 17, 10_000):
        profiles = well_aggregates(stored, grouped, how, block_cells=block)
        assert profiles.dtype == np.float32
        np.testing.assert_allclose(profiles, expected.to_numpy(), rtol=1e-6)
    assert grouped.left_out == 5
    np.testing.assert_array_equal(grouped.sizes, frame.groupby(["plate", "well"]).size().to_numpy())


def test_a_well_stored_in_order_is_profiled_from_one_slice_alike():
    """Cells stored well by well (a screen's table) take the one-slice path; the mean is the same as
    numpy's of each well's rows, and an odd cell moves the mean but not the median."""
    rng = np.random.default_rng(1)
    sizes = [3, 5, 4]
    wells = np.repeat(np.arange(3), sizes)
    features = rng.standard_normal((len(wells), 4)).astype(np.float32)
    features[0] = 1e3  # one odd cell in well 0
    grouped = group_wells(np.zeros(len(wells), np.int64), wells)
    means = well_aggregates(features, grouped, "mean", block_cells=4)
    bounds = np.cumsum([0, *sizes])
    for w, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        np.testing.assert_allclose(means[w], features[a:b].astype(np.float64).mean(axis=0), rtol=1e-6)
    medians = well_aggregates(features, grouped, "median")
    assert means[0].min() > 300 and np.abs(medians[0]).max() < 10


def test_every_aggregation_the_config_offers_is_one_wells_can_make():
    """eval.profile_aggregation's choices are the keys of wells.AGGREGATIONS, so that neither can gain a
    choice the other lacks (the config refuses any other in one line)."""
    import typing

    from training.config import EvalConfig
    from training.eval.profiles.wells import AGGREGATIONS

    offered = typing.get_args(typing.get_type_hints(EvalConfig)["profile_aggregation"])
    assert set(offered) == set(AGGREGATIONS) and "median" == EvalConfig().profile_aggregation


def test_an_unknown_aggregation_is_refused():
    with pytest.raises(ValueError, match="mode"):
        well_aggregates(np.zeros((2, 1), np.float32), group_wells(np.zeros(2, np.int64), np.zeros(2, np.int64)),
                        "mode")


def table(**columns) -> CellTable:
    n = len(next(iter(columns.values())))
    return CellTable("cells", table=storage_table([f"c{i}" for i in range(n)], np.zeros(n), np.arange(n),
                                                  np.ones(n), np.ones(n), columns))


def test_a_well_keeps_the_metadata_all_its_cells_share():
    cells = table(Metadata_Plate=["P1", "P1", "P1", "P2", "P2"], Metadata_Well=["A1", "A1", "A2", "A1", "A1"],
                  Metadata_Treatment=["x", "x", "y", "x", "x"], Metadata_Site=[1, 2, 1, 1, 1],
                  Metadata_Dose=[0.5, 0.5, 1.0, 0.5, 0.5])
    wells = cell_wells(cells, ("Metadata_Plate", "Metadata_Well"))
    shared = well_metadata(cells, wells)
    assert list(shared) == ["Metadata_Plate", "Metadata_Well", "Metadata_Treatment", "Metadata_Dose", OBJECT_COUNT]
    assert shared["Metadata_Treatment"].to_pylist() == ["x", "y", "x"]
    assert shared["Metadata_Dose"].to_pylist() == [0.5, 1.0, 0.5]
    assert shared[OBJECT_COUNT].tolist() == [2, 1, 2]


def test_control_settings_that_match_nothing_are_named():
    cells = table(Metadata_Plate=["P1"] * 4, Metadata_Well=["A1", "A1", "A2", "A2"],
                  Metadata_Treatment=["DMSO", "DMSO", "x", "x"])
    wells = cell_wells(cells, ("Metadata_Plate", "Metadata_Well"))
    sphere = {"eval.profile_normalization": "spherize"}
    with pytest.raises(UserError, match="set data.control_column and data.control_value"):
        control_wells(cells, Config().replace({}), wells)
    wrong = Config().replace({**sphere, "data.control_column": "Treatment", "data.control_value": "PBS"})
    with pytest.raises(UserError, match=r"data.control_value='PBS' is no value of Metadata_Treatment \(its values: "
                                        r"DMSO, x\)"):
        control_wells(cells, wrong, wells)
    right = Config().replace({**sphere, "data.control_column": "Treatment", "data.control_value": "DMSO"})
    assert control_wells(cells, right, wells).tolist() == [True, False]
