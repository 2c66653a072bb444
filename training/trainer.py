"""DINO pretraining loop: `python -m training pretrain --config run.yaml` (also under torchrun/srun).

`train` builds the run (`build_model`, `build_optimizer`, `build_schedules`, the loader from
`training.data`), resumes it from <run>/checkpoints/checkpoint.pth when there is one, to the same
losses as an uninterrupted run, and trains its epochs. Each step of `run_epoch`: run it
(`run_step`), read back what it produced (`read_step` -> `StepResult`), `decide`, act on the
`Decision`.
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
    """The loss became NaN or infinite; the message names where, the last good checkpoint and what to
    try. A UserError: the CLI prints one line and exits 2, and the launcher does not retry it."""


class TrainingCollapsedError(UserError):
    """The teacher output collapsed (training/dino/collapse.py) and train.stop_on_collapse stopped the
    run, after a save. A UserError, not retried: the same run would collapse the same way."""


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


class StopSignals:
    """Records SIGUSR1/SIGTERM instead of dying, so the loop can save first (main thread only). An EC2
    Spot interruption notice sends SIGUSR1 too (train.spot_watch, training/recovery/spot.py)."""

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
    try:
        spot = SpotWatcher(config.train.spot_watch, enabled=ctx.env.local_rank == 0)
        with StopSignals() as signals, spot:  # the watcher's SIGUSR1 needs StopSignals' handler
            hooks = LoopHooks(signals, metrics, checkpoints, on_progress=watchdog.beat,
                              on_step=on_step or (lambda step: None), collapse=collapse_detector(state, steps))
            return train_epochs(state, ctx, loader, sampler, steps, hooks)
    finally:
        metrics.close()


def train_epochs(state: TrainState, ctx: DistContext, loader: Any, sampler: Any, steps: int,
                 hooks: LoopHooks) -> TrainResult:
    """Epochs until the run's last, a pre-emption or a collapse under train.stop_on_collapse; the
    decision that ends each epoch saves checkpoint.pth first."""
    last_loss = None
    while state.epoch < state.config.optim.epochs:
        end = run_epoch(state, ctx, loader, sampler, steps, hooks)
        last_loss = end.mean_loss
        if end.decision.preempt:
            # Pre-emption protocol (slurm/pretrain.slurm relies on it): every rank read the same summed
            # stop flag, so all stop after this step. Rank 0 writes checkpoint.pth (the position inside
            # the epoch included), then the marker <run>/checkpoints/PREEMPTED; every rank returns, so
            # the process exits 0, and the batch script, seeing the marker, runs `scontrol requeue`.
            # The requeued job resumes from checkpoint.pth and deletes the marker; a finished run leaves none.
            hooks.checkpoints.save(state, ctx, preempted_by=hooks.signals.received or "a signal on another rank")
            return TrainResult(state.epoch, state.global_step, True, last_loss, state)
        hooks.checkpoints.save(state, ctx)
        if end.decision.halt is TrainingCollapsedError:
            raise collapse_error(end.last_step.collapse, hooks.checkpoints.latest)
        hooks.on_progress(state.global_step)
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


@dataclass(frozen=True)
class StepResult:
    """What one step produced, read back on the host, and where it leaves the epoch: all that `decide`
    looks at. The figures are summed over ranks (`_step_flags`), so every rank decides the same."""

    loss: float
    """The step's loss, mean over ranks."""
    loss_finite: bool
    stop_requested: bool
    """A stop signal (SIGUSR1/SIGTERM, `StopSignals`) had reached some rank when the step was queued."""
    save_due: bool
    """train.checkpoint_every_minutes have passed since the last save, by rank 0's clock."""
    collapse: Collapse | None
    """The collapse the detector sees in the window ending at this step (None: none, or not judged)."""
    epoch: int
    """Completed epochs: the step belongs to the next one."""
    step_in_epoch: int
    """Steps done in the epoch, this one included."""
    steps: int
    """Steps in the epoch."""
    global_step: int
    """Steps done in the run, this one included."""
    teacher: tuple[float, ...] = ()
    """The teacher statistics (training.dino.loss.TEACHER_STATISTICS), mean over ranks."""


@dataclass(frozen=True)
class Decision:
    """What the loop does once it has read a step, in this order: save checkpoint.pth (`save`, with the
    PREEMPTED marker when `preempt`), leave the epoch (`leave_epoch`), then end the run: by returning
    when `preempt` (the process exits 0), by raising `halt` when it is set (a UserError: exit 2)."""

    save: bool = False
    leave_epoch: bool = False
    preempt: bool = False
    halt: type[UserError] | None = None


NEXT_STEP = Decision()
SAVE_MID_EPOCH = Decision(save=True)
EPOCH_END = Decision(save=True, leave_epoch=True)
PREEMPT = Decision(save=True, leave_epoch=True, preempt=True)
HALT_COLLAPSED = Decision(save=True, leave_epoch=True, halt=TrainingCollapsedError)
HALT_DIVERGED = Decision(leave_epoch=True, halt=TrainingDivergedError)


def decide(step: StepResult, *, stop_on_collapse: bool) -> Decision:
    """Stop, save or halt after `step`, from what it produced alone (train.stop_on_collapse aside)."""
    if not step.loss_finite:
        # Nothing is saved: this step's update is already applied in memory (it was queued before its
        # loss could be read), so checkpoint.pth stays the last good checkpoint.
        return HALT_DIVERGED
    if step.collapse is not None and stop_on_collapse:
        return HALT_COLLAPSED  # before a pre-emption: the requeued run would only collapse again
    if step.stop_requested:
        return PREEMPT
    if step.step_in_epoch == step.steps:
        return EPOCH_END  # its save is the time-based one too
    return SAVE_MID_EPOCH if step.save_due else NEXT_STEP


@dataclass(frozen=True)
class StepTiming:
    """A step's host-side figures for the metrics: images (all ranks) and seconds."""

    images: int
    data_wait: float
    step_time: float
    """Wall time since the previous step ended (its read-back included, a save left out)."""
    cpu_time: float
    """This process's CPU time over the same span (every thread; loader workers not counted)."""


class StepClock:
    """Host wall and CPU time between the ends of consecutive steps."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self, images: int, data_wait: float) -> StepTiming:
        wall, cpu = time.perf_counter(), time.process_time()
        timing = StepTiming(images, data_wait, wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return timing


@dataclass(frozen=True)
class EpochEnd:
    """How `run_epoch` ended: the decision that left the epoch, the last step read (None when the
    epoch had no step left), and the mean loss of the epoch's steps."""

    decision: Decision
    last_step: StepResult | None
    mean_loss: float | None


def run_epoch(
    state: TrainState, ctx: DistContext, loader: Any, sampler: Any, steps: int, hooks: LoopHooks,
) -> EpochEnd:
    """Train the epoch's remaining steps until a decision leaves it: run, read back, decide, act."""
    batches = epoch_batches(state, loader, sampler)
    metrics = EpochMetrics(state, ctx, steps)
    clock = StepClock()
    # A run resumed at the very end of an epoch (its step cap changed since) has no step left in it.
    decision, result = (EPOCH_END if state.step_in_epoch == steps else NEXT_STEP), None
    while not decision.leave_epoch:
        flags, timing = run_step(state, ctx, batches, hooks, clock)
        # One step late: the step's flags are read only now, its backward and optimizer step already
        # queued, as the next step begins and before its batch is fetched. Read right after the
        # forward, they made the host wait for the GPU before it could queue the backward, so the GPU
        # idled; here the read waits for the forward alone. The decision is the one an immediate read
        # gives, as nothing changes the state in between. (The batch's copy to the device is done by
        # then, so the loader may reuse its pinned buffer.)
        result = read_step(flags, state, ctx, steps, hooks.collapse)
        decision = decide(result, stop_on_collapse=state.config.train.stop_on_collapse)
        if decision.halt is TrainingDivergedError:
            raise divergence_error(result, hooks.checkpoints.latest)  # before its metrics: none are finite
        metrics.add(result, timing, hooks, flush=decision.halt is not None)
        if decision.save and not decision.leave_epoch:
            save_mid_epoch(state, ctx, hooks)
            clock.restart()  # the save is no step's time
    metrics.bar.close()
    if state.step_in_epoch == steps:
        finish_epoch(state, ctx, hooks, metrics.epoch_window)
    return EpochEnd(decision, result, metrics.epoch_window.mean_loss)


def run_step(state: TrainState, ctx: DistContext, batches: Iterator[Any], hooks: LoopHooks,
             clock: StepClock) -> tuple[HostValues, StepTiming]:
    """Fetch the next batch, queue one step on the device and count it; its flags are still on their way."""
    fetched = time.perf_counter()
    crops, _labels = next(batches)
    crops = crops_on_device(crops, ctx.device)  # under data.gpu_augment, augments there
    data_wait = time.perf_counter() - fetched
    # Both flags are summed over ranks with the loss, so every rank stops, or saves, after the same
    # step: a signal seen by any rank, and rank 0's clock alone for checkpoints by time.
    flags = train_step(state, ctx, crops, state.epoch, stop=hooks.signals.received is not None,
                       save_now=ctx.is_main and hooks.checkpoints.time_to_save())
    state.step_in_epoch += 1
    state.global_step += 1
    return flags, clock.lap(len(crops[0]) * ctx.world_size, data_wait)


def read_step(flags: HostValues, state: TrainState, ctx: DistContext, steps: int,
              detector: CollapseDetector | None) -> StepResult:
    """Read back the step just trained (the state's counters are still that step's) and judge
    collapse on its teacher statistics; a step whose loss is not finite is not judged."""
    loss_sum, nonfinite, stop, save_due, *teacher_sums = flags.values()
    teacher = tuple(value / ctx.world_size for value in teacher_sums)
    collapse = None
    if detector is not None and not nonfinite:
        collapse = detector.observe(state.global_step, teacher[0], teacher[1])
    return StepResult(
        loss=loss_sum / ctx.world_size, loss_finite=not nonfinite, stop_requested=bool(stop),
        save_due=bool(save_due), collapse=collapse, epoch=state.epoch, step_in_epoch=state.step_in_epoch,
        steps=steps, global_step=state.global_step, teacher=teacher,
    )


def finish_epoch(state: TrainState, ctx: DistContext, hooks: LoopHooks, window: _Window) -> None:
    """Count the epoch whose steps are all done, and write its metrics line."""
    epoch = state.epoch
    state.epoch += 1
    state.step_in_epoch = 0
    hooks.metrics.log(metrics_line(state, ctx, "epoch", window, epoch=epoch))
    log.info("epoch %d/%d: loss %.4f, %.1f images/s", epoch + 1, state.config.optim.epochs,
             window.mean_loss, window.images_per_s)


def train_step(state: TrainState, ctx: DistContext, crops: list[torch.Tensor], epoch: int, *,
               stop: bool, save_now: bool) -> HostValues:
    """One DINO step, queued without a host synchronisation: forward, this rank's flags (`stop`: a
    signal arrived; `save_now`: rank 0's clock says save) summed over ranks on their way to the
    host, backward, optimizer step and teacher update. Read the flags with `.values()` later."""
    loss = forward_loss(state, crops, epoch)
    flags = all_reduce_sum_later(ctx, _step_flags(loss, state.loss_fn.teacher_stats, stop, save_now))
    update(state, loss, epoch)
    return flags


class EpochMetrics:
    """The epoch's metric windows (since the last metrics line, and the whole epoch) and its progress
    bar, fed with each step once it is read; they report, and decide nothing."""

    def __init__(self, state: TrainState, ctx: DistContext, steps: int) -> None:
        self.state, self.ctx = state, ctx
        self.window = _Window()
        self.epoch_window = _Window()
        self.bar = progress(steps, f"epoch {state.epoch + 1}/{state.config.optim.epochs}", enabled=ctx.is_main,
                            initial=state.step_in_epoch)

    def add(self, step: StepResult, timing: StepTiming, hooks: LoopHooks, *, flush: bool) -> None:
        """Count the step, move the bar, warn once of a collapse (rank 0), write a metrics line every
        train.log_every steps, at the epoch's last step and when `flush`, then tell the callbacks."""
        for window in (self.window, self.epoch_window):
            window.add(step.loss, timing, step.teacher)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{step.loss:.4f}")
        if step.collapse is not None:
            self.window.collapse = step.collapse.kind
            if step.collapse.new and self.ctx.is_main:
                log.warning("%s", step.collapse.describe())
        if step.global_step % self.state.config.train.log_every == 0 or step.step_in_epoch == step.steps or flush:
            hooks.metrics.log(metrics_line(self.state, self.ctx, "step", self.window))
            self.window = _Window()
        hooks.on_progress(step.global_step)
        hooks.on_step(step.global_step)


def collapse_detector(state: TrainState, steps_per_epoch: int) -> CollapseDetector | None:
    """The run's detector, keeping its window in the loss's `collapse_state` (checkpointed with the loss)."""
    if state.config.train.collapse_patience_steps == 0:
        return None
    return CollapseDetector(CollapseRule.from_config(state.config, steps_per_epoch), state.loss_fn.collapse_state)


def collapse_error(collapse: Collapse, latest: Path) -> TrainingCollapsedError:
    """The error that ends a run stopped by train.stop_on_collapse, once `latest` has been saved."""
    return TrainingCollapsedError(
        f"stopped by train.stop_on_collapse: {collapse.describe()}. Saved {latest}; change those settings "
        "and start a new run (another run.output_dir), or set train.stop_on_collapse=false to train on"
    )


def divergence_error(step: StepResult, latest: Path) -> TrainingDivergedError:
    """The error for a step whose loss was not finite; `latest` is named if a checkpoint exists."""
    last_good = latest if latest.exists() else "none yet"
    return TrainingDivergedError(
        f"non-finite loss ({step.loss}) at epoch {step.epoch + 1}, step {step.step_in_epoch} of the epoch "
        f"(global step {step.global_step}); last good checkpoint: {last_good}. Try a lower optim.lr, "
        "a smaller optim.clip_grad or train.precision=fp32"
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

    def add(self, loss: float, timing: StepTiming, teacher: tuple[float, ...]) -> None:
        self.steps += 1
        self.loss += loss
        self.images += timing.images
        self.data_wait += timing.data_wait
        self.step_time += timing.step_time
        self.cpu_time += timing.cpu_time
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


def metrics_line(state: TrainState, ctx: DistContext, kind: str, window: _Window, epoch: int | None = None) -> dict:
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

