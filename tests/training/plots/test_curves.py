"""The training curves draw the teacher statistics: both entropies against ln(out_dim), the centre
norm, and the first step flagged as a collapse."""

import math

import pytest

from training.plots.curves import plot_training_curves


def records(flag_from=None):
    lines = []
    for step in range(1, 11):
        entropy = 4.0 + 0.15 * step
        lines.append({"kind": "step", "epoch": 0, "step": step, "loss": 5.0, "teacher_entropy": entropy,
                      "teacher_batch_entropy": entropy + 0.3, "center_norm": 0.1 * step,
                      "log_out_dim": math.log(256), **({"collapse": "uniform"} if flag_from and step >= flag_from else {})})
    lines.append({"kind": "epoch", "epoch": 0, "step": 10, "loss": 5.0, "teacher_entropy": 4.8,
                  "teacher_batch_entropy": 5.1, "center_norm": 0.5, "log_out_dim": math.log(256)})
    return lines


def panel(fig, title):
    return next(ax for ax in fig.axes if ax.get_title() == title)


def test_the_entropy_panel_shows_both_entropies_under_ln_out_dim_and_the_flag():
    fig = plot_training_curves(records(flag_from=7), "run")
    ax = panel(fig, "teacher target entropy (nats)")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["per image (mean)"].get_ydata()) == pytest.approx([4.0 + 0.15 * s for s in range(1, 11)])
    assert list(lines["of the batch mean"].get_xdata()) == list(range(1, 11))
    ceiling = lines["ln(out_dim) = 5.55"]
    assert list(ceiling.get_ydata()) == pytest.approx([math.log(256)] * 2)
    assert list(lines["collapse (uniform)"].get_xdata()) == [7, 7]
    norm = panel(fig, "teacher centre norm").get_lines()
    assert [line.get_label() for line in norm] == ["per step", "per epoch"]


def test_no_flag_line_without_a_collapse_and_no_panel_for_old_metrics():
    ax = panel(plot_training_curves(records(), "run"), "teacher target entropy (nats)")
    assert not [line for line in ax.get_lines() if line.get_label().startswith("collapse")]
    old = [{k: v for k, v in r.items() if k not in ("teacher_entropy", "teacher_batch_entropy", "center_norm",
                                                    "log_out_dim")} for r in records()]
    titles = [ax.get_title() for ax in plot_training_curves(old, "run").axes if ax.get_visible()]
    assert "DINO loss" in titles and "teacher target entropy (nats)" not in titles
