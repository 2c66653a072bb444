"""DINO pretraining loop: `python -m training pretrain --config run.yaml` (also under torchrun/srun).

Built from builders (`build_model`, `build_optimizer`, `build_schedules`, the loader from
`training.data`); the loop itself is `train` -> `run_epoch` -> `training.dino.step`.

Resume: if <run>/checkpoints/checkpoint.pth exists, training continues from it, to the same losses
as an uninterrupted run (model, teacher, optimizer, scaler, loss centre, schedules position and RNG
states are restored; an epoch interrupted part-way skips the batches it had already done).

Pre-emption protocol (slurm/pretrain.slurm relies on it):
  1. SIGUSR1 or SIGTERM on any rank sets a flag (an EC2 Spot interruption notice sends SIGUSR1 too:
     train.spot_watch, training/recovery/spot.py). At the end of the current step all ranks agree
     (the flag is summed in the per-step all_reduce), so every rank stops after the same step.
  2. Rank 0 writes checkpoint.pth (including the position inside the epoch), then the marker file
     <run>/checkpoints/PREEMPTED (JSON: signal, epoch, step, time), and logs "pre-empted: ...".
  3. Every rank returns normally: the process exits with status 0.
  4. The batch script sees the marker after `srun` returns and runs `scontrol requeue $SLURM_JOB_ID`.
     The requeued job resumes from checkpoint.pth and deletes the marker when training starts.
  A run that finishes leaves no marker, so the script does not requeue it.

Checkpoints by time: every `train.checkpoint_every_minutes` (rank 0's clock, summed into the same
per-step all_reduce, so all ranks save after the same step) checkpoint.pth is also saved mid-epoch;
a crash then loses at most that much training, and the resume continues at the exact step.

One step late: a step's loss and flags (non-finite loss, stop signal, time to save, teacher
statistics) are summed over ranks and copied to the host without waiting, and read at the start of
the next step, before its batch is fetched (`run_epoch`). Reading them right after the forward, as
this loop once did, made the host wait for the GPU before it could queue the backward, so the GPU
idled while the host launched it. Read at the next step's start, they wait only for the previous
forward pass, while that step's backward and optimizer step are still queued on the GPU. Every
decision is the one an immediate read gives: the run stops, saves or halts after the same step,
with the same state, because nothing changes the state between the step and its read. (The read
also guarantees that the step's batch has been copied to the device before the loader may reuse
its pinned buffer.)

Non-finite loss: every rank stops with TrainingDivergedError (a UserError: the CLI prints one line
naming the epoch and step where the loss first became non-finite, and exits 2). That step's update
has been applied in memory by then (it was queued before its loss was read), but never saved: every
save follows the read of the last step's flags, and the error ends the run before any save, so
checkpoint.pth remains the last good checkpoint.

Collapse: every step's teacher statistics (training/dino/loss.py, summed over ranks in the same
all_reduce) go to the collapse detector (training/dino/collapse.py); the first step at which the
mean of the last train.collapse_patience_steps steps looks collapsed logs one WARNING on rank 0, and
the step lines of metrics.jsonl carry "collapse". Under train.stop_on_collapse every rank stops after that step,
checkpoint.pth is saved, and TrainingCollapsedError (a UserError: a deterministic failure, not
retried) ends the run.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from training.checkpointing import CheckpointManager, capture_rng, restore_rng
from training.config import Config
from training.data.loading.loaders import crops_on_device
from training.dino import DINOLoss, build_optimizer, build_schedules, teacher_temperature_schedule
from training.dino.collapse import Collapse, CollapseDetector, CollapseRule
from training.dino.loss import TEACHER_STATISTICS
from training.dino.step import TrainState, forward_loss, update
from training.distributed.groups import DistContext, HostValues, all_reduce_sum_later
from training.distributed.parallel import parallelize
from training.errors import UserError
from training.metrics import MetricsLogger, gpu_memory_gb, progress
from training.models import build_model, count_parameters
from training.models.pretrained import load_pretrained_into
from training.precision import resolve_precision
from training.recovery.failures import failure_guard, record_failure, record_resume, refuse_if_failed
from training.recovery.spot import SpotWatcher
from training.recovery.watchdog import ProgressWatchdog
from training.rundir import RunLayout
from training.rundir.artifacts import read_metrics
from training.writes.atomic import write_text_atomic

log = logging.getLogger(__name__)

LoaderFactory = Callable[[Config, DistContext], tuple[Any, Any]]


class TrainingDivergedError(UserError):
    """The loss became NaN or infinite; the message names where and what to try."""


class TrainingCollapsedError(UserError):
    """The teacher output collapsed and train.stop_on_collapse stopped the run (after a save)."""


@dataclass(frozen=True)
class TrainResult:
    epochs_completed: int
    global_step: int
    preempted: bool
    last_loss: float | None
    state: TrainState | None = field(default=None, repr=False, compare=False)
    """The live training state (models, optimizer), for callers that inspect it."""


@dataclass
class LoopHooks:
    """What the loop consults or tells besides the model: stop signals, metrics, checkpoints, and
    whoever wants to know that a step (or a save) completed, with the global step."""

    signals: StopSignals
    metrics: MetricsLogger
    checkpoints: CheckpointManager
    on_progress: Callable[[int], None] = lambda step: None
    """Told after every step and every save (the progress watchdog)."""
    on_step: Callable[[int], None] = lambda step: None
    """Told once per step, when its figures have been read (`train(on_step=...)`)."""
    collapse: CollapseDetector | None = None
    halted: Collapse | None = None
    """The collapse that stopped the run under train.stop_on_collapse (set by run_epoch)."""


class StopSignals:
    """Records SIGUSR1/SIGTERM instead of dying, so the loop can save first (main thread only)."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        self.received = signal.Signals(signum).name
        log.warning("received %s: will save a checkpoint and stop after this step", self.received)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def default_loader_factory(config: Config, ctx: DistContext) -> tuple[Any, Any]:
    from training.data.loading.loaders import build_pretrain_loader
    from training.data.stats import load_mean_std

    mean, std = load_mean_std(config)
    return build_pretrain_loader(config, rank=ctx.rank, world_size=ctx.world_size, mean=mean, std=std)


def build_state(config: Config, ctx: DistContext, steps_per_epoch: int) -> TrainState:
    """Models, optimizer, scaler, loss and schedules for this run, before any resume."""
    torch.manual_seed(config.run.seed)  # same initial weights on every rank
    student, teacher = build_model(config, config.data.in_chans)
    if config.model.pretrained:
        load_pretrained_into(student.backbone, Path(config.model.pretrained), config.model)
        teacher.load_state_dict(student.state_dict())
    log.info("student: %s/%d, %.1fM parameters", config.model.arch, config.model.patch_size,
             count_parameters(student) / 1e6)
    precision = resolve_precision(config.train.precision, ctx.device)
    models = parallelize(student, teacher, config, ctx)
    dino = config.dino
    loss_fn = DINOLoss(
        config.model.out_dim, 2 + dino.local_crops_number,
        teacher_temps=teacher_temperature_schedule(
            dino.warmup_teacher_temp, dino.teacher_temp, dino.warmup_teacher_temp_epochs, config.optim.epochs
        ),
        student_temp=dino.student_temp, center_momentum=dino.center_momentum,
    ).to(ctx.device)
    return TrainState(
        config=config, models=models, optimizer=build_optimizer(models.student),
        scaler=torch.amp.GradScaler(ctx.device.type, enabled=precision.name == "fp16"),
        loss_fn=loss_fn, schedules=build_schedules(config, steps_per_epoch, ctx.world_size),
        precision=precision,
    )


def steps_in_epoch(config: Config, loader: Any) -> int:
    cap = config.train.max_steps_per_epoch
    steps = min(len(loader), cap) if cap > 0 else len(loader)
    if steps < 1:
        raise UserError(
            f"the training split gives no full batch of optim.batch_size_per_gpu="
            f"{config.optim.batch_size_per_gpu} per rank; lower the batch size or add images"
        )
    return steps


def train(config: Config, ctx: DistContext, *, loader_factory: LoaderFactory | None = None,
          on_step: Callable[[int], None] | None = None) -> TrainResult:
    """Pretrain (or resume) the run in config.run.output_dir; returns how far it got.

    `on_step` is told the global step once each step's figures have been read (benchmarks time the
    loop with it).

    A progress watchdog covers all of it, set-up included: a rank that completes no step for
    train.hang_timeout_minutes ends its process with exit_codes.HANG (training/recovery/watchdog.py).
    A failure is recorded as deterministic (not retried) or transient (training/recovery/failures.py).
    """
    layout = RunLayout.from_config(config)

    def hang(message: str, last_step: int | None) -> None:
        record_failure(layout, ctx.rank, "hang", message, last_step)

    watchdog = ProgressWatchdog(config.train.hang_timeout_minutes * 60, rank=ctx.rank, on_fire=hang)
    with watchdog, failure_guard(layout, ctx.rank, lambda: watchdog.last_step):
        refuse_if_failed(layout, is_main=ctx.is_main)
        return _train(config, ctx, layout, loader_factory or default_loader_factory, watchdog, on_step)


def _train(config: Config, ctx: DistContext, layout: RunLayout, loader_factory: LoaderFactory,
           watchdog: ProgressWatchdog, on_step: Callable[[int], None] | None) -> TrainResult:
    checkpoints = CheckpointManager(layout, config.train)
    loader, sampler = loader_factory(config, ctx)
    steps = steps_in_epoch(config, loader)
    state = build_state(config, ctx, steps)
    preempted = layout.preempted_marker.exists()  # resume removes it
    checkpoints.resume(state, ctx)
    checkpoints.check_room(state, ctx)
    if ctx.is_main:
        resumed_from = str(checkpoints.resumed_from) if checkpoints.resumed_from else None
        record_resume(layout, resumed_from, state.epoch, state.step_in_epoch, state.global_step,
                      preempted=preempted)
        forget_metrics_after(layout, state.global_step)
    metrics = MetricsLogger(layout, config, enabled=ctx.is_main)
    last_loss = None
    try:
        spot = SpotWatcher(config.train.spot_watch, enabled=ctx.env.local_rank == 0)
        with StopSignals() as signals, spot:  # the watcher's SIGUSR1 needs StopSignals' handler
            hooks = LoopHooks(signals, metrics, checkpoints, on_progress=watchdog.beat,
                              on_step=on_step or (lambda step: None), collapse=collapse_detector(state, steps))
            while state.epoch < config.optim.epochs:
                last_loss, stopped_by = run_epoch(state, ctx, loader, sampler, steps, hooks)
                if hooks.halted:
                    checkpoints.save(state, ctx)
                    raise collapsed(hooks.halted, checkpoints.latest)
                if stopped_by:
                    checkpoints.save(state, ctx, preempted_by=stopped_by)
                    return TrainResult(state.epoch, state.global_step, True, last_loss, state)
                checkpoints.save(state, ctx)
                watchdog.beat(state.global_step)
    finally:
        metrics.close()
    log.info("pretraining finished: %d epochs, %d steps, last loss %s", state.epoch, state.global_step,
             last_loss)
    return TrainResult(state.epoch, state.global_step, False, last_loss, state)


def forget_metrics_after(layout: RunLayout, global_step: int) -> None:
    """Drop metric lines of steps after the checkpoint being resumed: a crash (unlike a pre-emption,
    which saves where it stops) leaves lines for steps that will be trained again, and the curves
    and the per-epoch records must show each step and epoch once."""
    if not layout.metrics.exists():
        return
    records = read_metrics(layout)
    kept = [r for r in records if r.get("step", 0) <= global_step]
    if len(kept) < len(records):
        write_text_atomic(layout.metrics, "".join(json.dumps(r) + "\n" for r in kept))
        log.info("dropped %d metric line(s) after global step %d: those steps are trained again",
                 len(records) - len(kept), global_step)


def epoch_batches(state: TrainState, loader: Any, sampler: Any) -> Iterator[Any]:
    """The current epoch's batches, skipping those an interrupted run already trained on.

    The RNG is set to its value at the start of the epoch before the iterator (and its worker seeds)
    is created, and to its value at the interruption after the skipped batches: both match the
    uninterrupted run.
    """
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(state.epoch)
    if state.rng_on_resume is not None and not state.step_in_epoch:
        restore_rng(state.rng_on_resume)  # saved at the end of the previous epoch
        state.rng_on_resume = None
    elif state.step_in_epoch and state.epoch_rng is not None:
        restore_rng(state.epoch_rng)
    state.epoch_rng = capture_rng()
    batches = iter(loader)
    for _ in range(state.step_in_epoch):
        next(batches)
    if state.rng_on_resume is not None:
        restore_rng(state.rng_on_resume)
        state.rng_on_resume = None
    return batches


def run_epoch(
    state: TrainState, ctx: DistContext, loader: Any, sampler: Any, steps: int, hooks: LoopHooks,
) -> tuple[float | None, str | None]:
    """Train until the epoch ends or a stop signal; returns (mean loss of the epoch, signal name).

    Each step's figures are read at the start of the next step (or, after the last, before the
    loop ends), never right after its forward: see "One step late" in the module docstring.
    """
    epoch, config = state.epoch, state.config
    batches = epoch_batches(state, loader, sampler)
    figures = _EpochFigures(state, ctx, steps)
    sent: _Sent | None = None
    stop = 0.0
    tick, cpu_tick = time.perf_counter(), time.process_time()
    while True:
        if sent is not None:
            stop, save_now = figures.read(sent, state, ctx, hooks)
            sent = None
            if stop or hooks.halted:
                break
            if save_now and state.step_in_epoch < steps:  # at the epoch's end the epoch save follows
                save_mid_epoch(state, ctx, hooks)
                tick, cpu_tick = time.perf_counter(), time.process_time()  # the save is no step's time
        if state.step_in_epoch == steps:
            break
        fetched = time.perf_counter()
        crops, _labels = next(batches)
        crops = crops_on_device(crops, ctx.device)  # under data.gpu_augment, augments there
        data_wait = time.perf_counter() - fetched
        flags = train_step(state, ctx, crops, epoch, stop=hooks.signals.received is not None,
                           save_now=ctx.is_main and hooks.checkpoints.time_to_save())
        state.step_in_epoch += 1
        state.global_step += 1
        now, cpu_now = time.perf_counter(), time.process_time()
        sent = _Sent(flags, len(crops[0]) * ctx.world_size, data_wait, now - tick, cpu_now - cpu_tick)
        tick, cpu_tick = now, cpu_now
    figures.bar.close()
    if state.step_in_epoch == steps:
        state.epoch += 1
        state.step_in_epoch = 0
        hooks.metrics.log(record(state, ctx, "epoch", figures.epoch_window, epoch=epoch))
        log.info("epoch %d/%d: loss %.4f, %.1f images/s", epoch + 1, config.optim.epochs,
                 figures.epoch_window.mean_loss, figures.epoch_window.images_per_s)
    stopped_by = (hooks.signals.received or "a signal on another rank") if stop else None
    return figures.epoch_window.mean_loss, stopped_by


def train_step(state: TrainState, ctx: DistContext, crops: list[torch.Tensor], epoch: int, *,
               stop: bool, save_now: bool) -> HostValues:
    """One DINO step, queued without a host synchronisation: forward, this rank's flags (`stop`: a
    signal arrived; `save_now`: rank 0's clock says save) summed over ranks on their way to the
    host, backward, optimizer step and teacher update. Read the flags with `.values()` later."""
    loss = forward_loss(state, crops, epoch)
    flags = all_reduce_sum_later(ctx, _step_flags(loss, state.loss_fn.teacher_stats, stop, save_now))
    update(state, loss, epoch)
    return flags


@dataclass
class _Sent:
    """A trained step whose figures are still on their way to the host, and its host-side timings."""

    flags: HostValues
    images: int
    data_wait: float
    step_time: float
    cpu_time: float


class _EpochFigures:
    """The epoch's metric windows and progress bar, fed with each step's figures once they are read."""

    def __init__(self, state: TrainState, ctx: DistContext, steps: int) -> None:
        self.window = _Window()
        self.epoch_window = _Window()
        self.steps = steps
        self.bar = progress(steps, f"epoch {state.epoch + 1}/{state.config.optim.epochs}", enabled=ctx.is_main,
                            initial=state.step_in_epoch)

    def read(self, sent: _Sent, state: TrainState, ctx: DistContext, hooks: LoopHooks) -> tuple[float, float]:
        """Read the step just trained (the state's counters are still that step's); stop the run if
        its loss was not finite; log, judge collapse; return its summed (stop, save_now) flags."""
        loss_sum, nonfinite, stop, save_now, *teacher = sent.flags.values()
        if nonfinite:
            raise diverged(state, ctx, loss_sum, hooks.checkpoints.latest)
        teacher = [value / ctx.world_size for value in teacher]
        for w in (self.window, self.epoch_window):
            w.add(loss_sum / ctx.world_size, sent.images, sent.data_wait, sent.step_time, sent.cpu_time, teacher)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss_sum / ctx.world_size:.4f}")
        hooks.halted = judge_collapse(state, ctx, hooks, teacher, self.window)
        cadence = state.global_step % state.config.train.log_every == 0 or state.step_in_epoch == self.steps
        if cadence or hooks.halted:
            hooks.metrics.log(record(state, ctx, "step", self.window))
            self.window = _Window()
        hooks.on_progress(state.global_step)
        hooks.on_step(state.global_step)
        return stop, save_now


def collapse_detector(state: TrainState, steps_per_epoch: int) -> CollapseDetector | None:
    """The run's detector, keeping its window in the loss's `collapse_state` (checkpointed with the loss)."""
    if state.config.train.collapse_patience_steps == 0:
        return None
    return CollapseDetector(CollapseRule.from_config(state.config, steps_per_epoch), state.loss_fn.collapse_state)


def judge_collapse(state: TrainState, ctx: DistContext, hooks: LoopHooks, teacher: list[float],
                   window: _Window) -> Collapse | None:
    """Feed the step's teacher statistics (the same on every rank) to the detector; warn on rank 0
    when a collapse first holds; return it when train.stop_on_collapse says to stop."""
    if hooks.collapse is None:
        return None
    collapse = hooks.collapse.observe(state.global_step, teacher[0], teacher[1])
    if collapse is None:
        return None
    window.collapse = collapse.kind
    if collapse.new and ctx.is_main:
        log.warning("%s", collapse.describe())
    return collapse if state.config.train.stop_on_collapse else None


def collapsed(collapse: Collapse, latest: Path) -> TrainingCollapsedError:
    return TrainingCollapsedError(
        f"stopped by train.stop_on_collapse: {collapse.describe()}. Saved {latest}; change those settings "
        "and start a new run (another run.output_dir), or set train.stop_on_collapse=false to train on"
    )


def _step_flags(loss: torch.Tensor, teacher_stats: torch.Tensor, stop: bool, save_now: bool) -> torch.Tensor:
    """What all ranks sum after each step, in one all_reduce: the loss, whether it is non-finite,
    whether a stop signal arrived, whether rank 0's clock says it is time to save, and the teacher
    statistics (training.dino.loss.TEACHER_STATISTICS; their mean over ranks is what is logged and
    what the collapse detector judges, the same on every rank). The host's two flags enter as fills
    on the device: a tensor made from a Python list would be a copy from pageable memory, which
    waits for the GPU."""
    loss = loss.detach().float().reshape(1)
    return torch.cat([loss, (~torch.isfinite(loss)).float(), loss.new_full((1,), float(stop)),
                      loss.new_full((1,), float(save_now)), teacher_stats.float()])


def save_mid_epoch(state: TrainState, ctx: DistContext, hooks: LoopHooks) -> None:
    """The time-based checkpoint: every rank takes part (FSDP gathers), rank 0 writes it."""
    hooks.checkpoints.save(state, ctx)
    log.info("saved mid-epoch checkpoint at epoch %d, step %d of the epoch (train.checkpoint_every_minutes=%g)",
             state.epoch + 1, state.step_in_epoch, state.config.train.checkpoint_every_minutes)
    hooks.on_progress(state.global_step)


class _Window:
    """Running sums over the steps since the last metric line."""

    def __init__(self) -> None:
        self.steps = 0
        self.loss = self.images = self.data_wait = self.step_time = self.cpu_time = 0.0
        self.teacher = [0.0] * len(TEACHER_STATISTICS)
        self.collapse: str | None = None

    def add(self, loss: float, images: int, data_wait: float, step_time: float, cpu_time: float,
            teacher: list[float]) -> None:
        self.steps += 1
        self.loss += loss
        self.images += images
        self.data_wait += data_wait
        self.step_time += step_time
        self.cpu_time += cpu_time
        self.teacher = [total + value for total, value in zip(self.teacher, teacher)]

    def teacher_means(self) -> dict[str, float | None]:
        return {name: round(total / self.steps, 5) if self.steps else None
                for name, total in zip(TEACHER_STATISTICS, self.teacher)}

    @property
    def mean_loss(self) -> float | None:
        return self.loss / self.steps if self.steps else None

    @property
    def images_per_s(self) -> float:
        return self.images / self.step_time if self.step_time > 0 else 0.0


def record(state: TrainState, ctx: DistContext, kind: str, window: _Window, epoch: int | None = None) -> dict:
    """One metrics line. `cpu_core_s` and `gpu_s` are the training compute of the window's steps
    (all ranks; summing the "step" lines gives a run's total, resumed parts included, so runs of
    different models compare by cost): rank 0's process CPU time (every thread; data-loader
    workers not counted) times the world size, and on GPUs the steps' wall time times the world size.
    `teacher_entropy`, `teacher_batch_entropy` and `center_norm` are the window's means of the
    teacher statistics (training/dino/loss.py), beside `log_out_dim`, ln(model.out_dim): the
    entropy of a uniform output, the ceiling both entropies collapse towards; `collapse` (only when
    one holds) the kind the collapse detector found at a step of the window."""
    lr, wd, momentum = state.schedules.at(max(state.global_step - 1, 0))
    steps = max(window.steps, 1)
    return {
        "kind": kind, "epoch": state.epoch if epoch is None else epoch, "step": state.global_step,
        "loss": window.mean_loss, "lr": lr, "wd": wd, "momentum": momentum,
        **window.teacher_means(), "log_out_dim": round(math.log(state.config.model.out_dim), 5),
        **({"collapse": window.collapse} if window.collapse else {}),
        "images_per_s": round(window.images_per_s, 2), "data_wait_s": round(window.data_wait / steps, 5),
        "step_time_s": round(window.step_time / steps, 5), "gpu_mem_gb": gpu_memory_gb(ctx.device),
        "cpu_core_s": round(window.cpu_time * ctx.world_size, 4),
        "gpu_s": round(window.step_time * ctx.world_size, 4) if ctx.device.type == "cuda" else 0.0,
    }


def diverged(state: TrainState, ctx: DistContext, loss_sum: float, latest: Path) -> TrainingDivergedError:
    """The error for a non-finite loss at the step the state's counters have just counted."""
    last_good = latest if latest.exists() else "none yet"
    return TrainingDivergedError(
        f"non-finite loss ({loss_sum / ctx.world_size}) at epoch {state.epoch + 1}, step "
        f"{state.step_in_epoch} of the epoch (global step {state.global_step}); last good "
        f"checkpoint: {last_good}. Try a lower optim.lr, a smaller optim.clip_grad or train.precision=fp32"
    )
