"""Training curves from metrics.jsonl: loss, learning rate, weight decay, momentum, throughput."""

from __future__ import annotations

import logging
from typing import Any

from matplotlib.ticker import MaxNLocator

from training.plots.common import new_figure

log = logging.getLogger(__name__)

PANELS = (
    ("loss", "DINO loss"),
    ("lr", "learning rate"),
    ("wd", "weight decay"),
    ("momentum", "teacher momentum"),
    ("images_per_s", "images / s"),
    ("data_wait_s", "data wait (s / step)"),
)


def plot_training_curves(records: list[dict[str, Any]], title: str):
    """One panel per metric: per-step values as a thin line, per-epoch values as markers."""
    steps = [r for r in records if r.get("kind") == "step"]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    panels = [(key, name) for key, name in PANELS if any(key in r for r in steps + epochs)]
    ncols = 2
    nrows = max(1, (len(panels) + 1) // 2)
    fig, axes = new_figure(10.0, 2.8 * nrows, nrows, ncols, squeeze=False)
    for ax, (key, name) in zip(axes.flat, panels):
        step_points = [(r["step"], r[key]) for r in steps if r.get(key) is not None and "step" in r]
        epoch_points = [(r["step"], r[key]) for r in epochs if r.get(key) is not None and "step" in r]
        if step_points:
            ax.plot(*zip(*step_points), linewidth=0.8, label="per step")
        if epoch_points:
            ax.plot(*zip(*epoch_points), "o-", markersize=4, label="per epoch")
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if key == "loss":
            ax.legend()
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
