"""Per-well profiles (training/eval/profiles.py): medians against pandas' groupby, block by block from
a memory map; sphering against pycytominer's own Spherize and against the definition of white
(the controls' covariance becomes the identity); the metadata a well keeps; bad settings named."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pycytominer.operations.transform import Spherize

from training.config import Config
from training.data.cells import CellTable, storage_table
from training.errors import UserError
from training.eval.profiles import (
    OBJECT_COUNT,
    cell_wells,
    control_wells,
    fit_sphering,
    group_wells,
    spherize,
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


def white(x: np.ndarray) -> np.ndarray:
    return np.cov(x, rowvar=False)


def test_sphering_makes_the_controls_white_and_matches_pycytominer():
    rng = np.random.default_rng(1)
    mixing = rng.standard_normal((5, 5)) * [3.0, 1.0, 0.6, 0.4, 2.0]
    profiles = rng.standard_normal((60, 5)) @ mixing + 4.0
    controls = np.zeros(60, bool)
    controls[::2] = True
    sphered = spherize(profiles, controls)
    np.testing.assert_allclose(white(sphered[controls]), np.eye(5), atol=1e-4)
    np.testing.assert_allclose(sphered[controls].mean(axis=0), 0.0, atol=1e-5)
    reference = Spherize(method="ZCA", epsilon=1e-6, return_numpy=True).fit(pd.DataFrame(profiles[controls]))
    np.testing.assert_allclose(sphered, reference.transform(pd.DataFrame(profiles)), rtol=1e-4, atol=1e-4)


def test_fewer_controls_than_dimensions_fill_the_unspanned_directions_as_pycytominer_does():
    rng = np.random.default_rng(2)
    profiles = rng.standard_normal((30, 12)) * np.linspace(0.5, 3.0, 12)
    controls = np.arange(30) < 8  # 8 controls in 12 dimensions: they span 7
    sphered = spherize(profiles, controls)
    reference = Spherize(method="ZCA", epsilon=1e-6, return_numpy=True).fit(pd.DataFrame(profiles[controls]))
    np.testing.assert_allclose(sphered, reference.transform(pd.DataFrame(profiles)), rtol=1e-3, atol=1e-3)
    eigen = np.linalg.eigvalsh(white(sphered[controls]))
    np.testing.assert_allclose(eigen[-7:], 1.0, atol=1e-4)  # white within the controls' span
    assert np.abs(sphered).max() < 100  # no direction blown up by 1 / sqrt(epsilon)


def test_sphering_without_variation_or_controls_is_refused():
    with pytest.raises(UserError, match="do not vary"):
        fit_sphering(np.ones((4, 3)))
    with pytest.raises(UserError, match="at least 2 control"):
        fit_sphering(np.ones((1, 3)))


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
        control_wells(cells, Config().replace(sphere), wells)
    wrong = Config().replace({**sphere, "data.control_column": "Treatment", "data.control_value": "PBS"})
    with pytest.raises(UserError, match=r"data.control_value='PBS' is no value of Metadata_Treatment \(its values: "
                                        r"DMSO, x\)"):
        control_wells(cells, wrong, wells)
    right = Config().replace({**sphere, "data.control_column": "Treatment", "data.control_value": "DMSO"})
    assert control_wells(cells, right, wells).tolist() == [True, False]
