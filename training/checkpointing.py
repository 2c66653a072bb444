"""Pretraining checkpoints: one manager for saving, resuming, numbering, RNG states and pre-emption.

A checkpoint (RunLayout.latest_checkpoint, RunLayout.epoch_checkpoint(e)) is a `torch.save` dict with
"student" and "teacher" (MultiCropWrapper state dicts: "backbone.<ViT keys>", "head.<...>"),
"optimizer", "epoch" (completed epochs), "step_in_epoch" (steps done in the next epoch, non-zero only
after a pre-emption), "global_step", "config", "dino_loss" (the centre), "scaler", "rng" and
"epoch_rng" (every rank's RNG states now and at the start of the interrupted epoch), "world_size".

Rank 0 writes it atomically (training/atomic.py); at the epochs `train.saveckp_rule` picks (every
`train.saveckp_freq` completed epochs, or scDINO's) a numbered copy is linked beside it and, when
`train.keep_last` > 0, all but the last that many numbered copies are pruned (0, the default, keeps
every one: `features` evaluates them all). Every `train.checkpoint_every_minutes` the loop also
saves mid-epoch: that replaces only the latest checkpoint (it is never numbered, so never pruned
and never taken for an evaluated epoch).
A pre-empted run also leaves the marker RunLayout.preempted_marker for the batch script, and the
resumed run removes it. Weights from elsewhere (DINO, scDINO, ImageNet) load through
training/models/pretrained.py instead.
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from training.atomic import link_atomic, save_torch_atomic, write_json_atomic
from training.config import TrainConfig, flatten_dotted
from training.distributed import DistContext, all_gather_object
from training.errors import UserError
from training.models.pretrained import load_checkpoint
from training.parallel import load_model_state, load_optimizer_state, model_state, optimizer_state
from training.rundir import RunLayout

if TYPE_CHECKING:
    from training.dino.step import TrainState

log = logging.getLogger(__name__)

clock = time.monotonic
"""The clock of time-based checkpoints (tests replace it to pass minutes in microseconds)."""

MUST_MATCH_ON_RESUME = ("model.arch", "model.patch_size", "model.out_dim", "model.use_bn_in_head",
                        "model.norm_last_layer", "data.channels", "train.parallel")
"""Settings a run cannot change when it resumes: the saved weights or optimizer state would not load."""
FOLLOWED_ON_RESUME = ("run.seed", "data.holdout_fraction", "model.drop_path_rate", "dino", "optim")
"""Settings (keys or whole sections) a resumed run takes from the new config, with a warning: the
run goes on, but it is no longer the run an uninterrupted job with either config would have made."""


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


def check_resumable(saved_config: dict[str, Any] | None, config_now: dict[str, Any], path: Any) -> list[str]:
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


def is_numbered_epoch(completed: int, total: int | None, every: int, rule: str) -> bool:
    """Whether the checkpoint after `completed` of `total` epochs gets a numbered copy (train.saveckp_rule).

    "every_n": N, 2N, ... completed epochs. "scdino": 0-based epoch e with e % N == 0 (DINO's and
    scDINO's main_dino), plus the last epoch, which scDINO's Snakefile analyses as well.
    """
    if every <= 0 or completed <= 0:
        return False
    if rule == "scdino":
        return (completed - 1) % every == 0 or completed == total
    return completed % every == 0


class CheckpointManager:
    """The checkpoints of one run directory."""

    def __init__(self, layout: RunLayout, settings: TrainConfig) -> None:
        self.layout = layout
        self.save_every, self.keep_last = settings.saveckp_freq, settings.keep_last
        self.rule = settings.saveckp_rule
        self.save_every_s = settings.checkpoint_every_minutes * 60
        self.last_save = clock()

    def time_to_save(self) -> bool:
        """Whether `train.checkpoint_every_minutes` have passed since the last save. Only rank 0's
        answer counts (the loop sums it into the per-step all_reduce), so every rank saves at the
        same step even when their clocks or start times differ."""
        return self.save_every_s > 0 and clock() - self.last_save >= self.save_every_s

    @property
    def latest(self):
        return self.layout.latest_checkpoint

    def write(self, state: dict[str, Any]) -> None:
        """Write the latest checkpoint and, at the epochs `is_numbered_epoch` picks, a numbered one."""
        save_torch_atomic(state, self.latest)
        epoch = int(state["epoch"])
        total = (state.get("config") or {}).get("optim", {}).get("epochs")
        if is_numbered_epoch(epoch, total, self.save_every, self.rule) and not state.get("step_in_epoch"):
            link_atomic(self.latest, self.layout.epoch_checkpoint(epoch))  # same bytes, no second write
            self.prune()

    def prune(self) -> None:
        if self.keep_last <= 0:
            return
        for _, path in self.layout.numbered_checkpoints()[:-self.keep_last]:
            path.unlink(missing_ok=True)
            log.info("removed old checkpoint %s (train.keep_last=%d)", path, self.keep_last)

    def mark_preempted(self, signal_name: str, epoch: int, step: int) -> None:
        """The marker the batch script looks for before requeueing the job."""
        marker = {"signal": signal_name, "epoch": epoch, "step": step, "time": time.time()}
        write_json_atomic(self.layout.preempted_marker, marker, indent=None)

    def clear_preempted(self) -> None:
        self.layout.preempted_marker.unlink(missing_ok=True)

    def save(self, state: TrainState, ctx: DistContext, *, preempted_by: str | None = None) -> None:
        """Gather the full training state (a collective under FSDP) and write it from rank 0."""
        payload = snapshot(state, ctx)
        if ctx.is_main:
            self.write(payload)
            if preempted_by:
                self.mark_preempted(preempted_by, state.epoch, state.global_step)
                log.warning("pre-empted: saved %s at epoch %d step %d; exiting 0 for a requeue",
                            self.latest, state.epoch, state.global_step)
        if ctx.distributed:
            dist.barrier()
        self.last_save = clock()

    def resume(self, state: TrainState, ctx: DistContext) -> None:
        """Continue from the latest checkpoint if the run has one; remove a pre-emption marker."""
        if ctx.is_main:
            self.clear_preempted()
        if not self.latest.exists():
            torch.manual_seed(state.config.run.seed + ctx.rank)
            return
        saved = load_checkpoint(self.latest)
        changed = check_resumable(saved.get("config"), state.config.to_dict(), self.latest)
        if changed:
            log.warning("resuming %s with settings changed since it was saved (the run follows the new ones "
                        "from here; a new run.output_dir starts afresh): %s", self.latest, "; ".join(changed))
        restore(state, saved, ctx)
        log.info("resumed from %s: epoch %d, step %d", self.latest, state.epoch, state.global_step)
        if state.epoch >= state.config.optim.epochs:
            log.info("the checkpoint already completed optim.epochs=%d; nothing to train",
                     state.config.optim.epochs)
        if not math.isfinite(float(state.loss_fn.center.abs().sum())):
            raise UserError(f"{self.latest} holds a non-finite loss centre; delete it to restart")


def snapshot(state: TrainState, ctx: DistContext) -> dict[str, Any]:
    """The checkpoint payload; every rank takes part (FSDP gathers; RNG states differ between ranks,
    so each rank's is all-gathered)."""
    return {
        "student": model_state(state.models, "student"),
        "teacher": model_state(state.models, "teacher"),
        "optimizer": optimizer_state(state.models, state.optimizer),
        "epoch": state.epoch, "step_in_epoch": state.step_in_epoch, "global_step": state.global_step,
        "config": state.config.to_dict(), "dino_loss": state.loss_fn.state_dict(),
        "scaler": state.scaler.state_dict(), "world_size": ctx.world_size,
        "rng": all_gather_object(ctx, capture_rng()), "epoch_rng": all_gather_object(ctx, state.epoch_rng),
    }


def restore(state: TrainState, saved: dict[str, Any], ctx: DistContext) -> None:
    """Load a payload of `snapshot` into the live state; RNG streams continue where the same
    world size left them, else restart from the seed and the step."""
    load_model_state(state.models, "student", saved["student"])
    load_model_state(state.models, "teacher", saved["teacher"])
    load_optimizer_state(state.models, state.optimizer, saved["optimizer"])
    state.scaler.load_state_dict(saved["scaler"])
    state.loss_fn.load_state_dict(saved["dino_loss"])
    state.epoch, state.step_in_epoch = saved["epoch"], saved.get("step_in_epoch", 0)
    state.global_step = saved["global_step"]
    if saved.get("world_size") == ctx.world_size:
        state.rng_on_resume = saved["rng"][ctx.rank]
        state.epoch_rng = saved["epoch_rng"][ctx.rank]
    else:
        log.warning("resuming with %d ranks instead of %s: random streams restart", ctx.world_size,
                    saved.get("world_size"))
        torch.manual_seed(state.config.run.seed + ctx.rank + state.global_step)
