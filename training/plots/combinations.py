"""The channel-combination comparison as a figure: what each combination (and so each channel) gives."""

from __future__ import annotations

from typing import Any

import numpy as np

from training.eval.compare import MODEL_NAMES, PER_COMBINATION, adaptive_models
from training.plots.common import new_figure
from training.rundir import tags


def _top1(entry: dict[str, Any], tag: str) -> float:
    return 100 * entry["knn"][tag]["top1"] if tag in entry["knn"] else np.nan


def plot_combinations(comparison: dict[str, Any], model: str = PER_COMBINATION):
    """Grouped bars of kNN top-1 per combination for the trained model and both baselines (and,
    where they ran, the channel-adaptive models beside the trained one), with the all-channels model as
    a dashed line, so a single channel's or a left-out channel's share reads off against it."""
    entries = comparison["models"][model]["combinations"]
    combos = sorted(entries, key=lambda c: (-len(c), c))
    shown = [t for t in tags.HEADLINE if any(t in entries[c]["knn"] for c in combos)]
    series = [(tags.label(t), [_top1(entries[c], t) for c in combos], t == tags.FINAL) for t in shown]
    adaptive = adaptive_models(comparison) if model == PER_COMBINATION else []
    if adaptive:
        series[0] = (f"{tags.label(tags.FINAL)}, {MODEL_NAMES[PER_COMBINATION]}", *series[0][1:])
    for position, other in enumerate(adaptive, start=1):
        entries_of = comparison["models"][other]["combinations"]
        series.insert(position, (f"{tags.label(tags.FINAL)}, {MODEL_NAMES[other]}",
                                 [_top1(entries_of[c], tags.FINAL) for c in combos], True))
    fig, ax = new_figure(max(4.0, 1.1 * len(combos) + 2), 4.0)
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(combos))
    for i, (label, values, trained) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label,
               hatch=None if trained else "//", alpha=1.0 if trained else 0.6)
    share = comparison["contribution"]
    if share.get("all_top1") is not None:
        ax.axhline(100 * share["all_top1"], linestyle="--", color="k", linewidth=1,
                   label=f"trained, all channels ({share['all_channels']})")
    ax.set_xticks(x, [f"{c}\n{', '.join(entries[c]['channel_names'])}" for c in combos], fontsize=8)
    ax.set_ylabel("kNN top-1 (%)")
    ax.set_ylim(0, 100)
    ax.set_title("kNN accuracy per channel combination")
    ax.legend(loc="lower right")
    return fig
