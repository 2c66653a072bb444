"""The report's Training section says when the collapse detector flagged the pretraining."""

import json

from training.report.html import build_report
from training.rundir import RunLayout


def write_metrics(root, flagged):
    lines = [{"kind": "step", "epoch": 0, "step": step, "loss": 5.5, **({"collapse": "one-hot"} if step in flagged else {})}
             for step in range(1, 6)]
    (root / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_flagged_run_is_named_in_the_training_section(tmp_path):
    write_metrics(tmp_path, flagged={4, 5})
    html = build_report(RunLayout(tmp_path), "run")
    training = html[html.index("<h2>Training</h2>"):html.index("<h2>Global kNN")]
    assert "DINO collapse (one-hot) flagged in the logged steps from 4 to 5" in training


def test_a_healthy_run_has_no_collapse_line(tmp_path):
    write_metrics(tmp_path, flagged=set())
    assert "DINO collapse" not in build_report(RunLayout(tmp_path), "run")
