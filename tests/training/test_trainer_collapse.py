"""A tiny pretraining made to collapse (a teacher temperature of 10 against the student's 0.1: its
target is the uniform distribution) logs the teacher statistics, is flagged with one WARNING, and
with train.stop_on_collapse saves, stops and fails deterministically: the launcher's policy does not
retry it, and the same run resubmitted unchanged stops again one step later."""

import json
import logging
import math

import pytest
import torch

from tests.support.heal_run import CPU, scripted, tiny_config
from training.recovery import policy
from training.recovery.failures import read_marker
from training.rundir import RunLayout
from training.trainer import TrainingCollapsedError, train

pytestmark = pytest.mark.slow

torch.set_num_threads(1)

FLAT_TEACHER = {"dino.teacher_temp": 10.0, "dino.warmup_teacher_temp": 10.0, "train.collapse_patience_steps": 2}
"""Three steps of learning-rate warm-up (one epoch), then a window of two collapsed steps: flagged at step 5."""


def step_lines(layout):
    return [r for r in map(json.loads, layout.metrics.read_text().splitlines()) if r["kind"] == "step"]


def test_a_collapsed_run_is_flagged_once_with_its_statistics(tmp_path, caplog):
    config = tiny_config(tmp_path, **FLAT_TEACHER)
    caplog.set_level(logging.WARNING, logger="training.trainer")
    assert train(config, CPU, loader_factory=scripted(3)).global_step == 6
    warnings = [r.getMessage() for r in caplog.records if "collapse" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("DINO collapse (uniform) over the 2 steps up to global step 5")
    lines = step_lines(RunLayout.from_config(config))
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
    for line in lines:
        assert line["log_out_dim"] == pytest.approx(math.log(256), abs=1e-5)
        assert line["teacher_entropy"] == pytest.approx(math.log(256), abs=1e-3)
        assert line["teacher_batch_entropy"] >= line["teacher_entropy"] - 1e-5
        assert line["center_norm"] >= 0
    assert lines[0]["center_norm"] == 0 and lines[1]["center_norm"] > 0  # the first target used a zero centre
    assert [line.get("collapse") for line in lines] == [None] * 4 + ["uniform"] * 2


def test_stop_on_collapse_saves_and_is_a_deterministic_failure_not_retried(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    for name in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    config = tiny_config(tmp_path, **FLAT_TEACHER, **{"train.stop_on_collapse": True})
    layout = RunLayout.from_config(config)
    with pytest.raises(TrainingCollapsedError, match=r"stopped by train.stop_on_collapse: DINO collapse \(uniform\)"):
        train(config, CPU, loader_factory=scripted(3))
    saved = torch.load(layout.latest_checkpoint, weights_only=False)
    assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (1, 2, 5)
    detector = saved["dino_loss"]["_extra_state"]["collapse_state"]  # the window of steps 4 and 5, warned
    assert detector["warned"] == ["uniform"] and len(detector["window"]) == 2
    assert all(entropy == pytest.approx(math.log(256), abs=1e-3) for entropy, _ in detector["window"])
    assert step_lines(layout)[-1]["step"] == 5 and step_lines(layout)[-1]["collapse"] == "uniform"
    marker = read_marker(layout.failure_marker)
    assert marker["class"] == "deterministic" and marker["error"].startswith("TrainingCollapsedError: stopped by")

    assert policy.main(["--failure-log", str(layout.failure_log), "--failure-marker", str(layout.failure_marker),
                        "--exit-code", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "not-retried"
    assert "TrainingCollapsedError" in err and "not retried (a deterministic failure" in err

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # resubmitted unchanged: the checkpoint's window goes on
    with pytest.raises(TrainingCollapsedError, match=r"over the 2 steps up to global step 6"):
        train(config, CPU, loader_factory=scripted(3))
    assert torch.load(layout.latest_checkpoint, weights_only=False)["global_step"] == 6
