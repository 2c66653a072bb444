"""Pretraining checkpoints: one manager for saving, resuming, numbering, RNG states and pre-emption.

A checkpoint (RunLayout.latest_checkpoint, RunLayout.epoch_checkpoint(e)) is a `torch.save` dict with
"student" and "teacher" (MultiCropWrapper state dicts: "backbone.<ViT keys>", "head.<...>"),
"optimizer", "epoch" (completed epochs), "step_in_epoch" (steps done in the next epoch, non-zero only
after a pre-emption), "global_step", "config", "dino_loss" (the centre), "scaler", "rng" and
"epoch_rng" (every rank's RNG states now and at the start of the interrupted epoch), "world_size",
and "model_card" (training/models/card.py: the channels, statistics, crop and scaling the weights
expect and the screen they learnt from, as a dict). A checkpoint saved before cards has none: it
resumes as before (the next save adds one), and readers rebuild its card from its config, with a note.

Rank 0 writes it atomically (training/writes/atomic.py), keeping the checkpoint it replaces as
RunLayout.previous_checkpoint (a hard link: nothing is written twice); at the epochs
`train.saveckp_rule` picks (every `train.saveckp_freq` completed epochs, or scDINO's) a numbered
copy is linked beside it and, when `train.keep_last` > 0, all but the last that many numbered
copies are pruned (0, the default, keeps every one: `features` evaluates them all). Every
`train.checkpoint_every_minutes` the loop also saves mid-epoch: that replaces only the latest
checkpoint (it is never numbered, so never pruned and never taken for an evaluated epoch).
A pre-empted run also leaves the marker RunLayout.preempted_marker for the batch script, and the
resumed run removes it. Weights from elsewhere (DINO, scDINO, ImageNet) load through
training/models/pretrained.py instead.

Damage: torch.save writes a zip archive whose records each carry a CRC-32 that torch computes as it
writes. Before resuming, rank 0 checks the latest checkpoint (training/rundir/integrity.py: every
record inside the file, every CRC-32 recomputed) and, if it is missing or damaged, the others
newest first: the save before it, the numbered ones (a file that is a hard link of a damaged one
is damaged too). It resumes from the first intact one and tells the other ranks which, so every
rank loads the same file. Damaged files newer than it are moved aside (layout.set_aside_path:
renamed to <name>.damaged, never deleted) and a resume point other than checkpoint.pth is linked
as checkpoint.pth, with one warning: only the training since that save is done again (one save
interval, unless the save before the latest is damaged too). With no intact checkpoint at all
nothing is moved and the run stops with one line saying so. Checking costs one read of the file
and a CRC-32; saving costs nothing extra (docs/training.md, "Damaged run files", has figures).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch
import torch.distributed as dist

from training.config import TrainConfig, flatten_dotted
from training.distributed.groups import DistContext, all_gather_object, broadcast_object
from training.distributed.parallel import load_model_state, load_optimizer_state, model_state, optimizer_state
from training.errors import UserError
from training.models.card import ModelCard, build_card
from training.rundir import RunLayout
from training.rundir.artifacts import read_checkpoint
from training.rundir.integrity import is_zip, zip_problem
from training.rundir.layout import set_aside_path
from training.writes.atomic import link_atomic, save_torch_atomic, write_json_atomic
from training.writes.diskspace import DiskFullError, no_space_error, room_problem

if TYPE_CHECKING:
    from training.dino.step import TrainState

log = logging.getLogger(__name__)

clock = time.monotonic
"""The clock of time-based checkpoints (tests replace it to pass minutes in microseconds)."""

MUST_MATCH_ON_RESUME = ("model.arch", "model.patch_size", "model.out_dim", "model.use_bn_in_head",
                        "model.norm_last_layer", "data.channels", "train.parallel")
"""Settings a run cannot change when it resumes: the saved weights or optimizer state would not load."""
FOLLOWED_ON_RESUME = ("run.seed", "data.holdout_fraction", "data.normalization", "model.drop_path_rate", "dino",
                      "optim")
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


@dataclass
class ResumePoint:
    """Which checkpoint a run resumes from (None: the start) and the damaged ones found before it,
    as (path, what is wrong)."""

    path: Path | None = None
    damaged: list[tuple[Path, str]] = field(default_factory=list)


def checkpoint_problem(path: Path) -> str | None:
    """What is wrong with a checkpoint file (integrity.zip_problem, every CRC-32), None when intact.
    A pre-zip file is not checked here: torch.load will say."""
    if path.stat().st_size and not is_zip(path):
        return None
    return zip_problem(path)


def resume_candidates(layout: RunLayout) -> Iterator[Path]:
    """Every checkpoint, newest first: the latest, then (looked at only if asked for) the previous
    save and the numbered ones by how far each got. A numbered one's epoch is in its name; the
    previous one's position is read from it, its weights left unread; if it cannot be read it comes
    first, to be found damaged."""
    if layout.latest_checkpoint.is_file():
        yield layout.latest_checkpoint
    found = [(epoch, 0, 1, path) for epoch, path in layout.numbered_checkpoints()]
    if layout.previous_checkpoint.is_file():
        try:
            saved = read_checkpoint(layout.previous_checkpoint, mmap_weights=True)
            position = (int(saved["epoch"]), int(saved.get("step_in_epoch", 0)))
        except (UserError, KeyError, TypeError, ValueError):
            position = (math.inf, math.inf)
        found.append((*position, 0, layout.previous_checkpoint))  # a tie goes to the numbered name
    yield from (path for *_, path in sorted(found, key=lambda item: item[:3], reverse=True))


def find_resume_point(layout: RunLayout) -> ResumePoint:
    """The newest intact checkpoint (resume_candidates, checked in that order)."""
    point = ResumePoint()
    for path in resume_candidates(layout):
        twin = next((bad for bad, _ in point.damaged if path.samefile(bad)), None)
        problem = f"is a hard link to {twin.name}" if twin else checkpoint_problem(path)
        if problem is None:
            point.path = path
            return point
        point.damaged.append((path, problem))
    return point


def settle_resume_point(layout: RunLayout) -> ResumePoint:
    """Rank 0: find the resume point; move the damaged checkpoints newer than it aside, with one
    warning; link a numbered resume point as the latest checkpoint (what `features` evaluates as
    final until the next save replaces it). UserError when checkpoints exist but none is intact
    (then nothing is moved)."""
    point = find_resume_point(layout)
    if point.damaged and point.path is None:
        found = "; ".join(f"{path.name} {problem}" for path, problem in point.damaged)
        raise UserError(f"no intact checkpoint to resume from in {layout.checkpoints} ({found}): restore one "
                        "from a copy, or move the folder away to start again from the first epoch")
    moved = []
    for path, problem in point.damaged:
        aside = set_aside_path(path)
        path.rename(aside)
        moved.append(f"{path.name} {problem} (moved aside to {aside.name})")
    if point.path is not None and point.path != layout.latest_checkpoint:
        link_atomic(point.path, layout.latest_checkpoint)
        why = (f"damaged checkpoint in {layout.checkpoints}: {'; '.join(moved)}" if moved
               else f"{layout.latest_checkpoint} is missing")
        log.warning("%s; resuming from %s, the newest intact checkpoint (linked as %s)", why, point.path.name,
                    layout.latest_checkpoint.name)
    return point


def agreed_resume_point(layout: RunLayout, ctx: DistContext) -> Path | None:
    """The checkpoint every rank resumes from: rank 0 decides (and moves damaged files aside) and
    tells the others, so that no rank picks another file or reads one while it is renamed. A
    UserError on rank 0 stops every rank with the same message."""
    decided: tuple[Path | None, str | None] = (None, None)
    if ctx.is_main:
        try:
            decided = (settle_resume_point(layout).path, None)
        except UserError as exc:
            decided = (None, str(exc))
    path, error = broadcast_object(ctx, decided)
    if error is not None:
        raise UserError(error)
    return path


class CheckpointManager:
    """The checkpoints of one run directory."""

    def __init__(self, layout: RunLayout, settings: TrainConfig) -> None:
        self.layout = layout
        self.save_every, self.keep_last = settings.saveckp_freq, settings.keep_last
        self.rule = settings.saveckp_rule
        self.save_every_s = settings.checkpoint_every_minutes * 60
        self.last_save = clock()
        self.resumed_from: Path | None = None
        """The checkpoint `resume` loaded (None: the run started afresh)."""
        self._card: ModelCard | None = None

    def time_to_save(self) -> bool:
        """Whether `train.checkpoint_every_minutes` have passed since the last save. Only rank 0's
        answer counts (the loop sums it into the per-step all_reduce), so every rank saves at the
        same step even when their clocks or start times differ."""
        return self.save_every_s > 0 and clock() - self.last_save >= self.save_every_s

    @property
    def latest(self):
        return self.layout.latest_checkpoint

    def write(self, state: dict[str, Any]) -> None:
        """Write the latest checkpoint, keeping the one it replaces as the previous (a hard link, no
        copy: a damaged latest then costs one save interval), and at the epochs `is_numbered_epoch`
        picks a numbered one."""
        needed = self.latest.stat().st_size if self.latest.exists() else tensor_bytes(state)
        if self.latest.exists():
            link_atomic(self.latest, self.layout.previous_checkpoint)
        try:
            save_torch_atomic(state, self.latest)
        except (OSError, RuntimeError) as exc:
            error = no_space_error(self.latest, needed, exc, "the checkpoint")
            if error is None:
                raise
            kept = self.layout.previous_checkpoint
            raise DiskFullError(f"{error}; nothing is lost: {kept if kept.exists() else 'no earlier checkpoint'} "
                                "is the last one saved, and a new attempt resumes from it") from None
        epoch = int(state["epoch"])
        total = (state.get("config") or {}).get("optim", {}).get("epochs")
        if is_numbered_epoch(epoch, total, self.save_every, self.rule) and not state.get("step_in_epoch"):
            link_atomic(self.latest, self.layout.epoch_checkpoint(epoch))  # same bytes, no second write
            self.prune()

    def check_room(self, state: TrainState, ctx: DistContext) -> None:
        """Before the first step: room for the next save beside the last one; a DiskFullError on
        every rank (rank 0 looks, the others hear its answer) rather than a save that fails later."""
        problem = None
        if ctx.is_main:
            needed = self.latest.stat().st_size if self.latest.exists() else estimated_checkpoint_bytes(state)
            problem = room_problem(self.layout.checkpoints, needed, "the checkpoints")
        problem = broadcast_object(ctx, problem)
        if problem:
            raise DiskFullError(problem)

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
            payload["model_card"] = self.card(state).to_dict()
            self.write(payload)
            if preempted_by:
                self.mark_preempted(preempted_by, state.epoch, state.global_step)
                log.warning("pre-empted: saved %s at epoch %d step %d; exiting 0 for a requeue",
                            self.latest, state.epoch, state.global_step)
        if ctx.distributed:
            dist.barrier()
        self.last_save = clock()

    def card(self, state: TrainState) -> ModelCard:
        """The run's model card at the state's epoch and step (rank 0; built once, at the first save:
        the data files it describes do not change while the run trains)."""
        if self._card is None:
            self._card = build_card(state.config)
        return self._card.at(state.epoch, state.global_step)

    def resume(self, state: TrainState, ctx: DistContext) -> None:
        """Continue from the newest intact checkpoint if the run has one (`agreed_resume_point`);
        remove a pre-emption marker."""
        if ctx.is_main:
            self.clear_preempted()
        path = self.resumed_from = agreed_resume_point(self.layout, ctx)
        if path is None:
            torch.manual_seed(state.config.run.seed + ctx.rank)
            return
        saved = read_checkpoint(path, verify=False)  # rank 0 has just checked it
        changed = check_resumable(saved.get("config"), state.config.to_dict(), path)
        if changed:
            log.warning("resuming %s with settings changed since it was saved (the run follows the new ones "
                        "from here; a new run.output_dir starts afresh): %s", path, "; ".join(changed))
        restore(state, saved, ctx)
        log.info("resumed from %s: epoch %d, step %d", path, state.epoch, state.global_step)
        if state.epoch >= state.config.optim.epochs:
            log.info("the checkpoint already completed optim.epochs=%d; nothing to train",
                     state.config.optim.epochs)
        if not math.isfinite(float(state.loss_fn.center.abs().sum())):
            raise UserError(f"{path} holds a non-finite loss centre; delete it to restart")


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a nested checkpoint payload (what torch.save writes, near enough)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def estimated_checkpoint_bytes(state: TrainState) -> int:
    """A checkpoint's size before the first one is written: student and teacher weights, and AdamW's
    two moments per trainable student weight, at their stored widths."""
    student = state.models.student.parameters()
    teacher = state.models.teacher.parameters()
    weights = sum(p.numel() * p.element_size() for p in [*student, *teacher])
    moments = sum(2 * p.numel() * 4 for p in state.models.student.parameters() if p.requires_grad)
    return weights + moments


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
