"""kNN accuracy versus k and versus epoch, and the confusion matrix, from knn/knn.json."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from training.plots.common import new_figure
from training.rundir import tags


def plot_knn_vs_k(knn: dict[str, Any]):
    """Top-1 accuracy against k (log axis) for the trained features and the baselines."""
    fig, ax = new_figure(6.0, 4.0)
    shown = [t for t in knn["tags"] if not tags.is_epoch_tag(t)] or list(knn["tags"])
    for tag in shown:
        entry = knn["tags"][tag]
        ks = sorted(int(k) for k in entry["top1"])
        style = tags.LINE_STYLES.get(tag, "-")
        ax.plot(ks, [100 * entry["top1"][str(k)] for k in ks], style, marker="o",
                label=tags.label(tag, entry.get("epoch")))
    ax.set_xscale("log")
    return _finish_accuracy_axes(fig, ax, "k (neighbours)", "Global kNN accuracy versus k")


def plot_knn_vs_epoch(knn: dict[str, Any]):
    """Top-1 accuracy (at each tag's best k) against the checkpoint epoch; baselines as lines."""
    points = sorted(
        (entry["epoch"], 100 * entry["top1"][str(entry["best_k"])])
        for tag, entry in knn["tags"].items()
        if not tags.is_baseline(tag) and entry.get("epoch") is not None
    )
    fig, ax = new_figure(6.0, 4.0)
    if points:
        epochs, accuracy = zip(*dict(points).items())
        ax.plot(epochs, accuracy, "-", marker="o", label="trained (best k)")
    for tag in tags.BASELINES:
        if tag in knn["tags"]:
            entry = knn["tags"][tag]
            ax.axhline(100 * entry["top1"][str(entry["best_k"])], linestyle=tags.LINE_STYLES[tag], color="grey",
                       label=tags.label(tag))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _finish_accuracy_axes(fig, ax, "epoch", "Global kNN accuracy during pretraining")


def _finish_accuracy_axes(fig, ax, xlabel: str, title: str):
    """Labels, 0-100 % range, grid and legend shared by the accuracy plots."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("kNN top-1 accuracy (%)")
    ax.set_title(title)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def plot_confusion(matrix: np.ndarray, class_names: list[str], title: str):
    """Row-normalised confusion matrix (recall per true class) with the raw counts written in."""
    matrix = np.asarray(matrix, dtype=float)
    rows = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, rows, out=np.zeros_like(matrix), where=rows > 0)
    side = 2.5 + 0.55 * len(class_names)
    fig, ax = new_figure(side + 1.0, side)
    image = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ticks = np.arange(len(class_names))
    ax.set_xticks(ticks, class_names, rotation=45, ha="right")
    ax.set_yticks(ticks, class_names)
    for i in ticks:
        for j in ticks:
            ax.text(j, i, int(matrix[i, j]), ha="center", va="center", fontsize=8,
                    color="white" if share[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of true class")
    return fig
