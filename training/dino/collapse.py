"""Collapse detection: whether DINO's teacher output stopped carrying information about the image.

DINO avoids the two trivial solutions of its loss by balancing centring against sharpening. When
the balance fails the loss curve hardly shows it, but the teacher's target distribution does
(training/dino/loss.py `teacher_statistics`, natural logs, so uniform = ln(out_dim)):

    healthy   sharp but diverse: low mean per-image entropy, high entropy of the batch mean
    uniform   every image gets the flat distribution: per-image entropy close to ln(out_dim)
    one-hot   every image gets the same prototype: the batch mean's entropy (and with it the
              per-image entropy, which it bounds from above) close to 0

`CollapseDetector.observe` judges the mean of the statistics over the last `patience_steps` steps
after the warm-up (their mean over ranks, so every rank decides the same): a window mean that looks
like a kind is a collapse. A mean, not a count of steps in a row: a near-uniform run's per-step
entropy is noisy, and a run whose steps dip in and out of the margin never makes a long streak
although its window mean sits inside it (docs/training.md, "Collapse"). The thresholds and the runs
they were measured on are in docs/training.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.config import Config

UNIFORM = "uniform"
ONE_HOT = "one-hot"

REMEDIES = {
    UNIFORM: "a teacher temperature below the student's (dino.teacher_temp, dino.warmup_teacher_temp; "
             "DINO: 0.04 to 0.07 against 0.1), a lower optim.lr, a normalised head (model.norm_last_layer, "
             "model.use_bn_in_head), another model.out_dim",
    ONE_HOT: "centring that follows the teacher (dino.center_momentum below 1; DINO: 0.9), a higher "
             "dino.teacher_temp, a lower optim.lr, model.norm_last_layer=true, another model.out_dim",
}
"""What usually cures each kind: the settings that set the balance between centring and sharpening."""


@dataclass(frozen=True)
class CollapseRule:
    """When the teacher statistics count as collapsed (train.collapse_* in the configuration)."""

    out_dim: int
    uniform_margin: float
    """Uniform: the mean per-image entropy is within this many nats of ln(out_dim)."""
    one_hot_entropy: float
    """One-hot: the entropy of the batch-mean distribution is below this many nats."""
    patience_steps: int
    """Steps after the warm-up whose mean is judged (the window), and so the earliest a collapse shows."""
    after_step: int
    """Steps up to this global step are not judged (the warm-ups)."""

    @classmethod
    def from_config(cls, config: Config, steps_per_epoch: int) -> "CollapseRule":
        """Judging starts after the later of the learning-rate and teacher-temperature warm-ups."""
        train = config.train
        warmup_epochs = max(config.optim.warmup_epochs, config.dino.warmup_teacher_temp_epochs)
        return cls(out_dim=config.model.out_dim, uniform_margin=train.collapse_uniform_margin,
                   one_hot_entropy=train.collapse_one_hot_entropy, patience_steps=train.collapse_patience_steps,
                   after_step=warmup_epochs * steps_per_epoch)

    @property
    def log_out_dim(self) -> float:
        return math.log(self.out_dim)

    def kind(self, teacher_entropy: float, batch_entropy: float) -> str | None:
        """Which collapse these statistics (a window's means) look like, or None for neither."""
        if teacher_entropy >= self.log_out_dim - self.uniform_margin:
            return UNIFORM
        if batch_entropy < self.one_hot_entropy and teacher_entropy < self.one_hot_entropy:
            return ONE_HOT
        return None


@dataclass(frozen=True)
class Collapse:
    """A kind that the window ending at global step `step` looks like."""

    kind: str
    step: int
    teacher_entropy: float
    """Mean over the window of the per-image entropy of the teacher's target."""
    batch_entropy: float
    """Mean over the window of the entropy of the batch-mean target."""
    rule: CollapseRule
    new: bool
    """Whether this is the first step at which the run looks like this kind: the one step that warns."""

    def describe(self) -> str:
        """One line: what collapsed, the evidence, and the usual remedies."""
        rule = self.rule
        if self.kind == UNIFORM:
            evidence = (f"mean entropy of the teacher's target {self.teacher_entropy:.3f} nats, within "
                        f"{rule.uniform_margin:g} of ln(out_dim) = {rule.log_out_dim:.3f}: every image gets the "
                        "flat distribution")
        else:
            evidence = (f"entropy of the batch-mean target {self.batch_entropy:.3f} nats (per image "
                        f"{self.teacher_entropy:.3f}), below {rule.one_hot_entropy:g}: every image gets the same "
                        "prototype")
        return (f"DINO collapse ({self.kind}) over the {rule.patience_steps} steps up to global step {self.step}: "
                f"{evidence}; usual remedies: {REMEDIES[self.kind]}")


class CollapseDetector:
    """Judges the mean teacher statistics of the last `patience_steps` steps after the warm-up.

    Its state lives in `state` (a dict the caller may own: the trainer passes the DINO loss's
    `collapse_state`, which checkpoints carry), so a resumed run judges as an uninterrupted one:
    "window", the [teacher_entropy, batch_entropy] of those steps, oldest first; "warned", the kinds
    already reported, so each kind warns once however often the window leaves and re-enters it.
    """

    def __init__(self, rule: CollapseRule, state: dict[str, Any] | None = None) -> None:
        self.rule = rule
        self.state = {} if state is None else state

    def observe(self, step: int, teacher_entropy: float, batch_entropy: float) -> Collapse | None:
        """Judge global step `step` (1-based, the step just trained); the collapse if its window shows one."""
        if step <= self.rule.after_step:
            return None
        window = self.state.setdefault("window", [])
        window.append([float(teacher_entropy), float(batch_entropy)])
        del window[: -self.rule.patience_steps]
        if len(window) < self.rule.patience_steps:
            return None
        mean_teacher = math.fsum(row[0] for row in window) / len(window)
        mean_batch = math.fsum(row[1] for row in window) / len(window)
        kind = self.rule.kind(mean_teacher, mean_batch)
        if kind is None:
            return None
        warned = self.state.setdefault("warned", [])
        new = kind not in warned
        if new:
            warned.append(kind)
        return Collapse(kind, step, mean_teacher, mean_batch, self.rule, new)
