"""A checkpoint holding only a run's config and model card, for the profile chain's setup stage.

The setup stage (training/eval/profiles/new_plates.py) reads a checkpoint's config and card, never
its weights, so a checkpoint of those alone stands in for a trained one, which would take a
pretraining to make: a model of three channels named a, b and c, cut at 40 px."""

from __future__ import annotations

from pathlib import Path

import torch

from training.config import Config
from training.models.card import ModelCard, Recipe
from training.rundir import RunLayout


def card_only_checkpoint(run_dir: Path) -> Path:
    """Write the checkpoint of a run at `run_dir` (its config and card, no weights); return its path."""
    model = Config().replace({"run.output_dir": str(run_dir), "data.channels": "012",
                              "data.channel_names": ["a", "b", "c"], "ingest.crop_size": 40})
    card = ModelCard(channels=("a", "b", "c"), channel_ids=(0, 1, 2), mean=(0.1, 0.2, 0.3), std=(0.2, 0.2, 0.2),
                     crop_size=40, recipe=Recipe(arch="vit_small", epochs=1, epochs_done=1))
    checkpoint = RunLayout.from_config(model).latest_checkpoint
    checkpoint.parent.mkdir(parents=True)
    torch.save({"config": model.to_dict(), "model_card": card.to_dict(), "epoch": 1, "global_step": 5}, checkpoint)
    return checkpoint
