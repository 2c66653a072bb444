"""Weights from elsewhere: our, DINO's or scDINO's checkpoints and ImageNet DINO ViT weights.

Used to evaluate a run's checkpoints (`features`, `plots`, `linear --finetune`) and to start a run
from published weights (`model.pretrained`). The keys are cleaned of DDP's `module.`, DINO's
MultiCropWrapper `backbone.` and torch.compile's `_orig_mod.` prefixes; the head is dropped; the
patch embedding is adapted to the channel count (RGB weights on 5-channel images).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.config import ModelConfig
from training.errors import MissingInputError, UserError
from training.models import build_backbone
from training.models.vit import ARCHS
from training.rundir.artifacts import read_checkpoint

log = logging.getLogger(__name__)

_PREFIXES = ("module.", "backbone.", "_orig_mod.")
ADAPTATIONS = ("mean", "mean_rescaled")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's dict on the CPU (ours hold the config and RNG states: not weights-only),
    checked for damage first (training/rundir/artifacts.py)."""
    return read_checkpoint(path)


def backbone_state_dict(checkpoint: dict[str, Any], which: str = "teacher") -> dict[str, torch.Tensor]:
    """ViT weights from our, DINO's or scDINO's checkpoint, or from plain ImageNet DINO weights."""
    state = checkpoint
    if which in checkpoint and isinstance(checkpoint[which], dict):
        state = checkpoint[which]
    elif "state_dict" in checkpoint and isinstance(checkpoint["state_dict"], dict):
        state = checkpoint["state_dict"]
    out = {}
    for key, value in state.items():
        while key.startswith(_PREFIXES):
            key = next(key[len(p):] for p in _PREFIXES if key.startswith(p))
        if not key.startswith("head.") and isinstance(value, torch.Tensor):
            out[key] = value
    if "pos_embed" not in out or "patch_embed.proj.weight" not in out:
        raise UserError(f"no ViT weights (pos_embed, patch_embed) under key {which!r} of the checkpoint")
    return out


def adapt_patch_embedding(weight: torch.Tensor, in_chans: int, method: str = "mean") -> torch.Tensor:
    """Map a patch embedding made for C channels (e.g. RGB) to `in_chans`: average, then replicate.

    "mean" is scDINO's `use_mean_patch_embedding`, so that weights evaluated here give scDINO's
    features; "mean_rescaled" also scales by C / in_chans, which keeps the embedding's response to
    an image whose channels are all equal (see model.channel_adaptation).
    """
    if method not in ADAPTATIONS:
        raise UserError(f"model.channel_adaptation must be one of {', '.join(ADAPTATIONS)}; got {method!r}")
    source = weight.shape[1]
    if source == in_chans:
        return weight
    adapted = weight.mean(dim=1, keepdim=True).repeat(1, in_chans, 1, 1)
    return adapted * (source / in_chans) if method == "mean_rescaled" else adapted


def load_backbone(path: Path, model_config: ModelConfig, in_chans: int, which: str = "teacher",
                  channels: tuple[int, ...] | None = None, normalization: str | None = None) -> nn.Module:
    """Build the backbone for `model_config` and load the checkpoint's `which` weights into it.

    A channel-adaptive checkpoint (it holds `channel_embed`) gives the channel-adaptive ViT whatever
    model.kind says, with the channels it was trained on; `channels` (data.channels of the evaluation,
    original ids) then picks their embeddings, so one model serves every combination unretrained.
    `normalization` (data.normalization of the images it will read) is checked against the one the
    checkpoint's run trained with (`warn_if_normalised_otherwise`).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInputError("checkpoint", path, "pretrain")
    checkpoint = load_checkpoint(path)
    if normalization is not None:
        warn_if_normalised_otherwise(checkpoint, normalization, path)
    state = backbone_state_dict(checkpoint, which)
    _check_arch(state, model_config, path)
    tokens = state["pos_embed"].shape[1] - 1
    img_size = math.isqrt(tokens) * model_config.patch_size
    if "channel_embed" in state or "bag_channel_ids" in state:
        return _load_channel_adaptive(state, model_config, img_size, in_chans, channels, path)
    if model_config.kind != "vit":
        raise UserError(f"model.kind={model_config.kind} but {path} holds a plain ViT (neither channel_embed nor "
                        "bag_channel_ids); set model.kind=vit to evaluate it")
    backbone = build_backbone(model_config, in_chans, img_size=img_size)
    state["patch_embed.proj.weight"] = adapt_patch_embedding(state["patch_embed.proj.weight"], in_chans,
                                                             model_config.channel_adaptation)
    backbone.load_state_dict(state)
    log.info("loaded %s backbone (%s/%d, %d channels) from %s", which, model_config.arch,
             model_config.patch_size, in_chans, path)
    return backbone


def warn_if_normalised_otherwise(checkpoint: dict[str, Any], normalization: str, path: Path) -> None:
    """Our checkpoints record the data.normalization their run trained with (before the key existed:
    "dataset"); inputs normalised the other way are not what the model learnt to read, so say so.
    A checkpoint without our config (DINO's, scDINO's) is trusted."""
    saved = checkpoint.get("config")
    if not isinstance(saved, dict):
        return
    trained = saved.get("data", {}).get("normalization", "dataset")
    if trained != normalization:
        log.warning("%s was trained with data.normalization=%s but is read here with %s: set "
                    "data.normalization=%s as in its pretraining", path, trained, normalization, trained)


def _load_channel_adaptive(state: dict[str, torch.Tensor], model_config: ModelConfig, img_size: int, in_chans: int,
                           channels: tuple[int, ...] | None, path: Path) -> nn.Module:
    """The channel-adaptive backbone of a checkpoint (a channel_vit when it has `channel_embed`, else a
    bag of channels; whatever model.kind says), reading inputs that carry `channels` (default: the
    channels it was trained on, which must then be `in_chans` many). A bag's features are combined as
    model.bag_combine says."""
    from training.models import channel_bag, channel_vit

    bag = "channel_embed" not in state
    name, build = ("bag-of-channels", channel_bag) if bag else ("channel-adaptive", channel_vit)
    trained = tuple(int(c) for c in state["bag_channel_ids" if bag else "channel_ids"].tolist())
    if channels is None and in_chans != len(trained):
        raise UserError(f"{path} is a {name} model, trained on channels {''.join(map(str, trained))!r}: "
                        f"say which {in_chans} of them the images carry (data.channels)")
    channels = trained if channels is None else tuple(channels)
    backbone = build(model_config, trained, img_size)
    backbone.load_state_dict(state)
    try:
        backbone.select_input_channels(channels)
    except ValueError as exc:
        raise UserError(f"data.channels={''.join(map(str, channels))!r} for {path}: {exc}") from None
    log.info("loaded %s backbone (%s/%d, trained on channels %s) from %s, reading channels %s%s",
             name, model_config.arch, model_config.patch_size, "".join(map(str, trained)), path,
             "".join(map(str, channels)), f", combined by {model_config.bag_combine}" if bag else "")
    return backbone


def load_pretrained_into(backbone: nn.Module, path: Path, model_config: ModelConfig, which: str = "teacher") -> None:
    """Initialise a freshly built backbone from a checkpoint (`model.pretrained`)."""
    from timm.layers import resample_abs_pos_embed

    if not Path(path).is_file():
        raise UserError(f"model.pretrained: no checkpoint at {path}; fix the path or leave it empty")
    state = backbone_state_dict(load_checkpoint(Path(path)), which)
    _check_arch(state, model_config, Path(path))
    state["patch_embed.proj.weight"] = adapt_patch_embedding(
        state["patch_embed.proj.weight"], backbone.patch_embed.proj.in_channels, model_config.channel_adaptation
    )
    if hasattr(backbone, "channel_embed"):  # a plain ViT's weights start a channel-adaptive one
        state.setdefault("channel_embed", backbone.channel_embed.detach().clone())
        state.setdefault("channel_ids", backbone.channel_ids.clone())
    if hasattr(backbone, "bag_channel_ids"):
        state.setdefault("bag_channel_ids", backbone.bag_channel_ids.clone())
    grid = backbone.patch_embed.grid_size
    state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], new_size=list(grid), num_prefix_tokens=1)
    backbone.load_state_dict(state)
    log.info("initialised the backbone from %s (%s weights)", path, which)


def _check_arch(state: dict[str, torch.Tensor], model_config: ModelConfig, path: Path) -> None:
    embed_dim = state["pos_embed"].shape[-1]
    patch = state["patch_embed.proj.weight"].shape[-1]
    expected = ARCHS[model_config.arch][0]
    if embed_dim != expected or patch != model_config.patch_size:
        arch = next((name for name, dims in ARCHS.items() if dims[0] == embed_dim), f"embed_dim {embed_dim}")
        raise UserError(
            f"{path} holds a {arch} with patch {patch}, but model.arch={model_config.arch} and "
            f"model.patch_size={model_config.patch_size}; set them to match the checkpoint"
        )
