"""Checkpoint files: atomic writes, numbered copies and pruning, and backbone loading from any source."""

import pickle

import pytest
import torch

from training.atomic import save_torch_atomic
from training.checkpointing import CheckpointManager
from training.config import Config, ModelConfig, TrainConfig
from training.errors import MissingInputError, UserError
from training.models import build_backbone, build_model, pretrained
from training.models.pretrained import load_checkpoint
from training.rundir import RunLayout

torch.set_num_threads(1)

TINY = ModelConfig(arch="vit_tiny", patch_size=8, out_dim=256)


def test_numbered_checkpoints_every_n_epochs_keep_the_last_k(tmp_path):
    layout = RunLayout(tmp_path)
    manager = CheckpointManager(layout, TrainConfig(saveckp_freq=2, keep_last=2))
    for epoch in range(1, 8):
        manager.write({"epoch": epoch, "w": torch.ones(2) * epoch})
    assert [e for e, _ in layout.numbered_checkpoints()] == [4, 6]
    assert load_checkpoint(layout.latest_checkpoint)["epoch"] == 7
    assert torch.equal(load_checkpoint(layout.epoch_checkpoint(6))["w"], torch.full((2,), 6.0))
    assert sorted(p.name for p in layout.checkpoints.iterdir()) == [
        "checkpoint.pth", "checkpoint_0004.pth", "checkpoint_0006.pth"]


def test_mid_epoch_checkpoint_is_not_numbered(tmp_path):
    layout = RunLayout(tmp_path)
    CheckpointManager(layout, TrainConfig(saveckp_freq=1, keep_last=3)).write({"epoch": 2, "step_in_epoch": 3})
    assert layout.numbered_checkpoints() == []


def test_failed_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pth"
    save_torch_atomic({"epoch": 1}, path)
    with pytest.raises((pickle.PicklingError, AttributeError)):  # which one depends on the Python version
        save_torch_atomic({"epoch": 2, "bad": lambda: None}, path)  # lambdas cannot be pickled
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pth"]


def _wrapper_checkpoint(in_chans: int, prefix: str = "") -> tuple[dict, torch.nn.Module]:
    config = Config().replace({"model.arch": "vit_tiny", "model.patch_size": 8, "model.out_dim": 256,
                               "dino.global_crop_size": 32})
    student, teacher = build_model(config, in_chans)
    with torch.no_grad():
        teacher.backbone.cls_token.fill_(0.5)
    state = {
        "student": {prefix + k: v for k, v in student.state_dict().items()},
        "teacher": teacher.state_dict(),
    }
    return state, teacher.backbone


@pytest.mark.parametrize("prefix", ["", "module."])
def test_load_backbone_from_our_or_dino_checkpoint(tmp_path, prefix):
    state, teacher_backbone = _wrapper_checkpoint(5, prefix)
    path = tmp_path / "ck.pth"
    torch.save(state, path)
    loaded = pretrained.load_backbone(path, TINY, in_chans=5, which="teacher")
    x = torch.randn(2, 5, 40, 40)
    assert torch.allclose(loaded.eval()(x), teacher_backbone.eval()(x), atol=1e-6)
    student = pretrained.load_backbone(path, TINY, in_chans=5, which="student")
    assert float(student.cls_token.detach().mean()) != pytest.approx(0.5)


def test_plain_imagenet_weights_are_adapted_to_the_channel_count(tmp_path):
    rgb = build_backbone(ModelConfig(arch="vit_tiny", patch_size=16), in_chans=3, img_size=224)
    path = tmp_path / "dino_deitsmall16_pretrain.pth"
    torch.save(rgb.state_dict(), path)
    loaded = pretrained.load_backbone(path, ModelConfig(arch="vit_tiny", patch_size=16,
                                                         channel_adaptation="mean_rescaled"), in_chans=5)
    weight = loaded.patch_embed.proj.weight
    assert weight.shape == (192, 5, 16, 16)
    expected = rgb.patch_embed.proj.weight.mean(dim=1) * 3 / 5
    assert torch.allclose(weight[:, 4], expected, atol=1e-6)
    # a uniform 5-channel image gets the same embedding as the uniform RGB image
    assert torch.allclose(loaded.patch_embed.proj(torch.ones(1, 5, 16, 16)),
                          rgb.patch_embed.proj(torch.ones(1, 3, 16, 16)), atol=1e-5)


def test_pretrained_weights_initialise_a_backbone_of_another_crop_size(tmp_path):
    source = build_backbone(TINY, in_chans=3, img_size=224)
    path = tmp_path / "w.pth"
    torch.save({"teacher": {"backbone." + k: v for k, v in source.state_dict().items()}}, path)
    target = build_backbone(TINY, in_chans=5, img_size=48)
    pretrained.load_pretrained_into(target, path, TINY)
    assert target.pos_embed.shape == (1, 37, 192)
    assert torch.equal(target.blocks[3].mlp.fc1.weight, source.blocks[3].mlp.fc1.weight)


def test_missing_and_mismatched_checkpoints_explain_the_fix(tmp_path):
    with pytest.raises(MissingInputError, match="python -m training pretrain"):
        pretrained.load_backbone(tmp_path / "none.pth", TINY, in_chans=5)
    small = build_backbone(ModelConfig(arch="vit_small", patch_size=16), in_chans=5, img_size=32)
    path = tmp_path / "small.pth"
    torch.save(small.state_dict(), path)
    with pytest.raises(UserError, match="holds a vit_small with patch 16, but model.arch=vit_tiny"):
        pretrained.load_backbone(path, TINY, in_chans=5)
