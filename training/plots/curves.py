"""Training curves from metrics.jsonl: loss, learning rate, weight decay, momentum, throughput, and
the teacher statistics that show a DINO collapse (training/dino/collapse.py)."""

from __future__ import annotations

import logging
from typing import Any

from matplotlib.ticker import MaxNLocator

from training.plots.common import new_figure

log = logging.getLogger(__name__)

PANELS = (
    ("loss", "DINO loss"),
    ("teacher_entropy", "teacher target entropy (nats)"),
    ("center_norm", "teacher centre norm"),
    ("lr", "learning rate"),
    ("wd", "weight decay"),
    ("momentum", "teacher momentum"),
    ("images_per_s", "images / s"),
    ("data_wait_s", "data wait (s / step)"),
)

ENTROPIES = (("teacher_entropy", "per image (mean)"), ("teacher_batch_entropy", "of the batch mean"))
"""The lines of the entropy panel, drawn under ln(out_dim), the entropy of a uniform output."""


def points(records: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if r.get(key) is not None and "step" in r]


def draw_entropies(ax: Any, steps: list[dict[str, Any]]) -> None:
    """Both entropies per logged step, ln(out_dim) as a dashed line, and where a collapse was flagged."""
    for key, label in ENTROPIES:
        if line := points(steps, key):
            ax.plot(*zip(*line), linewidth=0.8, label=label)
    ceilings = {r["log_out_dim"] for r in steps if r.get("log_out_dim") is not None}
    for ceiling in sorted(ceilings):
        ax.axhline(ceiling, color="grey", linestyle="--", linewidth=0.8, label=f"ln(out_dim) = {ceiling:.2f}")
    flagged = [r for r in steps if r.get("collapse") and "step" in r]
    if flagged:
        ax.axvline(flagged[0]["step"], color="red", linewidth=0.8, label=f"collapse ({flagged[0]['collapse']})")
    ax.set_ylim(bottom=0)
    ax.legend()


def plot_training_curves(records: list[dict[str, Any]], title: str):
    """One panel per metric: per-step values as a thin line, per-epoch values as markers; the
    entropy panel shows the teacher's per-image and batch-mean entropies per step against ln(out_dim)."""
    steps = [r for r in records if r.get("kind") == "step"]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    panels = [(key, name) for key, name in PANELS if any(key in r for r in steps + epochs)]
    ncols = 2
    nrows = max(1, (len(panels) + 1) // 2)
    fig, axes = new_figure(10.0, 2.8 * nrows, nrows, ncols, squeeze=False)
    for ax, (key, name) in zip(axes.flat, panels):
        if key == "teacher_entropy":
            draw_entropies(ax, steps)
        else:
            if step_points := points(steps, key):
                ax.plot(*zip(*step_points), linewidth=0.8, label="per step")
            if epoch_points := points(epochs, key):
                ax.plot(*zip(*epoch_points), "o-", markersize=4, label="per epoch")
            if key == "loss":
                ax.legend()
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
