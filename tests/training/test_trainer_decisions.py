"""The training loop's one decision point, `decide`, on plain step results. Each expected decision is
written out from the documented behaviour (the pre-emption protocol slurm/pretrain.slurm relies on,
the exit statuses of training/recovery/exit_codes.py, what a diverged or collapsed run keeps), not taken
from the code; the end-to-end runs of test_trainer.py and test_trainer_collapse.py check the loop acts
on them."""

import pytest

from training.dino.collapse import Collapse, CollapseRule
from training.errors import UserError
from training.recovery import exit_codes, policy
from training.recovery.failures import classify
from training.trainer import (
    Decision,
    StepResult,
    TrainingCollapsedError,
    TrainingDivergedError,
    collapse_error,
    decide,
    divergence_error,
)

STEPS = 10
"""Steps in an epoch."""

GOES_ON = Decision(save=False, leave_epoch=False, preempt=False, halt=None)
EPOCH_ENDS = Decision(save=True, leave_epoch=True, preempt=False, halt=None)
PREEMPTED = Decision(save=True, leave_epoch=True, preempt=True, halt=None)
"""Save at this step boundary (checkpoint.pth, then the PREEMPTED marker), stop, return normally."""


def step(**changes) -> StepResult:
    """A healthy step in the middle of the second epoch (step 4 of 10, global step 14), unless told otherwise."""
    fields = dict(loss=2.5, loss_finite=True, stop_requested=False, save_due=False, collapse=None, epoch=1,
                  step_in_epoch=4, steps=STEPS, global_step=14)
    return StepResult(**{**fields, **changes})


def uniform_collapse() -> Collapse:
    rule = CollapseRule(out_dim=256, uniform_margin=0.05, one_hot_entropy=0.5, patience_steps=2, after_step=0)
    return Collapse("uniform", 14, 5.541, 5.545, rule, new=True)


def exit_status(decision: Decision) -> int:
    """The status the process ends with once `decision` has ended its run, by the contract of
    training/recovery/exit_codes.py: OK when training returns (a pre-emption too); what it raises is a
    UserError, the CLI's status DETERMINISTIC."""
    if decision.halt is None:
        return exit_codes.OK
    assert issubclass(decision.halt, UserError)
    return exit_codes.DETERMINISTIC


def launcher_verdict(decision: Decision) -> str:
    """What slurm/heal.sh's policy makes of that status (no failure marker, no requeue so far)."""
    status = exit_status(decision)
    return policy.decide(status, policy.is_deterministic(status, None, "77", 0), requeues=0, max_requeues=3)


def test_a_healthy_step_mid_epoch_goes_on_without_a_save():
    assert decide(step(), stop_on_collapse=True) == GOES_ON


def test_a_due_time_checkpoint_is_saved_and_the_epoch_goes_on():
    assert decide(step(save_due=True), stop_on_collapse=False) == Decision(save=True)


@pytest.mark.parametrize("save_due", [False, True])
def test_the_last_step_of_an_epoch_ends_it_with_one_save(save_due):
    assert decide(step(step_in_epoch=STEPS, save_due=save_due), stop_on_collapse=False) == EPOCH_ENDS


@pytest.mark.parametrize("where", [dict(step_in_epoch=1), dict(step_in_epoch=4, save_due=True),
                                   dict(step_in_epoch=STEPS), dict(step_in_epoch=STEPS, save_due=True)],
                         ids=["first-step", "save-due", "last-step", "last-step-save-due"])
def test_a_stop_signal_saves_at_this_step_boundary_then_stops_and_exits_0_for_a_requeue(where):
    decision = decide(step(stop_requested=True, **where), stop_on_collapse=False)
    assert decision == PREEMPTED
    assert exit_status(decision) == exit_codes.OK == 0
    assert launcher_verdict(decision) == "done"  # the PREEMPTED marker, not the failure policy, requeues


@pytest.mark.parametrize("also", [{}, dict(stop_requested=True), dict(save_due=True), dict(step_in_epoch=STEPS),
                                  dict(collapse=uniform_collapse())],
                         ids=["alone", "with-a-signal", "save-due", "last-step", "collapsed-too"])
def test_a_non_finite_loss_halts_with_the_divergence_error_and_saves_nothing(also):
    decision = decide(step(loss=float("nan"), loss_finite=False, **also), stop_on_collapse=True)
    assert decision == Decision(save=False, leave_epoch=True, preempt=False, halt=TrainingDivergedError)
    assert exit_status(decision) == exit_codes.DETERMINISTIC == 2
    assert launcher_verdict(decision) == "not-retried"


def test_the_divergence_error_names_the_step_and_the_last_good_checkpoint(tmp_path):
    latest = tmp_path / "checkpoint.pth"
    diverged = step(loss=float("inf"), loss_finite=False)
    error = divergence_error(diverged, latest)
    assert classify(error) == "deterministic"
    assert str(error).startswith("non-finite loss (inf) at epoch 2, step 4 of the epoch (global step 14); "
                                 "last good checkpoint: none yet. Try a lower optim.lr")
    latest.write_bytes(b"saved")
    assert f"last good checkpoint: {latest}. Try" in str(divergence_error(diverged, latest))


@pytest.mark.parametrize("also", [{}, dict(stop_requested=True), dict(step_in_epoch=STEPS)],
                         ids=["alone", "with-a-signal", "last-step"])
def test_a_collapse_under_stop_on_collapse_saves_then_halts_even_when_a_signal_came(also):
    decision = decide(step(collapse=uniform_collapse(), **also), stop_on_collapse=True)
    assert decision == Decision(save=True, leave_epoch=True, preempt=False, halt=TrainingCollapsedError)
    assert launcher_verdict(decision) == "not-retried"  # a requeued run would collapse again


def test_a_collapse_without_stop_on_collapse_trains_on():
    assert decide(step(collapse=uniform_collapse()), stop_on_collapse=False) == GOES_ON
    assert decide(step(collapse=uniform_collapse(), step_in_epoch=STEPS), stop_on_collapse=False) == EPOCH_ENDS


def test_the_collapse_error_says_what_collapsed_where_it_was_saved_and_how_to_go_on(tmp_path):
    latest = tmp_path / "checkpoint.pth"
    error = collapse_error(uniform_collapse(), latest)
    assert classify(error) == "deterministic"
    assert str(error).startswith("stopped by train.stop_on_collapse: DINO collapse (uniform) over the 2 steps up "
                                 "to global step 14")
    assert f"Saved {latest};" in str(error) and "set train.stop_on_collapse=false to train on" in str(error)
