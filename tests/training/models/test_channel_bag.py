"""The bag-of-channels ViT (model.kind: bag_of_channels): each channel an image of its own through
one shared single-channel ViT, a channel per image per training step, a combination's feature from
its channels' CLS features, and checkpoints evaluated on any subset of the trained channels."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.support.tiny import tiny_config
from training.costs.flops import head_flops, train_flops_per_image
from training.dino.channels import bag_channel_draw, bag_of_channels
from training.dino.step import forward_loss
from training.errors import UserError
from training.models import ARCHS, ChannelBagViT, build_backbone, build_model, feature_dim
from training.models.pretrained import load_backbone
from training.models.vit import dino_resample_pos_embed

PATCH = 8


def bag_model(channel_ids: tuple[int, ...], combine: str = "concat", seed: int = 0) -> ChannelBagViT:
    torch.manual_seed(seed)
    config = tiny_config({"model.kind": "bag_of_channels", "model.bag_combine": combine})
    return build_backbone(config.model, len(channel_ids), img_size=32, channel_ids=channel_ids).eval()


def reference_cls(model: ChannelBagViT, image: torch.Tensor) -> torch.Tensor:
    """The CLS feature of one single-channel image (B, 1, H, W) from the definition: strided
    convolution, CLS and DINO's position embedding, the blocks, the final norm."""
    weight, bias = model.patch_embed.proj.weight, model.patch_embed.proj.bias
    patches = F.conv2d(image, weight, bias, stride=PATCH).flatten(2).transpose(1, 2)
    grid = (image.shape[-2] // PATCH, image.shape[-1] // PATCH)
    pos = dino_resample_pos_embed(model.pos_embed, grid, image.shape[-2] == image.shape[-1])
    tokens = torch.cat([model.cls_token.expand(len(image), -1, -1), patches], dim=1) + pos
    for block in model.blocks:
        tokens = block(tokens)
    return model.norm(tokens)[:, 0]


def test_a_single_channel_is_one_image_through_a_one_channel_vit():
    model = bag_model((0, 1, 2, 3, 4))
    assert model.patch_embed.proj.in_channels == 1
    x = torch.randn(3, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference_cls(model, x), rtol=1e-4, atol=1e-5)
        local = torch.randn(3, 1, 16, 16)  # a local crop: the position embedding resampled as DINO does
        torch.testing.assert_close(model(local), reference_cls(model, local), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("combine", ["concat", "concat_normalized", "mean", "concat_pairs"])
def test_a_combination_is_built_from_each_channel_encoded_alone(combine):
    model = bag_model((0, 1, 2, 3, 4), combine)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        per_channel = [reference_cls(model, x[:, c : c + 1]) for c in range(3)]
        out = model(x)
    if combine == "mean":
        expected = torch.stack(per_channel).mean(dim=0)
    elif combine == "concat":
        expected = torch.cat(per_channel, dim=1)  # in the input's channel order
    elif combine == "concat_pairs":  # then every pair, (0, 1), (0, 2), (1, 2), as the mean of its two channels
        pair_images = [(x[:, i : i + 1] + x[:, j : j + 1]) / 2 for i, j in [(0, 1), (0, 2), (1, 2)]]
        expected = torch.cat(per_channel + [reference_cls(model, image) for image in pair_images], dim=1)
    else:
        expected = torch.cat([f / f.norm(dim=1, keepdim=True) for f in per_channel], dim=1)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert out.shape[1] == feature_dim(tiny_config({"model.kind": "bag_of_channels",
                                                    "model.bag_combine": combine}).model, 3)


def test_the_channel_draw_is_per_image_distinct_and_depends_only_on_seed_step_and_rank():
    single = bag_channel_draw(4000, 5, 1, seed=3, step=7, rank=0)
    assert single.shape == (4000, 1)
    counts = np.bincount(single[:, 0], minlength=5) / 4000
    assert np.all(np.abs(counts - 0.2) < 0.03), counts  # every channel equally often
    assert np.array_equal(single, bag_channel_draw(4000, 5, 1, seed=3, step=7, rank=0))
    assert not np.array_equal(single, bag_channel_draw(4000, 5, 1, seed=3, step=7, rank=1))
    assert not np.array_equal(single, bag_channel_draw(4000, 5, 1, seed=3, step=8, rank=0))
    pairs = bag_channel_draw(500, 5, 2, seed=3, step=7, rank=0)
    assert pairs.shape == (500, 2) and np.all(pairs[:, 0] != pairs[:, 1]) and pairs.max() == 4
    with pytest.raises(UserError, match="bag_channels_per_image=6"):
        bag_channel_draw(2, 5, 6, seed=0, step=0, rank=0)


def test_bag_of_channels_picks_each_images_channels_in_every_view():
    views = [torch.randn(3, 5, s, s) for s in (32, 32, 16)]
    draw = np.array([[4, 0], [1, 3], [2, 2 - 1]])
    out = bag_of_channels(views, draw)
    for view, picked in zip(views, out):
        assert picked.shape == (6, 1, *view.shape[-2:])
        for image in range(3):
            for j in range(2):
                torch.testing.assert_close(picked[image * 2 + j, 0], view[image, draw[image, j]])


class RecordingModel(torch.nn.Module):
    """Stands in for a MultiCropWrapper: records the pixel value of each crop's first image."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[float]] = []

    def forward(self, crops, **extra):
        assert not extra  # a bag of channels takes plain single-channel crops
        self.seen = [crop[:, 0, 0, 0].tolist() for crop in crops]
        return torch.zeros(sum(len(c) for c in crops), 4, requires_grad=True)


def test_teacher_and_student_see_the_same_drawn_channel_of_each_image():
    config = tiny_config({"model.kind": "bag_of_channels", "data.channels": "1234", "run.seed": 2})
    teacher, student = RecordingModel(), RecordingModel()
    state = SimpleNamespace(config=config, global_step=11,
                            models=SimpleNamespace(teacher=teacher, student_forward=student),
                            precision=SimpleNamespace(autocast=contextlib.nullcontext),
                            loss_fn=lambda s, t, e: s.sum() + t.sum())
    # image i's channel position p holds 10 i + p
    values = torch.tensor([[10.0 * i + p for p in range(4)] for i in range(6)])[:, :, None, None]
    crops = [values.expand(-1, -1, s, s).clone() for s in (32, 32, 16, 16)]
    forward_loss(state, crops, epoch=0)
    draw = bag_channel_draw(6, 4, 1, seed=2, step=11, rank=0)[:, 0]
    expected = [10.0 * i + p for i, p in enumerate(draw)]
    assert teacher.seen == [expected] * 2 and student.seen == [expected] * 4
    assert len(set(draw.tolist())) > 1


def test_a_checkpoint_serves_any_subset_of_its_channels_and_refuses_others(tmp_path):
    config = tiny_config({"model.kind": "bag_of_channels", "data.channels": "0134"})
    student, teacher = build_model(config, 4)
    path = tmp_path / "checkpoint.pth"
    torch.save({"teacher": teacher.state_dict(), "student": student.state_dict(), "epoch": 1}, path)
    plain = tiny_config({"data.channels": "31"})  # model.kind says vit: the checkpoint decides
    loaded = load_backbone(path, plain.model, 2, channels=(3, 1)).eval()
    assert isinstance(loaded, ChannelBagViT) and loaded.trained_channels == (0, 1, 3, 4)
    x = torch.randn(2, 2, 32, 32)
    with torch.no_grad():
        single = teacher.backbone.eval()
        expected = torch.cat([single(x[:, :1]), single(x[:, 1:]), single(x.mean(dim=1, keepdim=True))], dim=1)
        torch.testing.assert_close(loaded(x), expected)  # model.bag_combine's default: concat_pairs
    with pytest.raises(UserError, match="trained on channels '0134'"):
        load_backbone(path, plain.model, 1, channels=(2,))


def test_a_plain_checkpoint_is_not_read_as_a_bag_of_channels(tmp_path):
    student, teacher = build_model(tiny_config(), 5)
    path = tmp_path / "plain.pth"
    torch.save({"teacher": teacher.state_dict(), "student": student.state_dict()}, path)
    with pytest.raises(UserError, match="model.kind=bag_of_channels but .* plain ViT"):
        load_backbone(path, tiny_config({"model.kind": "bag_of_channels"}).model, 5)


def test_training_flops_count_the_drawn_channels_tokens_only():
    """Per image and step: k single-channel images of N tokens each, per crop; from the formula."""
    config = tiny_config({"model.kind": "bag_of_channels", "model.bag_channels_per_image": 2})
    dim, depth, _ = ARCHS["vit_tiny"]

    def forward(side: int) -> float:
        patches = (side // PATCH) ** 2
        tokens = patches + 1
        blocks = depth * (24 * tokens * dim**2 + 4 * tokens**2 * dim)
        return blocks + 2 * patches * 1 * PATCH**2 * dim + head_flops("vit_tiny", 256)

    per_crop = {32: 2 * forward(32), 16: 2 * forward(16)}
    expected = 3 * (2 * per_crop[32] + 2 * per_crop[16]) + 2 * per_crop[32]
    assert train_flops_per_image(config, 5) == pytest.approx(expected)
    plain = train_flops_per_image(tiny_config(), 5)
    assert train_flops_per_image(tiny_config({"model.kind": "bag_of_channels"}), 5) < plain


def test_channel_vit_flops_average_the_sequence_over_the_subset_sizes_it_draws():
    """ChannelViT: one set of P patch tokens per present channel; hierarchical sampling draws a
    subset size uniform in 1..C, so a crop costs the mean over s of a forward of s P + 1 tokens."""
    dim, depth, _ = ARCHS["vit_tiny"]

    def forward(side: int, sets: int) -> float:
        patches = (side // PATCH) ** 2 * sets
        tokens = patches + 1
        return depth * (24 * tokens * dim**2 + 4 * tokens**2 * dim) + 2 * patches * PATCH**2 * dim

    def image(crop) -> float:
        return 3 * (2 * crop(32) + 2 * crop(16)) + 2 * crop(32)

    head = head_flops("vit_tiny", 256)
    hierarchical = tiny_config({"model.kind": "channel_vit", "data.channels": "012"})
    expected = image(lambda side: (forward(side, 1) + forward(side, 2) + forward(side, 3)) / 3 + head)
    assert train_flops_per_image(hierarchical, 3) == pytest.approx(expected)
    every = tiny_config({"model.kind": "channel_vit", "model.channel_sampling": "all"})
    assert train_flops_per_image(every, 3) == pytest.approx(image(lambda side: forward(side, 3) + head))
