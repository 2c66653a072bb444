"""A trained model on new plates: the screen checked against the model's card, and the configuration
with which the usual steps embed it as the model learnt (`python -m training profile`,
training/steps/profile.py).

The model's card (training/models/card.py) says what the model reads; the new screen's config says what
its images hold. `setup` maps the card's channels by name to the screen's (data.channel_names naming
data.channels), so that data.channels picks them in the model's order whatever order the screen stacks
them in; refuses, in one line, a screen that lacks one of the model's channels or is cut at another
crop size; and writes the profile's config (RunLayout.profile_config), the card with the channel map
(model_card) and the model's statistics placed at the screen's channel indices (model_mean_std, which
the profile's data.mean_std_file names), so that the model's own mean and std normalise the new cells.
`check`, once ingest and mean-std have run, compares the screen's per-channel statistics with the card's
(card.STATS_FACTOR) and refuses, in one line, a screen whose channels are not what the model learnt.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from training.config import Config, dump_config, from_dict, load_config
from training.errors import UserError
from training.eval.profiles.subpopulations import read_centres
from training.models.card import STATS_FACTOR, ModelCard, card_of_checkpoint
from training.rundir import RunLayout
from training.rundir.artifacts import read_checkpoint, read_json, read_mean_std
from training.writes.atomic import copy_atomic, write_json_atomic

log = logging.getLogger(__name__)

RECIPE_SECTIONS = ("model", "dino", "optim", "train")
"""The sections a profile takes from the model's config: how it was made. The screen's config gives
run, data (but for the channels, scaling and statistics), ingest (but for the crop size) and eval (but
for EVALUATION_SETTINGS)."""
EVALUATION_SETTINGS = {"image_size": "eval_image_size", "resize": "eval_resize", "normalize": "eval_normalize",
                       "tta": "eval_tta", "feature": "feature"}
"""eval settings -> the card's fields: what the encoder is fed and what it gives, the model's."""


def model_checkpoint(model: Path) -> Path:
    """The checkpoint --model names (training/chain/graph.py profile_checkpoint); a UserError when absent."""
    from training.chain.graph import profile_checkpoint

    path = Path(profile_checkpoint(str(model)))
    if not path.is_file():
        raise UserError(f"--model {model}: no checkpoint at {path}; give a trained run's directory or a checkpoint "
                        "file (*.pth)")
    return path


def setup(config: Config, model: Path) -> Config:
    """Check the screen against the model's card; write the profile's config, card and statistics; return
    the profile's config."""
    checkpoint = model_checkpoint(model)
    saved = read_checkpoint(checkpoint, mmap_weights=True)
    card = card_of_checkpoint(saved, checkpoint)
    if card is None:
        raise UserError(f"{checkpoint} holds no model card and no config of this package (weights from elsewhere): "
                        "profile needs a model trained here")
    layout = RunLayout.from_config(config)
    check_screen(config, layout, checkpoint)
    order = channel_order(card, config, checkpoint)
    if card.recipe.epochs_done < card.recipe.epochs:
        log.warning("%s has trained %d of its %d epochs: profiling with an unfinished model", checkpoint,
                    card.recipe.epochs_done, card.recipe.epochs)
    profile = profile_config(config, saved["config"], card, order, layout, checkpoint)
    if card.mean:
        write_json_atomic(layout.model_mean_std, model_statistics(card, order), indent=1)
    profile, subpopulations = carried_subpopulations(profile, card, checkpoint, layout)
    dump_config(profile, layout.profile_config)
    write_json_atomic(layout.model_card, {"model": str(checkpoint), "card": card.to_dict(),
                                          "channel_map": dict(zip(card.channels, order)),
                                          "crop_size": profile.ingest.crop_size,
                                          **({"subpopulations": subpopulations} if subpopulations else {})}, indent=1)
    moved = [f"{name} {index}->{position}" for position, (name, index) in enumerate(zip(card.channels, order))
             if index != position]
    log.info("profile: %s (%s, %d epochs) reads %s (the screen's channels %s), %d px crops; wrote %s",
             checkpoint, card.recipe.arch, card.recipe.epochs_done, ", ".join(card.channels),
             ", ".join(moved) or "in the model's order", profile.ingest.crop_size, layout.profile_config)
    return profile


def check_screen(config: Config, layout: RunLayout, checkpoint: Path) -> None:
    """What a profile needs of the screen's own config."""
    if not config.ingest.table:
        raise UserError("profile embeds a screen's LoadData table: set ingest.table in the new screen's config")
    if layout.root.resolve() == checkpoint.resolve().parent.parent:
        raise UserError(f"run.output_dir={config.run.output_dir} is the model's own run: give the new screen a "
                        "folder of its own (run.output_dir)")


def screen_channels(config: Config) -> dict[str, int]:
    """Each channel the screen's config names, by name: its index in the screen's images (data.channels,
    named by data.channel_names; unnamed ones are ch<index>, as the plots call them)."""
    names = config.data.channel_names or tuple(f"ch{c}" for c in config.data.channels)
    return {name: int(c) for name, c in zip(names, config.data.channels)}


def channel_order(card: ModelCard, config: Config, checkpoint: Path) -> tuple[int, ...]:
    """The screen's index of each channel the model reads, in the model's order. A channel-adaptive model
    knows its channels by their index in its training images, so those must not move."""
    order = card.channel_order(screen_channels(config))
    if card.recipe.kind != "vit" and order != card.channel_ids:
        raise UserError(f"{checkpoint} is a {card.recipe.kind} model, which knows its channels by their index: the "
                        f"screen must hold {', '.join(card.channels)} at indices {card.channel_ids}, it holds them at "
                        f"{order}")
    return order


def profile_config(config: Config, trained: dict[str, Any], card: ModelCard, order: tuple[int, ...],
                   layout: RunLayout, checkpoint: Path) -> Config:
    """The screen's config with what the model learnt: its recipe (RECIPE_SECTIONS), the channels in its
    order (by name), its crop size, scaling, statistics and EVALUATION_SETTINGS; a UserError for a screen
    cut at another crop size, or a model whose card has no statistics to normalise with."""
    crop = config.ingest.crop_size
    if card.crop_size and crop and crop != card.crop_size:
        raise UserError(f"ingest.crop_size={crop}, but {checkpoint} learnt from {card.crop_size} px crops: set "
                        f"ingest.crop_size={card.crop_size} (or 0), so that cells are seen at the scale it learnt")
    if not card.mean and card.eval_normalize and card.normalization == "dataset":
        raise UserError(f"{checkpoint}'s card holds no per-channel mean and std, with which the model normalises "
                        "its inputs: run `mean-std` in its run again, or profile with a checkpoint saved with them")
    tree = config.to_dict()
    tree.update({section: trained[section] for section in RECIPE_SECTIONS if section in trained})
    tree["model"]["pretrained"] = ""
    tree["data"].update(channels="".join(map(str, order)), channel_names=list(card.channels),
                        normalization=card.normalization, channel_combinations=[], compare_channel_adaptive=False,
                        mean_std_file=str(layout.model_mean_std) if card.mean else "")
    tree["ingest"]["crop_size"] = crop or card.crop_size
    tree["eval"].update({key: getattr(card, field) for key, field in EVALUATION_SETTINGS.items()},
                        checkpoints_dir="", embed_all_cells=True)
    tree["run"].update(combination="", channel_adaptive="")
    try:
        return from_dict(tree)
    except UserError as exc:
        raise UserError(f"{checkpoint}'s settings do not combine with the screen's config: {exc}") from None


def carried_subpopulations(profile: Config, card: ModelCard, checkpoint: Path,
                           layout: RunLayout) -> tuple[Config, dict[str, Any]]:
    """With eval.profile_subpopulations, the model's run's subpopulations (its export's
    profiles/subpopulations.parquet, fitted on features of these weights and as many), copied into the
    profile (model_subpopulations) and named by eval.profile_subpopulation_centres, so that the new
    plates' shares count the pilot's subpopulations; where there are none to carry, a warning that
    they are fitted on the new plates (their shares then compare among these plates only). Returns
    the profile's config and what model_card.json records of it."""
    k = profile.eval.profile_subpopulations
    if not k:
        return profile, {}
    if profile.eval.profile_subpopulation_centres:
        return profile, {"centres": profile.eval.profile_subpopulation_centres, "from": "the screen's config"}
    pilot = RunLayout(checkpoint.resolve().parent.parent).profiles_subpopulations
    reason = ""
    if not pilot.is_file():
        reason = f"the model's run has no {pilot.name} (run `export` there with eval.profile_subpopulations={k})"
    else:
        centres = read_centres(pilot)
        reason = (f"{pilot} holds {centres.k} subpopulations, the screen's config asks for {k}" if centres.k != k
                  else centres.fits(card.to_dict(), centres.centres.shape[1]))
    if reason:
        log.warning("profile: the %d subpopulations are fitted on the new plates, so their shares compare among "
                    "these plates only, not with the model's run: %s", k, reason)
        return profile, {"fitted": "on the new plates' cells", "why": reason}
    layout.root.mkdir(parents=True, exist_ok=True)
    copy_atomic(pilot, layout.model_subpopulations)
    log.info("profile: the new plates' cells are counted in the %d subpopulations of %s", k, pilot)
    return (profile.replace({"eval.profile_subpopulation_centres": str(layout.model_subpopulations)}),
            {"centres": str(layout.model_subpopulations), "from": str(pilot)})


def model_statistics(card: ModelCard, order: tuple[int, ...]) -> dict[str, Any]:
    """The model's mean and std placed at the screen's channel indices (what data.channels picks);
    indices the model does not read hold 0 and 1."""
    size = max(order) + 1
    mean, std = [0.0] * size, [1.0] * size
    for position, index in enumerate(order):
        mean[index], std[index] = card.mean[position], card.std[position]
    return {"mean": mean, "std": std, "channels": list(card.channels), "indices": list(order),
            "source": "the model's card: its run's per-channel statistics, in the model's channel order"}


def check(config: Config) -> None:
    """The screen's statistics (mean-std's, every channel of its images) against the card's; the result
    is added to the profile's card file."""
    layout = RunLayout.from_config(config)
    record = read_json(layout.model_card, "the profile's model card", "profile --stage setup", ("card",))
    card = ModelCard.from_dict(record["card"], layout.model_card)
    order = load_config(layout.profile_config).data.channel_indices
    stats = read_mean_std(layout.mean_std, layout)
    mean, std = [stats["mean"][i] for i in order], [stats["std"][i] for i in order]
    problems = card.statistics_problems(mean, std)
    record["statistics"] = {"screen_mean": mean, "screen_std": std, "factor": STATS_FACTOR, "problems": problems}
    write_json_atomic(layout.model_card, record, indent=1)
    if problems:
        raise UserError(f"the screen's per-channel statistics are not the model's (allowed: within {STATS_FACTOR}x "
                        f"either way): {'; '.join(problems)}; check data.channel_names against the images, or "
                        "train a model on such plates")
    if not card.mean:
        log.warning("the model's card has no per-channel statistics: the screen's were not checked")
    else:
        log.info("profile: the screen's per-channel mean and std are within %.2gx of the model's", STATS_FACTOR)
