"""Saving figures atomically as PNG (and PDF for print), with a style readable on a slide."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from training.writes.atomic import atomic_path

log = logging.getLogger(__name__)

DPI = 150
STYLE = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8}


def new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **kwargs):
    """A figure and its axes with the shared style; sizes are in inches."""
    with plt.rc_context(STYLE):
        return plt.subplots(nrows, ncols, figsize=(width, height), **kwargs)


def save_figure(fig: Figure, directory: Path, stem: str, *, pdf: bool = True) -> list[Path]:
    """Write <stem>.png (and <stem>.pdf) through temporary files, close the figure, return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in ("png", "pdf") if pdf else ("png",):
        final = directory / f"{stem}.{fmt}"
        with atomic_path(final) as tmp:
            fig.savefig(tmp, format=fmt, dpi=DPI, bbox_inches="tight")
        written.append(final)
    plt.close(fig)
    log.info("wrote %s", ", ".join(p.name for p in written))
    return written


def class_colours(n: int) -> list:
    """Distinct colours for up to 20 classes (tab10, then tab20), cycling beyond."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]
