"""UMAP of CLS features coloured by class (or any metadata column), one figure per checkpoint (scDINO's `plot_in_2D`)."""

from __future__ import annotations

import functools
import logging
import sys
import warnings

import numpy as np

from training.plots.common import class_colours, new_figure

log = logging.getLogger(__name__)

MAX_LEGEND = 20
"""Classes a UMAP's legend lists; a column with more values (wells, sites) is drawn without one."""


@functools.cache
def umap_with_cached_kernels():
    """The umap module, its numba kernels cached on disk as pynndescent's are. umap-learn compiles them
    without numba's cache, so every process that drew a UMAP spent its first embedding compiling them:
    31 s of a 32 s UMAP on 160 cells (2 busy cores), each `plots` job of a chain and each worker of the
    tests; loaded from the cache, 0.4 s. The cache lies beside umap's sources or, where those are read
    only, in the user's cache folder (numba's own rule); with neither, umap compiles as before."""
    import umap
    from numba.core.dispatcher import Dispatcher

    for name, module in list(sys.modules.items()):
        if name != "umap" and not name.startswith("umap."):
            continue
        for kernel in vars(module).values():
            if isinstance(kernel, Dispatcher) and kernel.__module__ == name:
                try:
                    kernel.enable_caching()
                except RuntimeError as exc:  # numba found no folder it may write its cache to
                    log.debug("umap's kernels stay uncached: %s", exc)
                    return umap
    return umap


def umap_embedding(features: np.ndarray, *, seed: int, n_neighbors: int, min_dist: float) -> np.ndarray:
    """2-D UMAP with cosine distance, seeded (single-threaded, hence reproducible).

    n_neighbors is clipped below the number of points so that small runs still embed.
    """
    umap = umap_with_cached_kernels()
    neighbours = max(2, min(n_neighbors, len(features) - 1))
    reducer = umap.UMAP(
        n_neighbors=neighbours, min_dist=min_dist, metric="cosine", random_state=seed, n_components=2
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*")
        warnings.filterwarnings("ignore", message=".*k-nearest neighbor.*")
        return reducer.fit_transform(np.asarray(features, np.float32))


def plot_embedding(embedding: np.ndarray, labels: np.ndarray, class_names: list[str], title: str):
    """Scatter of the 2-D embedding, one colour and legend entry (with its count) per class; above
    MAX_LEGEND classes the colours repeat and there is no legend. Cells without a class (-1) in grey."""
    fig, ax = new_figure(6.5, 5.5)
    colours = class_colours(len(class_names))
    size = max(2.0, min(20.0, 4000.0 / max(len(labels), 1)))
    legend = len(class_names) <= MAX_LEGEND
    for cls, name in [*enumerate(class_names), (-1, "no value")]:
        mask = labels == cls
        if mask.any():
            ax.scatter(embedding[mask, 0], embedding[mask, 1], s=size, color=colours[cls] if cls >= 0 else "0.6",
                       label=f"{name} ({int(mask.sum())})", alpha=0.8, linewidths=0)
    ax.set_title(title)
    ax.set_xlabel("UMAP 1")
    ax.set_ylabel("UMAP 2")
    ax.set_xticks([])
    ax.set_yticks([])
    if legend:
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, markerscale=2)
    return fig
