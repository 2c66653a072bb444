"""Per-well profiles normalised as image-based profiling normalises them, each step through the
library the field uses (eval.profile_normalization lists the steps; they run in this order):

    mad_robustize  plate by plate, each feature minus the median of the plate's control wells, over
                   their median absolute deviation x 1.4826 (pycytominer.normalize with
                   method="mad_robustize" and samples = the controls): the field's first answer to
                   plate and batch effects, and what puts every feature on the controls' scale; with
                   eval.mad_robustize_samples: all, the median and MAD of all the plate's wells
                   (pycytominer's samples="all"), steadier where a plate has few controls
    spherize       ZCA sphering fitted on the control wells of the whole screen (pycytominer's
                   Spherize, method "ZCA"): the controls' covariance becomes the identity, so that the
                   directions in which untreated wells vary, batch effects among them, count no more
                   than any other in a cosine
    harmony        Harmony (harmonypy) on data.batch_column: each well's profile moved towards the
                   clusters it shares with wells of the other batches (Arevalo et al. 2024 ranked it
                   among the best corrections for Cell Painting batches)

Features that do not vary among a plate's control wells (a median absolute deviation of 0) would be
divided by pycytominer's epsilon of 1e-18; they are dropped before the steps, and counted. After
mad_robustize, features beyond +-500 in some well are dropped too (pycytominer's drop_outliers, the
step profiling pipelines run next): a feature that hardly varies among a plate's few controls would
otherwise dominate every cosine and leave the controls a rank of one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from training.errors import UserError

log = logging.getLogger(__name__)

STEPS = ("mad_robustize", "spherize", "harmony")
"""The steps eval.profile_normalization may list, in the order they run."""
CONTROLLED = ("mad_robustize", "spherize")
"""The steps fitted on the control wells."""
SPHERE_EPSILON = 1e-9
"""Added to the singular values of the centred controls (Spherize's epsilon). Not its default of 1e-6:
on L2-normalised features the smallest singular values are about 1e-4 (variances of 1e-8 over ~100
wells), where 1e-6 leaves the controls' variance 2 % short of 1 in those directions."""
OUTLIER_CUTOFF = 500.0
"""pycytominer's drop_outliers default: features beyond it in absolute value after mad_robustize go."""
MIN_PLATE_CONTROLS = 2
"""A median absolute deviation needs two control wells on a plate (one has none)."""
CONTROL_FLAG = "Metadata_IsControl"
FEATURE_PREFIX = "f"


@dataclass(frozen=True)
class WellContext:
    """What the steps need besides the profiles, one entry per well."""

    plates: np.ndarray
    controls: np.ndarray | None
    """Which wells are controls (needed by mad_robustize and spherize)."""
    batches: np.ndarray | None = None
    """Each well's imaging batch (needed by harmony)."""
    seed: int = 0
    mad_samples: str = "controls"
    """The wells each plate's median and MAD come from: "controls", or "all" of the plate's wells."""
    sphere_shrinkage: float = 0.0
    """How much Spherize is regularised: sphere_epsilon (eval.spherize_shrinkage)."""

    @property
    def mad_reference(self) -> np.ndarray:
        """Which wells mad_robustize fits each plate on."""
        return np.ones(len(self.plates), bool) if self.mad_samples == "all" else np.asarray(self.controls, bool)


def check_steps(steps: tuple[str, ...], *, controls: bool, batches: bool, mad_samples: str = "controls") -> None:
    """A UserError naming the setting when a step lacks what it is fitted on."""
    fitted = [s for s in steps if s in CONTROLLED and not (s == "mad_robustize" and mad_samples == "all")]
    if fitted and not controls:
        raise UserError(f"eval.profile_normalization {', '.join(fitted)} {'is' if len(fitted) == 1 else 'are'} fitted "
                        "on the control wells: set data.control_column and data.control_value (e.g. "
                        "Metadata_Treatment and DMSO), or leave those steps out")
    if "harmony" in steps and not batches:
        raise UserError("eval.profile_normalization harmony corrects the batches of data.batch_column: set it (e.g. "
                        "Metadata_Batch), or leave harmony out")


def normalize_profiles(profiles: np.ndarray, steps: tuple[str, ...],
                       context: WellContext) -> tuple[np.ndarray, np.ndarray]:
    """`profiles` (wells, D) after each of `steps`, in STEPS' order, and the indices of the features
    kept (see the module); () returns them unchanged."""
    x = np.asarray(profiles, np.float64)
    kept = np.arange(x.shape[1])
    if not steps:
        return np.asarray(profiles, np.float32), kept
    check_steps(steps, controls=context.controls is not None and bool(np.any(context.controls)),
                batches=context.batches is not None, mad_samples=context.mad_samples)
    if "mad_robustize" in steps:
        check_plate_controls(context)
    if "spherize" in steps:
        check_sphere_controls(int(np.sum(context.controls)))
    if any(s in CONTROLLED for s in steps):
        kept = varying_on_references(x, context, steps)
        x = x[:, kept]
    if "mad_robustize" in steps:
        x = mad_robustize_per_plate(x, context)
        inside = within_outlier_cutoff(x)
        x, kept = x[:, inside], kept[inside]
    if "spherize" in steps:
        x = spherize(x, context.controls, context.sphere_shrinkage)
    if "harmony" in steps:
        x = harmony(x, context.batches, context.seed)
    return x.astype(np.float32), kept


def varying_on_references(x: np.ndarray, context: WellContext, steps: tuple[str, ...]) -> np.ndarray:
    """The indices of the features that vary among the wells each step is fitted on (each plate's for
    mad_robustize, the controls for sphering): all of them, as a rule; the others are counted in the log."""
    keep = np.ones(x.shape[1], bool)
    references = []
    if "mad_robustize" in steps:
        references += [context.mad_reference & (context.plates == plate) for plate in np.unique(context.plates)]
    if "spherize" in steps:
        references.append(np.asarray(context.controls, bool))
    for rows in references:
        if rows.any():
            keep &= np.ptp(x[rows], axis=0) > 0
    if not keep.any():
        raise UserError("no feature varies among the control wells, so nothing can be normalised on them: check "
                        "data.control_value, or set eval.profile_normalization: none")
    if not keep.all():
        log.info("%d of %d features do not vary among a plate's control wells and are dropped before normalising",
                 int((~keep).sum()), x.shape[1])
    return np.flatnonzero(keep)


def _frame(x: np.ndarray, controls: np.ndarray):
    import pandas as pd

    frame = pd.DataFrame(x, columns=_names(x.shape[1]))
    frame.insert(0, CONTROL_FLAG, np.asarray(controls, bool))
    return frame


def check_plate_controls(context: WellContext) -> None:
    """Every plate needs MIN_PLATE_CONTROLS control wells (or wells, with mad_samples "all") to be
    normalised to its own."""
    for plate in np.unique(context.plates):
        count = int(context.mad_reference[context.plates == plate].sum())
        if context.mad_samples == "all" and count < MIN_PLATE_CONTROLS:
            raise UserError(f"plate {plate} has {count} profiled well: mad_robustize needs at least "
                            f"{MIN_PLATE_CONTROLS} per plate; evaluate more cells or leave mad_robustize out")
        if count < MIN_PLATE_CONTROLS:
            raise UserError(f"plate {plate} has {count} control well{'' if count == 1 else 's'} among the profiled "
                            f"wells: mad_robustize needs at least {MIN_PLATE_CONTROLS} per plate (each plate is "
                            "normalised to its own controls); add controls, evaluate more cells (eval.max_cells, "
                            "data.holdout_fraction), or leave mad_robustize out of eval.profile_normalization")


def within_outlier_cutoff(x: np.ndarray) -> np.ndarray:
    """Which features pycytominer's drop_outlier_features keeps (none beyond OUTLIER_CUTOFF), counted in the log."""
    from pycytominer.cyto_utils.features import drop_outlier_features

    dropped = set(drop_outlier_features(_frame(x, np.zeros(len(x), bool)), features=_names(x.shape[1]),
                                        outlier_cutoff=OUTLIER_CUTOFF))
    keep = np.array([name not in dropped for name in _names(x.shape[1])])
    if not keep.any():
        raise UserError(f"after mad_robustize every feature is beyond +-{OUTLIER_CUTOFF:g} in some well: the control "
                        "wells hardly vary; check data.control_value, or leave mad_robustize out")
    if dropped:
        log.info("%d of %d features are beyond +-%g after mad_robustize and are dropped (pycytominer's "
                 "drop_outliers)", len(dropped), x.shape[1], OUTLIER_CUTOFF)
    return keep


def _names(count: int) -> list[str]:
    return [f"{FEATURE_PREFIX}{i}" for i in range(count)]


def mad_robustize_per_plate(x: np.ndarray, context: WellContext) -> np.ndarray:
    """pycytominer.normalize(method="mad_robustize") of each plate's wells, fitted on its controls
    (or on all of its wells)."""
    from pycytominer import normalize

    out = np.empty_like(x)
    features = _names(x.shape[1])
    for plate in np.unique(context.plates):
        rows = np.flatnonzero(context.plates == plate)
        normalized = normalize(_frame(x[rows], context.mad_reference[rows]), features=features,
                               meta_features=[CONTROL_FLAG], samples=f"{CONTROL_FLAG} == True",
                               method="mad_robustize")
        out[rows] = normalized[features].to_numpy(np.float64)
    return out


def beside_unit(profiles: np.ndarray, other: np.ndarray, weight: float) -> np.ndarray:
    """(wells, D + D') float32: each well's row of `profiles` and of `other` scaled to unit norm and
    weighted by sqrt(1 - weight) and sqrt(weight), so that the cosine between two wells is
    (1 - weight) x their profiles' cosine + weight x their others' (a row of zeros stays zeros)."""
    if not 0 < weight < 1:
        raise ValueError(f"the second block's weight must be in (0, 1), got {weight}")

    def unit(block: np.ndarray) -> np.ndarray:
        block = np.asarray(block, np.float64)
        norms = np.linalg.norm(block, axis=1, keepdims=True)
        return np.divide(block, norms, out=np.zeros_like(block), where=norms > 0)

    return np.concatenate([np.sqrt(1 - weight) * unit(profiles), np.sqrt(weight) * unit(other)],
                          axis=1).astype(np.float32)


def check_sphere_controls(count: int) -> None:
    """Sphering is fitted on the control wells: at least two of them."""
    if count < 2:
        raise UserError(f"sphering needs at least 2 control wells, got {count}: add control wells, evaluate more "
                        "cells, or leave spherize out of eval.profile_normalization")


def spherize(x: np.ndarray, controls: np.ndarray, shrinkage: float = 0.0) -> np.ndarray:
    """Every profile through pycytominer's ZCA Spherize fitted on the control rows, its epsilon set by
    `shrinkage` (sphere_epsilon)."""
    import pandas as pd
    from pycytominer.operations.transform import Spherize

    fit_rows = x[np.asarray(controls, bool)]
    check_sphere_controls(len(fit_rows))
    # Dependent controls are refused here: with more controls than features Spherize's own rank test
    # passes whenever it centres (an operator-precedence slip in pycytominer 1.7.1) and the missing
    # directions would be scaled by 1 / epsilon; with fewer, it raises a ValueError that blames itself.
    rank = int(np.linalg.matrix_rank(fit_rows - fit_rows.mean(axis=0)))
    spanned = min(len(fit_rows) - 1, x.shape[1])
    if rank < spanned:
        raise UserError(f"the {len(fit_rows)} control wells' profiles cannot be sphered: they are linearly dependent "
                        f"(rank {rank}, {spanned} expected from {len(fit_rows)} wells in {x.shape[1]} features); leave "
                        "spherize out of eval.profile_normalization")
    columns = _names(x.shape[1])
    sphere = Spherize(epsilon=sphere_epsilon(fit_rows, shrinkage), center=True, method="ZCA", return_numpy=True)
    sphere.fit(pd.DataFrame(fit_rows, columns=columns))
    return np.asarray(sphere.transform(pd.DataFrame(x, columns=columns)), np.float64)


def sphere_epsilon(controls: np.ndarray, shrinkage: float) -> float:
    """Spherize's epsilon for eval.spherize_shrinkage, SPHERE_EPSILON at 0.

    Spherize adds epsilon to the singular values S of the centred controls and divides each direction
    by (S + epsilon) / sqrt(n - 1), that is by its standard deviation s plus epsilon / sqrt(n - 1). So that
    a direction is divided by s + shrinkage x s_rms, where s_rms is the controls' root-mean-square
    standard deviation per feature (a scale of the profiles, whatever their units), epsilon is
    shrinkage x s_rms x sqrt(n - 1)."""
    if shrinkage == 0:
        return SPHERE_EPSILON
    rms_std = float(np.sqrt(np.var(controls, axis=0, ddof=1).mean()))
    return shrinkage * rms_std * float(np.sqrt(len(controls) - 1)) + SPHERE_EPSILON


def harmony(x: np.ndarray, batches: np.ndarray, seed: int) -> np.ndarray:
    """Harmony's corrected profiles (harmonypy with its defaults)."""
    import harmonypy

    if len(np.unique(batches)) < 2:
        raise UserError("harmony corrects between batches, and every profiled well is in one batch of "
                        "data.batch_column: leave harmony out of eval.profile_normalization")
    # Given (features, wells), harmonypy never has to guess the orientation of a square matrix; it
    # returns (wells, features). Its default of one cluster per 30 wells is kept, but at least one.
    clusters = max(1, min(round(len(x) / 30), 100))
    result = harmonypy.run_harmony(np.ascontiguousarray(x.T), {"batch": np.asarray(batches).astype(str)}, "batch",
                                   nclust=clusters, random_state=seed, verbose=False)
    return np.asarray(result.Z_corr, np.float64)
