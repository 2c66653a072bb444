"""report on a tiny real run: one self-contained HTML page that embeds and links every figure."""

import base64
import json
import re

import pytest

from tests.support.eval_tiny_run import plotted_run, run_dir, run_step

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    config = plotted_run(tmp_path_factory)
    assert run_step(config, "report") == 0
    root = run_dir(config)
    return root, (root / "report.html").read_text()


def test_report_embeds_and_links_every_plot(report):
    root, html = report
    entries = json.loads((root / "plots" / "manifest.json").read_text())
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(embedded) == len(entries)
    for entry, data in zip(entries, embedded):
        assert f'href="plots/{entry["png"]}"' in html
        assert base64.b64decode(data) == (root / "plots" / entry["png"]).read_bytes()
        if entry["pdf"]:
            assert f'href="plots/{entry["pdf"]}"' in html


def test_report_is_self_contained(report):
    _, html = report
    assert not re.findall(r'<img[^>]+src="(?!data:)', html)
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_report_has_tables_config_and_artefact_locations(report):
    root, html = report
    for text in ("Global kNN", "raw pixels (baseline)", "random init (baseline)", "Linear probe",
                 "kNN top-1 accuracy: trained", "arch: vit_tiny", "Where everything lies", "Step timings"):
        assert text in html, text
    for relative in ("knn/knn.json", "linear/linear.json", "labels.json", "metrics.jsonl", "checkpoints"):
        assert f'<a href="{relative}">' in html and (root / relative).exists()
    assert "class=\"missing\"" not in html


def test_sections_without_input_name_the_step_that_fills_them(tmp_path):
    from training.report.html import build_report
    from training.rundir import RunLayout

    layout = RunLayout(tmp_path)
    (tmp_path / "knn").mkdir()
    (tmp_path / "knn" / "knn.json").write_text(json.dumps({
        "ks": [5], "seed": 0, "temperature": 0.1, "n_reference": 8, "n_query": 2, "class_names": ["a", "b"],
        "tags": {"final": {"epoch": 1, "top1": {"5": 0.5}, "top2": {"5": 1.0}, "best_k": 5}},
    }))
    html = build_report(layout, "partial run")
    assert "kNN top-1 accuracy: trained 50.0% (k=5)" in html
    assert "No linear-probe results yet: run <code>python -m training linear</code>" in html
    assert "No UMAPs yet: run <code>python -m training plots</code>" in html
    assert "<td>metrics.jsonl</td><td>training metrics, one JSON object per line</td><td>absent</td>" in html
