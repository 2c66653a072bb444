"""The model card as a record (training/models/card.py): what a dict round trip keeps, what a reader
refuses (not a card, a newer version), how a screen's channels are matched to the model's by name, and
where the per-channel statistics stop fitting (card.STATS_FACTOR either way). The card a training run
writes, and profiling with it, are tests/training/steps/test_profile.py."""

from __future__ import annotations

import json
import re

import pytest

from training.errors import UserError
from training.models.card import CARD_VERSION, STATS_FACTOR, ModelCard, Provenance, Recipe

CARD = ModelCard(channels=("Membrane", "DNA", "Marker"), channel_ids=(0, 2, 3), mean=(0.17, 0.09, 0.19),
                 std=(0.21, 0.14, 0.22), crop_size=40, patch_size=8,
                 provenance=Provenance(source="screen", table="screen/load_data.csv", table_sha256="ab" * 32,
                                       generator_seed=None, cells=1727, plates=("Plate01", "Plate02"),
                                       batches=("Batch1",)),
                 recipe=Recipe(run="screen", arch="vit_tiny", epochs=30, epochs_done=30, global_step=780))


def test_a_card_survives_json_and_back_whole():
    text = json.dumps(CARD.to_dict())
    assert ModelCard.from_dict(json.loads(text)) == CARD
    assert json.loads(text)["version"] == CARD_VERSION and json.loads(text)["provenance"]["generator_seed"] is None


def test_at_moves_only_the_progress():
    later = CARD.at(epoch=31, global_step=806)
    assert (later.recipe.epochs_done, later.recipe.global_step) == (31, 806)
    assert later.to_dict() | {"recipe": None} == CARD.to_dict() | {"recipe": None}


@pytest.mark.parametrize("data, said", [
    ({"mean": [0.1]}, "is not a model card (no channels)"),
    ({**CARD.to_dict(), "version": CARD_VERSION + 1}, f"version {CARD_VERSION + 1}, newer than this code reads"),
    ({**CARD.to_dict(), "recipe": {"arch": "vit_tiny", "optimiser": "sgd"}}, "is not a model card this code reads"),
])
def test_what_is_not_a_card_this_code_reads_is_one_line(data, said):
    with pytest.raises(UserError, match=re.escape(said)) as caught:
        ModelCard.from_dict(data, "x.pth's model card")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("x.pth's model card")


def test_channels_are_found_by_name_in_the_models_order():
    assert CARD.channel_order({"Marker": 0, "DNA": 1, "Membrane": 4, "Extra": 2}) == (4, 1, 0)
    with pytest.raises(UserError) as caught:
        CARD.channel_order({"Membrane": 0, "DNA": 1, "Mito": 2})
    assert str(caught.value).startswith("the new screen lacks channel Marker of the model (it reads Membrane, DNA, "
                                        "Marker, in that order; the screen has Membrane, DNA, Mito)")


def test_statistics_fit_within_the_factor_either_way_and_not_beyond():
    inside = STATS_FACTOR * 0.99
    assert CARD.statistics_problems([0.17 * inside, 0.09 / inside, 0.19], [0.21, 0.14 * inside, 0.22]) == []
    outside = STATS_FACTOR * 1.01
    problems = CARD.statistics_problems([0.17, 0.09 * outside, 0.19], [0.21, 0.14, 0.22 / outside])
    assert problems == [f"DNA: mean {0.09 * outside:.3g} is {outside:.2f}x above the model's 0.09",
                        f"Marker: std {0.22 / outside:.3g} is {outside:.2f}x below the model's 0.22"]
    assert CARD.statistics_problems([0.17, 0.09, 0.19], [0.21, 0.0, 0.22]) == ["DNA: std 0 is infx below the model's 0.14"]


def test_a_card_without_statistics_checks_none():
    bare = ModelCard(channels=("a",), channel_ids=(0,))
    assert bare.statistics_problems([5.0], [5.0]) == []
