"""`bench screen --seeds` (training/benchmarks/quality/screen_seeds.py): the runs' summary is their mean
and worst figure, with the bars checked on the mean and on every run, each worked out here by hand from
the figures; each seed runs into its own folder with its own run.seed, on one screen made once; bad
seeds and a run.seed given beside --seeds are refused with a line naming the flag."""

from __future__ import annotations

import pytest

from training.benchmarks.quality import screen_seeds
from training.errors import UserError


def figures(nsb, over_raw, over_cp, share, activity, consistency, cp_activity=0.98, cp_consistency=0.85):
    return {"nsb": nsb, "nsb_over_cellprofiler": over_cp, "nsb_over_raw_pixels": over_raw,
            "nsb_share_of_oracle": share, "activity": activity, "consistency": consistency,
            "cellprofiler_activity": cp_activity, "cellprofiler_consistency": cp_consistency}


RUNS = {"0": {"goal_figures": {"trained": figures(0.54, 0.075, 0.126, 0.84, 0.965, 0.789)}},
        "1": {"goal_figures": {"trained": figures(0.60, 0.144, 0.173, 0.92, 0.985, 0.904)}},
        "2": {"goal_figures": {"trained": figures(0.61, 0.140, 0.161, 0.97, 0.994, 0.904, cp_activity=0.99)}}}


def test_the_summary_is_each_figures_mean_and_worst_run_and_the_bars_both_ways():
    summary = screen_seeds.summarise(RUNS)["trained"]
    assert summary["per_run"]["consistency"] == [0.789, 0.904, 0.904]
    assert summary["mean"]["nsb"] == pytest.approx((0.54 + 0.60 + 0.61) / 3)
    assert summary["mean"]["consistency"] == pytest.approx((0.789 + 0.904 + 0.904) / 3)  # 0.8657 > 0.85
    assert summary["mean"]["cellprofiler_activity"] == pytest.approx((0.98 + 0.98 + 0.99) / 3)
    # the worst run of the model's figures is its lowest; of CellProfiler's, its highest
    assert summary["worst"]["nsb_share_of_oracle"] == 0.84 and summary["worst"]["activity"] == 0.965
    assert summary["worst"]["cellprofiler_activity"] == 0.99
    # seed 0 misses the oracle's share (0.84 < 0.9), activity (0.965 < 0.98) and consistency (0.789 < 0.85);
    # seed 2's activity 0.994 meets its CellProfiler's 0.99
    assert summary["bars_met_per_run"] == {"0": 2, "1": 5, "2": 5}
    assert summary["runs_meeting_every_bar"] == 2
    assert summary["bars_on_every_run"] == {"nsb_over_cellprofiler": True, "nsb_over_raw_pixels": True,
                                            "nsb_share_of_oracle": False, "activity_at_least_cellprofiler": False,
                                            "consistency_at_least_cellprofiler": False}
    # on the mean: share (0.84 + 0.92 + 0.97) / 3 = 0.91 >= 0.9; activity 0.9813 against 0.9833 misses
    assert summary["bars_on_the_mean"] == {"nsb_over_cellprofiler": True, "nsb_over_raw_pixels": True,
                                           "nsb_share_of_oracle": True, "activity_at_least_cellprofiler": False,
                                           "consistency_at_least_cellprofiler": True}


def test_a_figure_missing_from_one_run_is_missing_from_the_summary_not_averaged_over_the_others():
    runs = {**RUNS, "3": {"goal_figures": {"trained": figures(0.58, 0.1, 0.1, 0.9, 0.99, None)}}}
    summary = screen_seeds.summarise(runs)["trained"]
    assert summary["mean"]["consistency"] is None and summary["worst"]["consistency"] is None
    assert summary["bars_on_every_run"]["consistency_at_least_cellprofiler"] is None
    assert summary["mean"]["nsb"] == pytest.approx((0.54 + 0.60 + 0.61 + 0.58) / 4)


def test_each_seed_runs_into_its_own_folder_on_one_screen_made_once(tmp_path, monkeypatch):
    """The screen chain is six processes and minutes of training a seed; here a recorder stands in for
    it (make_screen, run_screen_benchmark) to show what each seed's run is given. The chain itself is
    run for real by `make screen` and the screen benchmark's own tests."""
    from training.benchmarks.quality import screen

    made, ran = [], []
    monkeypatch.setattr(screen, "make_screen", lambda config, path, overrides: made.append(
        (config.run.seed, config.run.output_dir, list(overrides))) or 12.5)

    def run(config, path, overrides, *, ranks, reuse, truth):
        ran.append((config.run.seed, config.run.output_dir, overrides, ranks, reuse))
        seed = str(config.run.seed)
        return {**RUNS[seed], "date": "today", "machine": {}, "config": None, "screen": {"seed": 6}}

    monkeypatch.setattr(screen, "run_screen_benchmark", run)
    base = [f"run.output_dir={tmp_path / 'g6'}", "eval.knn_folds=5"]
    result = screen_seeds.run_seeds(None, base, (2, 0, 1), ranks=2, reuse=True, truth=None)
    assert made == [(0, str(tmp_path / "g6"), base)]  # the config's own seed and folder, the user's overrides
    assert [(seed, folder, ranks, reuse) for seed, folder, _, ranks, reuse in ran] == [
        (s, str(tmp_path / f"g6-seed{s}"), 2, True) for s in (2, 0, 1)]
    assert all(overrides[:2] == base for _, _, overrides, _, _ in ran)  # the steps get the same --set lines
    assert result["seeds"] == [2, 0, 1] and set(result["runs"]) == {"0", "1", "2"}
    assert result["summary"]["trained"]["runs_meeting_every_bar"] == 2
    table = screen_seeds.markdown(result)
    assert "| mean | 58.3 |" in table  # (54 + 60 + 61) / 3 points
    assert "| 0 | 54.0 | 7.5 | 12.6 | 0.840 | 0.965 (0.980) | 0.789 (0.850) | 2 |" in table
    assert "| worst | 54.0 |" in table and "2 of 3 runs meet all" in table


def test_a_run_seed_given_beside_seeds_is_refused():
    with pytest.raises(UserError, match="drop `--set run.seed=...` or drop --seeds"):
        screen_seeds.run_seeds(None, ["run.seed=3"], (0, 1), ranks=2, reuse=False, truth=None)


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "screen", "--seeds", "0,one"], "--seeds '0,one': give run.seed values of 0 or more"),
    (["bench", "screen", "--seeds", "-1"], "--seeds '-1': give run.seed values of 0 or more"),
    (["bench", "screen", "--seeds", "1,1"], "--seeds 1,1: each seed once"),
    (["bench", "screen", "--ranks", "0"], "--ranks 0: pretrain on at least one rank"),
    (["bench", "scale", "--seeds", "0,1"], "--seeds: only `bench screen` takes it"),
])
def test_bad_seeds_are_one_line_naming_the_flag(argv, message, capsys):
    from training.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err
