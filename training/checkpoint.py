"""Checkpoints: atomic writes by rank 0, numbered copies every N epochs, resume, and backbone loading.

A checkpoint (layout.latest_checkpoint, layout.epoch_checkpoint(e)) is a `torch.save` dict with
"student" and "teacher" (MultiCropWrapper state dicts: "backbone.<ViT keys>", "head.<...>"),
"optimizer", "epoch" (completed epochs), "step_in_epoch" (steps done in the next epoch, non-zero only
after a pre-emption), "global_step", "config", "dino_loss" (the centre), "scaler", "rng" and
"epoch_rng" (RNG states now and at the start of the interrupted epoch), "world_size".
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from training.config import ModelConfig, flatten_dotted
from training.errors import MissingInputError, UserError
from training.layout import RunLayout
from training.models import ARCHS, build_backbone

log = logging.getLogger(__name__)

_PREFIXES = ("module.", "backbone.", "_orig_mod.")


def save_atomic(state: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary file beside `path`, then rename: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_checkpoint(layout: RunLayout, state: dict[str, Any], *, save_every: int, keep_last: int) -> Path:
    """Write the latest checkpoint and, every `save_every` completed epochs, a numbered one."""
    save_atomic(state, layout.latest_checkpoint)
    epoch = int(state["epoch"])
    if save_every > 0 and epoch > 0 and epoch % save_every == 0 and not state.get("step_in_epoch"):
        numbered = layout.epoch_checkpoint(epoch)
        tmp = numbered.with_name(f".{numbered.name}.tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.link(layout.latest_checkpoint, tmp)  # same bytes, no second write; the rename is atomic
        os.replace(tmp, numbered)
        prune_numbered(layout, keep_last)
    return layout.latest_checkpoint


def numbered_checkpoints(layout: RunLayout) -> list[tuple[int, Path]]:
    found = []
    for path in layout.checkpoints.glob("checkpoint_*.pth"):
        match = re.fullmatch(r"checkpoint_(\d+)\.pth", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def prune_numbered(layout: RunLayout, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for _, path in numbered_checkpoints(layout)[:-keep_last]:
        path.unlink(missing_ok=True)
        log.info("removed old checkpoint %s (train.keep_last=%d)", path, keep_last)


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


MUST_MATCH_ON_RESUME = ("model.arch", "model.patch_size", "model.out_dim", "model.use_bn_in_head",
                        "model.norm_last_layer", "data.channels", "train.parallel")
"""Settings a run cannot change when it resumes: the saved weights or optimizer state would not load."""
FOLLOWED_ON_RESUME = ("run.seed", "data.holdout_fraction", "model.drop_path_rate", "dino", "optim")
"""Settings (keys or whole sections) a resumed run takes from the new config, with a warning: the
run goes on, but it is no longer the run an uninterrupted job with either config would have made."""


def check_resumable(saved_config: dict[str, Any] | None, config_now: dict[str, Any], path: Path) -> list[str]:
    """Refuse to resume across settings the checkpoint cannot follow; return the changed settings
    the resumed run will follow (as "key: old -> new") so that the caller can warn about them."""
    if not saved_config:
        return []
    old, new = flatten_dotted(saved_config), flatten_dotted(config_now)
    changed = [key for key in sorted(set(old) & set(new)) if old[key] != new[key]]
    fatal = [key for key in changed if key in MUST_MATCH_ON_RESUME]
    if fatal:
        settings = ", ".join(f"{key}={old[key]!r} (now {new[key]!r})" for key in fatal)
        raise UserError(f"{path} was trained with {settings}: resume with the same settings, or start a new "
                        "run in another run.output_dir")
    followed = [key for key in changed
                if any(key == f or key.startswith(f + ".") for f in FOLLOWED_ON_RESUME)]
    return [f"{key}: {old[key]!r} -> {new[key]!r}" for key in followed]


def capture_rng() -> dict[str, Any]:
    """Every RNG the training step draws from: Python, NumPy, torch CPU and CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def adapt_patch_embedding(weight: torch.Tensor, in_chans: int) -> torch.Tensor:
    """Map a patch embedding made for C channels (e.g. RGB) to `in_chans`: average, then replicate.

    Scaling by C / in_chans keeps the embedding's response to an image of uniform channels.
    """
    source = weight.shape[1]
    if source == in_chans:
        return weight
    mean = weight.mean(dim=1, keepdim=True)
    return mean.repeat(1, in_chans, 1, 1) * (source / in_chans)


def load_backbone(path: Path, model_config: ModelConfig, in_chans: int, which: str = "teacher") -> nn.Module:
    """Build the backbone for `model_config` and load the checkpoint's `which` weights into it."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError("checkpoint", path, "pretrain")
    state = backbone_state_dict(load_checkpoint(path), which)
    _check_arch(state, model_config, path)
    tokens = state["pos_embed"].shape[1] - 1
    grid = math.isqrt(tokens)
    backbone = build_backbone(model_config, in_chans, img_size=grid * model_config.patch_size)
    state["patch_embed.proj.weight"] = adapt_patch_embedding(state["patch_embed.proj.weight"], in_chans)
    backbone.load_state_dict(state)
    log.info("loaded %s backbone (%s/%d, %d channels) from %s", which, model_config.arch,
             model_config.patch_size, in_chans, path)
    return backbone


def load_pretrained_into(backbone: nn.Module, path: Path, model_config: ModelConfig, which: str = "teacher") -> None:
    """Initialise a freshly built backbone from a checkpoint (`model.pretrained`)."""
    from timm.layers import resample_abs_pos_embed

    if not Path(path).is_file():
        raise UserError(f"model.pretrained: no checkpoint at {path}; fix the path or leave it empty")
    state = backbone_state_dict(load_checkpoint(Path(path)), which)
    _check_arch(state, model_config, Path(path))
    state["patch_embed.proj.weight"] = adapt_patch_embedding(
        state["patch_embed.proj.weight"], backbone.patch_embed.proj.in_channels
    )
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
