"""A well's subpopulations beside its mean profile (eval.profile_subpopulations).

A compound that changes only some of a well's cells moves the well's mean little, and which of the
screen's cell states its cells fall in a lot. Slack et al. (PNAS 2008) profile a well by the share of
its cells in each subpopulation of the screen's cells; here those shares stand beside the usual
normalised profile, so that retrieval mAP reads both:

    subpopulations  k-means (scikit-learn, seeded, RESTARTS restarts) on the L2-normalised features of
                    a seeded sample of at most SAMPLE_CELLS of the profiled cells; every cell then
                    belongs to the centre nearest its L2-normalised features, as k-means assigns
    well_shares     each well's fraction of cells in each of the k subpopulations
    beside_shares   the shares minus the control wells' mean shares (what a well gains or loses
                    against DMSO), each block scaled so that the shares make `weight` of a well's
                    squared norm on average and the normalised profile the rest, side by side

The shares are not put through mad_robustize or sphering: a rare subpopulation's share hardly varies
among a plate's wells, and scaled to unit spread it would outweigh the rest (docs/performance.md,
"Wells by their subpopulations").
"""

from __future__ import annotations

import numpy as np

from training.errors import UserError
from training.eval.profiles.wells import BLOCK_CELLS, Wells

SAMPLE_CELLS = 50_000
"""The most cells k-means is fitted on (a seeded sample above it), so that 10^7 cells cost what 5 x 10^4 do."""
RESTARTS = 4
"""k-means restarts (scikit-learn's n_init): the best of four seeded initialisations."""


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def subpopulations(features: np.ndarray, rows: np.ndarray, k: int, seed: int,
                   sample: int = SAMPLE_CELLS) -> np.ndarray:
    """(k, D) float32 centres of k-means on the L2-normalised `features[rows]` (a seeded sample of at
    most `sample` of them). A UserError when there are fewer cells than subpopulations."""
    from sklearn.cluster import KMeans

    rows = np.asarray(rows, np.int64)
    if k < 2:
        raise ValueError(f"subpopulations need k >= 2, got {k}")
    if len(rows) < k:
        raise UserError(f"eval.profile_subpopulations={k} asks for more subpopulations than the {len(rows)} profiled "
                        f"cells: set it to at most {len(rows)}, or 0 for the mean profile alone")
    if len(rows) > sample:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=sample, replace=False))
    fitted = KMeans(n_clusters=k, n_init=RESTARTS, random_state=seed).fit(_unit_rows(features[rows]))
    return fitted.cluster_centers_.astype(np.float32)


def nearest(features: np.ndarray, rows: np.ndarray, centres: np.ndarray, block_cells: int = BLOCK_CELLS) -> np.ndarray:
    """Each of `features[rows]`'s subpopulation: the centre nearest its L2-normalised features (in
    Euclidean distance, as k-means assigns), read `block_cells` rows at a time."""
    rows = np.asarray(rows, np.int64)
    out = np.empty(len(rows), np.int64)
    squared = np.einsum("ij,ij->i", centres, centres)
    for first in range(0, len(rows), block_cells):
        chosen = rows[first:first + block_cells]
        ascending = np.argsort(chosen, kind="stable")
        block = np.empty((len(chosen), centres.shape[1]), np.float32)
        block[ascending] = features[chosen[ascending]]
        # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 is the same for every centre
        out[first:first + len(chosen)] = np.argmin(squared[None, :] - 2 * (_unit_rows(block) @ centres.T), axis=1)
    return out


def well_shares(features: np.ndarray, wells: Wells, k: int, seed: int) -> np.ndarray:
    """(wells, k) float64: each well's fraction of cells in each of the k subpopulations of its cells'
    features (`features` positions are those `wells` groups)."""
    centres = subpopulations(features, wells.order, k, seed)
    members = nearest(features, wells.order, centres)
    well_of = np.repeat(np.arange(wells.count), wells.sizes)
    counts = np.bincount(well_of * k + members, minlength=wells.count * k).reshape(wells.count, k)
    return counts / wells.sizes[:, None]


def beside_shares(profiles: np.ndarray, shares: np.ndarray, controls: np.ndarray | None,
                  weight: float) -> np.ndarray:
    """(wells, D + k) float32: the normalised `profiles` beside the `shares` less the control wells'
    mean shares (every well's mean without controls), scaled so that on average over the wells the
    shares hold `weight` of the squared norm and the profiles 1 - weight."""
    if not 0 < weight < 1:
        raise ValueError(f"the shares' weight must be in (0, 1), got {weight}")
    profiles = np.asarray(profiles, np.float64)
    shares = np.asarray(shares, np.float64)
    reference = shares[controls] if controls is not None and np.any(controls) else shares
    shares = shares - reference.mean(axis=0)

    def scaled(block: np.ndarray, share: float) -> np.ndarray:
        power = float(np.mean(np.einsum("ij,ij->i", block, block)))
        return block * np.sqrt(share / power) if power > 0 else block

    return np.concatenate([scaled(profiles, 1 - weight), scaled(shares, weight)], axis=1).astype(np.float32)
