"""Collapse detection: the teacher statistics against scipy's entropy on small batches, and the
detector's judgement on synthetic sequences of statistics (healthy, uniform, one-hot, noisy,
interrupted, resumed from a checkpointed loss), each checked against the window means computed here."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy

from tests.support.tiny import tiny_config
from training.config import ConfigError
from training.dino import DINOLoss, teacher_temperature_schedule
from training.dino.collapse import ONE_HOT, UNIFORM, CollapseDetector, CollapseRule
from training.dino.loss import TEACHER_STATISTICS, teacher_statistics

torch.set_num_threads(1)

LN256 = math.log(256)
RULE = CollapseRule(out_dim=256, uniform_margin=0.2, one_hot_entropy=0.5, patience_steps=3, after_step=4)

HEALTHY = (1.2, 4.0)
"""(mean per-image entropy, entropy of the batch mean): sharp but diverse."""
FLAT = (LN256 - 0.05, LN256 - 0.01)
SAME_PROTOTYPE = (0.01, 0.05)


def scipy_statistics(teacher, center, temp):
    """The same three numbers from scipy's entropy (natural log) on NumPy arrays, in float64."""
    logits = (teacher.double().numpy() - center.double().numpy()) / temp
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return (float(np.mean([entropy(row) for row in p])), float(entropy(p.mean(axis=0))),
            float(np.linalg.norm(center.double().numpy())))


@pytest.mark.parametrize("temp", [0.04, 1.0])
def test_the_loss_measures_its_target_as_scipy_does(temp):
    torch.manual_seed(0)
    n_crops, batch, dim = 4, 5, 32
    loss_fn = DINOLoss(dim, n_crops, teacher_temps=teacher_temperature_schedule(temp, temp, 0, 1))
    loss_fn.center.copy_(torch.randn(1, dim) * 0.3)
    center = loss_fn.center.clone()
    teacher = torch.randn(2 * batch, dim)
    loss_fn(torch.randn(n_crops * batch, dim), teacher, epoch=0)
    got = loss_fn.teacher_stats.tolist()
    assert got == pytest.approx(scipy_statistics(teacher, center, temp), rel=1e-4, abs=1e-5)
    assert len(got) == len(TEACHER_STATISTICS)


def test_the_extremes_are_zero_and_ln_out_dim_even_where_probabilities_underflow():
    dim = 64
    one_hot = torch.zeros(6, dim)
    one_hot[:, 3] = 1.0
    assert teacher_statistics(one_hot, torch.zeros(1, dim)).tolist() == [0.0, 0.0, 0.0]
    uniform = torch.full((6, dim), 1 / dim)
    per_image, of_mean, _ = teacher_statistics(uniform, torch.ones(1, dim)).tolist()
    assert per_image == pytest.approx(math.log(dim), abs=1e-5) and of_mean == pytest.approx(math.log(dim), abs=1e-5)
    diverse = torch.eye(dim)[:6]  # sharp but each image its own prototype: 0 per image, ln 6 for the batch
    assert teacher_statistics(diverse, torch.zeros(1, dim)).tolist()[:2] == pytest.approx([0.0, math.log(6)])
    sharp = torch.softmax(torch.randn(6, dim) / 1e-4, dim=-1)  # most entries underflow to 0
    assert all(math.isfinite(v) for v in teacher_statistics(sharp, torch.zeros(1, dim)).tolist())


def judge(sequence, rule=RULE, state=None, first_step=1):
    """The detector's verdict per step of `sequence` as (kind or None, whether it warns)."""
    detector = CollapseDetector(rule, state)
    verdicts = []
    for step, stats in enumerate(sequence, start=first_step):
        collapse = detector.observe(step, *stats)
        verdicts.append((collapse.kind, collapse.new) if collapse else None)
    return verdicts


def test_a_healthy_run_is_never_flagged_and_the_warm_up_is_not_judged():
    assert judge([HEALTHY] * 50) == [None] * 50
    assert judge([FLAT] * 4 + [HEALTHY] * 10) == [None] * 14  # a flat start during the warm-up is normal


def test_uniform_is_flagged_once_the_window_is_full_and_warns_once():
    verdicts = judge([FLAT] * 10)
    assert verdicts[:6] == [None] * 6  # steps 1-4 warm-up, 5-6 fill the window
    assert verdicts[6:] == [(UNIFORM, True)] + [(UNIFORM, False)] * 3


def test_one_hot_needs_both_entropies_near_zero():
    assert judge([SAME_PROTOTYPE] * 8)[6:] == [(ONE_HOT, True), (ONE_HOT, False)]
    sharp_but_diverse = (0.01, 3.0)  # every image certain of its own prototype: healthy
    assert judge([sharp_but_diverse] * 8) == [None] * 8


def window_verdicts(sequence, rule=RULE):
    """The reference: at each step after the warm-up with a full window, the kind its plain means show."""
    out = []
    for step in range(1, len(sequence) + 1):
        window = sequence[max(rule.after_step, step - rule.patience_steps):step]
        if step <= rule.after_step or len(window) < rule.patience_steps:
            out.append(None)
            continue
        teacher, batch = np.mean(window, axis=0)
        if teacher >= LN256 - rule.uniform_margin:
            out.append(UNIFORM)
        elif teacher < rule.one_hot_entropy and batch < rule.one_hot_entropy:
            out.append(ONE_HOT)
        else:
            out.append(None)
    return out


def test_a_noisy_near_uniform_run_never_in_the_margin_long_is_flagged_by_its_mean():
    """As measured on the masked-channels runs: single steps dip in and out of the margin (never
    `patience` in a row), but their mean sits inside it."""
    noisy = [HEALTHY] * 4 + [(LN256 - 0.02, LN256 - 0.01), (LN256 - 0.05, LN256 - 0.01),
                             (LN256 - 0.45, LN256 - 0.2)] * 6
    inside = "".join("i" if LN256 - t < RULE.uniform_margin else "o" for t, _ in noisy[4:])
    assert max(map(len, inside.split("o"))) == RULE.patience_steps - 1  # a streak rule would wait forever
    verdicts = judge(noisy)
    assert [v and v[0] for v in verdicts] == window_verdicts(noisy)
    assert verdicts[:6] == [None] * 6 and verdicts[6] == (UNIFORM, True)  # (0.02 + 0.05 + 0.45) / 3 < 0.2
    assert verdicts[7:] == [(UNIFORM, False)] * (len(noisy) - 7)


def test_a_healthy_run_with_noisy_steps_is_never_flagged():
    rng = np.random.default_rng(1)
    healthy = [(LN256 - 0.36 - rng.uniform(0, 1.0), 5.3 + rng.uniform(-0.2, 0.2)) for _ in range(200)]
    assert judge(healthy, rule=CollapseRule(256, 0.3, 0.5, 50, 31)) == [None] * 200


def test_a_window_that_leaves_and_returns_does_not_warn_again_but_a_new_kind_does():
    sequence = [HEALTHY] * 4 + [FLAT, FLAT, HEALTHY, FLAT, FLAT, FLAT, HEALTHY] + [SAME_PROTOTYPE] * 3
    verdicts = judge(sequence)
    assert [v and v[0] for v in verdicts] == window_verdicts(sequence)
    assert [i + 1 for i, v in enumerate(verdicts) if v] == [10, 14]
    assert verdicts[9] == (UNIFORM, True) and verdicts[13] == (ONE_HOT, True)
    again = judge([HEALTHY] * 4 + [FLAT] * 3 + [HEALTHY] * 3 + [FLAT] * 3)
    assert [v for v in again if v] == [(UNIFORM, True), (UNIFORM, False)]


def test_values_just_outside_the_thresholds_are_healthy():
    assert judge([(LN256 - 0.3, LN256 - 0.1)] * 20) == [None] * 20  # 0.3 nats from uniform: not within 0.2
    assert judge([(0.6, 0.7)] * 20) == [None] * 20  # above the one-hot threshold


def test_a_resumed_run_judges_as_an_uninterrupted_one():
    """The window lives in the DINO loss's state_dict, which checkpoints carry."""
    sequence = [HEALTHY] * 4 + [FLAT, HEALTHY, FLAT] + [FLAT] * 6
    uninterrupted = judge(sequence)
    loss = DINOLoss(256, 4, teacher_temps=np.array([0.04]))
    first = judge(sequence[:9], state=loss.collapse_state)
    saved = loss.state_dict()
    resumed = DINOLoss(256, 4, teacher_temps=np.array([0.04]))
    resumed.load_state_dict(saved)
    assert first + judge(sequence[9:], state=resumed.collapse_state, first_step=10) == uninterrupted
    assert uninterrupted[8] == (UNIFORM, True) and uninterrupted[9] == (UNIFORM, False)  # not a second warning
    older = DINOLoss(256, 4, teacher_temps=np.array([0.04]))
    older.load_state_dict({"center": torch.ones(1, 256)})  # a checkpoint from before the detector
    assert older.collapse_state == {} and float(older.center.sum()) == 256
    streak_rule = DINOLoss(256, 4, teacher_temps=np.array([0.04]))  # one from the earlier streak rule
    streak_rule.load_state_dict({"center": torch.ones(1, 256), "_extra_state": {"collapse_streaks": {"uniform": 7}}})
    assert streak_rule.collapse_state == {}


def test_the_rule_waits_for_the_later_warm_up_and_reads_the_config():
    config = tiny_config({"optim.warmup_epochs": 2, "dino.warmup_teacher_temp_epochs": 3,
                          "train.collapse_patience_steps": 7, "train.collapse_uniform_margin": 0.3})
    rule = CollapseRule.from_config(config, steps_per_epoch=31)
    assert (rule.after_step, rule.patience_steps, rule.out_dim, rule.uniform_margin) == (93, 7, 256, 0.3)
    assert CollapseRule.from_config(tiny_config({"optim.warmup_epochs": 4}), steps_per_epoch=2).after_step == 8


def test_the_warning_names_the_kind_the_evidence_and_the_remedies():
    detector = CollapseDetector(RULE)
    collapse = [detector.observe(step, *FLAT) for step in range(1, 8)][-1]
    text = collapse.describe()
    assert text.startswith("DINO collapse (uniform) over the 3 steps up to global step 7")
    assert f"{FLAT[0]:.3f} nats" in text and "ln(out_dim) = 5.545" in text
    for remedy in ("dino.teacher_temp", "optim.lr", "model.out_dim", "model.norm_last_layer"):
        assert remedy in text
    detector = CollapseDetector(RULE)
    text = [detector.observe(step, *SAME_PROTOTYPE) for step in range(1, 8)][-1].describe()
    assert "same prototype" in text and "dino.center_momentum" in text


@pytest.mark.parametrize(("key", "value"), [("collapse_uniform_margin", 0.0), ("collapse_one_hot_entropy", -1.0),
                                            ("collapse_uniform_margin", float("nan")),
                                            ("collapse_patience_steps", -1)])
def test_bad_thresholds_are_refused_naming_the_setting(key, value):
    with pytest.raises(ConfigError, match=rf"train\.{key} must be"):
        tiny_config({f"train.{key}": value})
