"""Retrieval mAP in copairs' two documented setups (training/eval/retrieval.py) against average
precision computed here from the definitions: phenotypic activity (a perturbation's replicate wells
against the control wells of the query's plate) and phenotypic consistency (the wells of active
perturbations retrieving the other perturbations of their group); the FDR correction against
Benjamini-Hochberg computed here; significance telling separated perturbations from random ones; a
screen without controls says so."""

from __future__ import annotations

import numpy as np
import pytest

from training.eval.retrieval import NO_CONTROLS, WellProfiles, phenotypic_activity, phenotypic_consistency, profile_map


def make_wells(profiles, perturbations, plates, controls, groups=None) -> WellProfiles:
    keys = np.array([f"{p}/w{i}" for i, p in enumerate(plates)], dtype=object)
    return WellProfiles(np.asarray(profiles, np.float64), np.asarray(perturbations, dtype=object),
                        np.asarray(plates, dtype=object), keys, np.asarray(controls, bool),
                        None if groups is None else np.asarray(groups, dtype=object))


def average_precision(x: np.ndarray, query: int, positives: list[int], negatives: list[int]) -> float:
    """Candidates ranked by cosine similarity to the query; AP = mean over positives of (positives at
    or above its rank) / (its rank)."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    candidates = positives + negatives
    sims = np.array([unit[query] @ unit[j] for j in candidates])
    relevant = np.array([1] * len(positives) + [0] * len(negatives))[np.argsort(-sims, kind="stable")]
    ranks = np.flatnonzero(relevant) + 1
    return float((np.arange(1, len(ranks) + 1) / ranks).mean())


def activity_by_definition(x, perturbations, plates, controls, same_plate=True) -> dict[str, float]:
    per: dict[str, list[float]] = {}
    for q in np.flatnonzero(~controls):
        positives = [j for j in range(len(x)) if j != q and not controls[j] and perturbations[j] == perturbations[q]]
        negatives = [j for j in range(len(x)) if controls[j] and (plates[j] == plates[q] or not same_plate)]
        if positives and negatives:
            per.setdefault(perturbations[q], []).append(average_precision(x, q, positives, negatives))
    return {name: float(np.mean(v)) for name, v in per.items()}


def consistency_by_definition(x, perturbations, groups, chosen) -> dict[str, float]:
    per: dict[str, list[float]] = {}
    for q in np.flatnonzero(chosen):
        positives = [j for j in np.flatnonzero(chosen) if groups[j] == groups[q] and perturbations[j] != perturbations[q]]
        negatives = [j for j in np.flatnonzero(chosen) if groups[j] != groups[q]]
        if positives and negatives:
            per.setdefault(groups[q], []).append(average_precision(x, q, positives, negatives))
    return {name: float(np.mean(v)) for name, v in per.items()}


def small_screen(rng, separation: float = 0.8):
    """3 plates of 8 wells: 2 controls each, and 6 perturbations in 3 groups (2 each), a well of each
    perturbation per plate; a perturbation leans towards its group's direction, plus its own."""
    perturbations, plates, controls, groups = [], [], [], []
    for plate in ("P1", "P2", "P3"):
        for name in ("DMSO", "DMSO", "a1", "a2", "b1", "b2", "c1", "c2"):
            perturbations.append(name)
            plates.append(plate)
            controls.append(name == "DMSO")
            groups.append("control" if name == "DMSO" else name[0])
    group_direction = {g: rng.standard_normal(6) for g in "abc"}
    own = {p: rng.standard_normal(6) for p in set(perturbations)}
    x = np.stack([separation * (group_direction.get(g, 0) + 0.5 * own[p]) for p, g in zip(perturbations, groups)])
    x = x + rng.standard_normal(x.shape)
    return x, np.array(perturbations, dtype=object), np.array(plates, dtype=object), np.array(controls), \
        np.array(groups, dtype=object)


@pytest.mark.parametrize("same_plate", [True, False])
def test_activity_equals_average_precision_against_the_controls(same_plate):
    """Against the control wells of the query's plate (JUMP), or every control well."""
    x, perturbations, plates, controls, _ = small_screen(np.random.default_rng(0))
    result = phenotypic_activity(make_wells(x, perturbations, plates, controls), seed=0, same_plate=same_plate)
    expected = activity_by_definition(x, perturbations, plates, controls, same_plate)
    assert set(result["per_treatment"]) == set(expected)  # the controls are not scored
    for name, value in expected.items():
        assert result["per_treatment"][name]["map"] == pytest.approx(value, abs=1e-6)
        assert result["per_treatment"][name]["n_wells"] == 3
    assert result["mean_map"] == pytest.approx(np.mean(list(expected.values())), abs=1e-6)
    assert result["n_treatments"] == 6 and result["n_control_wells"] == 6


def test_consistency_equals_average_precision_among_the_active_perturbations_of_a_group():
    x, perturbations, plates, controls, groups = small_screen(np.random.default_rng(1))
    wells = make_wells(x, perturbations, plates, controls, groups)
    active = ["a1", "a2", "b1", "b2", "c1"]  # c2 inactive: group c has one perturbation left, so no positive
    result = phenotypic_consistency(wells, active, seed=0)
    chosen = np.isin(perturbations, active)
    expected = consistency_by_definition(x, perturbations, groups, chosen)
    assert set(expected) == {"a", "b"}
    for name, value in expected.items():
        assert result["per_treatment"][name]["map"] == pytest.approx(value, abs=1e-6)
    assert result["per_treatment"]["c"]["map"] is None
    assert result["n_active_perturbations"] == 5 and result["n_treatments"] == 2


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    order = np.argsort(p)
    scaled = p[order] * len(p) / np.arange(1, len(p) + 1)
    q = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty_like(q)
    out[order] = np.minimum(q, 1.0)
    return out


def replicate_screen(rng, separation: float, perturbations: int = 8, replicates: int = 4, plates: int = 4):
    """`replicates` wells of each perturbation over the plates, and 4 control wells per plate; a
    perturbation leans towards its own direction by `separation` (0: nothing is retrievable)."""
    names, plate_of, controls = [], [], []
    for plate in range(plates):
        for p in range(perturbations):
            names += [f"t{p}"] * (replicates // plates)
        names += ["DMSO"] * 4
        plate_of += [f"P{plate}"] * (len(names) - len(plate_of))
    controls = np.array([n == "DMSO" for n in names])
    directions = {n: rng.standard_normal(24) for n in set(names)}
    x = rng.standard_normal((len(names), 24)) + separation * np.stack([directions[n] * (n != "DMSO") for n in names])
    return make_wells(x, names, plate_of, controls)


def test_separated_perturbations_are_retrieved_and_random_ones_are_not():
    rng = np.random.default_rng(2)
    strong = phenotypic_activity(replicate_screen(rng, 3.0), seed=0)
    noise = phenotypic_activity(replicate_screen(rng, 0.0), seed=0)
    assert strong["fraction_significant"] == 1.0 and strong["mean_map"] > 0.9
    assert noise["fraction_significant"] <= 0.25, noise
    for result in (strong, noise):
        p = np.array([v["p_value"] for v in result["per_treatment"].values()])
        q = np.array([v["q_value"] for v in result["per_treatment"].values()])
        np.testing.assert_allclose(q, benjamini_hochberg(p), rtol=1e-9)
        assert all(v["significant"] == (v["q_value"] < 0.05) for v in result["per_treatment"].values())


def test_a_screen_without_controls_says_so_and_scores_consistency_over_every_perturbation():
    x, perturbations, plates, _, groups = small_screen(np.random.default_rng(3))
    keep = perturbations != "DMSO"
    wells = make_wells(x[keep], perturbations[keep], plates[keep], np.zeros(keep.sum(), bool), groups[keep])
    result = profile_map(wells, has_controls=False, seed=0)
    assert result["map"]["skipped"] == NO_CONTROLS and result["map"]["mean_map"] is None
    assert "data.control_column" in NO_CONTROLS
    assert result["map_consistency"]["active_filter"] == "none (no controls)"
    assert result["map_consistency"]["n_active_perturbations"] == 6 and result["map_consistency"]["n_treatments"] == 3


def test_activity_filters_consistency_to_the_retrieved_perturbations():
    wells = replicate_screen(np.random.default_rng(4), 3.0, perturbations=4)
    groups = np.array(["control" if c else ("g1" if p in ("t0", "t1") else "g2")
                       for p, c in zip(wells.perturbations, wells.controls)], dtype=object)
    wells = WellProfiles(wells.profiles, wells.perturbations, wells.plates, wells.keys, wells.controls, groups)
    result = profile_map(wells, has_controls=True, seed=0)
    retrieved = sorted(n for n, v in result["map"]["per_treatment"].items() if v["significant"])
    assert result["map_consistency"]["n_active_perturbations"] == len(retrieved) == 4


def test_consistency_without_two_groups_to_compare_says_why():
    x, perturbations, plates, controls, groups = small_screen(np.random.default_rng(5))
    wells = make_wells(x, perturbations, plates, controls, groups)
    one_group = phenotypic_consistency(wells, ["a1", "a2"], seed=0)
    assert one_group["mean_map"] is None and "all of one group" in one_group["skipped"]
    lonely = phenotypic_consistency(wells, ["a1", "b1"], seed=0)
    assert lonely["mean_map"] is None and "no group has two active perturbations" in lonely["skipped"]
