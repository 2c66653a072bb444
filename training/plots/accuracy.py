"""kNN accuracy versus k and versus epoch, the screen measures side by side, and the confusion matrix,
from knn/knn.json."""

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


def screen_values(knn: dict[str, Any]) -> dict[str, list[float | None]]:
    """Per headline tag: plain kNN top-1, not-same-batch top-1 (each at its best k, %) and mAP x 100."""
    def best(entry: dict[str, Any] | None) -> float | None:
        return None if entry is None else 100 * entry["top1"][str(entry["best_k"])]

    values = {}
    for tag in [t for t in tags.HEADLINE if t in knn["tags"]]:
        entry = knn["tags"][tag]
        mean_map = (entry.get("map") or {}).get("mean_map")
        values[tag] = [best(entry), best(entry.get("not_same_batch")), None if mean_map is None else 100 * mean_map]
    return values


def plot_screen_measures(knn: dict[str, Any]):
    """Grouped bars: for the trained model and each baseline, plain kNN, not-same-batch kNN and mAP."""
    values = screen_values(knn)
    measures = ["kNN top-1", "kNN not same batch", "mAP x 100"]
    fig, ax = new_figure(6.5, 4.0)
    width = 0.8 / max(len(values), 1)
    for i, (tag, heights) in enumerate(values.items()):
        x = np.arange(len(measures)) + (i - (len(values) - 1) / 2) * width
        shown = [h if h is not None else 0.0 for h in heights]
        bars = ax.bar(x, shown, width, label=tags.label(tag), hatch=None if tag == tags.FINAL else "//", alpha=0.85)
        ax.bar_label(bars, labels=["-" if h is None else f"{h:.0f}" for h in heights], fontsize=7)
    ax.set_xticks(np.arange(len(measures)), measures)
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.set_title("What a screen judges: plain kNN, kNN across batches, retrieval mAP")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return fig


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
