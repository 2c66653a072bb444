"""Training a channel-adaptive ViT on random channel subsets: the rule (hierarchical, from the seed
and the global step), that every view, teacher and student share it, and a tiny pretraining with
the option on that learns and is then evaluated on a subset of its channels."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from tests.support.tiny import TINY_MODEL, tiny_config
from training.dino.channels import hierarchical_subset, select_channels, step_channels
from training.dino.step import forward_loss

IDS = (0, 1, 2, 3, 4)


def test_the_subset_of_a_step_depends_only_on_seed_and_step():
    first = [hierarchical_subset(IDS, 7, step) for step in range(50)]
    again = [hierarchical_subset(IDS, 7, step) for step in reversed(range(50))][::-1]
    assert first == again  # no running RNG: a resumed run, or any rank, draws the same
    torch.manual_seed(123)
    np.random.seed(123)
    assert [hierarchical_subset(IDS, 7, step) for step in range(50)] == first
    assert [hierarchical_subset(IDS, 8, step) for step in range(50)] != first


def test_subsets_are_non_empty_ordered_and_every_size_is_equally_likely():
    draws = [hierarchical_subset((1, 3, 4, 6, 7), 0, step) for step in range(5000)]
    assert all(d and set(d) <= {1, 3, 4, 6, 7} and list(d) == sorted(d) for d in draws)
    sizes = Counter(len(d) for d in draws)
    assert sorted(sizes) == [1, 2, 3, 4, 5]
    assert all(abs(sizes[k] / 5000 - 0.2) < 0.03 for k in sizes), sizes
    singles = Counter(d for d in draws if len(d) == 1)
    assert all(abs(singles[(c,)] / sizes[1] - 0.2) < 0.05 for c in (1, 3, 4, 6, 7)), singles


def test_no_subsets_unless_the_channel_adaptive_model_samples_them():
    assert step_channels(tiny_config(), 3) is None
    assert step_channels(tiny_config({"model.kind": "channel_vit", "model.channel_sampling": "all"}), 3) is None
    config = tiny_config({"model.kind": "channel_vit", "data.channels": "024", "run.seed": 5})
    assert step_channels(config, 3) == hierarchical_subset((0, 2, 4), 5, 3)


class RecordingModel(nn.Module):
    """Stands in for a MultiCropWrapper: records the channel ids and the channels' pixel values."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple[int, ...] | None, list[list[float]]]] = []

    def forward(self, crops, channels=None):
        self.calls.append((channels, [crop[0, :, 0, 0].tolist() for crop in crops]))
        return torch.zeros(sum(len(c) for c in crops), 4, requires_grad=True)


def run_forward(config, step: int) -> tuple[RecordingModel, RecordingModel]:
    teacher, student = RecordingModel(), RecordingModel()
    state = SimpleNamespace(
        config=config, global_step=step, models=SimpleNamespace(teacher=teacher, student_forward=student),
        precision=SimpleNamespace(autocast=contextlib.nullcontext), loss_fn=lambda s, t, e: s.sum() + t.sum(),
    )
    ids = config.data.channel_indices
    # channel c of every crop holds the value c, so what reaches the models shows which channels did
    crops = [torch.tensor(ids, dtype=torch.float32)[None, :, None, None].expand(2, -1, s, s).clone()
             for s in (32, 32, 16, 16, 16)]
    forward_loss(state, crops, epoch=0)
    return teacher, student


def test_teacher_and_student_see_the_same_channels_in_every_view():
    config = tiny_config({"model.kind": "channel_vit", "data.channels": "1234", "run.seed": 3})
    seen = set()
    for step in range(12):
        expected = hierarchical_subset((1, 2, 3, 4), 3, step)
        teacher, student = run_forward(config, step)
        (t_channels, t_values), = teacher.calls
        (s_channels, s_values), = student.calls
        assert t_channels == s_channels == expected
        assert len(t_values) == 2 and len(s_values) == 5
        assert all(values == list(map(float, expected)) for values in t_values + s_values)
        seen.add(expected)
    assert len(seen) > 3


def test_the_plain_vit_step_is_unchanged():
    teacher, student = run_forward(tiny_config({"data.channels": "012"}), 0)
    assert teacher.calls[0] == (None, [[0.0, 1.0, 2.0]] * 2)
    assert student.calls[0] == (None, [[0.0, 1.0, 2.0]] * 5)


def test_select_channels_keeps_the_crops_when_all_are_present():
    config = tiny_config({"data.channels": "13"})
    crops = [torch.randn(2, 2, 8, 8)]
    assert select_channels(crops, config, (1, 3))[0] is crops[0]
    torch.testing.assert_close(select_channels(crops, config, (3,))[0], crops[0][:, 1:])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A 5-channel synthetic set, packed, with its mean/std."""
    from training.cli import main
    from training.config import load_config

    root = tmp_path_factory.mktemp("chansub")
    config_path = root / "run.yaml"
    config_path.write_text(f"run: {{output_dir: {root / 'run'}, seed: 0}}\n"
                           f"data: {{source: {root / 'images'}, channels: '01234', num_workers: 0}}\n")
    assert main(["synth-data", "--config", str(config_path), "--classes", "3", "--per-class", "16",
                 "--size", "32", "--channels", "5"]) == 0
    for step in ("prepare", "mean-std"):
        assert main([step, "--config", str(config_path)]) == 0
    return config_path, load_config(config_path)


@pytest.mark.slow
def test_tiny_channel_adaptive_pretraining_learns_and_serves_a_subset(prepared):
    from training.cli import main
    from training.distributed.groups import DistContext, DistEnv
    from training.rundir import RunLayout
    from training.rundir.features import load_features
    from training.trainer import train

    torch.set_num_threads(1)
    config_path, base = prepared
    config = base.replace({
        **TINY_MODEL, "model.kind": "channel_vit", "model.drop_path_rate": 0.0, "dino.global_crop_size": 24,
        "optim.batch_size_per_gpu": 8, "optim.epochs": 4, "optim.warmup_epochs": 1, "optim.lr": 0.01,
        "optim.freeze_last_layer": 0, "dino.momentum_teacher": 0.9, "train.log_every": 1,
        "train.tensorboard": False, "train.precision": "fp32",
    })
    result = train(config, DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None))
    assert result.epochs_completed == 4
    lines = [json.loads(line) for line in RunLayout.from_config(config).metrics.read_text().splitlines()]
    losses = [line["loss"] for line in lines if line["kind"] == "epoch"]
    assert sum(losses[-2:]) / 2 < losses[0] - 0.05, losses
    assert all(line["cpu_core_s"] > 0 and line["gpu_s"] == 0.0 for line in lines)

    overrides = ["model.kind=channel_vit", "model.arch=vit_tiny", "model.patch_size=8", "eval.image_size=32",
                 "data.channels=02"]
    args = ["features", "--config", str(config_path), "--no-baselines", "--epochs", "none"]
    assert main(args + [item for o in overrides for item in ("--set", o)]) == 0
    layout = RunLayout.from_config(config)
    features = load_features(layout.features("final"))
    assert features.meta["channels"] == "02"
    assert features.features.shape[1] == 192 and np.isfinite(features.features).all()
