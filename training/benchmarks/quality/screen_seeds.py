"""`bench screen --seeds 0,1,2`: the screen benchmark once per run.seed, and what the runs say together.

    python -m training bench screen --config configs/screen.yaml --seeds 0,1,2 [--ranks 2] [--reuse]
                                    [--out docs/benchmarks/screen_seeds.json]

One training run is one draw: run.seed chooses which cells train and which are queries, the initial
weights and every augmentation, and on the screens of docs/performance.md three seeds of one recipe
span up to 7.5 points of not-same-batch kNN and 0.115 of consistency, wider than the margins the bars
are met by. So a recipe is judged on several runs. Each seed runs the whole screen benchmark
(training/benchmarks/quality/screen.py) into its own run folder beside the config's,
`<run.output_dir>-seed<s>` (runs/screen-seed1), on the one screen, which is made first (`synth-data` at
the config's own seed) when it is missing. With `--reuse` a seed whose steps are done is only scored
again, so an interrupted sweep goes on where it stopped.

The summary takes, for the trained model and for the hybrid where the run scores it, every figure the
bars read (goal_figures'): each run's value, their mean, and the worst run's (the lowest of the model's
figures; the highest of CellProfiler's best mAPs). The bars are then checked two ways: on the mean
figures, and on every run (a bar holds only if each seed meets it), beside how many runs met all five.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from training.config import load_config
from training.errors import UserError

log = logging.getLogger(__name__)

SEED_KEY = "run.seed"
THEIRS = ("cellprofiler_activity", "cellprofiler_consistency")
"""The goal figures that are CellProfiler's, not the model's: their worst run is their highest."""


def seed_overrides(overrides: list[str], output_dir: str, seed: int) -> list[str]:
    """The run's overrides for one seed: its run.seed and its own run folder, run.output_dir-seed<s>."""
    return [*overrides, f"{SEED_KEY}={seed}", f"run.output_dir={str(output_dir).rstrip('/')}-seed{seed}"]


def run_seeds(config_path: Path | None, overrides: list[str], seeds: tuple[int, ...], *, ranks: int, reuse: bool,
              truth: Path | None) -> dict[str, Any]:
    """The benchmark of the module docstring; returns its JSON payload."""
    from training.benchmarks.quality.screen import make_screen, run_screen_benchmark

    if any(o.split("=", 1)[0].strip() == SEED_KEY for o in overrides):
        raise UserError(f"--seeds sets {SEED_KEY} for each run: drop `--set {SEED_KEY}=...` or drop --seeds")
    base = load_config(config_path, overrides)
    made = make_screen(base, config_path, overrides)
    runs = {}
    for number, seed in enumerate(seeds, 1):
        log.info("bench screen --seeds: run.seed %d (%d of %d)", seed, number, len(seeds))
        chosen = seed_overrides(overrides, base.run.output_dir, seed)
        runs[str(seed)] = run_screen_benchmark(load_config(config_path, chosen), config_path, chosen, ranks=ranks,
                                               reuse=reuse, truth=truth)
    first = runs[str(seeds[0])]
    return {"benchmark": "screen-seeds", "date": first["date"], "machine": first["machine"],
            "config": first["config"], "overrides": overrides, "ranks": ranks, "screen": first["screen"],
            "seeds": list(seeds), "seconds_synth_data": made, "summary": summarise(runs), "runs": runs}


def summarise(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per feature set scored against the bars (trained, hybrid): every goal figure's value per run, mean
    and worst; the bars on the mean figures and on every run; the runs that met all five."""
    from training.benchmarks.quality.screen import bars_met

    out = {}
    for name in next(iter(runs.values()))["goal_figures"]:
        per_run = {seed: run["goal_figures"][name] for seed, run in runs.items()}
        keys = next(iter(per_run.values()))
        figures = {key: [per_run[seed][key] for seed in runs] for key in keys}
        mean = {key: _over_runs(values, lambda v: float(np.mean(v))) for key, values in figures.items()}
        worst = {key: _over_runs(values, max if key in THEIRS else min) for key, values in figures.items()}
        met = {seed: bars_met(per_run[seed]) for seed in runs}
        out[name] = {"per_run": figures, "mean": mean, "worst": worst, "bars_on_the_mean": bars_met(mean),
                     "bars_on_every_run": {bar: _over_runs([met[seed][bar] for seed in runs], all)
                                           for bar in next(iter(met.values()))},
                     "bars_met_per_run": {seed: sum(bool(v) for v in bars.values()) for seed, bars in met.items()},
                     "runs_meeting_every_bar": sum(all(bars.values()) for bars in met.values())}
    return out


def _over_runs(values: list, reduce):
    """`reduce` of one figure's values over the runs; None if any run lacks it (never the other runs' alone)."""
    return None if any(v is None for v in values) else reduce(values)


def markdown(result: dict[str, Any]) -> str:
    """Each run's figures for the model, then their mean and worst, as a table for the log and the docs."""
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    summary = result["summary"]["trained"]
    lines = ["| run.seed | NSB % | over raw pixels | over CellProfiler | share of oracle | activity (CellProfiler) "
             "| consistency (CellProfiler) | bars |", "|---|---|---|---|---|---|---|---|"]

    def row(label: str, f: dict[str, float | None], bars: str) -> str:
        return (f"| {label} | {pct(f['nsb'])} | {pct(f['nsb_over_raw_pixels'])} | {pct(f['nsb_over_cellprofiler'])} | "
                f"{num(f['nsb_share_of_oracle'])} | {num(f['activity'])} ({num(f['cellprofiler_activity'])}) | "
                f"{num(f['consistency'])} ({num(f['cellprofiler_consistency'])}) | {bars} |")

    for i, seed in enumerate(result["seeds"]):
        figures = {key: values[i] for key, values in summary["per_run"].items()}
        lines.append(row(str(seed), figures, str(summary["bars_met_per_run"][str(seed)])))
    lines.append(row("mean", summary["mean"], str(sum(bool(v) for v in summary["bars_on_the_mean"].values()))))
    lines.append(row("worst", summary["worst"], f"{summary['runs_meeting_every_bar']} of {len(result['seeds'])} "
                                                "runs meet all"))
    return "\n".join(lines)
