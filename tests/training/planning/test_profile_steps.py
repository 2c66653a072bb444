"""`plan`'s steps after `features` for a 10^8-cell screen: each figure of the dated table derived again
from the benchmark's JSON it cites, and the plan's hours, storage and memory recomputed here from
that table (and the feature set's size from first principles)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.cli import main
from training.planning import profile_steps as planned

REPO = Path(__file__).resolve().parents[3]
BENCHMARKS = REPO / "docs" / "benchmarks"


def _rows(name: str) -> dict[int, dict]:
    return {row["n_cells"]: row for row in json.loads((BENCHMARKS / name).read_text())["rows"]}


def test_the_dated_table_is_what_the_cited_benchmarks_measured():
    assert [cost.step for cost in planned.STEP_COSTS] == ["features", "h5ad", "parquet", "wells", "subpopulations",
                                                          "map"]
    for cost in planned.STEP_COSTS:
        date, cells_json, wells_json = cost.measured
        assert date in cells_json and date in wells_json
        cells, wells = _rows(cells_json), _rows(wells_json)
        small, middle, large, more_wells = cells[100_000], cells[1_000_000], cells[10_000_000], wells[1_000_000]
        s, m, lg, w = (row[cost.step] for row in (small, middle, large, more_wells))
        if "n_wells" in m:
            assert (m["n_wells"], w["n_wells"]) == (planned.MEASURED_WELLS, planned.MORE_WELLS), cost.step
        expected = {
            "cpu_s_per_million_cells": (lg["cpu_s"] - m["cpu_s"]) / 9,
            "cpu_s_per_thousand_wells": (w["cpu_s"] - m["cpu_s"]) / 46.08,  # same cells, 4x the wells
            "bytes_per_cell": (lg["bytes"] - m["bytes"]) / 9e6,
            "bytes_per_well": (w["bytes"] - m["bytes"]) / 46_080,
            "peak_anon_mb": lg["peak_anon_mb"],
            "anon_mb_per_million_cells": (lg["peak_anon_mb"] - s["peak_anon_mb"]) / 9.9,
            "anon_mb_per_thousand_wells": (w["peak_anon_mb"] - m["peak_anon_mb"]) / 46.08,
        }
        for field, value in expected.items():
            assert getattr(cost, field) == pytest.approx(max(0.0, value), rel=0.01, abs=0.01), (cost.step, field)
    shares = next(cost for cost in planned.STEP_COSTS if cost.step == planned.SUBPOPULATIONS)
    assert json.loads((BENCHMARKS / shares.measured[1]).read_text())["rows"][-1][planned.SUBPOPULATIONS]["k"] == 32


def _without_shares() -> list:
    return [cost for cost in planned.STEP_COSTS if cost.step != planned.SUBPOPULATIONS]


def test_a_screen_of_10_8_cells_is_sized_from_the_table(tmp_path, capsys):
    out = tmp_path / "plan.json"
    cells = 100_000_000
    assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", "--images", str(cells), "--preset",
                 "p5.48xlarge", "--nodes", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    plan = json.loads(out.read_text())["profile_steps"]
    wells = round(cells / (planned.MEASURED_CELLS / planned.MEASURED_WELLS))
    assert plan["cells"] == cells and plan["wells"] == wells == 153_600
    assert "100,000,000 cells in 153,600 wells (assumed: 651 cells a well" in text
    for cost, step in zip(_without_shares(), plan["steps"], strict=True):
        seconds = cost.cpu_s_per_million_cells * 100 + cost.cpu_s_per_thousand_wells * 153.6
        assert step["hours"] == pytest.approx(seconds / 3600, abs=1e-4), cost.step
        assert step["storage_gb"] == pytest.approx((cost.bytes_per_cell * cells + cost.bytes_per_well * wells) / 1e9,
                                                   abs=1e-3)
        grown = cost.peak_anon_mb + cost.anon_mb_per_million_cells * 90 + cost.anon_mb_per_thousand_wells * 138.24
        assert step["peak_memory_gb"] == pytest.approx(grown / 1024, abs=1e-3)
        assert f"  {cost.step:<14} {step['hours']:>8.3f}" in text
    features = plan["steps"][0]
    assert features["storage_gb"] == pytest.approx(cells * (384 * 4 + 8) / 1e9, rel=1e-4)  # float32 row + int64 row id
    h5ad, parquet = plan["steps"][1], plan["steps"][2]
    assert h5ad["storage_gb"] > features["storage_gb"] and parquet["storage_gb"] > 0.99 * features["storage_gb"]
    assert plan["hours"] == pytest.approx(sum(step["hours"] for step in plan["steps"]), abs=1e-3)
    assert plan["storage_gb"] == pytest.approx(sum(step["storage_gb"] for step in plan["steps"]), abs=1e-2)


def test_wells_given_replace_the_guess_and_scale_only_the_per_well_part(tmp_path, capsys):
    def plan(*wells: str) -> dict:
        out = tmp_path / "plan.json"
        assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", "--images", "20000000", "--preset",
                     "p5.48xlarge", "--nodes", "1", "--json", str(out), *wells]) == 0
        capsys.readouterr()
        return json.loads(out.read_text())["profile_steps"]

    few, many = plan("--wells", "1000"), plan("--wells", "101000")
    assert few["wells"] == 1000 and few["wells_source"] == "--wells 1000"
    for cost, a, b in zip(_without_shares(), few["steps"], many["steps"], strict=True):
        assert (b["hours"] - a["hours"]) * 3600 == pytest.approx(cost.cpu_s_per_thousand_wells * 100, abs=0.5)


def test_the_shares_step_is_planned_where_the_config_asks_for_it(tmp_path, capsys):
    def plan(*settings: str) -> dict:
        out = tmp_path / "plan.json"
        assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", *settings, "--images", "100000000",
                     "--wells", "153600", "--json", str(out)]) == 0
        capsys.readouterr()
        return json.loads(out.read_text())["profile_steps"]

    plain, shared = plan(), plan("--set", "eval.profile_subpopulations=32")
    (cost,) = [cost for cost in planned.STEP_COSTS if cost.step == planned.SUBPOPULATIONS]
    (step,) = [step for step in shared["steps"] if step["step"] == planned.SUBPOPULATIONS]
    assert planned.SUBPOPULATIONS not in [step["step"] for step in plain["steps"]]
    assert step["hours"] == pytest.approx((cost.cpu_s_per_million_cells * 100 + cost.cpu_s_per_thousand_wells * 153.6)
                                          / 3600, abs=1e-4)
    assert shared["hours"] == pytest.approx(plain["hours"] + step["hours"], abs=1e-3)
    assert cost.measured[1] in shared["source"] and cost.measured[1] not in plain["source"]


def test_no_wells_is_one_line_naming_the_fix(tmp_path, capsys):
    assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", "--images", "1000", "--wells", "0"]) == 2
    assert "--wells 0: give the number of wells the screen's cells are in (at least 1)" in capsys.readouterr().err
