"""The DINO method against direct computations: loss, centre, temperatures, schedules, EMA, optimizer."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from training.config import Config
from training.cosine_schedule import cosine_schedule
from training.dino import (
    DINOLoss,
    build_optimizer,
    build_schedules,
    cancel_last_layer_gradients,
    clip_gradients,
    scaled_lr,
    teacher_temperature_schedule,
    update_teacher,
)

torch.set_num_threads(1)


def direct_dino_loss(student, teacher, center, n_crops, student_temp, teacher_temp):
    """Sample by sample, pair by pair, with explicit sums."""
    batch = student.shape[0] // n_crops
    s = student.view(n_crops, batch, -1)
    t = teacher.view(2, batch, -1)
    total, terms = 0.0, 0
    for ti in range(2):
        for si in range(n_crops):
            if si == ti:
                continue
            pair = 0.0
            for b in range(batch):
                q = torch.exp((t[ti, b] - center[0]) / teacher_temp)
                q = q / q.sum()
                logits = s[si, b] / student_temp
                log_p = logits - torch.log(torch.exp(logits).sum())
                pair += float(-(q * log_p).sum())
            total += pair / batch
            terms += 1
    return total / terms


def test_loss_and_centre_match_a_direct_computation():
    torch.manual_seed(0)
    n_crops, batch, dim = 4, 3, 16
    temps = teacher_temperature_schedule(0.04, 0.07, 3, 10)
    loss_fn = DINOLoss(dim, n_crops, teacher_temps=temps, student_temp=0.1, center_momentum=0.9)
    loss_fn.center.copy_(torch.randn(1, dim) * 0.1)
    center_before = loss_fn.center.clone()
    student, teacher = torch.randn(n_crops * batch, dim), torch.randn(2 * batch, dim)
    loss = loss_fn(student, teacher, epoch=1)
    expected = direct_dino_loss(student, teacher, center_before, n_crops, 0.1, temps[1])
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    expected_center = 0.9 * center_before + 0.1 * teacher.mean(dim=0, keepdim=True)
    assert torch.allclose(loss_fn.center, expected_center, atol=1e-6)


def test_teacher_temperature_warms_up_linearly_then_stays():
    temps = teacher_temperature_schedule(0.04, 0.07, 4, 10)
    assert len(temps) == 10
    assert temps[0] == pytest.approx(0.04) and temps[3] == pytest.approx(0.07)
    assert np.allclose(np.diff(temps[:4]), 0.01) and np.all(temps[3:] == 0.07)


def test_cosine_schedule_warmup_and_endpoints():
    values = cosine_schedule(1.0, 0.1, epochs=5, iters_per_epoch=4, warmup_epochs=1)
    assert len(values) == 20
    assert np.allclose(values[:4], np.linspace(0, 1, 4))
    assert values[4] == pytest.approx(1.0)
    # half cosine over the remaining 16 iterations: midpoint at the mean of base and final
    assert values[4 + 8] == pytest.approx(0.55)
    assert values[-1] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 15 / 16)))
    assert np.all(np.diff(values[4:]) <= 0)


def test_schedules_scale_lr_by_global_batch_and_raise_momentum_to_one():
    config = Config().replace({"optim.epochs": 10, "optim.warmup_epochs": 2, "optim.batch_size_per_gpu": 32,
                               "optim.lr": 0.0005})
    assert scaled_lr(config, world_size=4) == pytest.approx(0.0005 * 128 / 256)
    schedules = build_schedules(config, iters_per_epoch=5, world_size=4)
    assert len(schedules.lr) == len(schedules.weight_decay) == len(schedules.momentum) == 50
    assert schedules.lr.max() == pytest.approx(0.0005 * 128 / 256)
    assert schedules.lr[-1] == pytest.approx(1e-6, abs=1e-6)
    assert schedules.weight_decay[0] == pytest.approx(0.04) and schedules.weight_decay[-1] == pytest.approx(0.4, rel=1e-2)
    assert schedules.momentum[0] == pytest.approx(0.996) and schedules.momentum[-1] == pytest.approx(1.0, abs=1e-5)
    assert schedules.at(10_000) == schedules.at(49)


def test_ema_update_is_the_convex_combination():
    torch.manual_seed(0)
    student, teacher = nn.Linear(4, 3), nn.Linear(4, 3)
    before = [p.clone() for p in teacher.parameters()]
    update_teacher(student, teacher, momentum=0.9)
    for t_old, t_new, s in zip(before, teacher.parameters(), student.parameters()):
        assert torch.allclose(t_new, 0.9 * t_old + 0.1 * s)


def test_gradient_clipping_is_per_parameter_tensor():
    model = nn.Linear(4, 2)
    model.weight.grad = torch.full_like(model.weight, 3.0)  # norm sqrt(8 * 9) = 8.49
    model.bias.grad = torch.tensor([0.3, 0.4])  # norm 0.5, below the limit
    clip_gradients(model, max_norm=1.0)
    assert float(model.weight.grad.norm()) == pytest.approx(1.0, rel=1e-5)
    assert torch.allclose(model.bias.grad, torch.tensor([0.3, 0.4]))


def test_last_layer_gradients_cancelled_only_during_freeze():
    model = nn.Module()
    model.last_layer = nn.Linear(2, 2)
    model.other = nn.Linear(2, 2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    cancel_last_layer_gradients(model, epoch=1, freeze_epochs=1)
    assert model.last_layer.weight.grad is not None
    cancel_last_layer_gradients(model, epoch=0, freeze_epochs=1)
    assert model.last_layer.weight.grad is None and model.other.weight.grad is not None


def test_optimizer_decays_weights_but_not_biases_or_norms_as_dino():
    from training.config import ModelConfig
    from training.models import build_backbone

    backbone = build_backbone(ModelConfig(arch="vit_tiny", patch_size=16), in_chans=2, img_size=32)
    decay, no_decay = build_optimizer(backbone).param_groups
    assert no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in backbone.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} >= {"norm.weight", "blocks.0.attn.qkv.bias"}
    assert all(p.ndim >= 2 for p in decay["params"])
    assert {"pos_embed", "cls_token"} <= {names[id(p)] for p in decay["params"]}


def test_the_three_adamw_implementations_step_alike_and_a_resume_keeps_the_built_one():
    """Fused (the default here), foreach and for-loop AdamW give the same update within float32
    rounding; loading a for-loop optimizer's state (an earlier checkpoint) leaves a fused one fused,
    with its step counter where the fused kernel reads it."""
    torch.manual_seed(0)
    template = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    grads = [torch.randn_like(p) for p in template.parameters()]
    results, optimizers = {}, {}
    for implementation in ("fused", "foreach", "for-loop"):
        model = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
        model.load_state_dict(template.state_dict())
        optimizer = build_optimizer(model, implementation=implementation)
        for _ in range(3):
            for param, grad in zip(model.parameters(), grads):
                param.grad = grad.clone()
            optimizer.step()
        results[implementation] = torch.cat([p.detach().flatten() for p in model.parameters()])
        optimizers[implementation] = optimizer
    assert build_optimizer(template).param_groups[0]["fused"] is True  # auto on CPU: fused
    for implementation in ("foreach", "for-loop"):
        torch.testing.assert_close(results[implementation], results["fused"], rtol=0, atol=1e-6)
    fused = optimizers["fused"]
    fused.load_state_dict(optimizers["for-loop"].state_dict())
    assert all(g["fused"] is True and not g["foreach"] for g in fused.param_groups)
    steps = [state["step"] for state in fused.state.values()]
    assert steps and all(s.dtype == torch.float32 and float(s) == 3 for s in steps)
    with pytest.raises(ValueError, match="implementation must be"):
        build_optimizer(template, implementation="apex")


def test_clipping_many_tensors_at_once_equals_clipping_each():
    torch.manual_seed(0)
    grads = [torch.randn(7, 3) * 5, torch.randn(4) * 0.01, torch.zeros(3), torch.randn(2, 2)]
    model = nn.ParameterList([nn.Parameter(torch.zeros_like(g)) for g in grads])
    for param, grad in zip(model, grads):
        param.grad = grad.clone()
    clip_gradients(model, max_norm=1.5)
    for param, grad in zip(model, grads):
        expected = grad * torch.clamp(1.5 / (grad.norm() + 1e-6), max=1.0)
        assert torch.equal(param.grad, expected)
