"""A screen's measures where people read them: knn.md, the report, results.json and the comparison of
channel combinations show plain kNN, not-same-batch kNN and mAP for the trained model and both
baselines, each number the one knn.json holds; the report lists the exported profiles."""

from __future__ import annotations

import json
from html import escape

import pytest

from tests.support.screen_run import screen_run
from tests.support.tiny import run_cli
from training.cli import main
from training.eval.compare import build_comparison, comparison_markdown
from training.rundir import RunLayout

HEADLINE = ("final", "raw_pixels", "random_init")


@pytest.fixture(scope="module")
def screen(tmp_path_factory):
    config = screen_run(tmp_path_factory.mktemp("screen"))
    for step in ("knn", "export", "report"):
        assert run_cli(config, step) == 0, step
    layout = RunLayout.from_config(config)
    return config, layout, json.loads(layout.knn_json.read_text())


def best(entry: dict) -> str:
    return f"{100 * entry['top1'][str(entry['best_k'])]:.1f} (k={entry['best_k']})"


def test_knn_md_and_the_report_show_all_three_measures_for_the_model_and_both_baselines(screen):
    _, layout, knn = screen
    text, report = layout.knn_md.read_text(), layout.report.read_text()
    assert "## Not same batch" in text and "## Screen measures" in text
    for tag in HEADLINE:
        entry = knn["tags"][tag]
        mean_map = entry["map"]["mean_map"]
        assert mean_map is not None
        row = f"| {best(entry)} | {best(entry['not_same_batch'])} | {mean_map:.3f} |"
        assert row.replace(" ", "") in text.replace(" ", ""), (tag, row)
        cells = "".join(f"<td>{escape(c)}</td>" for c in (best(entry), best(entry["not_same_batch"]), f"{mean_map:.3f}"))
        assert cells in report, tag
    assert "Not same batch: trained" in report and "mAP: trained" in report


def test_the_report_lists_the_profiles_and_links_them(screen):
    _, layout, _ = screen
    report = layout.report.read_text()
    assert "<h2>Profiles</h2>" in report and "192 cells (96 held out) x 16 features" in report
    for name in ("profiles/cells.h5ad", "profiles/cells.parquet", "profiles/wells.parquet"):
        assert f'<a href="{name}">' in report


def test_results_json_carries_not_same_batch_and_map(screen, capsys):
    _, layout, knn = screen
    assert main(["summary", "--set", f"run.output_dir={layout.root}"]) == 0
    summary = json.loads(layout.results.read_text())
    for tag in HEADLINE:
        entry = knn["tags"][tag]
        other = entry["not_same_batch"]
        assert summary["knn"][tag]["not_same_batch"] == {"best_k": other["best_k"],
                                                         "top1": other["top1"][str(other["best_k"])],
                                                         "top2": other["top2"][str(other["best_k"])]}
        assert summary["knn"][tag]["map"]["mean_map"] == entry["map"]["mean_map"]
    assert "not-same-batch top-1" in capsys.readouterr().out


def test_the_comparison_of_combinations_shows_the_screen_measures(screen, tmp_path):
    config, layout, knn = screen
    parent = RunLayout(tmp_path / "run")
    for combo in ("01", "0"):
        run = parent.combination(combo)
        run.knn.mkdir(parents=True)
        run.linear.mkdir()
        run.knn_json.write_text(layout.knn_json.read_text())
        run.linear_json.write_text(json.dumps({"tags": {t: {"final_top1": 0.5, "best_top1": 0.6} for t in HEADLINE}}))
    combined = config.replace({"run.output_dir": str(parent.root), "data.channel_combinations": ["01", "0"]})
    comparison = build_comparison(combined, parent)
    scores = comparison["models"]["per_combination"]["combinations"]["0"]["knn"]
    final = knn["tags"]["final"]
    assert scores["final"]["not_same_batch"]["top1"] == final["not_same_batch"]["top1"][
        str(final["not_same_batch"]["best_k"])]
    assert scores["raw_pixels"]["map"]["mean_map"] == knn["tags"]["raw_pixels"]["map"]["mean_map"]
    text = comparison_markdown(comparison)
    assert "kNN not same batch trained" in text and "mAP (q<0.05) random init" in text
    m = knn["tags"]["random_init"]["map"]
    assert f"{m['mean_map']:.3f} ({m['n_significant']}/{m['n_treatments']})" in text
