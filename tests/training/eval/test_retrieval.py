"""Retrieval mAP (copairs, training/eval/retrieval.py) against average precision computed here from
its definition, the FDR correction against Benjamini-Hochberg computed here, and the significance
test telling separated treatments from random ones."""

from __future__ import annotations

import numpy as np
import pytest

from training.eval.retrieval import WellProfiles, treatment_map

NAMES = ["DMSO", "cpdA", "cpdB"]


def wells(profiles: np.ndarray, treatments: list[int], plates: list[str]) -> WellProfiles:
    keys = np.array([f"{p}/w{i}" for i, p in enumerate(plates)], dtype=object)
    return WellProfiles(np.asarray(profiles, np.float64), np.asarray(treatments), np.asarray(plates, dtype=object), keys)


def independent_map(profiles, treatments, plates) -> dict[int, float]:
    """Each well ranks the other wells of its treatment (positives) and the wells of another treatment
    on its plate (negatives) by cosine similarity; AP = mean over positives of (positives ranked at or
    above it) / (its rank); a treatment's mAP the mean over its wells with a positive."""
    x = profiles / np.linalg.norm(profiles, axis=1, keepdims=True)
    per_treatment: dict[int, list[float]] = {}
    for q in range(len(x)):
        positives = [j for j in range(len(x)) if j != q and treatments[j] == treatments[q]]
        negatives = [j for j in range(len(x)) if treatments[j] != treatments[q] and plates[j] == plates[q]]
        if not positives:
            continue
        candidates = positives + negatives
        sims = np.array([x[q] @ x[j] for j in candidates])
        relevant = np.array([1] * len(positives) + [0] * len(negatives))[np.argsort(-sims, kind="stable")]
        ranks = np.flatnonzero(relevant) + 1
        precision = np.arange(1, len(ranks) + 1) / ranks
        per_treatment.setdefault(int(treatments[q]), []).append(float(precision.mean()))
    return {t: float(np.mean(v)) for t, v in per_treatment.items()}


def test_map_equals_average_precision_computed_from_its_definition():
    rng = np.random.default_rng(0)
    treatments = [0, 1, 2, 1, 2, 0, 1, 2, 0, 1, 2, 2]
    plates = ["P1"] * 6 + ["P2"] * 6
    profiles = rng.standard_normal((12, 5)) + 0.8 * np.eye(5)[np.array(treatments)]
    result = treatment_map(wells(profiles, treatments, plates), NAMES, seed=0, control=["DMSO"])
    expected = independent_map(profiles, np.array(treatments), np.array(plates))
    for t, name in enumerate(NAMES):
        assert result["per_treatment"][name]["map"] == pytest.approx(expected[t], abs=1e-5)
        assert result["per_treatment"][name]["n_wells"] == treatments.count(t)
    assert result["mean_map"] == pytest.approx((expected[1] + expected[2]) / 2, abs=1e-5)  # DMSO left out
    assert result["n_treatments"] == 2 and result["n_wells"] == 12


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    order = np.argsort(p)
    scaled = p[order] * len(p) / np.arange(1, len(p) + 1)
    q = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty_like(q)
    out[order] = np.minimum(q, 1.0)
    return out


def screen_wells(rng, separation: float, treatments_count: int = 8, replicates: int = 4, plates: int = 4):
    """`replicates` wells per treatment spread over the plates; treatment t's profiles lean towards
    its own direction by `separation` (0: no treatment is retrievable)."""
    treatments = [t for t in range(treatments_count) for _ in range(replicates)]
    plate_of = [f"P{i % plates}" for i in range(len(treatments))]
    directions = rng.standard_normal((treatments_count, 24))
    profiles = rng.standard_normal((len(treatments), 24)) + separation * directions[treatments]
    return wells(profiles, treatments, plate_of)


def test_separated_treatments_are_significant_and_random_ones_are_not():
    rng = np.random.default_rng(1)
    names = [f"t{i}" for i in range(8)]
    strong = treatment_map(screen_wells(rng, 3.0), names, seed=0)
    noise = treatment_map(screen_wells(rng, 0.0), names, seed=0)
    assert strong["fraction_significant"] == 1.0 and strong["mean_map"] > 0.9
    assert noise["fraction_significant"] <= 0.25, noise
    for result in (strong, noise):
        p = np.array([v["p_value"] for v in result["per_treatment"].values()])
        q = np.array([v["q_value"] for v in result["per_treatment"].values()])
        np.testing.assert_allclose(q, benjamini_hochberg(p), rtol=1e-9)
        assert all(v["significant"] == (v["q_value"] < 0.05) for v in result["per_treatment"].values())


def test_a_treatment_in_one_well_has_no_map():
    rng = np.random.default_rng(2)
    result = treatment_map(wells(rng.standard_normal((5, 4)), [0, 1, 1, 2, 2], ["P1"] * 5), NAMES, seed=0)
    assert result["per_treatment"]["DMSO"] == {"map": None, "p_value": None, "q_value": None, "significant": None,
                                               "n_wells": 1}
    assert result["n_treatments"] == 2
