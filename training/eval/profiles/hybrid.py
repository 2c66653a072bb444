"""The trained model's features beside CellProfiler's measurements: the hybrid labs build when they
combine learned and engineered features (eval.hybrid_cellprofiler).

Each block is standardised per feature over the cells it is scored on (mean 0, standard deviation 1;
a feature constant there is 0) and weighted by 1 / sqrt(its width), so that each block's squared
norm averages 1 whatever its width: the 489 CellProfiler measurements do not outvote the model's 384
features by their number, nor the other way round. The hybrid is reported as its own row ("trained +
CellProfiler"), never as the model's figure.
"""

from __future__ import annotations

import numpy as np

from training.rundir import tags
from training.rundir.features import FeatureSet


def standardised_block(features: np.ndarray) -> np.ndarray:
    """`features` (cells, D) standardised per column and scaled by 1 / sqrt(D), as float32."""
    x = np.asarray(features, np.float64)
    spread = x.std(axis=0)
    centred = x - x.mean(axis=0)
    scaled = np.divide(centred, spread, out=np.zeros_like(centred), where=spread > 0)
    return (scaled / np.sqrt(x.shape[1])).astype(np.float32)


def hybrid_set(trained: FeatureSet, cellprofiler: FeatureSet) -> FeatureSet:
    """The hybrid of the same cells' trained features and CellProfiler measurements."""
    if not np.array_equal(trained.indices, cellprofiler.indices):
        cellprofiler = cellprofiler.select(trained.indices, "the CellProfiler feature set")
    features = np.concatenate([standardised_block(trained.features), standardised_block(cellprofiler.features)],
                              axis=1)
    return FeatureSet(features, trained.indices, {"kind": tags.HYBRID, "tag": tags.HYBRID, "epoch": None,
                                                  "blocks": {tags.FINAL: trained.dim,
                                                             tags.CELLPROFILER: cellprofiler.dim}})


def with_hybrid(sets: dict[str, FeatureSet]) -> dict[str, FeatureSet]:
    """`sets` and, where it holds both final and cellprofiler, their hybrid (tags.HYBRID)."""
    if tags.FINAL not in sets or tags.CELLPROFILER not in sets:
        return sets
    return {**sets, tags.HYBRID: hybrid_set(sets[tags.FINAL], sets[tags.CELLPROFILER])}
