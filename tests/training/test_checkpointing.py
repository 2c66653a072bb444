"""Checkpoint files: atomic writes, numbered copies and pruning, backbone loading from any source, and
resuming past a damaged checkpoint."""

import json
import os
import pickle
import shutil

import pytest
import torch
import torch.serialization

from training.checkpointing import CheckpointManager, settle_resume_point
from training.config import Config, ModelConfig, TrainConfig
from training.errors import DamagedFileError, MissingInputError, UserError
from training.models import build_backbone, build_model, pretrained
from training.models.pretrained import load_checkpoint
from training.rundir import RunLayout
from training.writes.atomic import save_torch_atomic

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
        "checkpoint.pth", "checkpoint_0004.pth", "checkpoint_0006.pth", "checkpoint_previous.pth"]
    assert load_checkpoint(layout.previous_checkpoint)["epoch"] == 6  # the save before the latest
    assert layout.previous_checkpoint.samefile(layout.epoch_checkpoint(6))  # a hard link, not a copy


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


def written_checkpoints(layout, epochs):
    manager = CheckpointManager(layout, TrainConfig(saveckp_freq=1))
    for epoch in range(1, epochs + 1):
        manager.write({"epoch": epoch, "w": torch.full((4000,), float(epoch))})


def checkpoint_names(layout):
    return sorted(p.name for p in layout.checkpoints.iterdir())


def test_a_damaged_latest_checkpoint_and_its_hard_link_are_set_aside_for_the_one_before(tmp_path, caplog):
    layout = RunLayout(tmp_path)
    written_checkpoints(layout, 3)
    os.truncate(layout.latest_checkpoint, layout.latest_checkpoint.stat().st_size // 2)  # and checkpoint_0003.pth
    point = settle_resume_point(layout)
    assert point.path == layout.epoch_checkpoint(2)
    assert [(path.name, problem.split(" (")[0]) for path, problem in point.damaged] == [
        ("checkpoint.pth", "is truncated or damaged at its end"),
        ("checkpoint_0003.pth", "is a hard link to checkpoint.pth")]
    assert checkpoint_names(layout) == ["checkpoint.pth", "checkpoint.pth.damaged", "checkpoint_0001.pth",
                                        "checkpoint_0002.pth", "checkpoint_0003.pth.damaged",
                                        "checkpoint_previous.pth"]
    assert layout.latest_checkpoint.samefile(layout.epoch_checkpoint(2))  # `features` evaluates it as final
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"damaged checkpoint in {layout.checkpoints}: checkpoint.pth is truncated")
    assert warning.endswith("resuming from checkpoint_0002.pth, the newest intact checkpoint (linked as checkpoint.pth)")

    garble(layout.latest_checkpoint)  # damaged again, in place: checkpoint_0002.pth and the previous with it
    assert settle_resume_point(layout).path == layout.epoch_checkpoint(1)
    assert checkpoint_names(layout) == ["checkpoint.pth", "checkpoint.pth.damaged", "checkpoint.pth.damaged-2",
                                        "checkpoint_0001.pth", "checkpoint_0002.pth.damaged",
                                        "checkpoint_0003.pth.damaged", "checkpoint_previous.pth.damaged"]
    assert [e for e, _ in layout.numbered_checkpoints()] == [1]  # set-aside files are no epochs


def garble(path):
    with open(path, "r+b") as handle:
        handle.seek(path.stat().st_size // 2)
        handle.write(b"\xff" * 16)


def test_a_mid_epoch_save_damaged_costs_one_save_interval(tmp_path):
    """The latest is a mid-epoch save: the save before it (also mid-epoch, newer than any numbered
    checkpoint) is the resume point."""
    layout = RunLayout(tmp_path)
    written_checkpoints(layout, 2)
    manager = CheckpointManager(layout, TrainConfig(saveckp_freq=1))
    for step in (3, 6):
        manager.write({"epoch": 2, "step_in_epoch": step, "w": torch.zeros(4000)})
    garble(layout.latest_checkpoint)
    point = settle_resume_point(layout)
    assert point.path == layout.previous_checkpoint and [p.name for p, _ in point.damaged] == ["checkpoint.pth"]
    assert load_checkpoint(layout.latest_checkpoint)["step_in_epoch"] == 3


def test_without_a_latest_checkpoint_the_newest_numbered_one_is_the_resume_point(tmp_path, caplog):
    layout = RunLayout(tmp_path)
    written_checkpoints(layout, 2)
    layout.latest_checkpoint.unlink()
    assert settle_resume_point(layout).path == layout.epoch_checkpoint(2)  # newer than the previous save
    assert load_checkpoint(layout.latest_checkpoint)["epoch"] == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{layout.latest_checkpoint} is missing; resuming from checkpoint_0002.pth, the newest intact checkpoint "
        "(linked as checkpoint.pth)"]


def test_no_intact_checkpoint_is_an_error_that_moves_nothing(tmp_path):
    layout = RunLayout(tmp_path)
    written_checkpoints(layout, 2)
    garble(layout.latest_checkpoint)
    garble(layout.epoch_checkpoint(1))
    before = checkpoint_names(layout)
    with pytest.raises(UserError, match=r"^no intact checkpoint to resume from in .*checkpoints \(checkpoint\.pth "
                                        r"fails its checksum .*; checkpoint_0002\.pth is a hard link to checkpoint\.pth; "
                                        r"checkpoint_0001\.pth fails its checksum .*; checkpoint_previous\.pth is a hard "
                                        r"link to checkpoint_0001\.pth\): restore one from a copy"):
        settle_resume_point(layout)
    assert checkpoint_names(layout) == before
    assert settle_resume_point(RunLayout(tmp_path / "new")).path is None  # a new run starts afresh


def test_checkpoints_saved_without_crcs_still_resume(tmp_path):
    """Checksums come with torch.save; a checkpoint written with them turned off (all 0) gets the
    structural checks and loads."""
    layout = RunLayout(tmp_path)
    torch.serialization.set_crc32_options(False)
    try:
        written_checkpoints(layout, 1)
    finally:
        torch.serialization.set_crc32_options(True)
    assert settle_resume_point(layout).path == layout.latest_checkpoint
    assert load_checkpoint(layout.latest_checkpoint)["epoch"] == 1


def test_a_damaged_checkpoint_read_for_its_weights_names_the_fix(tmp_path):
    layout = RunLayout(tmp_path)
    written_checkpoints(layout, 2)
    garble(layout.epoch_checkpoint(1))
    with pytest.raises(DamagedFileError, match=r"checkpoint_0001\.pth fails its checksum \(record data/0: .*\): rename "
                                               r"it to checkpoint_0001\.pth\.damaged and rerun `python -m training "
                                               r"features`"):
        pretrained.load_backbone(layout.epoch_checkpoint(1), TINY, in_chans=5)
    os.truncate(layout.latest_checkpoint, 100)
    with pytest.raises(DamagedFileError, match=r"checkpoint\.pth is truncated .*: rerun `python -m training pretrain`"):
        load_checkpoint(layout.latest_checkpoint)
    outside = tmp_path / "dino_vits16.pth"
    outside.write_bytes(layout.latest_checkpoint.read_bytes())
    with pytest.raises(DamagedFileError, match=r"dino_vits16\.pth is truncated .*: replace it with an intact copy"):
        load_checkpoint(outside)


@pytest.mark.slow
def test_training_resumed_past_a_damaged_checkpoint_ends_bit_identical(tmp_path, caplog):
    """Epoch 2's checkpoint is damaged (and checkpoint.pth, the same file): the run resumes from
    epoch 1's, trains epoch 2 again and ends exactly as the run that was never damaged."""
    from tests.support.heal_run import CPU, assert_same_weights, scripted, tiny_config
    from training.trainer import train

    caplog.set_level("INFO")
    train(tiny_config(tmp_path / "ref"), CPU, loader_factory=scripted(2))
    ref, run = RunLayout(tmp_path / "ref"), RunLayout(tmp_path / "run")
    shutil.copytree(ref.root, run.root, copy_function=os.link)  # hard links, as the run left them
    for path in (run.latest_checkpoint, run.epoch_checkpoint(2)):  # each a file of its own, damaged
        shutil.copy(path, path.with_name("copy"))
        os.replace(path.with_name("copy"), path)
        garble(path)
    result = train(tiny_config(run.root), CPU, loader_factory=scripted(2))
    assert result.global_step == 4
    assert "resumed from " + str(run.epoch_checkpoint(1)) in caplog.text
    assert_same_weights(run.root, ref.root)
    assert run.metrics.read_text() != "" and metric_steps(run) == metric_steps(ref)


def metric_steps(layout):
    return [(r["kind"], r["epoch"], r["step"]) for r in map(json.loads, layout.metrics.read_text().splitlines())]
