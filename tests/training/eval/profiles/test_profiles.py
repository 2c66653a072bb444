"""Per-well profiles (training/eval/profiles/wells.py): medians against pandas' groupby, block by block from
a memory map; the metadata a well keeps; control settings that match nothing named. Their
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
    well_medians,
    well_metadata,
)


def test_medians_per_well_match_pandas_groupby_across_blocks(tmp_path):
    rng = np.random.default_rng(0)
    n = 500
    plates, wells = rng.integers(0, 3, n), rng.integers(0, 7, n)
    plates[:5] = -1  # no plate value: in no well
    features = rng.standard_normal((n, 6)).astype(np.float32)
    stored = np.lib.format.open_memmap(tmp_path / "f.npy", mode="w+", dtype=np.float32, shape=features.shape)
    stored[:] = features
    grouped = group_wells(plates, wells)
    frame = pd.DataFrame(features).assign(plate=plates, well=wells)[plates >= 0]
    expected = frame.groupby(["plate", "well"]).median()
    for block in (1, 17, 10_000):
        medians = well_medians(stored, grouped, block_cells=block)
        np.testing.assert_allclose(medians, expected.to_numpy(), rtol=1e-6)
    assert grouped.left_out == 5
    np.testing.assert_array_equal(grouped.sizes, frame.groupby(["plate", "well"]).size().to_numpy())


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
