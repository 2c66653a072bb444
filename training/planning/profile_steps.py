"""The steps after `features` at screen scale: time, storage and memory of writing the feature set,
`export`'s AnnData and Parquet files, the per-well profiles and their normalisation, the cells'
subpopulation shares per well (where eval.profile_subpopulations asks for them), and the retrieval
mAP, for a screen of N cells in W wells, from figures `bench profile-scale` measured
(training/benchmarks/data/profile_scale.py; the dated table STEP_COSTS below).

Each step costs so much per cell (its medians read every cell) plus so much per well (normalisation
and the mAP's pairs grow with the wells, not the cells):

    hours    = (cells / 10^6 x cpu_s_per_million_cells + wells / 10^3 x cpu_s_per_thousand_wells) / 3600
    storage  = cells x bytes_per_cell + wells x bytes_per_well
    memory   = peak_anon_mb + anon_mb_per_million_cells x (cells - 10^7) / 10^6
                            + anon_mb_per_thousand_wells x (wells - 15,360) / 10^3
               (each term counted where it adds: never below the peak measured at 10^7 cells)

Per well is linear between the two numbers of wells measured; sphering (in `wells` and `map`) grows
faster than that (pycytominer's Spherize takes a full SVD of the control wells, a controls x controls
matrix: 6.3x the time for 4x the wells measured), so above 61,440 wells those two steps' per-well
hours are a lower bound.

Time is the CPU seconds of the step's process (user + system, its imports left out): each step is one
process that keeps one core busy, which a node with a core free for it spends as wall time. On the
measuring machine, at a load average of 2 to 4 (the JSON records it per step), wall and CPU time agreed
within 20 % but for writing cells.h5ad at 10^7 cells: 37.7 s wall for 24.1 s of CPU (the disk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.errors import UserError

MEASURED_CELLS, MEASURED_WELLS, MORE_WELLS = 10_000_000, 15_360, 61_440
CELLS_PER_WELL = MEASURED_CELLS / MEASURED_WELLS
"""Assumed when the plan is given no --wells: the benchmark's screen at 10^7 cells (651 cells a well)."""
EXPORT = ("2026-11-28", "profile_scale_cpu_2026-11-28.json", "profile_scale_wells_cpu_2026-11-28.json")
SHARES = ("2026-12-03", "profile_scale_subpopulations_cpu_2026-12-03.json",
          "profile_scale_subpopulations_wells_cpu_2026-12-03.json")
"""When and in which two JSONs of docs/benchmarks/ a step was measured: `bench profile-scale` on the 2-core
development machine at 10^5, 10^6 and 10^7 synthetic cells (384 float32 features each) on 40 plates of
384 wells, and at 10^6 cells on 160 plates (`--plates 160`)."""


@dataclass(frozen=True)
class StepCost:
    """One step's measured cost: per cell, the change from 10^6 to 10^7 cells (15,360 wells); per
    well, the change from 15,360 to 61,440 wells (10^6 cells); none where a change was below zero
    (noise: the step does not grow with that)."""

    step: str
    writes: str
    cpu_s_per_million_cells: float
    cpu_s_per_thousand_wells: float
    bytes_per_cell: float
    bytes_per_well: float
    peak_anon_mb: float
    """At 10^7 cells in 15,360 wells."""
    anon_mb_per_million_cells: float
    """The growth of the peak from 10^5 to 10^7 cells, per 10^6 cells."""
    anon_mb_per_thousand_wells: float
    measured: tuple[str, str, str] = EXPORT
    """EXPORT or SHARES: the date and the benchmark JSONs the figures come from."""


SUBPOPULATIONS = "subpopulations"
"""The step that runs only where eval.profile_subpopulations is set (configs/screen.yaml: 32)."""
STEP_COSTS: tuple[StepCost, ...] = (
    StepCost("features", "the feature set of every cell (its write: the forward pass is in the downstream hours)",
             4.090, 0.0023, 1544.0, 0.0, 798.1, 0.0101, 0.2821),
    StepCost("h5ad", "export: every cell's profile as AnnData", 2.234, 0.0001, 1694.9, 29.22, 605.6, 6.374, 0.0217),
    StepCost("parquet", "export: every cell's profile as Parquet", 6.953, 0.0, 1552.9, 21.48, 779.0, 8.586, 0.0109),
    StepCost("wells", "export: per-well medians and their normalisation, as Parquet", 4.429, 0.2843, 0.0, 3080.5,
             901.6, 9.636, 13.83),
    StepCost(SUBPOPULATIONS, "export: each well's shares of the cells' subpopulations, as Parquet (k: 32)",
             7.751, 0.2459, 0.01333, 27.33, 906.5, 12.34, 0.3060, measured=SHARES),
    StepCost("map", "knn: the activity mAP of every cell's wells (eval.profile_cells: all)", 4.478, 0.4561, 0.0, 0.0,
             1388.0, 16.55, 4.829),
)
"""Each step's figures, from the JSONs its `measured` names; tests/training/planning/test_profile_steps.py
derives every figure again from those JSONs."""


def profile_steps(cells: int, wells: int, *, subpopulations: int = 0) -> dict[str, Any]:
    """Every step's hours, storage and peak private memory for `cells` cells in `wells` wells, with
    where the figures come from; the subpopulations step where `subpopulations` (the config's
    eval.profile_subpopulations) is set."""
    steps = []
    costs = [cost for cost in STEP_COSTS if subpopulations or cost.step != SUBPOPULATIONS]
    for cost in costs:
        seconds = cells / 1e6 * cost.cpu_s_per_million_cells + wells / 1e3 * cost.cpu_s_per_thousand_wells
        memory = (cost.peak_anon_mb + max(0.0, cost.anon_mb_per_million_cells * (cells - MEASURED_CELLS) / 1e6)
                  + max(0.0, cost.anon_mb_per_thousand_wells * (wells - MEASURED_WELLS) / 1e3))
        steps.append({"step": cost.step, "writes": cost.writes, "hours": round(seconds / 3600, 4),
                      "storage_gb": round((cells * cost.bytes_per_cell + wells * cost.bytes_per_well) / 1e9, 3),
                      "peak_memory_gb": round(memory / 1024, 3)})
    return {"cells": cells, "wells": wells, "steps": steps,
            "hours": round(sum(step["hours"] for step in steps), 4),
            "storage_gb": round(sum(step["storage_gb"] for step in steps), 3),
            "source": "; ".join(f"{', '.join(cost.step for cost in costs if cost.measured == measured)}: docs/benchmarks/"
                                f"{measured[1]} and {measured[2]} ({measured[0]})"
                                for measured in dict.fromkeys(cost.measured for cost in costs))
                      + "; bench profile-scale on the 2-core development machine, CPU seconds of each step's process"}


def wells_of(cells: int, wells: int | None) -> tuple[int, str]:
    """The screen's wells and where the number comes from: --wells, else CELLS_PER_WELL's guess."""
    if wells is not None:
        if wells < 1:
            raise UserError(f"--wells {wells}: give the number of wells the screen's cells are in (at least 1)")
        return wells, f"--wells {wells}"
    guess = max(1, round(cells / CELLS_PER_WELL))
    return guess, f"assumed: {CELLS_PER_WELL:.0f} cells a well, as in the benchmark's screen; give --wells for yours"


def profile_steps_text(plan: dict[str, Any] | None) -> list[str]:
    """The lines `plan` prints of profile_steps' answer."""
    if not plan:
        return []
    lines = [f"steps after features for {plan['cells']:,} cells in {plan['wells']:,} wells ({plan['wells_source']}):",
             f"  {'step':<14} {'hours':>8} {'storage GB':>11} {'memory GB':>10}  writes"]
    for step in plan["steps"]:
        lines.append(f"  {step['step']:<14} {step['hours']:>8.3f} {step['storage_gb']:>11.1f} "
                     f"{step['peak_memory_gb']:>10.2f}  {step['writes']}")
    lines.append(f"  {'total':<14} {plan['hours']:>8.3f} {plan['storage_gb']:>11.1f}")
    lines.append(f"  figures: {plan['source']}")
    return lines
